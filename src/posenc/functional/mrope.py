"""Multimodal rotary position embedding (M-RoPE) as pure functions of tensors.

Paper: Wang et al. 2024, "Qwen2-VL: Enhancing Vision-Language Model's Perception of the World at Any Resolution"
(arXiv:2409.12191), section 2.1 "Multimodal Rotary Position Embedding".
Reference implementations checked against: Hugging Face transformers ``Qwen2VLRotaryEmbedding`` (contiguous sections,
``recomposition_frequencies``) and ``Qwen3VLTextRotaryEmbedding`` (``interleaved=True``, Qwen3-VL's interleaved
M-RoPE), each followed by ``apply_rotary_pos_emb``.

Every token has three positions, temporal, height and width (text tokens: three equal ones). The F rotary
frequencies are split into three groups of ``mrope_section = (F_t, F_h, F_w)`` frequencies, and a frequency in group
``j`` rotates by stream ``j``'s position. Qwen2-VL's groups are contiguous runs of frequencies (``[t..t h..h w..w]``);
Qwen3-VL interleaves them (``[t h w t h w ... t t]``) so each stream spans high and low frequencies alike.

Shapes:
    B batch, S positions, D head dim, F = D / 2.
    inv_freq   (F,)                    float32
    positions  (3, S) or (3, B, S)     integer or floating point, rows [temporal, height, width]
    streams    (F,)                    int64, the stream (0, 1, 2) whose position frequency f uses
    angles     (S, F) or (B, S, F)     float64 (float32 on MPS)
    cos, sin   (S, F) or (B, S, F)     float32 (float64 on request)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch

from posenc._checks import fail
from posenc.functional.rope import rope_angles, rope_cos_sin

STREAMS = ("temporal", "height", "width")


def check_mrope_section(mrope_section: object, num_freqs: int, *, interleaved: bool = False) -> tuple[int, int, int]:
    """Validate ``mrope_section`` against ``num_freqs = F`` (``head_dim // 2``); returns it as a tuple.

    Three non-negative integers summing to F. With ``interleaved`` (Qwen3-VL), height takes frequencies
    ``1, 4, 7, ...`` below ``3 * F_h`` and width ``2, 5, 8, ...`` below ``3 * F_w``, which needs ``3 * F_h - 2 < F``
    and ``3 * F_w - 1 < F``.
    """
    section = _three_counts(mrope_section)
    if sum(section) != num_freqs:
        fail("mrope_section", mrope_section, f"three integers summing to head_dim // 2 = {num_freqs}")
    if interleaved:
        streams = _streams(section, num_freqs, interleaved=True)
        counts = tuple(streams.count(j) for j in range(3))
        if counts != section:
            fail(
                "mrope_section",
                mrope_section,
                f"sections the interleaved layout can realise over {num_freqs} frequencies "
                f"(3 * height - 2 < {num_freqs} and 3 * width - 1 < {num_freqs}); this one gives {list(counts)}",
            )
    return section


def mrope_streams(
    mrope_section: Sequence[int], *, interleaved: bool = False, device: torch.device | str | None = None
) -> torch.Tensor:
    """For each frequency ``f < F``, the position stream (0 temporal, 1 height, 2 width) it rotates by.

    Shapes:
        returns (F,) int64, F = sum(mrope_section)
    """
    num_freqs = sum(_three_counts(mrope_section))
    section = check_mrope_section(mrope_section, num_freqs, interleaved=interleaved)
    return torch.tensor(_streams(section, num_freqs, interleaved=interleaved), dtype=torch.long, device=device)


def _three_counts(mrope_section: object) -> tuple[int, int, int]:
    ok = isinstance(mrope_section, Sequence) and not isinstance(mrope_section, str) and len(mrope_section) == 3
    if not ok or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in cast("Sequence", mrope_section)):
        fail("mrope_section", mrope_section, "three non-negative integers (temporal, height, width)")
    return cast("tuple[int, int, int]", tuple(cast("Sequence[int]", mrope_section)))


def _streams(section: tuple[int, ...], num_freqs: int, *, interleaved: bool) -> list[int]:
    """Plain Python, so validation and index building stay out of ``torch.compile`` graphs."""
    if not interleaved:
        return [0] * section[0] + [1] * section[1] + [2] * section[2]
    # Qwen3-VL: temporal everywhere, then height at 1, 4, ... < 3 F_h and width at 2, 5, ... < 3 F_w.
    streams = [0] * num_freqs
    streams[1 : 3 * section[1] : 3] = [1] * len(range(1, min(3 * section[1], num_freqs), 3))
    streams[2 : 3 * section[2] : 3] = [2] * len(range(2, min(3 * section[2], num_freqs), 3))
    return streams


def _select(tables: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
    """Frequency f of the result is frequency f of stream ``streams[f]``'s table: an exact gather, no arithmetic."""
    index = streams.to(tables.device).view((1,) * (tables.dim() - 1) + (-1,))  # (1, ..., 1, F)
    return torch.take_along_dim(tables, index, dim=0).squeeze(0)  # (3, ..., S, F) -> (..., S, F)


def _check_inputs(positions: torch.Tensor, inv_freq: torch.Tensor, num_freqs: int) -> None:
    if not isinstance(positions, torch.Tensor):
        fail("positions", type(positions).__name__, "a torch.Tensor of shape (3, S) or (3, B, S)")
    if positions.dim() not in (2, 3) or positions.shape[0] != 3:
        fail("positions.shape", tuple(positions.shape), "(3, S) or (3, B, S): temporal, height and width positions")
    if inv_freq.shape != (num_freqs,):
        fail("inv_freq.shape", tuple(inv_freq.shape), f"({num_freqs},), one frequency per mrope_section entry")


def mrope_angles(
    positions: torch.Tensor, inv_freq: torch.Tensor, *, mrope_section: Sequence[int], interleaved: bool = False
) -> torch.Tensor:
    """Angles ``positions[stream(f)] * inv_freq[f]``, in float64 (float32 on devices without float64).

    Shapes:
        positions (3, S) or (3, B, S); inv_freq (F,) -> (S, F) or (B, S, F)
    """
    streams = mrope_streams(mrope_section, interleaved=interleaved)  # (F,), moved to the device in _select
    _check_inputs(positions, inv_freq, streams.shape[0])
    return _select(rope_angles(positions, inv_freq), streams)  # (3, ..., S, F) -> (..., S, F)


def mrope_cos_sin(
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    mrope_section: Sequence[int],
    interleaved: bool = False,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine and sine tables for three-stream ``positions``, ready for ``apply_rotary``.

    The tables of the three streams come from ``rope_cos_sin`` and frequency f is picked from stream ``stream(f)``,
    so text tokens (three equal positions) get exactly RoPE's tables.

    Shapes:
        positions (3, S) or (3, B, S); inv_freq (F,) -> cos, sin (S, F) or (B, S, F)
    """
    streams = mrope_streams(mrope_section, interleaved=interleaved)  # (F,), moved to the device in _select
    _check_inputs(positions, inv_freq, streams.shape[0])
    cos, sin = rope_cos_sin(positions, inv_freq, dtype=dtype)  # (3, ..., S, F) each
    return _select(cos, streams), _select(sin, streams)
