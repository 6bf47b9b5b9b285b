"""Multimodal rotary position embedding (M-RoPE) as pure functions of tensors.

Paper: Wang et al. 2024, "Qwen2-VL: Enhancing Vision-Language Model's Perception of the World at Any Resolution"
(arXiv:2409.12191), section 2.1 "Multimodal Rotary Position Embedding".
Reference implementations checked against: Hugging Face transformers ``Qwen2VLRotaryEmbedding`` (contiguous sections,
``recomposition_frequencies``) and ``Qwen3VLTextRotaryEmbedding`` (``interleaved=True``, Qwen3-VL's interleaved
M-RoPE), each followed by ``apply_rotary_pos_emb``; the other stream layouts (``multistream_cos_sin``) name their own.

Every token has N positions, one per stream (M-RoPE: three, temporal, height and width; text tokens: N equal ones).
Each of the F rotary frequencies rotates by one stream's position: frequency ``f`` by stream ``streams[f]``.

Shapes:
    B batch, S positions, D head dim, F = D / 2, N streams.
    inv_freq   (F,)                    float32
    positions  (N, S) or (N, B, S)     integer or floating point, one row per stream
    streams    (F,)                    int64, the stream whose position frequency f uses
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
    return torch.tensor(mrope_stream_list(mrope_section, interleaved=interleaved), dtype=torch.long, device=device)


def mrope_stream_list(mrope_section: Sequence[int], *, interleaved: bool = False) -> list[int]:
    """``mrope_streams`` as a plain list (validated), for building tables inside ``torch.compile`` graphs."""
    num_freqs = sum(_three_counts(mrope_section))
    section = check_mrope_section(mrope_section, num_freqs, interleaved=interleaved)
    return _streams(section, num_freqs, interleaved=interleaved)


def _three_counts(mrope_section: object) -> tuple[int, int, int]:
    ok = isinstance(mrope_section, Sequence) and not isinstance(mrope_section, str) and len(mrope_section) == 3
    if not ok or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in cast("Sequence", mrope_section)):
        fail("mrope_section", mrope_section, "three non-negative integers (temporal, height, width)")
    return cast("tuple[int, int, int]", tuple(cast("Sequence[int]", mrope_section)))


def _streams(section: tuple[int, ...], num_freqs: int, *, interleaved: bool) -> list[int]:
    """Plain Python, so validation and index building stay out of ``torch.compile`` graphs."""
    if not interleaved:
        return contiguous_streams(section)
    # Qwen3-VL: temporal everywhere, then height at 1, 4, ... < 3 F_h and width at 2, 5, ... < 3 F_w.
    streams = [0] * num_freqs
    streams[1 : 3 * section[1] : 3] = [1] * len(range(1, min(3 * section[1], num_freqs), 3))
    streams[2 : 3 * section[2] : 3] = [2] * len(range(2, min(3 * section[2], num_freqs), 3))
    return streams


def contiguous_streams(sections: Sequence[int]) -> list[int]:
    """Stream ``j`` takes the next ``sections[j]`` frequencies: ``[0]*s0 + [1]*s1 + ...`` (plain Python).

    Qwen2-VL's ``mrope_section`` (three streams) and HunYuan-VL's ``xdrope_section`` (four).
    """
    return [j for j, count in enumerate(sections) for _ in range(count)]


def alternating_spatial_streams(temporal: int, spatial: int) -> list[int]:
    """Height (stream 1) and width (stream 2) alternate over the first ``2 * spatial`` frequencies, temporal (stream
    0) takes the last ``temporal``: ``[1 2 1 2 ... 1 2 0 0 ... 0]`` (plain Python).

    ERNIE-4.5-VL's 3-D RoPE (``mrope_section = [h, w, t]`` with ``h == w``) and Bailing's M-RoPE
    (``mrope_section = [t, h, w]``, ``h == w``): streams ordered ``[temporal, height, width]`` as their positions are.
    """
    return [1 + f % 2 for f in range(2 * spatial)] + [0] * temporal


def _select(tables: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
    """Frequency f of the result is frequency f of stream ``streams[f]``'s table: an exact gather, no arithmetic."""
    index = streams.to(tables.device).view((1,) * (tables.dim() - 1) + (-1,))  # (1, ..., 1, F)
    return torch.take_along_dim(tables, index, dim=0).squeeze(0)  # (3, ..., S, F) -> (..., S, F)


def _check_inputs(positions: torch.Tensor, inv_freq: torch.Tensor, num_freqs: int, num_streams: int = 3) -> None:
    rows = f"({num_streams}, S) or ({num_streams}, B, S)"
    if not isinstance(positions, torch.Tensor):
        fail("positions", type(positions).__name__, f"a torch.Tensor of shape {rows}")
    if positions.dim() not in (2, 3) or positions.shape[0] != num_streams:
        what = ": temporal, height and width positions" if num_streams == 3 else f": {num_streams} position streams"
        fail("positions.shape", tuple(positions.shape), rows + what)
    if inv_freq.shape != (num_freqs,):
        fail("inv_freq.shape", tuple(inv_freq.shape), f"({num_freqs},), one frequency per stream entry")


def check_streams(streams: object, num_streams: int) -> tuple[int, ...]:
    """``streams``: one stream index in ``[0, num_streams)`` per frequency, as a tuple of ints."""
    if not isinstance(streams, Sequence) or isinstance(streams, str) or len(streams) == 0:
        fail("streams", streams, f"a non-empty sequence of stream indices in [0, {num_streams}), one per frequency")
    if not all(not isinstance(j, bool) and isinstance(j, int) and 0 <= j < num_streams for j in streams):
        fail("streams", streams, f"a non-empty sequence of stream indices in [0, {num_streams}), one per frequency")
    return tuple(streams)


def multistream_angles(
    positions: torch.Tensor, inv_freq: torch.Tensor, *, streams: Sequence[int], num_streams: int
) -> torch.Tensor:
    """Angles ``positions[streams[f]] * inv_freq[f]`` for any stream layout, in float64 (float32 without float64).

    Shapes:
        positions (N, S) or (N, B, S); inv_freq (F,); streams F ints < N -> (S, F) or (B, S, F)
    """
    index = torch.tensor(check_streams(streams, num_streams), dtype=torch.long)
    _check_inputs(positions, inv_freq, index.shape[0], num_streams)
    return _select(rope_angles(positions, inv_freq), index)  # (N, ..., S, F) -> (..., S, F)


def multistream_cos_sin(
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    streams: Sequence[int],
    num_streams: int,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine and sine tables for N-stream ``positions``, ready for ``apply_rotary``: frequency ``f`` is picked from
    stream ``streams[f]``'s RoPE tables (an exact gather), so equal streams (text tokens) give exactly RoPE's tables.

    The layouts of ``streams`` that released models use, each a plain function of its section sizes:

    - ``contiguous_streams``: runs of frequencies ``[0..0 1..1 2..2 ...]`` (Qwen2-VL's ``mrope_section``; HunYuan-VL's
      four-stream XD-RoPE, ``xdrope_section``);
    - Qwen3-VL's interleaved ``[t h w t h w ... t t]`` (``mrope_streams(..., interleaved=True)``), so each stream spans
      high and low frequencies alike;
    - ``alternating_spatial_streams``: ``[h w h w ... h w t t ... t]``, height and width alternating over the highest
      frequencies and temporal over the lowest (ERNIE-4.5-VL's 3-D RoPE; Bailing's M-RoPE).

    Shapes:
        positions (N, S) or (N, B, S); inv_freq (F,); streams F ints < N -> cos, sin (S, F) or (B, S, F)
    """
    index = torch.tensor(check_streams(streams, num_streams), dtype=torch.long)
    _check_inputs(positions, inv_freq, index.shape[0], num_streams)
    cos, sin = rope_cos_sin(positions, inv_freq, dtype=dtype)  # (N, ..., S, F) each
    return _select(cos, index), _select(sin, index)


def mrope_angles(
    positions: torch.Tensor, inv_freq: torch.Tensor, *, mrope_section: Sequence[int], interleaved: bool = False
) -> torch.Tensor:
    """Angles ``positions[stream(f)] * inv_freq[f]``, in float64 (float32 on devices without float64).

    Shapes:
        positions (3, S) or (3, B, S); inv_freq (F,) -> (S, F) or (B, S, F)
    """
    streams = mrope_stream_list(mrope_section, interleaved=interleaved)
    return multistream_angles(positions, inv_freq, streams=streams, num_streams=3)


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
    streams = mrope_stream_list(mrope_section, interleaved=interleaved)
    return multistream_cos_sin(positions, inv_freq, streams=streams, num_streams=3, dtype=dtype)
