"""llama.cpp's RoPE angles and cos/sin scale for a Llama GGUF, written out from its source as loops in float64.

From the file's metadata (``llama_model::load_hparams``, llama.cpp ``src/llama-model.cpp``):

    n_ctx_orig  = rope.scaling.original_context_length, default context_length
    base        = rope.freq_base, default 10000
    type        = rope.scaling.type, default "linear"
    freq_scale  = 1 / rope.scaling.factor (factor 0 or absent: 1); type "none": 1      (llama-context.cpp)
    ext_factor  = 1 for type yarn, else 0
    attn_factor = 1; with ext_factor != 0: get_mscale(1 / freq_scale) / (1 + 0.1 ln(1 / freq_scale)),
                  get_mscale(s) = 1 if s <= 1 else 0.1 ln(s) + 1;  then *= rope.scaling.attn_factor (default 1)

and per position ``p`` (``ggml_rope_cache_init`` and ``rope_yarn``, ``ggml/src/ggml-cpu/ops.cpp``;
``ggml_rope_yarn_corr_dims``, ``ggml/src/ggml.c``):

    theta_scale = base ** (-2 / n_dims); theta = p
    for i0 in 0, 2, ..., n_dims - 2:
        ff = freq_factors[i0 / 2] (rope_freqs; LongRoPE: long if n_ctx > n_ctx_orig else short) or 1
        theta_extrap = theta / ff; theta_interp = freq_scale * theta_extrap
        if ext_factor != 0:
            corr_dim(r) = n_dims * ln(n_ctx_orig / (r * 2 pi)) / (2 ln base)
            low = max(0, floor(corr_dim(32))); high = min(n_dims - 1, ceil(corr_dim(1)))
            ramp_mix = (1 - min(1, max(0, (i0 / 2 - low) / max(0.001, high - low)))) * ext_factor
            angle = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix
            mscale = attn_factor * (1 + 0.1 ln(1 / freq_scale))
        else:
            angle = theta_interp; mscale = attn_factor
        theta *= theta_scale
"""

from __future__ import annotations

import math


def llamacpp_angles(meta: dict, tensors: dict, positions: list[int], *, n_ctx: int) -> tuple[list[list[float]], float]:
    """``(angles[p][i], mscale)`` llama.cpp rotates pair ``i`` at position ``p`` by, and its cos/sin scale.

    ``meta``: the file's ``llama.*`` keys; ``tensors``: ``{"rope_freqs.weight": [...], ...}``; ``n_ctx``: the
    context llama.cpp runs with.
    """
    n_dims = meta["llama.rope.dimension_count"]
    context = meta["llama.context_length"]
    n_ctx_orig = meta.get("llama.rope.scaling.original_context_length", context)
    base = meta.get("llama.rope.freq_base", 10000.0)
    kind = meta.get("llama.rope.scaling.type", "linear")
    factor = meta.get("llama.rope.scaling.factor", 0.0)
    freq_scale = 1.0 if factor == 0.0 else 1.0 / factor
    if kind == "none":
        freq_scale = 1.0
    ext_factor = 1.0 if kind == "yarn" else 0.0
    attn_factor = 1.0
    if ext_factor != 0:
        s = 1.0 / freq_scale
        attn_factor = (1.0 if s <= 1 else 0.1 * math.log(s) + 1.0) / (1.0 + 0.1 * math.log(s))
    attn_factor *= meta.get("llama.rope.scaling.attn_factor", 1.0)
    factors = tensors.get("rope_freqs.weight")
    if factors is None and kind == "longrope":
        factors = tensors["rope_factors_long.weight" if n_ctx > n_ctx_orig else "rope_factors_short.weight"]

    def corr_dim(rotations: float) -> float:
        return n_dims * math.log(n_ctx_orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(0.0, math.floor(corr_dim(32.0)))
    high = min(n_dims - 1.0, math.ceil(corr_dim(1.0)))
    theta_scale = base ** (-2.0 / n_dims)
    angles, mscale = [], attn_factor
    for p in positions:
        theta, row = float(p), []
        for i0 in range(0, n_dims, 2):
            ff = 1.0 if factors is None else factors[i0 // 2]
            theta_extrap = theta / ff
            theta_interp = freq_scale * theta_extrap
            if ext_factor != 0:
                ramp_mix = (1 - min(1.0, max(0.0, (i0 // 2 - low) / max(0.001, high - low)))) * ext_factor
                row.append(theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix)
                mscale = attn_factor * (1.0 + 0.1 * math.log(1.0 / freq_scale))
            else:
                row.append(theta_interp)
            theta *= theta_scale
        angles.append(row)
    return angles, mscale
