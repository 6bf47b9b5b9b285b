"""Shared fixtures of the bias-encoding tests (FIRE, KERPLE, Sandwich): a small score grid, FlexAttention's index
tensors over it, and the position layouts every bias must handle."""

from __future__ import annotations

import torch

EXACT = {"rtol": 0.0, "atol": 0.0}
B, H, S, T = 2, 4, 5, 7


def indices(b: int, h: int, s: int, t: int) -> tuple[torch.Tensor, ...]:
    """FlexAttention's (b, h, q_idx, kv_idx) as broadcasting index tensors over a (B, H, S, T) score grid."""
    return (
        torch.arange(b).view(b, 1, 1, 1),
        torch.arange(h).view(1, h, 1, 1),
        torch.arange(s).view(1, 1, s, 1),
        torch.arange(t).view(1, 1, 1, t),
    )


def score_mod_grid(enc, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    """``enc.score_mod`` evaluated on every cell of a zero (B, H, S, T) score grid."""
    return enc.score_mod(q_pos, k_pos)(torch.zeros(B, H, S, T), *indices(B, H, S, T))  # (B, H, S, T)


def positions(kind: str, *, high: int = 1000, shared: tuple[int, int] = (10, 8)) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_pos, k_pos) of one layout: shared (S,)/(T,), one-row (1, S), batched (B, S), mixed, float."""
    g = torch.Generator().manual_seed(3)
    return {
        "shared": (torch.arange(S) + shared[0], torch.arange(T) + shared[1]),
        "one_row": (torch.arange(S).unsqueeze(0), torch.arange(T).unsqueeze(0) * 3),
        "batched": (torch.randint(0, high, (B, S), generator=g), torch.randint(0, high, (B, T), generator=g)),
        "mixed": (torch.randint(0, high, (B, S), generator=g), torch.arange(T)),
        "float": (torch.rand(S, generator=g) * 100, torch.rand(B, T, generator=g, dtype=torch.float64) * 100),
    }[kind]
