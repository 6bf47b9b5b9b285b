"""Packed rows: documents laid back to back in one sequence, each attending only to itself.

``packed_positions`` gives the positions (restarting per document) and document ids of a packing;
``document_lengths`` each token's document length, the ``seq_len`` a length-dependent scaling (dynamic NTK,
LongRoPE) takes per document. ``posenc.attention`` and ``posenc.remapping`` both use them.

Shapes:
    lengths (N,) -> positions, document_ids (sum(lengths),); positions (T,) or (B, T) with document_ids (T,) or
    (B|1, T) -> (B|1, T)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from posenc._checks import fail


def packed_positions(
    lengths: Sequence[int] | torch.Tensor, *, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions restarting at 0 per document, and the document ids, for documents packed back to back.

    ``attention(..., q_positions=positions, document_ids=ids)`` then equals running each document alone.

    Shapes:
        lengths (N,) -> positions (sum(lengths),) int64, document_ids (sum(lengths),) int64
    """
    lengths = torch.as_tensor(lengths, device=device)
    integer = not (lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool)
    if lengths.dim() != 1 or lengths.numel() == 0 or not integer or bool((lengths <= 0).any()):
        fail("lengths", lengths.tolist(), "a non-empty sequence of positive integer document lengths")
    ids = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)
    starts = torch.cumsum(lengths, 0) - lengths  # (N,) first token of each document
    return torch.arange(ids.numel(), device=lengths.device) - starts[ids], ids


def document_lengths(positions: torch.Tensor, document_ids: torch.Tensor) -> torch.Tensor:
    """Each token's document length, ``max(position in its document) + 1``, for length-dependent scalings on
    packed rows (``attention(..., document_ids=)`` uses it by default; pass it as ``seq_len=`` to a rotary
    module called directly).

    Shapes:
        positions (T,) or (B, T) sequence positions; document_ids (T,) or (B|1, T) -> (B|1, T) float64
    """
    docs = document_ids if document_ids.dim() == 2 else document_ids.unsqueeze(0)  # (B|1, T)
    pos = positions if positions.dim() == 2 else positions.unsqueeze(0)  # (B|1, T)
    pos, docs = torch.broadcast_tensors(pos.double(), docs)
    _, index = torch.unique(docs, return_inverse=True)  # (B, T) dense document numbers
    longest = torch.full((docs.shape[0], int(index.max()) + 1), -math.inf, dtype=torch.float64, device=pos.device)
    longest = longest.scatter_reduce(1, index, pos, "amax")  # (B, documents)
    return longest.gather(1, index) + 1  # (B, T)
