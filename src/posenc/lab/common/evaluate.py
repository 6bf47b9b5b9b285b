"""Scoring a lab ``GPT`` on held-out data: perplexity by windows, and loss and exact match on task instances.

Shared by ``posenc lab`` (evaluation past the training length, ``posenc.lab.length.evaluate`` choosing what runs)
and ``posenc extend`` (a lab model patched for a longer context). Perplexity follows Press et al. 2022 (ALiBi,
sec. 4): non-overlapping windows of the evaluation length, each target scored once; or sliding windows
(``stride``), where every target but the first window's sees ``length - stride`` tokens or more of context.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from posenc._checks import fail
from posenc.lab.common.corpus import eval_windows


@dataclass(frozen=True)
class Score:
    """One evaluation: mean loss over the scored targets, their count, and whether the model could run at all."""

    loss: float | None
    tokens: int
    status: str = "ok"

    @property
    def ppl(self) -> float | None:
        return None if self.loss is None else math.exp(self.loss)


def max_length(model) -> int | None:  # noqa: ANN001
    """The longest sequence the model's encoding can run on (a learned table's length), None if unbounded."""
    return getattr(getattr(model.encoding, "config", None), "max_len", None)


@torch.no_grad()
def perplexity(
    model,  # noqa: ANN001 - posenc.lab.common.gpt.GPT
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
    model,  # noqa: ANN001 - posenc.lab.common.gpt.GPT
    make_batch: Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    *,
    length: int,
    n_sequences: int,
    seed: int,
    batch_size: int = 32,
) -> tuple[Score, float]:
    """Loss on the answer tokens and exact-match accuracy over ``n_sequences`` fresh task instances of ``length``."""
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


def exact_match(logits: torch.Tensor, y: torch.Tensor, score_mask: torch.Tensor) -> float:
    """Fraction of rows whose every scored target is the argmax of ``logits`` (rows with no answer count as right).

    Shapes:
        logits (B, S, V), y (B, S) int, score_mask (B, S) bool -> a Python float in [0, 1].
    """
    if logits.dim() != 3 or y.shape != logits.shape[:2] or score_mask.shape != y.shape:
        fail(
            "logits",
            tuple(logits.shape),
            f"(B, S, V) logits matching y {tuple(y.shape)} and score_mask {tuple(score_mask.shape)} of shape (B, S)",
        )
    if score_mask.dtype != torch.bool:
        fail("score_mask", score_mask.dtype, "a bool tensor (True on the answer targets)")
    if y.shape[0] == 0:
        fail("y", tuple(y.shape), "at least one row")
    right = (logits.argmax(dim=-1) == y) | ~score_mask  # (B, S)
    return right.all(dim=1).float().mean().item()
