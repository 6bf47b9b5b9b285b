"""``MultiStreamRoPE``: the shared shell of the RoPEs whose frequencies each rotate by one of N position streams.

M-RoPE (Qwen2-VL, three streams), XD-RoPE (HunYuan-VL, four) and the 3-D RoPE of ERNIE-4.5-VL and Bailing differ
only in which stream each frequency reads (``posenc.functional.mrope``'s stream layouts) and in their frequencies;
the positions' shape, the table gather and RoPE's rotation are this one class.

Shapes:
    q (B, H, S, D), k (B, Hkv, T, D); positions (N, S) or (N, B, S), one row per stream (Hugging Face's
    ``position_ids`` layout). With ``k_positions`` omitted, keys use the query positions (T == S).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from posenc._checks import fail
from posenc.encodings._base import FrequencyModule, check_position_values, check_qk, shape_stub
from posenc.functional.mrope import multistream_cos_sin
from posenc.functional.rope import table_dtype


def check_stream_positions(
    positions: torch.Tensor, x: torch.Tensor, names: Sequence[str], name: str = "positions"
) -> torch.Tensor:
    """Positions must be ``(N, S)`` or ``(N, B, S)`` (``B`` may be 1), N = ``len(names)``, for ``x (B, H, S, D)``."""
    n = len(names)
    if not isinstance(positions, torch.Tensor):
        fail(name, type(positions).__name__, f"a torch.Tensor of shape ({n}, S) or ({n}, B, S)")
    s, b = x.shape[-2], x.shape[0] if x.dim() >= 4 else None
    ok = positions.dim() == 2 and positions.shape == (n, s)
    ok = ok or (
        positions.dim() == 3 and positions.shape[0] == n and positions.shape[2] == s and positions.shape[1] in (1, b)
    )
    if not ok:
        fail(
            f"{name}.shape",
            tuple(positions.shape),
            f"({n}, {s}) or ({n}, {1 if b is None else b}, {s}) [{', '.join(names)}] to match x of shape "
            f"{tuple(x.shape)}",
        )
    return positions


class MultiStreamRoPE(FrequencyModule):
    """RoPE whose frequency ``f`` turns by stream ``streams[f]``'s position; N equal streams give plain RoPE.

    Subclasses set, in ``__init__``: ``config`` (with ``head_dim`` and ``layout``), ``stream_names`` (one per row of
    the positions, in the model's order), ``streams`` (one stream index per frequency, plain ints) and the
    ``inv_freq`` buffer from ``build_inv_freq``.

    Shapes:
        q (B, H, S, D), k (B, Hkv, T, D), positions (N, S) or (N, B, S) -> q, k of the same shapes and dtypes.
    """

    inv_freq: torch.Tensor
    stream_names: tuple[str, ...]
    streams: tuple[int, ...]

    position_kind = "mrope"

    @property
    def num_streams(self) -> int:
        """N, the number of position streams (rows of the positions)."""
        return len(self.stream_names)

    def cos_sin(
        self, positions: torch.Tensor, *, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cos/sin tables for N-stream ``positions``: ``(S, F)`` or ``(B, S, F)``."""
        return multistream_cos_sin(
            positions,
            self.inv_freq.to(positions.device),
            streams=self.streams,
            num_streams=self.num_streams,
            dtype=dtype,
        )

    def rotate_one(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate one tensor ``x (B, H, S, D)`` (or ``(S, D)``, ``(H, S, D)``) at N-stream ``positions``."""
        if x.shape[-1] != self.config.head_dim:
            fail("x.shape[-1]", x.shape[-1], f"head_dim = {self.config.head_dim}")
        check_stream_positions(positions, x, self.stream_names)
        check_position_values(positions, x)
        cos, sin = self.cos_sin(positions, dtype=table_dtype(x.dtype))
        return self._apply_tables(x, cos, sin, batched=positions.dim() == 3)

    def check_positions(self, positions: torch.Tensor, length: int, batch: int, name: str = "positions") -> None:
        check_stream_positions(positions, shape_stub(batch, length), self.stream_names, name)

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``Encoding`` hook: rotate queries at ``q_pos`` and keys at ``k_pos`` (both N-stream)."""
        check_qk(q, k, self.config.head_dim)
        check_stream_positions(q_pos, q, self.stream_names, "positions")
        check_stream_positions(k_pos, k, self.stream_names, "k_positions")
        self._check_position_pair(q, k, q_pos, k_pos)
        q_tables, k_tables = self._table_pair(q, k, q_pos, k_pos, lambda pos, dtype: self.cos_sin(pos, dtype=dtype))
        return (
            self._apply_tables(q, *q_tables, batched=q_pos.dim() == 3),
            self._apply_tables(k, *k_tables, batched=k_pos.dim() == 3),
        )
