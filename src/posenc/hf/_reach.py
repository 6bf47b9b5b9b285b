"""How far a patched model reaches, and a warning, once per model, for an input past it.

A context extension is made for a length; past it the model attends over distances (rotary angles) it never saw,
in pretraining or through the extension, as an unpatched model past its ``max_position_embeddings``:

- a remapping method reaches ``method.reach(original)`` tokens, the longest sequence whose every (query, key) pair it
  scores at a distance below the length ``original`` it was derived over (Self-Extend ``G (L - W + W // G)``, STRING
  ``L + offset - W``, Leaky ReRoPE); DCA, ReRoPE, LM-Infinite and StreamingLLM have no limit;
- a frequency method with a target (``linear``, ``ntk``, ``yarn``, ``longrope``, ``llama3``; ``linear`` on p-RoPE)
  reaches the context it extended the model to, the ``max_position_embeddings`` it wrote; ``dynamic`` has no limit
  (it rescales with the length).

The last ``extend_context`` call sets the model's reach (a remapping method after YaRN: the remapping method's,
counted over the YaRN model's context). A forward pre-hook on each rotary module -- which every forward runs once,
before any layer, with the call's ``position_ids`` -- warns (``ReachExceededWarning``) the first time a sequence is
longer (largest position + 1) than the reach: a prefill, or the step of ``generate`` that passes it. ALiBi's slope
interpolation has no hook here (BLOOM records no training length).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

import torch

_STATE = "_posenc_reach"  # on each rotary module: the model's _Reach (shared), or None
_HOOK = "_posenc_reach_hook"  # on each rotary module: the id of its pre-hook


class ReachExceededWarning(UserWarning):
    """An input longer than a patched model reaches (``posenc.hf.extend_context``: a remapping method's reach, a
    frequency method's extended context): past it the model attends over distances it never saw. Given once per
    model."""


@dataclasses.dataclass
class _Reach:
    tokens: int
    what: str
    warned: bool = False


def rotary_positions(args: tuple, kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The ``position_ids`` a transformers rotary module is called with (``forward(x, position_ids, ...)``)."""
    positions = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
    return positions if isinstance(positions, torch.Tensor) else None


def watch_reach(modules: list[tuple[str, torch.nn.Module]], reach: float | None, what: str) -> None:
    """Warn once (``ReachExceededWarning``) when a forward of the model whose rotary ``modules`` these are runs a
    sequence longer than ``reach`` tokens; ``what`` names the patch (e.g. ``"yarn x2 over 32"``). ``None`` or ``inf``:
    no limit. Replaces the reach an earlier call set."""
    state = None if reach is None or math.isinf(reach) else _Reach(int(reach), what)
    for _, module in modules:
        module.__dict__[_STATE] = state  # one object for every module: once per model
        if state is not None and module.__dict__.get(_HOOK) not in module._forward_pre_hooks:  # once per module
            module.__dict__[_HOOK] = module.register_forward_pre_hook(_check, with_kwargs=True).id


def _check(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
    state = module.__dict__.get(_STATE)
    if state is None or state.warned or torch.compiler.is_compiling():
        return None
    positions = rotary_positions(args, kwargs)
    if positions is None or positions.numel() == 0:
        return None
    length = int(positions.max()) + 1
    if length > state.tokens:
        state.warned = True
        warnings.warn(
            f"posenc.hf.extend_context: a sequence of {length} tokens is past the reach of {state.what}, "
            f"{state.tokens} tokens: past it the model attends over distances it never saw, as an unpatched model "
            "past its max_position_embeddings (extend with a larger factor to reach further). Warned once per model.",
            ReachExceededWarning,
            stacklevel=2,
        )
    return None
