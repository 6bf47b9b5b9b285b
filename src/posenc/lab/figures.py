"""``posenc figures``: explanatory pictures of the encodings, computed with posenc's own public functions.

1. ``sinusoidal.png``: the sinusoidal encoding (Vaswani et al. 2017) as a position x channel heatmap, and the dot
   products between positions, which depend on the distance only.
2. ``alibi.png``: ALiBi's bias matrices for 8 heads (Press et al. 2022): one slope per head, causal.
3. ``rope_decay.png``: RoPE's long-term decay (Su et al. 2021, RoFormer sec. 3.4.3): the relative upper bound
   ``(1 / (d/2)) sum_i |S_i|``, ``S_i = sum_{j<i} exp(1j * (m - n) * theta_j)``, and ``q . R(m - n) k`` for
   ``q = k = ones``.
4. ``rope_scalings.png``: the inverse frequencies of each RoPE context-extension scaling across the rotary
   dimensions, and their ratio to the unscaled ones (``posenc.rope_frequencies`` with Hugging Face scaling dicts).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import posenc
from posenc._checks import check_positive_int
from posenc.lab.common.plots import MARKERS, PALETTE, new_figure, save_png

#: RoPE settings of the scaling figure: a Llama-2-like head (128 channels, base 10000, 2048 tokens) stretched 8x.
ROPE_HEAD_DIM = 128
ROPE_BASE = 10000.0
ORIGINAL_CONTEXT = 2048
FACTOR = 8.0


def sinusoidal_figure(positions: int = 128, dim: int = 64) -> Any:
    """The sinusoidal table ``PE`` (positions x channels) and its Gram matrix ``PE PE^T / (dim / 2)``.

    Shapes:
        PE (positions, dim); Gram (positions, positions)
    """
    pe = posenc.functional.sinusoidal_encoding(torch.arange(positions), dim)  # (S, D)
    gram = pe @ pe.T / (dim / 2)  # (S, S): sum_i cos((p - q) w_i) / (D / 2)
    fig = new_figure(12.0, 5.0)
    left, right = fig.subplots(1, 2, width_ratios=(1.0, 1.15))
    image = left.imshow(pe.numpy(), aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    left.set_xlabel("channel (even: sin, odd: cos; frequency falls to the right)")
    left.set_ylabel("position p")
    left.set_title(f"Sinusoidal encoding, {positions} positions x {dim} channels\n"
                   r"$PE[p, 2i] = \sin(p\,/\,10000^{2i/d})$,  $PE[p, 2i+1] = \cos(p\,/\,10000^{2i/d})$",
                   fontsize=10)
    fig.colorbar(image, ax=left, shrink=0.85, label="value")
    image = right.imshow(gram.numpy(), cmap="viridis", interpolation="nearest")
    right.set_xlabel("position q")
    right.set_ylabel("position p")
    right.set_title("Dot products $PE[p] \\cdot PE[q]\\,/\\,(d/2)$: a function of $p - q$ only\n"
                    "(constant along diagonals, highest at p = q)", fontsize=10)
    fig.colorbar(image, ax=right, shrink=0.85, label="normalised dot product")
    return fig


def alibi_figure(num_heads: int = 8, positions: int = 32) -> Any:
    """ALiBi's causal bias ``-m_h (q - k)`` per head; future keys (masked) are left blank.

    Shapes:
        bias (1, H, S, S)
    """
    slopes = posenc.alibi_slopes(num_heads)  # (H,)
    pos = torch.arange(positions)
    bias = posenc.functional.alibi_bias(pos, pos, slopes)[0]  # (1, H, S, S) -> (H, S, S)
    bias = bias.masked_fill(pos[None, :] > pos[:, None], float("nan"))  # (H, S, S): causal mask
    cols = min(num_heads, 4)
    rows = math.ceil(num_heads / cols)
    fig = new_figure(3.1 * cols + 1.2, 3.2 * rows + 0.7)
    axes = fig.subplots(rows, cols, squeeze=False)
    low = float(torch.nan_to_num(bias, nan=0.0).min())
    cmap = _cmap("magma").with_extremes(bad="#eeeeee")
    image = None
    for h, ax in enumerate(axes.flat):
        if h >= num_heads:
            ax.set_axis_off()
            continue
        image = ax.imshow(bias[h].numpy(), cmap=cmap, vmin=low, vmax=0.0, interpolation="nearest")
        slope = float(slopes[h])
        exponent = -math.log2(slope)
        name = f"1/2^{exponent:g}" if exponent.is_integer() else f"{slope:.3g}"
        ax.set_title(f"head {h + 1}: m = {name}", fontsize=10)
        ax.set_xlabel("key position k", fontsize=9)
        if h % cols == 0:
            ax.set_ylabel("query position q", fontsize=9)
        ax.tick_params(labelsize=8)
    fig.colorbar(image, ax=axes, shrink=0.8, label="bias added to the score, $-m\\,(q - k)$")
    fig.suptitle(f"ALiBi: a linear distance penalty with one slope per head ({num_heads} heads, {positions} positions;"
                 " grey: masked future keys)\nSteep heads attend locally, shallow heads far back; nothing is learned, "
                 "so it runs at any length", fontsize=11)
    return fig


def rope_decay(distances: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RoFormer's relative upper bound and the ``q = k = ones`` score, both as functions of the distance.

    ``bound[n] = (1 / F) sum_{i=1..F} |sum_{j<i} exp(1j * n * theta_j)|`` (Su et al. 2021, eq. 37 and fig. 2) and
    ``ones[n] = q . R(n) k / |q|^2 = (1 / F) sum_j cos(n * theta_j)`` for ``q = k = ones``, with ``F`` frequencies.

    Shapes:
        distances (N,), inv_freq (F,) -> bound (N,), ones (N,), float64
    """
    angles = distances.double()[:, None] * inv_freq.double()[None, :]  # (N, F)
    partial = torch.polar(torch.ones_like(angles), angles).cumsum(-1)  # (N, F): S_1 .. S_F
    return partial.abs().mean(-1), angles.cos().mean(-1)  # (N,), (N,)


def rope_decay_figure(head_dim: int = ROPE_HEAD_DIM, max_distance: int = 1024) -> Any:
    """Long-term decay of RoPE scores with distance, for two bases."""
    distances = torch.arange(max_distance + 1)
    fig = new_figure(12.0, 4.6)
    left, right = fig.subplots(1, 2)
    every = max(1, max_distance // 16)  # a marker now and then: the two lines stay apart in grey print too
    for color, marker, base in zip(PALETTE[:2], MARKERS[:2], (10000.0, 500000.0), strict=True):
        inv_freq, _ = posenc.rope_frequencies(head_dim, base=base)  # (head_dim / 2,)
        bound, ones = rope_decay(distances, inv_freq)
        kw = {"color": color, "marker": marker, "markevery": every, "markersize": 5, "label": f"base {base:g}"}
        left.plot(distances.numpy(), bound.numpy(), linewidth=1.2, **kw)
        right.plot(distances.numpy(), ones.numpy(), linewidth=1.0, **kw)
    left.set_title(r"RoFormer's relative upper bound $\frac{1}{d/2}\sum_i |S_i|$, "
                   r"$S_i = \sum_{j<i} e^{\,\mathrm{i}(m-n)\theta_j}$", fontsize=10)
    left.set_ylabel("relative upper bound")
    right.set_title(r"score $q \cdot R(m - n)\, k\; /\; |q|^2$ for $q = k = (1, \dots, 1)$", fontsize=10)
    right.set_ylabel("normalised score")
    right.axhline(0.0, color="0.6", linewidth=0.8)
    for ax in (left, right):
        ax.set_xlabel("relative distance m - n (tokens)")
        ax.set_xlim(0, max_distance)
        ax.grid(True, color="0.9")
        ax.legend(frameon=False)
    fig.suptitle(f"RoPE's long-term decay (head dim {head_dim}): scores between similar vectors shrink, with "
                 "oscillations, as tokens get further apart;\na larger base decays more slowly",
                 fontsize=11)
    return fig


def scaling_configs(factor: float = FACTOR, original: int = ORIGINAL_CONTEXT) -> dict[str, dict | None]:
    """The Hugging Face ``rope_scaling`` dicts drawn in the scaling figure, by label (None: unscaled)."""
    return {
        "default (no scaling)": None,
        f"linear / PI (factor {factor:g})": {"rope_type": "linear", "factor": factor},
        f"NTK-aware (factor {factor:g})": {"rope_type": "ntk", "factor": factor},
        f"YaRN (factor {factor:g})": {"rope_type": "yarn", "factor": factor,
                                      "original_max_position_embeddings": original},
        f"Llama 3.1 (factor {factor:g}, low 1, high 4)": {"rope_type": "llama3", "factor": factor,
                                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                          "original_max_position_embeddings": original},
    }


def rope_scalings_figure(head_dim: int = ROPE_HEAD_DIM, base: float = ROPE_BASE) -> Any:
    """Inverse frequencies of each scaling across the rotary dimensions (log y), and their ratio to the default."""
    fig = new_figure(12.5, 5.0)
    left, right = fig.subplots(1, 2)
    default, _ = posenc.rope_frequencies(head_dim, base=base)  # (F,)
    index = torch.arange(default.numel()).numpy()
    styles = ("-", "--", "-.", (0, (5, 1.5)), ":")
    for i, (label, scaling) in enumerate(scaling_configs().items()):
        inv_freq, attention_factor = posenc.rope_frequencies(head_dim, base=base, scaling=scaling)  # (F,)
        if attention_factor != 1.0:
            label += f", attention x{attention_factor:.3f}"
        kw = {"color": PALETTE[i], "linestyle": styles[i], "marker": MARKERS[i], "markevery": (i, 6), "markersize": 5,
              "linewidth": 2.2 if i == 0 else 1.7, "label": label}
        left.plot(index, inv_freq.numpy(), **kw)
        right.plot(index, (inv_freq / default).numpy(), **kw)
    for ax in (left, right):
        ax.set_yscale("log")
        ax.set_xlabel(f"frequency index i (rotary pair), 0 .. {default.numel() - 1}")
        ax.set_xlim(0, default.numel() - 1)
        ax.grid(True, which="major", color="0.9")
    cutoff = 2 * math.pi / ORIGINAL_CONTEXT
    left.axhline(cutoff, color="0.4", linestyle=":", linewidth=1.2)
    left.text(1, cutoff * 1.4, f"one full turn in the original {ORIGINAL_CONTEXT} tokens", fontsize=8.5, color="0.3")
    left.set_ylabel(r"inverse frequency $\theta_i$ (radians per token)")
    wavelength = left.secondary_yaxis("right", functions=(_turn, _turn))
    wavelength.set_ylabel("wavelength $2\\pi / \\theta_i$ (tokens)")
    left.set_title(f"RoPE frequencies, head dim {head_dim}, base {base:g}, original context {ORIGINAL_CONTEXT}",
                   fontsize=10)
    left.legend(fontsize=8.5, frameon=False, loc="lower left")
    right.set_ylabel(r"$\theta_i$ scaled / $\theta_i$ default")
    right.set_ylim(1 / FACTOR / 1.4, 1.4)
    right.set_yticks([1 / FACTOR, 1 / 4, 1 / 2, 1], [f"1/{FACTOR:g}", "1/4", "1/2", "1"])
    right.minorticks_off()
    right.set_title("What each scaling does: high frequencies (left) kept or not,\n"
                    f"low frequencies (right) slowed by the factor {FACTOR:g}", fontsize=10)
    fig.suptitle(f"Context extension by {FACTOR:g}x: each scaling as a transform of the inverse frequencies",
                 fontsize=11)
    return fig


def _turn(x: Any) -> Any:
    """``2 pi / x``, its own inverse: inverse frequency <-> wavelength for the secondary axis."""
    import numpy as np

    with np.errstate(divide="ignore"):
        return 2 * np.pi / np.asarray(x, dtype=float)


def _cmap(name: str) -> Any:
    import matplotlib

    return matplotlib.colormaps[name]


FIGURES: dict[str, Callable[[], Any]] = {
    "sinusoidal.png": sinusoidal_figure,
    "alibi.png": alibi_figure,
    "rope_decay.png": rope_decay_figure,
    "rope_scalings.png": rope_scalings_figure,
}


def draw_figures(out_dir: str | Path, *, dpi: int = 150) -> list[Path]:
    """Draw every figure of ``FIGURES`` into ``out_dir`` (created if needed), atomically; returns their paths."""
    check_positive_int("dpi", dpi)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [save_png(make(), out_dir / name, dpi=dpi) for name, make in FIGURES.items()]
