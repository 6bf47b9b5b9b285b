"""What SGLang runs for a model: its RoPE per layer, read the way SGLang reads a transformers folder, a
``config.json`` or a GGUF file.

Follows ``sgl-project/sglang`` (``FOLLOWS`` names the file and commit of each piece): the rotary factory
``python/sglang/srt/layers/rotary_embedding/factory.py`` at 108c36c008291c3a1ea524342837056c503c5724 (``get_rope``,
``_get_rope_param``) with its classes (``base.py``, ``yarn.py``, ``rope_variant.py`` at
0b1fd02d56f010c589968aa6e05534e10c2d4bf3), the config path ``python/sglang/srt/utils/hf_transformers/common.py`` at
d7287464193f2efe5b2e72385f883534e2ba04f5 (``get_rope_config``, ``get_context_length``) and ``config.py`` at
9b6f8f1ffe0fc2fcc09865108fb39e61804600be (``get_config``: transformers' ``AutoConfig``, GGUF through
``gguf_file``), and ``python/sglang/srt/models/qwen3.py`` at 01b5f572b7b678e2fa5a727881f1ff3ab4dd3c6d. SGLang >=
0.5.10 runs with transformers 5 (pinned 5.8.1 since sglang #25451); posenc parses the config with the installed
transformers. SGLang's rotary modules import its kernels and platform code, so this module is written from that code;
``tests/reference/sglang_rope.py`` holds the formulas copied from it and the tests hold this reader to them. How it
differs from vLLM (``posenc.runtimes.vllm``) is said where it is read: ``get_rope_config``, ``sglang_get_rope``,
``sglang_context_length``, ``_sglang_layers`` (Dual Chunk Attention, and what is not verified).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc.runtimes import LayerRope, RuntimeView, Source, register
from posenc.runtimes import vllm as _v

#: The SGLang release this reader follows: the files of its wheel on the package index (``FOLLOWS``).
SGLANG_VERSION = "0.5.23"
#: How ``posenc check`` names it in every row.
RELEASE = f"SGLang {SGLANG_VERSION}"

#: The code this reader follows (``RuntimeView.follows``).
FOLLOWS = (
    f"sglang {SGLANG_VERSION} (wheel on PyPI): python/sglang/srt/layers/rotary_embedding/factory.py (get_rope, "
    "_get_rope_param), base.py, yarn.py, rope_variant.py; sglang/srt/utils/hf_transformers/common.py "
    "(get_rope_config), config.py (get_config: transformers' AutoConfig, GGUF through gguf_file or a config.json "
    "beside the file), gguf_native.py; sglang/srt/configs/model_config.py (get_context_length); "
    "sglang/srt/models/llama.py, qwen2.py, qwen3.py, gemma3_causal.py; sglang/srt/model_loader/loader.py "
    "(GGUFModelLoader) and weight_utils.py (gguf_quant_weights_iterator)"
)

#: ``DeepseekScalingRotaryEmbedding``'s keyword arguments ``get_rope`` passes on, with its defaults.
_DEEPSEEK_DEFAULTS = {**_v.YARN_DEFAULTS, "mscale": 1.0, "mscale_all_dim": 0.0}

#: The keys SGLang's ``get_rope`` reads for each rope type.
_READS = {
    "default": {
        "mrope_section",
        "mrope_interleaved",
        "mrope_interleaved_glm",
        "video_rope",
        "use_fope",
        "num_kv_heads",
        "fope_init_factor",
        "fope_sep_head",
        "num_inv_freq",
    },
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "linear": {"factor"},
    "dynamic": {"alpha", "factor"},
    "yarn": {
        "factor",
        "original_max_position_embeddings",
        "extrapolation_factor",
        "attn_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
        "mrope_section",
        "mrope_interleaved",
        "video_rope",
    },
    "deepseek_yarn": {
        "factor",
        "original_max_position_embeddings",
        "extrapolation_factor",
        "attn_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
    },
    "longrope": {"short_factor", "long_factor", "original_max_position_embeddings", "short_mscale", "long_mscale"},
    "proportional": set(),
}


def sglang_get_rope(
    head_size: int,
    rotary_dim: int,
    max_position: int,
    base: float,
    rope_scaling: Mapping[str, Any] | None,
    *,
    is_neox_style: bool = True,
    partial_rotary_factor: float = 1.0,
    dual_chunk: Mapping[str, Any] | None = None,
    where: str = "rope_parameters",
) -> _v.Built:
    """What SGLang's ``get_rope(head_size, rotary_dim, max_position, base, is_neox_style, rope_scaling, dtype,
    partial_rotary_factor, dual_chunk_attention_config)`` builds, in float64.

    Where it differs from vLLM's (``posenc.runtimes.vllm.vllm_get_rope``): missing keys default
    (``_get_rope_param``, with a warning) instead of raising: ``factor`` 1, ``original_max_position_embeddings``
    ``max_position``, llama3's ``low_freq_factor`` 1 and ``high_freq_factor`` 4. ``dynamic`` with ``factor`` is
    static NTK at the constant base ``base * (factor**2 - factor + 1) ** (d / (d - 2))`` (the formula vLLM fixed in
    PR #41277), over ``factor * max_position_embeddings`` positions. ``yarn`` reads ``mscale`` and
    ``mscale_all_dim`` (the DeepSeek ratio when both are given, else ``0.1 ln s + 1``), times ``attn_factor``;
    ``truncate``; not ``attention_factor``. ``longrope`` switches a whole batch to the long factors once any
    position exceeds ``original_max_position_embeddings`` (length dependent, like transformers, but on position > L,
    not length > L). ``ntk``, ``telechat3-yarn`` and other types vLLM knows are unknown here: ``ValueError``.

    Raises:
        _Refused: where ``get_rope`` raises (no rope type, unknown rope type, missing factor lists).
    """
    if partial_rotary_factor < 1.0:
        rotary_dim = int(rotary_dim * partial_rotary_factor)
    dim, base = rotary_dim, float(base)
    layout = _v._layout(is_neox_style)
    notes: list[str] = []
    params: dict[str, Any] = {"rope_theta": base, "max_position": max_position}
    if dual_chunk is not None:
        for key in ("chunk_size", "local_size"):
            if key not in dual_chunk:
                raise _v._Refused(f"DualChunkRotaryEmbedding needs dual_chunk_attention_config[{key!r}] (TypeError)")
        params.update(
            rope_type="dual_chunk",
            chunk_size=int(dual_chunk["chunk_size"]),
            local_size=int(dual_chunk["local_size"]),
            original_max_position_embeddings=dual_chunk.get("original_max_position_embeddings", 0),
            logit_mscale=0.1,
            posenc_method="dca_vllm",
        )
        ignored = []
        kind = (rope_scaling or {}).get("rope_type") or (rope_scaling or {}).get("type")
        if kind not in (None, "default"):
            ignored.append(f"{where} (rope_type {kind!r}): the dual-chunk branch of get_rope comes first")
        notes.append("not verified: SGLang's dual-chunk attention backend (read: its rotary tables, as vLLM's)")
        layer = LayerRope(_v.inv_freq(dim, base), 1.0, dim, layout, "dual_chunk", params, length_dependent=True)
        return _v.Built(layer, None, ignored, notes)
    if rope_scaling is None:
        params["rope_type"] = "default"
        return _v.Built(LayerRope(_v.inv_freq(dim, base), 1.0, dim, layout, "default", params), None, [], notes)
    rp = dict(rope_scaling)
    rope_type = rp.get("rope_type", rp.get("type"))
    if rope_type is None:
        raise _v._Refused(f"SGLang's get_rope raises ValueError: Unknown RoPE scaling type ({where} has no rope_type)")
    reads = _READS.get(rope_type)
    if reads is None:
        raise _v._Refused(f"SGLang's get_rope raises ValueError: Unknown RoPE scaling type {rope_type!r} ({where})")
    params["rope_type"] = rope_type
    ignored = _v.unread(rp, reads, where, rope_type)

    def get(key: str, default: Any) -> Any:  # _get_rope_param: a missing key is defaulted, with a warning
        if key not in rp:
            notes.append(f"{where} (rope_type {rope_type!r}) lacks {key!r}: SGLang defaults it to {default}")
        return rp.get(key, default)

    factor_af, length_dependent = 1.0, False
    if rope_type == "default":
        if any(k in rp for k in ("mrope_section", "use_fope")):
            notes.append("not verified: M-RoPE / Fourier RoPE (read here as plain RoPE for text positions)")
        freqs = _v.inv_freq(dim, base)
    elif rope_type == "llama3":
        f, lo = get("factor", 1.0), get("low_freq_factor", 1.0)
        hi, orig = get("high_freq_factor", 4.0), get("original_max_position_embeddings", max_position)
        params.update(factor=f, low_freq_factor=lo, high_freq_factor=hi, original_max_position_embeddings=orig)
        freqs = _v.llama3_inv_freq(dim, base, f, lo, hi, orig)
    elif rope_type == "linear":
        f = get("factor", 1.0)
        params["factor"] = f
        freqs = _v.inv_freq(dim, base) / f
    elif rope_type == "dynamic":
        f = get("factor", 1.0)
        if "alpha" in rp:
            params.update(alpha=rp["alpha"], base_used=_v.ntk_base(base, dim, rp["alpha"]))
        else:
            params.update(factor=f, base_used=_v.ntk_base(base, dim, f * f - (f - 1)))
            notes.append(
                f"dynamic NTK served static: SGLang's DynamicNTKScalingRotaryEmbedding uses one base, "
                f"base * (factor**2 - factor + 1) ** (d / (d - 2)) = base * {f * f - (f - 1):g}^(d/(d-2)), for every "
                "length (rope_variant.py; the formula vLLM replaced in PR #41277)"
            )
        freqs = _v.inv_freq(dim, params["base_used"])
    elif rope_type == "yarn":
        f, orig = get("factor", 1.0), get("original_max_position_embeddings", max_position)
        kw = {k: rp.get(k, d) for k, d in {**_v.YARN_DEFAULTS, "truncate": True}.items()}
        mscale, mscale_all_dim = rp.get("mscale"), rp.get("mscale_all_dim")
        params.update(
            factor=f, original_max_position_embeddings=orig, mscale=mscale, mscale_all_dim=mscale_all_dim, **kw
        )
        freqs = _v.yarn_kw_inv_freq(dim, base, f, orig, kw)
        if mscale is not None and mscale_all_dim is not None:
            factor_af = _v.yarn_mscale(f, mscale) / _v.yarn_mscale(f, mscale_all_dim)
        else:
            factor_af = _v.yarn_mscale(f)
        factor_af *= kw["attn_factor"]
        if "mrope_section" in rp:
            notes.append("not verified: YaRN with M-RoPE (YaRNScalingMRotaryEmbedding)")
    elif rope_type == "deepseek_yarn":
        f, orig = get("factor", 1.0), get("original_max_position_embeddings", max_position)
        kw = {k: rp.get(k, d) for k, d in _DEEPSEEK_DEFAULTS.items()}
        params.update(factor=f, original_max_position_embeddings=orig, **kw)
        freqs = _v.yarn_kw_inv_freq(dim, base, f, orig, kw)
        factor_af = _v.yarn_mscale(f, kw["mscale"]) / _v.yarn_mscale(f, kw["mscale_all_dim"]) * kw["attn_factor"]
    elif rope_type == "longrope":
        for key in ("short_factor", "long_factor"):
            if key not in rp:
                raise _v._Refused(f"SGLang's get_rope raises KeyError {key!r}: {where} of rope_type 'longrope'")
        short, long, orig = rp["short_factor"], rp["long_factor"], get("original_max_position_embeddings", max_position)
        if not is_neox_style:
            raise _v._Refused("Phi3LongRoPEScaledRotaryEmbedding only supports neox_style")
        if len(short) != dim // 2 or len(long) != dim // 2:
            raise _v._Refused(f"longrope factors of lengths {len(short)}, {len(long)} for {dim // 2} rotary pairs")
        m = _v.longrope_mscale(max_position, orig)
        params.update(original_max_position_embeddings=orig, short_factor=list(short), long_factor=list(long))
        params.update(short_mscale=rp.get("short_mscale", m), long_mscale=rp.get("long_mscale", m))
        freqs, factor_af, length_dependent = _v.longrope_inv_freq(dim, base, short), params["short_mscale"], True
        notes.append(
            f"LongRoPE: SGLang switches a whole batch to the long factors (times long_mscale "
            f"{params['long_mscale']:.6g}) once any position exceeds {orig} (position > L, where transformers "
            "switches on length > L); the inv_freq here is the short one"
        )
    elif rope_type == "proportional":
        freqs = _v.proportional_inv_freq(head_size, dim, base)
        params["rotating_pairs"] = dim // 2
        dim = head_size
    else:  # a type listed in _READS without a branch
        raise AssertionError(rope_type)
    layer = LayerRope(freqs, float(factor_af), dim, layout, rope_type, params, length_dependent)
    return _v.Built(layer, None, ignored, notes)


def get_rope_config(config: Any, raw: Mapping[str, Any]) -> tuple[float, dict | None]:
    """SGLang's ``get_rope_config``: ``(rope_parameters.get("rope_theta", config.rope_theta or 10000),
    rope_parameters)`` with transformers 5, else ``(config.rope_theta or 10000, config.rope_scaling)``.

    With transformers 5 the whole ``rope_parameters`` dict is the ``rope_scaling`` passed to ``get_rope`` (a dict
    nested by layer type has no ``rope_theta``: ``KeyError`` in SGLang). SGLang has no ``patch_rope_parameters``:
    ``rotary_emb_base`` and ``rotary_pct`` are not renamed.
    """
    rp = _v.rope_parameters(config)
    if rp is not None:
        return float(rp.get("rope_theta", _v.attr(config, raw, "rope_theta") or 10000)), rp
    return float(_v.attr(config, raw, "rope_theta") or 10000), _v.attr(config, raw, "rope_scaling")


#: Model types whose SGLang model file builds RoPE its own way and was not read at a transformers-5 version.
_UNREAD = (
    "gemma4",
    "gemma4_text",
    "llama4",
    "llama4_text",
    "gpt_oss",
    "gemma3n",
    "gemma3n_text",
)
_DEEPSEEK = ("deepseek_v2", "deepseek_v3", "kimi_k2")


def _sglang_layers(parsed: _v.ParsedConfig) -> tuple[list[_v.Built], list[str], list[str]]:
    """Per layer, what SGLang's model file builds; plus notes and ignored config keys.

    Dual Chunk Attention: ``qwen3.py`` (01b5f572) passes no ``dual_chunk_attention_config`` to ``get_rope``, so a
    Qwen3 model runs plain RoPE; Qwen2 / Qwen2-MoE pass it (seen in an unpinned excerpt of ``qwen2_moe.py``: not
    verified at a commit). Not verified (said in the views' notes): SGLang's model files other than ``qwen3.py`` at a
    transformers-5 version (the stored ``llama.py`` and ``qwen2.py`` predate it: ``llama.py``
    reads ``config.rope_theta``, which a transformers-5 ``LlamaConfig`` no longer has, the default-θ fallback of
    sglang #14745); generic models are read with ``get_rope_config`` as ``qwen3.py`` does; Gemma 4 / Llama 4 /
    gpt-oss layers are not read (no view layers); Gemma 3 is read from the wheel's ``gemma3_causal.py``
    (``_gemma3_layers``); ``hf_transformers/gguf_native.py`` (not read).
    """
    text = parsed.text
    raw = dict(parsed.raw.get("text_config") or parsed.raw)
    model_type = text.model_type
    notes: list[str] = []
    ignored: list[str] = []
    n = int(text.num_hidden_layers)
    mpe = int(_v.attr(text, raw, "max_position_embeddings", 32768))
    if model_type in ("gemma3", "gemma3_text"):
        return _gemma3_layers(text)
    if model_type in _UNREAD:
        raise _v._Refused(
            f"not verified: SGLang's model file for {model_type} builds its RoPE its own way and was not read "
            f"(SGLang {SGLANG_VERSION})"
        )
    theta, rp = get_rope_config(text, raw)
    dca = _v.attr(text, raw, "dual_chunk_attention_config")
    if model_type in _DEEPSEEK:
        rp = dict(rp or {})
        if rp and rp.get("rope_type", "default") != "default":
            rp["rope_type"] = "deepseek_yarn"
        head = text.qk_rope_head_dim
        built = sglang_get_rope(head, head, mpe, theta, rp, is_neox_style=False)
        notes.append(
            f"not verified: SGLang's {model_type} model file at a pinned commit (read as its DeepSeek-V4 code and "
            "vLLM's deepseek_v2.py do: non-default rope types as deepseek_yarn, GPT-J style)"
        )
        return [built] * n, notes, ignored
    head = _v.attr(text, raw, "head_dim") or text.hidden_size // text.num_attention_heads
    neox = True
    if model_type == "llama":  # llama.py (SGLANG_VERSION): LlamaDecoderLayer / LlamaAttention
        mpe = int(_v.attr(text, raw, "max_position_embeddings", 8192))
        rp = _v.rope_parameters(text)
        if rp is not None:
            theta = float(rp.get("rope_theta", 10000))
        top = _v.attr(text, raw, "original_max_position_embeddings")
        if rp is not None and top and rp.get("original_max_position_embeddings") != top:
            was = rp.get("original_max_position_embeddings")
            notes.append(f"llama.py sets rope_parameters['original_max_position_embeddings'] to the config's top-level "
                         f"original_max_position_embeddings={top} (was {was})")
            rp = {**rp, "original_max_position_embeddings": top}
        partial = _v.attr(text, raw, "partial_rotary_factor", 1) or 1
        neox = bool(_v.attr(text, raw, "rope_is_neox_style", True))
        dual = None
        if dca is not None:
            ignored.append("dual_chunk_attention_config (llama.py does not pass it to get_rope)")
    elif model_type in ("qwen2", "qwen3"):  # qwen2.py / qwen3.py (SGLANG_VERSION): the whole head rotates
        partial = 1.0
        if rp and rp.get("partial_rotary_factor", 1.0) != 1.0:
            ignored.append(
                f"rope_parameters['partial_rotary_factor']={rp['partial_rotary_factor']} ({model_type}.py "
                "rotates head_dim channels)"
            )
        dual = dca if model_type == "qwen2" else None
        if dca is not None and dual is None:
            ignored.append("dual_chunk_attention_config (qwen3.py does not pass it to get_rope)")
    else:
        try:
            partial = getattr(text, "partial_rotary_factor", 1)
        except Exception:
            partial = 1
        partial = 1 if partial is None else partial
        if rp and rp.get("partial_rotary_factor", 1.0) != partial:
            ignored.append(
                f"rope_parameters['partial_rotary_factor']={rp['partial_rotary_factor']} (the model file "
                f"reads config.partial_rotary_factor = {partial})"
            )
        dual = dca if model_type == "qwen2_moe" else None
        if dca is not None and dual is None:
            ignored.append(f"dual_chunk_attention_config (not passed to get_rope for {model_type}; not verified)")
        notes.append(
            f"not verified: SGLang {SGLANG_VERSION}'s model file for {model_type} was not read; read with "
            "get_rope_config as llama.py and qwen2.py read it"
            + (" (dual_chunk_attention_config passed as qwen2_moe.py passes it)" if dual is not None else "")
        )
    built = sglang_get_rope(head, head, mpe, theta, rp, is_neox_style=neox, partial_rotary_factor=partial,
                            dual_chunk=dual)
    return [built] * n, notes, ignored


def _gemma3_layers(text: Any) -> tuple[list[_v.Built], list[str], list[str]]:
    """Gemma 3 as ``models/gemma3_causal.py`` (``SGLANG_VERSION``'s wheel) builds it: ``Gemma3TextModel`` makes two
    rotary modules, a copy of transformers' rotary class (``Gemma3RotaryEmbedding``) -- the global one from
    ``rope_parameters["full_attention"]`` (its rope type through transformers' ``ROPE_INIT_FUNCTIONS`` on a config
    whose ``rope_parameters`` is that dict, flat; ``attention_scaling`` multiplies cos and sin; ``dynamic`` grows
    past ``max_position_embeddings`` and resets below it, as transformers' ``dynamic_rope_update``), the local one
    default RoPE at ``rope_parameters["sliding_attention"]["rope_theta"]`` -- and each decoder layer takes the
    global cos/sin on a ``full_attention`` layer, the local on a ``sliding_attention`` one (window
    ``sliding_window - 1`` exclusive, i.e. transformers' inclusive ``sliding_window``).

    Where it differs: on a CPU with AMX (``_is_cpu and _is_cpu_amx_available``) the attention runs ``forward_cpu``,
    whose ``get_rope`` is called with ``{"rope_type": "default"}`` on both layer types: a scaled global layer runs
    unscaled there. A flat ``rope_parameters`` (no ``full_attention`` entry) makes ``Gemma3TextModel.__init__`` raise
    ``KeyError``.
    """
    import copy

    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rp = getattr(text, "rope_parameters", None)
    if not (isinstance(rp, Mapping) and "full_attention" in rp and "sliding_attention" in rp):
        raise _v._Refused(
            "gemma3_causal.py reads rope_parameters['full_attention'] and ['sliding_attention'] (transformers 5's "
            f"per-layer-type form); this config's is {rp!r}: KeyError in Gemma3TextModel.__init__"
        )
    head = int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
    notes: list[str] = []
    ignored: list[str] = []
    full = dict(rp["full_attention"])
    theta_global = float(full.get("rope_theta", 1000000.0))
    theta_local = float(rp["sliding_attention"].get("rope_theta", 10000.0))
    if rp["sliding_attention"].get("rope_type", "default") != "default":
        ignored.append(
            f"rope_parameters['sliding_attention'] rope_type={rp['sliding_attention'].get('rope_type')!r} "
            "(gemma3_causal.py builds the local rotary as default RoPE at its rope_theta)"
        )
    def default(theta: float) -> torch.Tensor:  # compute_default_rope_parameters, in float64
        return 1.0 / (theta ** (torch.arange(0, head, 2, dtype=torch.float64) / head))

    local = _v.Built(LayerRope(default(theta_local), 1.0, head, "half", "default", {"rope_theta": theta_local}), None,
                     [], [])
    rope_type = full.get("rope_type", full.get("type", "default")) or "default"
    if rope_type == "default":
        inv_freq, factor = default(theta_global), 1.0
        at_length = None
    else:
        if rope_type not in ROPE_INIT_FUNCTIONS:
            raise _v._Refused(f"gemma3_causal.py: ROPE_INIT_FUNCTIONS has no {rope_type!r} (KeyError)")
        flat = copy.deepcopy(text)
        flat.rope_parameters = {**full, "rope_theta": theta_global}
        init = ROPE_INIT_FUNCTIONS[rope_type]
        freq32, scaling = init(flat, "cpu")
        inv_freq, factor = freq32.to(torch.float64), float(scaling)
        at_length = None
        if "dynamic" in rope_type:
            start = int(text.max_position_embeddings)
            original = inv_freq

            def at_length(n: int) -> tuple[torch.Tensor, float]:
                if n > start:  # grown past the cached length; reset below the original
                    grown, f = init(flat, "cpu", seq_len=n)
                    return grown.to(torch.float64), float(f)
                return original, factor

            notes.append(
                "SGLang Gemma 3, dynamic: the global frequencies follow the largest position of the whole forward "
                "batch (all requests' tokens flattened), so a request batched with a longer one runs that one's "
                "frequencies; cached keys keep the frequencies they were written with"
            )
    global_layer = LayerRope(inv_freq, factor, head, "half", rope_type, {**full, "rope_theta": theta_global},
                             length_dependent=at_length is not None, at_length=at_length)
    glob = _v.Built(global_layer, None, [], [])
    if rope_type != "default":
        notes.append(
            f"SGLang Gemma 3 on a CPU with AMX runs forward_cpu, whose get_rope is called with rope_type 'default': "
            f"the full_attention layers' {rope_type} scaling is not applied there (GPUs: applied, as read here)"
        )
    if getattr(text, "partial_rotary_factor", 1) not in (None, 1, 1.0):
        notes.append("not verified: partial_rotary_factor on Gemma 3 (gemma3_causal.py's GPU path rotates head_dim)")
    built = [glob if kind == "full_attention" else local for kind in text.layer_types]
    return built, notes, ignored


_CONTEXT_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")


def sglang_context_length(parsed: _v.ParsedConfig) -> tuple[int, dict[str, Any]]:
    """SGLang's ``get_context_length(hf_text_config)`` (no ``--context-length``).

    The first of ``max_sequence_length``, ``seq_length``, ``max_seq_len``, ``model_max_length``,
    ``max_position_embeddings``, times ``factor`` unless the RoPE dict has ``original_max_position_embeddings``
    (which transformers 5 adds to every YaRN dict) or is ``llama3``: a YaRN model gets ``max_position_embeddings``,
    not ``original_max_position_embeddings * factor``. Cos/sin tables grow on demand
    (``_ensure_cos_sin_cache_length``).
    """
    text = parsed.text
    raw = dict(parsed.raw.get("text_config") or parsed.raw)
    try:
        rope_scaling = getattr(text, "rope_scaling", None)  # transformers 5: rope_parameters
    except Exception:
        rope_scaling = raw.get("rope_scaling")
    factor = 1
    if rope_scaling:
        factor = rope_scaling.get("factor", 1)
        if "original_max_position_embeddings" in rope_scaling or rope_scaling.get("rope_type") == "llama3":
            factor = 1
    for key in _CONTEXT_KEYS:
        value = _v.attr(text, raw, key)
        if value is not None:
            return int(factor * value), {"key": key, "factor": factor}
    return 2048, {"key": "none (SGLang assumes 2048)", "factor": factor}


@register("sglang")
def read_sglang(source: Source) -> RuntimeView:
    """What SGLang (``FOLLOWS``) runs for ``source``: per layer, the RoPE ``get_rope`` builds from
    ``get_rope_config``; its default context length; the keys it does not read; why it would refuse."""
    follows = f"{FOLLOWS}; config parsed by transformers {_v.transformers_version()} as installed"
    context = None
    try:
        parsed = _v.parse_config(source, "SGLang")
        context, how = sglang_context_length(parsed)
        built, notes, ignored = _sglang_layers(parsed)
    except _v._Refused as err:
        message = str(err)
        if message.startswith("not verified"):
            return RuntimeView("sglang", follows, (), context, notes=(message,), version=RELEASE)
        return RuntimeView("sglang", follows, (), context, refused=message, version=RELEASE)
    notes = [*parsed.notes, *notes]
    if source.kind == "gguf" and parsed.text.model_type == "llama":  # llama.cpp permutes only Llama's q/k rows
        notes.append(
            "GGUF: SGLang's GGUFModelLoader loads the file's q/k rows as they are (gguf_quant_weights_iterator does "
            "not undo the converter's permutation) and the model file rotates them with its own layout"
        )
        if (source.path.parent / "config.json").is_file():
            notes.append(
                "not verified: a config.json sits beside this GGUF; SGLang reads it instead of the GGUF header "
                "(hf_transformers/config.py get_config), and posenc compared the header"
            )
    if (note := _v.missing_original_note(parsed)) is not None:
        notes.append(note)
    for b in _v._unique(built):
        notes.extend(b.notes)
        ignored.extend(b.ignored)
    notes.append(f"context: SGLang's get_context_length from {how}")
    layers = tuple(b.layer for b in built)
    return RuntimeView(
        "sglang",
        follows,
        layers,
        context,
        tuple(_v._dedupe([*parsed.ignored, *ignored])),
        None,
        tuple(_v._dedupe(notes)),
        version=RELEASE,
    )


__all__ = ["FOLLOWS", "read_sglang", "sglang_get_rope", "sglang_context_length", "get_rope_config"]
