"""Meta llama's rotary embedding, complex-number form (Touvron et al. 2023), written from the formula.

freqs_cis[s, i] = exp(1j * s * theta_i); x viewed as complex pairs (x[2i] + 1j x[2i+1]) is multiplied by it.
"""

import torch


def precompute_freqs_cis(inv_freq: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    angles = torch.outer(positions.to(torch.float64), inv_freq.to(torch.float64))  # (S, F)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rotary_emb(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """x (B, H, S, D) float64 -> same, pairs (2i, 2i+1) rotated."""
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))  # (B, H, S, F)
    return torch.view_as_real(xc * freqs_cis).flatten(-2)
