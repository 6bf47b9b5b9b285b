"""llama.cpp's RoPE angles and cos/sin scale for a GGUF, written out from its source as loops in float64.

Source: ggml-org/llama.cpp at commit 0c1e57098bba43ac29e6e3b677cdceebdd22334f (2026-10-01), the tree
llama-cpp-python 0.3.36 vendors (its sdist's ``vendor/llama.cpp``; CHANGELOG: "update llama.cpp to
ggml-org/llama.cpp@0c1e57098"). ``llamacpp_angles`` is the
Llama file's computation; ``ggml_rope_angles`` the kernel for any arguments, ``context_attn_factor`` the context's
``attn_factor`` and ``llamacpp_layers`` what each layer's graph passes to the kernel, for the architectures the
tests build files of (each branch below follows ``src/models/<arch>.cpp``).

From the file's metadata (``llama_model::load_hparams``, llama.cpp ``src/llama-model.cpp``):

    n_ctx_orig  = rope.scaling.original_context_length, default context_length (0: context_length in the
                  context, llama-context.cpp; LongRoPE's long/short choice compares with the key itself)
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
import struct


def llamacpp_angles(meta: dict, tensors: dict, positions: list[int], *, n_ctx: int) -> tuple[list[list[float]], float]:
    """``(angles[p][i], mscale)`` llama.cpp rotates pair ``i`` at position ``p`` by, and its cos/sin scale.

    ``meta``: the file's ``llama.*`` keys; ``tensors``: ``{"rope_freqs.weight": [...], ...}``; ``n_ctx``: the
    context llama.cpp runs with.
    """
    n_dims = meta["llama.rope.dimension_count"]
    context = meta["llama.context_length"]
    n_ctx_orig_key = meta.get("llama.rope.scaling.original_context_length", context)
    n_ctx_orig = n_ctx_orig_key or context
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
        factors = tensors["rope_factors_long.weight" if n_ctx > n_ctx_orig_key else "rope_factors_short.weight"]

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


def ggml_rope_angles(
    positions: list[int], *, n_dims: int, freq_base: float, freq_scale: float, n_ctx_orig: int,
    freq_factors: list[float] | None = None, ext_factor: float = 0.0, attn_factor: float = 1.0,
    beta_fast: float = 32.0, beta_slow: float = 1.0,
) -> tuple[list[list[float]], float]:
    """``ggml_rope_ext`` for one call (``ggml_rope_cache_init`` / ``rope_yarn``, ``ops.cpp``; the correction dims of
    ``ggml_rope_yarn_corr_dims``, ``ggml.c``): ``(angles[p][i], mscale)``."""

    def corr_dim(rotations: float) -> float:
        return n_dims * math.log(n_ctx_orig / (rotations * 2 * math.pi)) / (2 * math.log(freq_base))

    low = max(0.0, math.floor(corr_dim(beta_fast)))
    high = min(n_dims - 1.0, math.ceil(corr_dim(beta_slow)))
    theta_scale = freq_base ** (-2.0 / n_dims)
    angles, mscale = [], attn_factor
    for p in positions:
        theta, row = float(p), []
        for i0 in range(0, n_dims, 2):
            ff = 1.0 if freq_factors is None else freq_factors[i0 // 2]
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


def context_attn_factor(
    freq_scale: float, ext_factor: float, *, rope_attn_factor: float = 1.0, yarn_attn_factor: float = 1.0,
    yarn_log_mul: float = 0.0,
) -> float:
    """``llama_context``'s ``cparams.yarn_attn_factor`` (``src/llama-context.cpp``; ``mscale`` taken as 1, as there
    for every architecture but DeepSeek-V2)."""

    def get_mscale(scale: float, mscale: float) -> float:
        return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0

    attn = yarn_attn_factor
    if ext_factor != 0:
        factor = 1.0 / freq_scale
        if yarn_log_mul != 0.0:
            attn = get_mscale(factor, 1.0) / get_mscale(factor, yarn_log_mul)
        else:
            attn = get_mscale(factor, 1.0)
        attn *= 1.0 / (1.0 + 0.1 * math.log(factor))
    return attn * rope_attn_factor


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def llamacpp_layers(meta: dict, tensors: dict, *, n_ctx: int | None = None) -> list[tuple[list | None, float, int]]:
    """Per layer ``(angles at position 1, mscale, n_rot)`` llama.cpp runs (``None`` angles: the layer is not rotated),
    for a file of architecture ``llama``, ``qwen2``, ``gemma2``, ``gemma3``, ``cohere2``, ``olmo2``, ``smollm3``,
    ``llama4``, ``gpt-oss``, ``mistral3``, ``grok`` or ``phi3`` with the context ``n_ctx`` (default
    ``context_length``)."""
    arch = meta["general.architecture"]

    def kv(name, default=None):
        return meta.get(f"{arch}.{name}", default)

    # llama_model_base::load_hparams
    n_ctx_train = kv("context_length")
    n_layer = kv("block_count")
    n_ctx_orig_key = kv("rope.scaling.original_context_length", n_ctx_train)  # hparams.n_ctx_orig_yarn
    n_ctx_orig_yarn = n_ctx_orig_key or n_ctx_train  # cparams.n_ctx_orig_yarn (llama_context: 0 -> n_ctx_train)
    freq_base_train = kv("rope.freq_base", 10000.0)
    scaling = kv("rope.scaling.type", "linear")
    ropescale = kv("rope.scaling.factor", kv("rope.scale_linear", 0.0))
    freq_scale_train = 1.0 if ropescale == 0.0 else _f32(1.0 / ropescale)
    rope_attn_factor = kv("rope.scaling.attn_factor", 1.0)
    n_head = kv("attention.head_count")
    n_embd_head = kv("attention.key_length", kv("embedding_length") // n_head)
    n_rot_full = kv("rope.dimension_count", n_embd_head)
    n_rot_swa = kv("rope.dimension_count_swa", n_rot_full)
    yarn_ext, yarn_attn, beta_fast, beta_slow, log_mul = -1.0, 1.0, 32.0, 1.0, 0.0
    freq_base_swa, freq_scale_swa = 10000.0, 1.0
    is_swa = [False] * n_layer

    def pattern(n, dense_first=False):
        value = kv("attention.sliding_window_pattern")
        if isinstance(value, (tuple, list)):  # load_hparams zero-fills is_swa_impl first: missing layers are full
            return [bool(v) for v in value][:n_layer] + [False] * (n_layer - len(value))
        n = n if value is None else value
        if dense_first:
            return [n == 0 or il % n != 0 for il in range(n_layer)]
        return [n == 0 or il % n < n - 1 for il in range(n_layer)]

    # load_arch_hparams
    if arch in ("gemma2", "gpt-oss", "cohere2"):
        is_swa = pattern({"gemma2": 2, "gpt-oss": 2, "cohere2": 4}[arch])
        freq_base_swa, freq_scale_swa = freq_base_train, freq_scale_train
        freq_base_swa = kv("rope.freq_base_swa", freq_base_swa)
    elif arch == "gemma3":
        if kv("attention.sliding_window", 0) > 0:
            is_swa = pattern(6)
            freq_base_swa = kv("rope.freq_base_swa", freq_base_swa)
    elif arch == "olmo2":
        if kv("attention.sliding_window", 0) > 0:
            is_swa = pattern(4)
    elif arch == "llama4":
        no_rope_step = 4
        if kv("attention.sliding_window") == 0:
            no_rope_step = n_layer
        else:
            is_swa = pattern(4)
            freq_base_swa, freq_scale_swa = freq_base_train, freq_scale_train
            freq_base_swa = kv("rope.freq_base_swa", freq_base_swa)
    elif arch == "mistral3":
        beta_fast = kv("rope.scaling.yarn_beta_fast", beta_fast)
        beta_slow = kv("rope.scaling.yarn_beta_slow", beta_slow)
        log_mul = kv("rope.scaling.yarn_log_multiplier", log_mul)
    elif arch == "grok":
        beta_fast = 8.0
        yarn_ext = kv("rope.scaling.yarn_ext_factor", yarn_ext)
        yarn_attn = kv("rope.scaling.yarn_attn_factor", yarn_attn)
        beta_fast = kv("rope.scaling.yarn_beta_fast", beta_fast)
        beta_slow = kv("rope.scaling.yarn_beta_slow", beta_slow)

    # llama_context
    n_ctx = n_ctx_train if n_ctx is None else n_ctx
    n_ctx_seq = -(-n_ctx // 256) * 256
    freq_scale = 1.0 if scaling == "none" else freq_scale_train
    ext_factor = yarn_ext if yarn_ext >= 0 else (1.0 if scaling == "yarn" else 0.0)
    attn_factor = context_attn_factor(freq_scale, ext_factor, rope_attn_factor=rope_attn_factor,
                                      yarn_attn_factor=yarn_attn, yarn_log_mul=log_mul)

    # get_rope_factors, for the architectures whose graph passes it (and creates the tensors)
    factors = None
    if arch in ("llama", "mistral3", "llama4", "phi3"):
        if "rope_freqs.weight" in tensors:
            factors = tensors["rope_freqs.weight"]
        elif n_ctx_seq > n_ctx_orig_key:  # get_rope_factors: hparams.n_ctx_orig_yarn
            factors = tensors.get("rope_factors_long.weight")
        else:
            factors = tensors.get("rope_factors_short.weight")

    # each graph's call of ggml_rope_ext (n_rot: hparams.n_rot(), layer 0's, for these graphs)
    n_rot = n_rot_swa if is_swa[0] else n_rot_full
    layers = []
    for il in range(n_layer):
        base, scale, ext, attn = freq_base_train, freq_scale, ext_factor, attn_factor
        rotate = True
        if arch in ("gemma2", "gemma3", "gpt-oss", "llama4") and is_swa[il]:  # get_rope_freq_base / _scale
            base, scale = freq_base_swa, freq_scale_swa
        if arch == "cohere2":
            rotate = is_swa[il]
        if arch == "olmo2" and is_swa[il]:
            scale, ext, attn = 1.0, 0.0, 1.0
        if arch == "smollm3":
            rotate = (il + 1) % 4 != 0
        if arch == "llama4":
            rotate = no_rope_step > 0 and (il + 1) % no_rope_step != 0
        if not rotate:
            layers.append((None, 1.0, 0))
            continue
        angles, mscale = ggml_rope_angles(
            [1], n_dims=n_rot, freq_base=base, freq_scale=scale, n_ctx_orig=n_ctx_orig_yarn, freq_factors=factors,
            ext_factor=ext, attn_factor=attn, beta_fast=beta_fast, beta_slow=beta_slow,
        )
        layers.append((angles[0], mscale, n_rot))
    return layers
