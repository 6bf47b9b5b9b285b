"""Evaluation past the training length: perplexity by windows, task accuracy, and the RoPE extensions applied zero-shot.

Perplexity follows Press et al. 2022 (ALiBi, sec. 4): non-overlapping windows of the evaluation length, each target
scored once; or sliding windows (``stride``), where every target but the first window's sees ``length - stride``
tokens or more of context.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import posenc
from posenc._checks import check_choice, check_number, check_positive_int, fail
from posenc.lab.data import eval_windows
from posenc.lab.model import split_encoding

#: RoPE context-extension methods applied zero-shot at an evaluation length ``L'`` past the training length ``L``,
#: with factor ``L' / L`` (Chen et al. 2023 PI; bloc97 NTK-aware; emozilla dynamic NTK; Peng et al. 2023 YaRN).
ROPE_SCALINGS = ("linear", "ntk", "dynamic", "yarn")

#: Ways to run an encoding past its training length that are not RoPE scalings: learned tables interpolated to the
#: new length (as ViT fine-tuning does for grids), ALiBi slopes interpolated (Al-Khateeb et al. 2023).
OTHER_EXTENSIONS = {"learned": ("interpolate",), "alibi": ("interpolate",)}


@dataclass(frozen=True)
class Score:
    """One evaluation: mean loss over the scored targets, their count, and whether the model could run at all."""

    loss: float | None
    tokens: int
    status: str = "ok"

    @property
    def ppl(self) -> float | None:
        return None if self.loss is None else math.exp(self.loss)


def extension_names(encoding: str) -> tuple[str, ...]:
    """The extensions ``posenc lab`` evaluates for ``encoding``, after ``"none"`` (the model as trained).

    For a per-layer ``"BASE/OTHER:N"``, BASE's: they act on BASE's layers (``rope/nope:4``: RoPE scalings of the
    RoPE layers, the NoPE layers unchanged).
    """
    encoding = split_encoding(encoding)[0]
    if encoding == "rope":
        return ("none", *ROPE_SCALINGS)
    return ("none", *OTHER_EXTENSIONS.get(encoding, ()))


def extended_encoding(model, extension: str, *, train_len: int, eval_len: int) -> posenc.Encoding | None:  # noqa: ANN001
    """The encoding to swap into ``model`` to run ``extension`` at ``eval_len``; None keeps the trained one.

    ``model`` is a ``posenc.lab.model.GPT``; its own encoding is never modified. For a per-layer model the result
    replaces BASE's encoding (``GPT.set_encoding``), in every BASE layer.
    """
    encoding = model.config.base_encoding
    if extension == "none" or eval_len <= train_len:
        return None
    factor = eval_len / train_len
    if encoding == "rope":
        # dynamic NTK derives its factor from each call's length, so it is built unscaled (factor 1)
        return rope_like(model, rope_scaling(extension, factor=1.0 if extension == "dynamic" else factor,
                                             original_len=train_len))  # fmt: skip
    if encoding == "alibi" and extension == "interpolate":
        return alibi_like(model, train_len=train_len, eval_len=eval_len)
    if encoding == "learned" and extension == "interpolate":
        return model.encoding.resized(eval_len)
    raise ValueError(f"extension={extension!r} is invalid: expected one of {extension_names(encoding)}")


def max_length(model) -> int | None:  # noqa: ANN001
    """The longest sequence the model's encoding can run on (a learned table's length), None if unbounded."""
    return getattr(getattr(model.encoding, "config", None), "max_len", None)


@torch.no_grad()
def perplexity(
    model,  # noqa: ANN001 - posenc.lab.model.GPT
    data: torch.Tensor,
    *,
    length: int,
    stride: int | None = None,
    max_tokens: int | None = None,
    batch_size: int = 8,
) -> Score:
    """Mean next-byte cross-entropy of ``model`` over ``data`` in windows of ``length`` tokens.

    Shapes:
        data (N,) uint8 bytes; each window x, y (n, length) with a boolean score mask of the same shape.
    """
    limit = max_length(model)
    if limit is not None and length > limit:
        return Score(loss=None, tokens=0, status="n/a")
    was_training = model.training
    model.eval()
    total, count = torch.zeros((), dtype=torch.float64), 0
    for x, y, mask in eval_windows(data, length=length, stride=stride, max_tokens=max_tokens):
        device = next(model.parameters()).device
        x, y, mask = x.to(device), y.to(device), mask.to(device)
        for start in range(0, x.shape[0], batch_size):
            sl = slice(start, start + batch_size)
            logits = model(x[sl])  # (n, length, vocab)
            losses = F.cross_entropy(logits.flatten(0, 1).float(), y[sl].flatten(), reduction="none")  # (n * length,)
            keep = mask[sl].flatten()
            total += losses[keep].double().sum().cpu()
            count += int(keep.sum())
    model.train(was_training)
    if count == 0:
        raise ValueError(
            f"data={data.numel()} bytes is invalid: expected enough held-out text for one window of {length}"
        )
    return Score(loss=float(total / count), tokens=count)


@torch.no_grad()
def task_accuracy(
    model,  # noqa: ANN001 - posenc.lab.model.GPT
    make_batch: Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    *,
    length: int,
    n_sequences: int,
    seed: int,
    batch_size: int = 32,
) -> tuple[Score, float]:
    """Loss on the answer tokens and exact-match accuracy over ``n_sequences`` fresh task instances of ``length``."""
    from posenc.lab.tasks import exact_match

    limit = max_length(model)
    if limit is not None and length > limit:
        return Score(loss=None, tokens=0, status="n/a"), float("nan")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    total, count, correct, seen = 0.0, 0, 0.0, 0
    while seen < n_sequences:
        n = min(batch_size, n_sequences - seen)
        x, y, mask = (t.to(device) for t in make_batch(n, generator))
        logits = model(x)  # (n, length, vocab)
        losses = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="none")
        keep = mask.flatten()
        total += float(losses[keep].double().sum())
        count += int(keep.sum())
        correct += exact_match(logits, y, mask) * n
        seen += n
    model.train(was_training)
    return Score(loss=total / max(count, 1), tokens=count), correct / seen


#: ``posenc extend``'s methods for a lab model, by its encoding: the RoPE scalings (plus Llama 3.1's, whose defaults
#: ``low_freq_factor=1, high_freq_factor=4`` need nothing searched; LongRoPE's per-frequency factors do, so it is not
#: offered here), and for ALiBi ``linear``: slope interpolation (Al-Khateeb et al. 2023), which is Position
#: Interpolation for ALiBi (positions divided by the factor = slopes divided by it); ``posenc.hf.extend_context``
#: uses the same name.
EXTEND_METHODS = {"rope": (*ROPE_SCALINGS, "llama3"), "alibi": ("linear",)}


def scaled_encoding(model, method: str, *, factor: float, original_len: int) -> posenc.Encoding:  # noqa: ANN001
    """A new encoding for ``model`` (a lab ``GPT``) extending its context ``factor`` times past ``original_len``.

    Unlike :func:`extended_encoding` (factor = evaluation length / training length, rebuilt per length), the
    factor is fixed, as when a deployed model is patched once for a target context ``factor * original_len`` and
    then run at every length. ``model`` is not modified; swap the result in with ``model.set_encoding`` (for a
    per-layer ``"BASE/OTHER:N"`` model, the result is BASE's, as in :func:`extended_encoding`).

    Raises:
        ValueError: an encoding without positional parameters we extend, a method it does not offer, a factor < 1.
    """
    encoding = model.config.base_encoding
    if encoding not in EXTEND_METHODS:
        fail(
            "encoding",
            encoding,
            f"one with positional parameters posenc extend knows how to scale: {sorted(EXTEND_METHODS)}",
        )
    check_choice("method", method, EXTEND_METHODS[encoding])
    check_number("factor", factor, minimum=1.0)
    check_positive_int("original_len", original_len)
    if encoding == "alibi":
        eval_len = max(original_len, round(original_len * factor))  # slopes times original_len / eval_len
        return alibi_like(model, train_len=original_len, eval_len=eval_len)
    return rope_like(model, rope_scaling(method, factor=factor, original_len=original_len))


def rope_scaling(method: str, *, factor: float, original_len: int) -> dict:
    """The Hugging Face ``rope_scaling`` dict of ``method`` at ``factor`` for a model trained at ``original_len``."""
    return {
        "linear": {"rope_type": "linear", "factor": factor},
        "ntk": {"rope_type": "ntk", "factor": factor},
        "dynamic": {"rope_type": "dynamic", "factor": factor, "max_position_embeddings": original_len},
        "yarn": {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original_len},
        "llama3": {
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": original_len,
        },
    }[method]


def rope_like(model, scaling: dict) -> posenc.RotaryEmbedding:  # noqa: ANN001
    """A RoPE like ``model``'s own (head dim, base, layout, partial rotary), with ``scaling``, on its device."""
    c = model.encoding.config
    return posenc.RotaryEmbedding(
        c.head_dim, base=c.base, scaling=scaling, layout=c.layout, partial_rotary_factor=c.partial_rotary_factor
    ).to(model.encoding.inv_freq.device)


def alibi_like(model, *, train_len: int, eval_len: int) -> posenc.ALiBi:  # noqa: ANN001
    """``model``'s ALiBi with its slopes interpolated from ``train_len`` to ``eval_len``, on its device."""
    c = model.encoding.config
    return posenc.ALiBi(c.num_heads, symmetric=c.symmetric, train_len=train_len, eval_len=eval_len).to(
        model.encoding.slopes.device
    )
