"""Fine-tuning an extended model in a short window: the batches (plain, PoSE or random positions) and the loop for a
transformers model (resumable AdamW through ``posenc.lab.common.train``).

A fine-tune at the target context ``T`` costs ``T``-token forwards and backwards: out of reach on a CPU for a real
model at 16k. With a window ``W < T`` every step costs a ``W``-token step, and the positions decide what the model
learns about the far positions it will be read at:

    plain   positions 0..W-1 of a contiguous window: the fine-tune never sees a distance of W or more.
    pose    PoSE (Zhu et al., ICLR 2024): two chunks of the window, the second's positions and text skipping ahead
            (``posenc.functional.position_sampling.pose_sample``); the text is read from a span of ``5 W`` tokens
            (the reference truncates each training document there), so the second chunk's text follows at a random
            gap, as its positions do.
    random  Randomized positional encodings (Ruoss et al., ACL 2023): a contiguous window at a sorted random subset
            of ``[0, T)`` (``randomized_positions``).

``pose`` and ``random`` need a model that reads the positions it is given. A lab ``GPT`` does, whatever its encoding
(its ALiBi bias is ``-m (i - j)`` of those positions); a transformers ALiBi model (BLOOM, MPT) takes no position
ids, so both are refused for it (``check_positions_reach``) rather than run as plain fine-tuning.

Every input token's next-token target is the token that follows it in the text (for PoSE's last first-chunk token,
the text's next token, not the second chunk's first: the reference scores the latter, a prediction across the jump
no model can make). Batches are a pure function of ``(seed, step)``, so a resumed fine-tune sees the same batches.

Shapes:
    tokens (N,) integer (uint8 bytes or int64 token ids) -> x, y, positions (batch, W) int64.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from posenc._checks import check_choice, check_positive_int, fail
from posenc.functional.position_sampling import pose_sample, randomized_positions
from posenc.lab.extend.settings.config import FINETUNE_POSITIONS

#: PoSE's text span per sample, in windows (the reference tokenizes each document up to 5 training windows).
POSE_SPAN = 5


def check_positions_reach(kinds: Sequence[str], model_type: str | None) -> None:
    """Refuse ``pose`` and ``random`` fine-tuning positions (``kinds``) for a transformers model that ignores
    position ids: BLOOM and MPT (``posenc.hf.ALIBI_MODEL_TYPES``) accept ``position_ids`` and drop them, their ALiBi
    bias built from the token distance alone, so the fine-tune would silently be a plain one. ``model_type``: the
    transformers config's (None for a lab model, which reads its positions)."""
    from posenc.hf.alibi import ALIBI_MODEL_TYPES

    sampled = [k for k in kinds if k != "plain"]
    if sampled and model_type in ALIBI_MODEL_TYPES:
        fail(
            "finetune_positions",
            list(kinds),
            f"--finetune-positions plain for an ALiBi model ({model_type}): ALiBi models take no position ids (their "
            "bias depends only on the token distance), so PoSE's skipped positions and random ones cannot reach "
            f"them and a {sampled[0]} fine-tune would be plain fine-tuning; use plain fine-tuning",
        )


def needed_tokens(window: int) -> int:
    """The fewest text tokens a fine-tune in ``window``-token windows needs: one window and the token after it."""
    return window + 1


def _row(tokens: torch.Tensor, *, window: int, target: int, kind: str, generator: torch.Generator) -> tuple:
    n = tokens.numel()
    if kind == "pose":
        span = min(POSE_SPAN * window, n - 1)  # the sample's document: tokens[start : start + span] (+1 target)
        start = int(torch.randint(0, n - span, (), generator=generator))
        sample = pose_sample(document_length=span, window=window, target=target, generator=generator)
        index = start + sample.text_index  # (W,)
        return tokens[index], tokens[index + 1], sample.positions
    start = int(torch.randint(0, n - window, (), generator=generator))
    index = torch.arange(start, start + window)  # (W,)
    if kind == "random":
        positions = randomized_positions(length=window, target=target, generator=generator)
    else:
        positions = torch.arange(window)
    return tokens[index], tokens[index + 1], positions


def finetune_batch(
    tokens: torch.Tensor, *, window: int, target: int, positions: str, batch: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, None, torch.Tensor]:
    """One fine-tuning batch ``(x, y, None, positions)`` for ``posenc.lab.common.train.train``: ``batch`` rows of
    ``window`` tokens of ``tokens``, read at ``positions`` (``plain``, ``pose``, ``random``) for a ``target`` context.

    Shapes:
        tokens (N,) integer, N > window -> x, y, positions (batch, window) int64.
    """
    check_choice("positions", positions, FINETUNE_POSITIONS)
    check_positive_int("window", window)
    check_positive_int("batch", batch)
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 1 or tokens.is_floating_point():
        fail("tokens", getattr(tokens, "shape", type(tokens).__name__), "a 1-D tensor of token ids")
    if tokens.numel() < needed_tokens(window):
        fail("tokens", tokens.numel(), f"at least {needed_tokens(window)} tokens for a {window}-token window")
    if target < window:
        fail("target", target, f"a target context of at least the window, {window} tokens")
    rows = [_row(tokens, window=window, target=target, kind=positions, generator=generator) for _ in range(batch)]
    x, y, pos = (torch.stack(parts).long() for parts in zip(*rows, strict=True))  # (batch, W) each
    return x, y, None, pos


# ---------------------------------------------------------------------------------------------------------------------
# A transformers model through the lab's training loop


class _RunConfig(dict):
    """What identifies a fine-tune (``config.json``'s ``model`` section, compared on resume)."""

    def to_dict(self) -> dict[str, Any]:
        return dict(self)


class CausalLMTrainer(nn.Module):
    """A transformers causal LM as ``(tokens (B, S), positions (B, S)) -> logits (B, S, V)``, the form
    ``posenc.lab.common.train.train`` steps; ``config`` describes the fine-tune for its resume check."""

    def __init__(self, model: nn.Module, description: Mapping[str, Any]) -> None:
        super().__init__()
        self.model = model
        self.config = _RunConfig(description)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(input_ids=tokens, position_ids=positions, use_cache=False).logits  # (B, S, V)


def warmup_steps(steps: int) -> int:
    """Linear warmup of a transformers fine-tune: 10 steps (PoSE's and PI's recipes), at most a tenth of them."""
    return min(10, steps // 10)


def read_losses(run_dir: Path) -> list[tuple[int, float]]:
    """``(step, loss)`` of a fine-tune's ``metrics.jsonl`` (empty when it has none)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
            if math.isfinite(float(row["loss"])):
                out.append((int(row["step"]), float(row["loss"])))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue  # a line cut by a crash
    return out


def plot_losses(runs: Mapping[str, Path], path: Path, *, unit: str = "token") -> Path | None:
    """The fine-tunes' training loss against step, one line per fine-tuned model; None when none has a loss.
    ``unit``: what the model predicts (``token``, or ``byte`` for the lab's models)."""
    from matplotlib.ticker import MaxNLocator

    from posenc.lab.common.plots import MARKERS, PALETTE, new_figure, save_png

    curves = {name: read_losses(d) for name, d in runs.items()}
    curves = {name: c for name, c in curves.items() if c}
    if not curves:
        return None
    fig = new_figure(6.4, 4.0)
    ax = fig.add_subplot()
    for i, (name, curve) in enumerate(curves.items()):
        steps, losses = zip(*curve, strict=True)
        ax.plot(steps, losses, color=PALETTE[i % len(PALETTE)], marker=MARKERS[i % len(MARKERS)] if len(steps) < 30
                else None, markersize=3, label=name)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("fine-tuning step")
    ax.set_ylabel(f"training loss (nats per {unit})")
    ax.set_title("Fine-tuning loss (each point: mean over the steps since the last)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_png(fig, path, dpi=120)


def run_folder(out: Path, label: str) -> Path:
    """Where the fine-tune of the model ``label`` (``yarn-x2-ft20-pose``) keeps its checkpoint and losses."""
    return Path(out) / "runs" / f"finetune-{label}"
