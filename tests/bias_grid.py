"""Shared fixtures of the bias-encoding tests (FIRE, KERPLE, Sandwich): a small score grid, FlexAttention's index
tensors over it, and the position layouts every bias must handle."""

from __future__ import annotations

import pytest
import torch

EXACT = {"rtol": 0.0, "atol": 0.0}
B, H, S, T = 2, 4, 5, 7
#: ``(backend, device)`` of ``check_compiled_attention``: one compile each (the GPU case skips without CUDA).
COMPILED = [("sdpa", "cpu"), ("flex", "cpu"), pytest.param("flex", "cuda", marks=pytest.mark.gpu)]


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


def check_compiled_attention(enc, backend: str, device: str = "cpu", *, t: int = 16, q_offset: int = 8) -> None:  # noqa: ANN001
    """``posenc.attention`` with ``enc``, compiled as one graph (``fullgraph=True``: no graph break), equals softmax
    attention with ``enc.bias`` added, for two rows whose queries sit at different offsets (q_offset and 3) over keys
    0..t-1. On ``flex`` this is the compiled FlexAttention kernel running ``enc.score_mod``, so the score_mod must
    capture parameters, not tensors computed in the graph (CPU inductor cannot lower those); one compile checks both
    (BENCHMARKS.md, "Time of CI")."""
    from torch.testing import assert_close

    import posenc
    from encoding_cases import attention_tol

    # qk head dim >= 24: torch 2.13's compiled CPU FlexAttention is wrong at 16 and below on AVX2-only CPUs
    b, s, d = 2, 8, 32
    q = torch.randn(b, H, s, d, device=device)
    k, v = torch.randn(b, H, t, d, device=device), torch.randn(b, H, t, d, device=device)
    enc = enc.to(device)
    q_pos = torch.stack((torch.arange(s) + q_offset, torch.arange(s) + 3)).to(device)  # per-row query offsets
    k_pos = torch.arange(t, device=device)

    def step(q, k, v):  # noqa: ANN001, ANN202
        return posenc.attention(q, k, v, encoding=enc, backend=backend, q_positions=q_pos, k_positions=k_pos,
                                causal=False)

    with torch.no_grad():
        got = torch.compile(step, fullgraph=True, dynamic=False)(q, k, v)
        scores = q @ k.transpose(-1, -2) * d**-0.5 + enc.bias(q_pos, k_pos)
    # score_mod and bias may sum their terms apart (encoding_cases.score_error), on top of the attention's rounding
    tol = attention_tol(q, k, v, encoding=enc, q_positions=q_pos, k_positions=k_pos)
    assert_close(got, torch.softmax(scores, dim=-1) @ v, **tol)
