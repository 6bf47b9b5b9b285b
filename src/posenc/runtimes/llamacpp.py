"""What llama.cpp runs for a model: per layer, the RoPE its graph builds from a GGUF file's keys and tensors.

Follows ggml-org/llama.cpp at commit ``0c1e57098bba43ac29e6e3b677cdceebdd22334f`` (2026-10-01, "webgpu: fix
SSM_SCAN binding aliasing (#29750)"): the tree llama-cpp-python 0.3.36 vendors, read from that release's sdist (its
``vendor/llama.cpp`` gitlink; its CHANGELOG: "update llama.cpp to ggml-org/llama.cpp@0c1e57098"; llama.cpp's build
number is not in the sdist). ``RELEASE`` names it (and what changed across releases), ``FOLLOWS`` lists the files:
``src/llama-model.cpp`` and ``src/llama-hparams.cpp`` (the keys, read by ``_layers``), ``src/models/<arch>.cpp``
(``_ARCHS``), ``src/llama-context.cpp`` (the context and YaRN arguments), ``ggml/src/ggml-cpu/ops.cpp`` and
``ggml/src/ggml.c`` (the frequencies, ``posenc.gguf.rope``). A transformers folder is first converted as
``convert_hf_to_gguf.py`` at the same commit would (``convert``) for Llama, Mistral, Qwen2, Qwen3 and Gemma 3; other
architectures are "not verified". The traps a file can fall into are named in ``notes`` (``_trap_notes``).

Shapes:
    ``LayerRope.inv_freq`` (F,) float64, F = rotary dims / 2 (``n_rot`` of the layer / 2).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any, cast

import torch

from posenc.gguf import rope as gguf_rope
from posenc.runtimes import LayerRope, RuntimeView, Source, Variant, register

#: How ``posenc check`` names the release this reader follows.
#:
#: Across releases (the files of ``FOLLOWS`` in the sdists of llama-cpp-python 0.3.24, 0.3.35 and 0.3.36; the
#: converter's in 0.3.30 to 0.3.33): ``rope_yarn`` / ``ggml_rope_yarn_corr_dims``, the context's YaRN
#: ``attn_factor`` and the converter's ``rope.scaling`` keys are the same in 0.3.24, 0.3.35 and 0.3.36; a per-layer
#: ``attention.sliding_window_pattern`` array is read by Gemma 2/3, Cohere 2, OLMo 2, Llama 4, EXAONE 4 and gpt-oss
#: from 0.3.36 on (0.3.35, llama.cpp 4df29be4f, ran their default pattern); the converter takes a top-level
#: ``original_max_position_embeddings`` into the RoPE dict, and Llama 3's ``rope_freqs`` the dict's, from 0.3.32
#: (llama.cpp b3fed31b9) on (0.3.31, f449e0553: a YaRN dict without it stops the converter, and ``rope_freqs`` use
#: the top-level value, default 8192). The notes say so where a file or config meets one of these.
RELEASE = "llama.cpp 0c1e57098 (llama-cpp-python 0.3.36)"
#: The code this reader follows.
FOLLOWS = (
    "ggml-org/llama.cpp@0c1e57098 (2026-10-01; vendored by llama-cpp-python 0.3.36): src/llama-model.cpp "
    "load_hparams, llama_model_rope_type, get_rope_freq_base/scale, get_rope_factors; src/llama-hparams.cpp "
    "set_swa_pattern; "
    "src/models/<arch>.cpp; src/llama-context.cpp (n_ctx, ext_factor, attn_factor); ggml/src/ggml-cpu/ops.cpp "
    "rope_yarn; ggml/src/ggml.c ggml_rope_yarn_corr_dims; conversion/base.py, llama.py, gemma.py"
)

#: Scaling types ``llama_rope_scaling_type_from_string`` knows.
SCALING_TYPES = ("none", "linear", "yarn", "longrope")
_PAD = 256  # llama_context pads n_ctx (and n_ctx_seq) to a multiple of this
_MAX_LAYERS = 512  # LLAMA_MAX_LAYERS: the longest per-layer array get_arr reads


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# llama_model_rope_type at the commit, by GGUF architecture name.
_INTERLEAVED = _names(
    "arcee arctic baichuan bailingmoe chameleon chatglm cohere2 cohere2moe command-r deci deepseek deepseek2 "
    "deepseek2-ocr deepseek32 deepseek4 dots3note eagle3 ernie4_5 ernie4_5-moe glm-dsa granite granite_swa "
    "granitehybrid granitemoe graniteswitch hy_v4 internlm2 llada llama llama-embed llama4 maincoder minicpm "
    "mistral3 mistral4 muse-glimmer nanbeige neo-bert olmo plm pockettts smollm3 starcoder xverse"
)
_HALF = _names(
    "afmoe apertus bailingmoe2 bert bitnet codeshell cogvlm dbrx dots1 dream eurobert exaone exaone-moe exaone4 "
    "falcon falcon-h1 gemma gemma-embedding gemma2 gemma3 gemma3n gemma4 gemma4-assistant gpt-oss gptneox grok "
    "grovemoe hrm_text hunyuan-dense hunyuan-moe hy_v3 jais2 jina-bert-v3 laguna lfm2 lfm2moe llada-moe maple "
    "mellum mimo2 minicpm3 minimax-01 minimax-m2 minimax-m3 modern-bert nemotron nomic-bert nomic-bert-moe olmo2 "
    "olmoe openelm orion pangu-embedded phi2 phi3 phimoe plamo plamo2 plamo3 qwen qwen2 qwen2moe qwen3 qwen3moe "
    "qwen3next rnd1 seed_oss smallthinker spark2_5 stablelm starcoder2 step35 talkie"
)
_NO_ROPE = _names(
    "arwkv7 bloom clip glm5-next gpt2 gptj jais jamba jina-bert-v2 kimi-k3 kimi-linear mamba mamba2 mpt nemotron_h "
    "nemotron_h_moe refact rwkv6 rwkv6qwen2 rwkv7 t5 t5encoder wavtokenizer-dec"
)
#: Multimodal RoPE (sections of the head rotated by different position streams): always, or when the file has
#: ``rope.dimension_sections`` (else the layout named).
_MROPE = {"qwen2vl": None, "paddleocr": None, "dflash": None, "qwen3vl": None, "qwen3vlmoe": None, "qwen35": None,
          "qwen35moe": None, "qwen4exp": None, "qwen3tts": None, "bailingmoe3": "interleaved", "glm4": "interleaved",
          "glm4moe": "half", "hunyuan_vl": "half"}


@dataclasses.dataclass(frozen=True)
class _Arch:
    """How one architecture's ``load_arch_hparams`` and graph use RoPE (``src/models/<arch>.cpp``).

    swa: the default sliding pattern ``(n, dense_first)`` (``load_swa_pattern``), ``"array"`` (the file's per-layer
        array, required), or None (no sliding layers).
    swa_when: ``"always"``; ``"window"`` (only when ``attention.sliding_window`` > 0); ``"n_layer_64"`` (EXAONE 4's
        32B); ``"llama4"`` (unless ``attention.sliding_window`` is present and 0).
    base_swa: what sliding layers rotate at: ``"key"`` (``rope.freq_base_swa``, default the full base), ``"key_10000"``
        (default 10000, the hparams default), ``"unused"`` (the key is read but the graph passes the full base), or
        None (the key is not read).
    scale_swa: sliding layers' ``freq_scale``: ``"train"`` (the file's ``1 / factor``) or ``"one"``.
    swa_plain: sliding layers get ``ext_factor`` 0 and ``attn_factor`` 1 (OLMo 2/3).
    rope_on: which layers rotate: ``"all"``; ``"swa"`` (only sliding ones, Cohere 2); ``"swa_or_dense_model"``
        (sliding ones, or every layer when the model has no SWA at all, EXAONE 4); ``"nope_step"`` (all but every
        ``nope_step``-th).
    factors: the factor tensors the architecture creates: ``"freqs_or_longrope"`` (``rope_freqs``, or LongRoPE's
        long/short when the type is longrope), ``"freqs"``, ``"longrope"``, ``"freqs_full"`` (Gemma 4: full layers
        only, required), ``"none"``.
    per_layer_rot: the graph passes each layer's ``n_rot(il)``; else ``n_rot()`` (layer 0's) to every layer.
    keys: further RoPE keys it reads: ``"yarn_beta"``, ``"yarn_log_mul"``, ``"yarn_ext_attn"``.
    rot_is_head: ``n_rot`` must equal the key length (else the load fails).
    """

    swa: tuple[int, bool] | str | None = None
    swa_when: str = "always"
    base_swa: str | None = None
    scale_swa: str = "train"
    swa_plain: bool = False
    rope_on: str = "all"
    nope_step: int = 0
    factors: str = "none"
    per_layer_rot: bool = False
    keys: tuple[str, ...] = ()
    beta_fast: float = 32.0
    rot_is_head: bool = False


_ARCHS: dict[str, _Arch] = {
    "llama": _Arch(factors="freqs_or_longrope", rot_is_head=True),
    "mistral3": _Arch(factors="freqs_or_longrope", keys=("yarn_beta", "yarn_log_mul")),
    "qwen2": _Arch(),
    "qwen3": _Arch(),
    "qwen2moe": _Arch(),
    "qwen3moe": _Arch(),
    "gemma": _Arch(),
    "gemma2": _Arch(swa=(2, False), base_swa="key"),
    "gemma3": _Arch(swa=(6, False), swa_when="window", base_swa="key_10000", scale_swa="one"),
    "gemma4": _Arch(swa="array", base_swa="key_10000", scale_swa="one", factors="freqs_full", per_layer_rot=True),
    "cohere2": _Arch(swa=(4, False), base_swa="unused", rope_on="swa"),
    "olmo2": _Arch(swa=(4, False), swa_when="window", base_swa="unused", swa_plain=True),
    "exaone4": _Arch(
        swa=(4, False), swa_when="n_layer_64", base_swa="unused", rope_on="swa_or_dense_model", factors="freqs"
    ),
    "smollm3": _Arch(rope_on="nope_step", nope_step=4),
    "llama4": _Arch(
        swa=(4, False), swa_when="llama4", base_swa="key", rope_on="nope_step", nope_step=4, factors="freqs"
    ),
    "phi3": _Arch(factors="longrope"),  # its SWA is switched off at load (set_swa_pattern(1))
    "gpt-oss": _Arch(swa=(2, False), base_swa="key"),
    "grok": _Arch(keys=("yarn_ext_attn", "yarn_beta"), beta_fast=8.0),
}

#: RoPE keys (under the architecture) only some architectures read, and the ``_Arch`` feature that reads them.
_OPTIONAL_KEYS = {
    "rope.scaling.yarn_beta_fast": "yarn_beta",
    "rope.scaling.yarn_beta_slow": "yarn_beta",
    "rope.scaling.yarn_log_multiplier": "yarn_log_mul",
    "rope.scaling.yarn_ext_factor": "yarn_ext_attn",
    "rope.scaling.yarn_attn_factor": "yarn_ext_attn",
}


class _Refused(Exception):
    """llama.cpp would not load the model; the message says why."""


class _ConverterStops(ValueError):
    """``convert_hf_to_gguf.py`` itself fails on the config; the message says why."""


def _f32(x: float) -> float:
    import numpy as np  # only here: `import posenc` needs torch alone

    return float(np.float32(x))


def _pad(n: int) -> int:
    return -(-n // _PAD) * _PAD


def _layout(arch: str, meta: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """``(layout, note)``: llama.cpp's rotation for the architecture; ``"none"`` for an architecture without RoPE."""
    if arch in _NO_ROPE:
        return "none", None
    if arch in _MROPE:
        sections: tuple[int, ...] = meta.get(f"{arch}.rope.dimension_sections") or ()
        plain = _MROPE[arch]
        if plain is not None and not (len(sections) > 1 and sections[0] > 0 and sections[1] > 0):
            return plain, None
        return "half", (
            f"not verified: {arch} runs multimodal RoPE (M-RoPE: head sections rotated by separate position streams, "
            "NEOX pairing); posenc reads it as one position stream, as for text tokens"
        )
    if arch in _INTERLEAVED:
        return "interleaved", None
    if arch in _HALF:
        return "half", None
    return None, None


def _swa_on(arch: str, rules: _Arch, meta: Mapping[str, Any], n_layer: int) -> bool:
    """Whether ``load_arch_hparams`` sets a sliding-window type (its pattern may still leave no layer sliding)."""
    window = meta.get(f"{arch}.attention.sliding_window")
    return {
        "always": True,
        "window": bool(window),
        "n_layer_64": n_layer == 64,
        "llama4": not (window is not None and window == 0),
    }[rules.swa_when]


def _swa_layers(arch: str, rules: _Arch, meta: Mapping[str, Any], n_layer: int) -> list[bool]:
    """Which layers are sliding (``is_swa``), as ``load_swa_pattern`` / ``set_swa_pattern`` set them."""
    key = f"{arch}.attention.sliding_window_pattern"
    if rules.swa is None or not _swa_on(arch, rules, meta, n_layer):
        return [False] * n_layer
    value = meta.get(key)
    if rules.swa == "array" and not isinstance(value, tuple):
        raise _Refused(f"{key} (a per-layer array) is required for {arch} and missing")
    if isinstance(value, tuple):  # get_arr into is_swa_impl, which load_hparams zero-filled: missing layers are full
        if len(value) > _MAX_LAYERS:
            raise _Refused(f"{key} holds {len(value)} values; llama.cpp reads at most {_MAX_LAYERS} (LLAMA_MAX_LAYERS)")
        return [bool(v) for v in value[:n_layer]] + [False] * (n_layer - len(value))
    n, dense_first = cast("tuple[int, bool]", rules.swa)  # "array" returned above
    if value is not None:
        n = int(value)
    if dense_first:
        return [n == 0 or il % n != 0 for il in range(n_layer)]
    return [n == 0 or il % n < n - 1 for il in range(n_layer)]


def _first(value: Any) -> Any:
    """A per-layer array's first value (``get_key_or_arr``), or the scalar."""
    return value[0] if isinstance(value, tuple) else value


@dataclasses.dataclass
class _Reading:
    ignored: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)


def _layers(meta: Mapping[str, Any], tensors: Mapping[str, Any], *, n_ctx: int | None, out: _Reading) -> tuple:
    """``(layers, n_ctx_train)`` llama.cpp runs for the file's metadata and RoPE factor tensors.

    As ``src/llama-model.cpp`` ``load_hparams`` reads them, for every architecture: ``{arch}.context_length``
    (``n_ctx_train``, required), ``rope.freq_base`` (default 10000), ``rope.scaling.type`` (default ``"linear"``; a
    name other than ``none``, ``linear``, ``yarn``, ``longrope`` stops the load with an assertion),
    ``rope.scaling.factor`` (else the old ``rope.scale_linear``; ``freq_scale = 1 / factor`` in float32, 1 when
    absent or 0), ``rope.scaling.attn_factor`` (default 1), ``rope.scaling.original_context_length`` (default
    ``n_ctx_train``), ``rope.dimension_count`` (default the key length, ``attention.key_length`` or
    ``embedding_length / head_count``; ``llama`` refuses any other value) and ``rope.dimension_count_swa``.
    ``llama_model_rope_type`` gives the channel layout per architecture (NORM: consecutive pairs, ``"interleaved"``;
    NEOX: halves, ``"half"``; none); ``get_rope_freq_base/scale`` the sliding layers' ``rope_freq_base_train_swa``
    and ``rope_freq_scale_train_swa`` (defaults 10000 and 1 unless the architecture sets them); ``get_rope_factors``
    the factor tensor (``rope_freqs``, else LongRoPE's ``rope_factors_long`` when the per-sequence context
    ``n_ctx_seq`` exceeds the original context, else ``rope_factors_short``); ``load_swa_pattern`` and
    ``llama_hparams::set_swa_pattern`` (``src/llama-hparams.cpp``) the sliding layers: every ``n``-th layer full, the
    rest sliding; ``attention.sliding_window_pattern`` as a number or a per-layer array, at most 512 values, layers
    past a shorter array full.

    Then ``src/models/<arch>.cpp`` (``_ARCHS``): what each architecture reads beyond that (``load_arch_hparams``: its
    default sliding pattern, ``rope.freq_base_swa``, YaRN's ``yarn_beta_fast/slow``, ``yarn_ext_factor``,
    ``yarn_attn_factor``, ``yarn_log_multiplier``), which base, scale and factor tensor its graph passes to
    ``ggml_rope_ext`` at each layer, and which layers it rotates at all. A tensor the architecture does not create
    (``rope_freqs`` in a Qwen2 file) fails the load ("wrong number of tensors").

    And ``src/llama-context.cpp``: ``n_ctx`` 0 means ``n_ctx_train`` (llama-server's and llama-cli's default; the C
    API's is 512, llama-cpp-python's ``Llama()`` 512, its server 2048: pass ``n_ctx``) and is padded to a multiple
    of 256; ``rope.scaling.original_context_length`` 0 means ``n_ctx_train`` there too (but LongRoPE's long/short
    choice, ``get_rope_factors``, compares with the key itself); ``ext_factor`` is 1 for YaRN, else 0 (unless the
    architecture read a ``yarn_ext_factor``); the betas and, without YaRN, ``yarn_attn_factor`` are the model's
    (llama-server passes -1; llama-cpp-python's ``Llama()`` passes 32, 1 and 1, which override a file's: named in
    ``notes`` where they differ); the ``attn_factor`` handed to the kernel is
    ``posenc.gguf.rope.llamacpp_attn_factor`` (YaRN's ``1 + 0.1 ln s``, or ``get_mscale(s, mscale) / get_mscale(s,
    yarn_log_multiplier)``, divided by the ``1 + 0.1 ln s`` the kernel multiplies back, times
    ``rope.scaling.attn_factor``). The frequencies and cos/sin scale follow from those arguments as in
    ``ggml/src/ggml-cpu/ops.cpp`` (``rope_yarn``, ``ggml_rope_cache_init``) and ``ggml/src/ggml.c``
    (``ggml_rope_yarn_corr_dims``): ``posenc.gguf.rope.ggml_rope_frequencies``, in float64 from the float32 values
    llama.cpp holds.
    """
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise _Refused("the file has no general.architecture")

    def key(name: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{name}", default)

    layout, note = _layout(arch, meta)
    if layout is None:
        raise _Refused(f"llama.cpp at this commit knows no architecture {arch!r}")
    if note:
        out.notes.append(note)
    rules = _ARCHS.get(arch)
    if rules is None:
        rules = _Arch(factors="any")
        out.notes.append(
            f"not verified: posenc reads {arch} with the keys every architecture reads (one RoPE for every layer); "
            f"llama.cpp's src/models/{arch}.cpp may read more or rotate some layers differently"
        )
    n_ctx_train = key("context_length")
    n_layer = key("block_count")
    if n_ctx_train is None or n_layer is None:
        raise _Refused(f"{arch}.context_length and {arch}.block_count are required keys")
    n_layer = int(n_layer) - int(key("nextn_predict_layers", 0) or 0)
    if layout == "none":
        return tuple(LayerRope(None, 1.0, 0, "half", "none", {}) for _ in range(n_layer)), int(n_ctx_train)

    # load_hparams: keys every architecture reads
    kind = key("rope.scaling.type", "linear")
    if kind not in SCALING_TYPES:
        raise _Refused(f"{arch}.rope.scaling.type is {kind!r}; llama.cpp knows {list(SCALING_TYPES)} (its load "
                       "stops on an assertion)")
    factor = key("rope.scaling.factor", key("rope.scale_linear", 0.0)) or 0.0
    freq_scale_train = 1.0 if factor == 0.0 else _f32(1.0 / _f32(factor))
    base = float(key("rope.freq_base", 10000.0))
    n_ctx_orig_key = int(key("rope.scaling.original_context_length", n_ctx_train))  # hparams.n_ctx_orig_yarn
    n_ctx_orig = n_ctx_orig_key or int(n_ctx_train)  # cparams.n_ctx_orig_yarn: llama_context takes 0 as n_ctx_train
    rope_attn = float(key("rope.scaling.attn_factor", 1.0))
    n_head = int(_first(key("attention.head_count", 0)) or 0)
    head_k = key("attention.key_length") or (int(key("embedding_length")) // n_head if n_head else 0)
    n_rot_full = int(key("rope.dimension_count", head_k))
    n_rot_swa = int(key("rope.dimension_count_swa", n_rot_full))
    if rules.rot_is_head and n_rot_full != head_k:
        raise _Refused(f"invalid n_rot: {arch}.rope.dimension_count is {n_rot_full}, llama.cpp requires the head "
                       f"dim {head_k} for {arch}")

    # load_arch_hparams: keys some architectures read
    ext_key, attn_key = -1.0, 1.0
    beta_fast, beta_slow, log_mul = rules.beta_fast, 1.0, 0.0
    if "yarn_ext_attn" in rules.keys:
        ext_key = float(key("rope.scaling.yarn_ext_factor", ext_key))
        attn_key = float(key("rope.scaling.yarn_attn_factor", attn_key))
    if "yarn_beta" in rules.keys:
        beta_fast = float(key("rope.scaling.yarn_beta_fast", beta_fast))
        beta_slow = float(key("rope.scaling.yarn_beta_slow", beta_slow))
    if "yarn_log_mul" in rules.keys:
        log_mul = float(key("rope.scaling.yarn_log_multiplier", 0.0))
    if rules.factors != "any":  # an architecture posenc has not read: claim nothing about the keys it reads
        for name, feature in _OPTIONAL_KEYS.items():
            if f"{arch}.{name}" in meta and feature not in rules.keys:
                out.ignored.append(f"{arch}.{name}")

    # llama_context
    freq_scale = 1.0 if kind == "none" else freq_scale_train
    ext = ext_key if ext_key >= 0.0 else (1.0 if kind == "yarn" else 0.0)
    attn = gguf_rope.llamacpp_attn_factor(freq_scale, ext_factor=ext, rope_attn_factor=rope_attn,
                                          yarn_attn_factor=attn_key, yarn_log_mul=log_mul)
    n_ctx_seq = _pad(int(n_ctx or n_ctx_train))

    # sliding layers
    is_swa = _swa_layers(arch, rules, meta, n_layer)
    swa_model = rules.swa is not None and _swa_on(arch, rules, meta, n_layer)  # swa_type != NONE
    base_swa, scale_swa = base, freq_scale
    swa_key = f"{arch}.rope.freq_base_swa"
    if any(is_swa) and rules.base_swa in ("key", "key_10000"):
        base_swa = float(meta.get(swa_key, base if rules.base_swa == "key" else 10000.0))
        scale_swa = 1.0 if rules.scale_swa == "one" else freq_scale_train
    if swa_key in meta and not (any(is_swa) and rules.base_swa in ("key", "key_10000")) and rules.factors != "any":
        out.ignored.append(swa_key)
        if rules.base_swa == "unused" and any(is_swa):
            out.notes.append(f"{arch} reads {swa_key} but its graph rotates sliding layers at the full base {base:g}")

    # factor tensors the architecture creates
    names = _created_tensors(rules, kind)
    unread = sorted(set(tensors) - names)
    if unread:
        raise _Refused(f"{arch} creates no tensor {unread} (llama.cpp: 'wrong number of tensors')")

    def factors_for(il: int, n_rot: int) -> tuple[str | None, Any]:
        if rules.factors == "freqs_full":
            if is_swa[il]:
                return None, None
            if gguf_rope.FREQS not in tensors:
                raise _Refused(f"{arch} requires the tensor {gguf_rope.FREQS} for its full layers")
            name = gguf_rope.FREQS
        elif gguf_rope.FREQS in tensors:
            name = gguf_rope.FREQS
        else:  # get_rope_factors compares with hparams.n_ctx_orig_yarn: the key itself, 0 included
            name = gguf_rope.LONG if n_ctx_seq > n_ctx_orig_key else gguf_rope.SHORT
            if name not in tensors:
                return None, None
        values = tensors[name]
        if len(values) != n_rot // 2:
            raise _Refused(f"{name} holds {len(values)} values; llama.cpp creates it with n_rot / 2 = {n_rot // 2}")
        return name, [float(v) for v in values]

    nope = rules.nope_step
    if arch == "llama4" and not any(is_swa):
        nope = n_layer  # "always use rope" -- (il + 1) % n_layer also skips the last layer, as the graph does
    layers = []
    for il in range(n_layer):
        rotates = {"all": True, "swa": is_swa[il], "swa_or_dense_model": is_swa[il] or not swa_model,
                   "nope_step": nope > 0 and (il + 1) % nope != 0}[rules.rope_on]
        if not rotates:
            layers.append(LayerRope(None, 1.0, 0, layout, kind, {"sliding": is_swa[il]}))
            continue
        n_rot = (n_rot_swa if is_swa[il] else n_rot_full) if rules.per_layer_rot else (
            n_rot_swa if is_swa[0] else n_rot_full)
        sliding = is_swa[il]
        layer_base, layer_scale, layer_ext, layer_attn = base, freq_scale, ext, attn
        if sliding and rules.base_swa in ("key", "key_10000"):
            layer_base, layer_scale = base_swa, scale_swa
        if sliding and rules.swa_plain:
            layer_scale, layer_ext, layer_attn = 1.0, 0.0, 1.0
        tensor, ff = factors_for(il, n_rot)
        theta, mscale = gguf_rope.ggml_rope_frequencies(
            n_rot, layer_base, layer_scale, n_ctx_orig=n_ctx_orig, freq_factors=ff, ext_factor=layer_ext,
            attn_factor=layer_attn, beta_fast=beta_fast, beta_slow=beta_slow,
        )
        params = {"freq_base": layer_base, "freq_scale": layer_scale, "factor": 1.0 / layer_scale,
                  "original_context_length": n_ctx_orig, "ext_factor": layer_ext, "attn_factor": layer_attn,
                  "beta_fast": beta_fast, "beta_slow": beta_slow, "freq_factors": tensor, "sliding": sliding,
                  "n_ctx_seq": n_ctx_seq}
        layers.append(LayerRope(torch.from_numpy(theta), mscale, n_rot, layout, kind, params))
    _trap_notes(arch, meta, kind, factor, tensors, rules, is_swa, base, base_swa, n_ctx_seq, n_ctx_orig, out)
    _python_note(ext, beta_fast, beta_slow, attn_key, out)
    return tuple(layers), int(n_ctx_train)


def _created_tensors(rules: _Arch, kind: str) -> set[str]:
    """The RoPE factor tensors the architecture's ``load_arch_tensors`` creates (others fail the load)."""
    if rules.factors == "any":
        return set(gguf_rope.ROPE_TENSORS)
    return {
        "freqs_or_longrope": {gguf_rope.LONG, gguf_rope.SHORT} if kind == "longrope" else {gguf_rope.FREQS},
        "freqs": {gguf_rope.FREQS},
        "freqs_full": {gguf_rope.FREQS},
        "longrope": {gguf_rope.LONG, gguf_rope.SHORT},
        "none": set(),
    }[rules.factors]


def _trap_notes(arch, meta, kind, factor, tensors, rules, is_swa, base, base_swa, n_ctx_seq, n_ctx_orig, out) -> None:
    """What a user must know about how llama.cpp reads these keys: the known traps, read as llama.cpp does.

    YaRN keys dropped by a converter (``rope.scaling.type`` yarn without a factor runs plain RoPE, llama.cpp #13322;
    without ``original_context_length`` the correction range is computed from ``context_length``; a YaRN model
    converted with no ``rope.scaling`` keys at all runs plain RoPE at its base, which the file's ``posenc.rope``
    record, when present, shows: ``_record_note``); YaRN's ``attention_factor`` and betas, which the converter writes
    as ``yarn_attn_factor`` / ``yarn_beta_*`` and most architectures never read; Gemma's sliding layers (their base
    is ``rope.freq_base_swa``, 10000 when absent, unscaled; a file whose ``freq_base_swa`` equals the full layers'
    base rotates them with the full-layer theta; llama.cpp #14367 reported Gemma 3's linear factor applied to its
    sliding layers too: at the followed commit ``gemma3.cpp`` leaves their scale at 1, as transformers does) and the
    layer pattern (every 6th layer full for Gemma 3 unless the file says otherwise); ``yarn_log_multiplier``, read
    by a few architectures only.
    """
    has = f"{arch}.rope.scaling.type" in meta
    if kind == "yarn" and factor in (0.0, 1.0):
        out.notes.append(
            f"{arch}.rope.scaling.type is yarn but rope.scaling.factor is {'absent' if not factor else 1}: llama.cpp "
            f"runs plain RoPE at base {base:g} (a converter dropped the YaRN keys; llama.cpp #13322)"
        )
    elif kind == "yarn" and f"{arch}.rope.scaling.original_context_length" not in meta:
        out.notes.append(
            f"{arch}.rope.scaling.original_context_length is absent: llama.cpp computes YaRN's correction range "
            f"from context_length ({n_ctx_orig}), not the pre-extension context"
        )
    if not has and factor not in (0.0, 1.0):
        out.notes.append(f"{arch}.rope.scaling.type is absent: llama.cpp reads the factor {factor:g} as linear")
    if kind == "longrope" and rules.factors in ("freqs_or_longrope", "longrope", "any"):
        if gguf_rope.LONG not in tensors and gguf_rope.SHORT not in tensors:
            out.notes.append("rope.scaling.type is longrope but the file has no rope_factors_long/short: llama.cpp "
                             "runs plain frequencies")
        else:
            orig = int(meta.get(f"{arch}.rope.scaling.original_context_length", n_ctx_orig))  # get_rope_factors' own
            which = "long" if n_ctx_seq > orig else "short"
            out.notes.append(
                f"LongRoPE: llama.cpp picks the {which} factors for n_ctx_seq={n_ctx_seq} (the context, padded to "
                f"256, against the original {orig}), once per context, not per sequence length; the context is "
                "llama-server's / llama-cli's default (the file's), while llama-cpp-python's Llama() defaults to "
                "n_ctx=512 and its server to 2048"
            )
    pattern_key = f"{arch}.attention.sliding_window_pattern"
    read_pattern = rules.swa is not None and _swa_on(arch, rules, meta, len(is_swa))
    if read_pattern and rules.swa != "array" and isinstance(meta.get(pattern_key), tuple):
        out.notes.append(f"{pattern_key} is a per-layer array: read as one from llama-cpp-python 0.3.36 (llama.cpp "
                         f"0c1e57098) on; 0.3.35 (4df29be4f) and earlier ignore an array here and run {arch}'s "
                         f"default pattern")
    if read_pattern and isinstance(meta.get(pattern_key), tuple) and len(meta[pattern_key]) < len(is_swa):
        out.notes.append(f"{pattern_key} holds {len(meta[pattern_key])} values for {len(is_swa)} layers: llama.cpp "
                         f"runs layers {len(meta[pattern_key])}.. as full attention (load_hparams zero-fills the "
                         "rest)")
    if any(is_swa) and rules.base_swa in ("key", "key_10000"):
        swa_key = f"{arch}.rope.freq_base_swa"
        full = [il for il, s in enumerate(is_swa) if not s]
        shown = full if len(full) <= 12 else [*full[:12], "..."]
        pattern = "" if f"{arch}.attention.sliding_window_pattern" in meta else " (the architecture's default pattern)"
        out.notes.append(f"full-attention layers {shown}{pattern}; the others slide with base {base_swa:g}")
        if swa_key not in meta and rules.base_swa == "key_10000":
            out.notes.append(f"{swa_key} is absent: sliding layers run llama.cpp's default base 10000")
        if arch.startswith("gemma") and arch != "gemma2" and base_swa == base:
            out.notes.append(
                f"sliding layers rotate with the full layers' base {base:g} ({swa_key} equals rope.freq_base); Gemma "
                "3/4 train them with their own (local) base"
            )


def _python_note(ext: float, beta_fast: float, beta_slow: float, yarn_attn: float, out: _Reading) -> None:
    """llama-cpp-python 0.3.36's ``Llama()`` passes ``yarn_beta_fast=32``, ``yarn_beta_slow=1`` and
    ``yarn_attn_factor=1`` to llama.cpp as set (``llama_cpp/llama.py``; llama-server and the C API pass -1, "from the
    model"), and ``llama_context`` takes a value >= 0 over the model's: where the file's differ, say so."""
    overridden = []
    if ext != 0.0 and (beta_fast, beta_slow) != (32.0, 1.0):
        overridden.append(f"YaRN's beta_fast {beta_fast:g} / beta_slow {beta_slow:g} (Llama() runs 32 / 1)")
    if ext == 0.0 and yarn_attn != 1.0:
        overridden.append(f"yarn_attn_factor {yarn_attn:g} (Llama() runs 1)")
    if overridden:
        out.notes.append(
            f"this is llama.cpp's reading (llama-server, llama-cli); llama-cpp-python's Llama() overrides "
            f"{' and '.join(overridden)} unless given yarn_beta_fast=-1, yarn_beta_slow=-1, yarn_attn_factor=-1"
        )


def _record_note(meta: Mapping[str, Any], layers: tuple[LayerRope, ...], n_ctx_seq: int) -> str | None:
    """When the file carries posenc's record of the config it was measured with and llama.cpp's layers run other
    frequencies (keys dropped or edited after the export), say so."""
    recorded = meta.get(gguf_rope.POSENC_KEY)
    rotating = [layer for layer in layers if layer.inv_freq is not None]
    if not isinstance(recorded, str) or not rotating or meta.get("general.architecture") != "llama":
        return None  # Llama files; a Qwen2 / Gemma 3 record is the check's reference (runtimes.check)
    import numpy as np

    try:
        from transformers import LlamaConfig

        saved = json.loads(recorded)
        d = rotating[0].rotary_dim
        config = LlamaConfig(
            rope_parameters=dict(saved["rope_parameters"]),
            head_dim=d,
            hidden_size=d,
            num_attention_heads=1,
            max_position_embeddings=int(saved["max_position_embeddings"]),
        )
        theirs, scale = gguf_rope.hf_frequencies(config, seq_len=n_ctx_seq)
    except (ImportError, ValueError, KeyError, TypeError):
        return None
    for layer in rotating:
        ours = cast(torch.Tensor, layer.inv_freq).numpy()  # rotating: not None
        if ours.shape != theirs.shape or not (
            np.allclose(ours, theirs, rtol=1e-5, atol=0) and math.isclose(layer.attention_factor, scale, rel_tol=1e-5)
        ):
            kind = saved["rope_parameters"].get("rope_type", "default")
            return (
                f"posenc measured this model with rope_type {kind!r} ({gguf_rope.POSENC_KEY}), but llama.cpp's keys "
                f"run other frequencies (scaling type {layer.method!r}, factor {layer.params.get('factor', 1):g}): "
                "the RoPE keys were dropped or edited after the export"
            )
    return None


def read_gguf(header: Any, *, n_ctx: int | None = None) -> RuntimeView:
    """What llama.cpp runs for a GGUF file's header (``posenc.gguf.header.read_gguf_header``), with a context of
    ``n_ctx`` tokens (default: the file's ``context_length``, llama.cpp's default)."""
    from posenc.gguf import llama as gguf_llama

    meta = header.metadata
    out = _Reading()
    try:
        try:
            tensors = gguf_llama.rope_tensors(header)
        except ValueError as err:
            raise _Refused(str(err)) from err
        layers, context = _layers(meta, tensors, n_ctx=n_ctx, out=out)
    except _Refused as err:
        return RuntimeView("llamacpp", FOLLOWS, (), meta.get(f"{meta.get('general.architecture')}.context_length"),
                           tuple(out.ignored), str(err), tuple(out.notes))
    note = _record_note(meta, layers, _pad(int(n_ctx or context)))
    if note:
        out.notes.append(note)
    return RuntimeView("llamacpp", FOLLOWS, layers, context, tuple(out.ignored), None, tuple(out.notes))


# --- transformers folders: what convert_hf_to_gguf.py writes -------------------------------------------------------

#: ``architectures[0]`` -> the GGUF architecture the converter writes (conversion/__init__.py), for those posenc
#: models.
CONVERTED = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
             "Qwen3ForCausalLM": "qwen3", "Gemma3ForCausalLM": "gemma3",
             "Gemma3ForConditionalGeneration": "gemma3"}
#: The architectures whose q/k rows the converter permutes (``conversion/llama.py``: ``LlamaModel.undo_permute``):
#: llama.cpp's interleaved rotation of the file is transformers' half rotation of the folder.
PERMUTED = {"LlamaForCausalLM", "MistralForCausalLM"}


def _find(hp: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    """``find_hparam(keys, optional=True)``: the first key present (even when null)."""
    return next((hp[k] for k in keys if k in hp), None)


def convert(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, list[float]], list[str], list[str]]:
    """``(metadata, rope tensors, ignored, notes)``: the RoPE keys and tensors ``convert_hf_to_gguf.py`` writes for
    ``config`` (a ``config.json`` dict of an architecture in ``CONVERTED``), and the config keys it does not carry.

    As at the followed commit: ``conversion/base.py`` ``TextModel.__init__`` / ``set_gguf_parameters``,
    ``conversion/llama.py`` (``rope_freqs`` for Llama 3.1's scaling), ``conversion/gemma.py``.

    Raises:
        ValueError: for an architecture posenc does not model (the caller reports it as not verified).
    """
    hp = dict(config)
    hf_arch = (hp.get("architectures") or [None])[0]
    if hf_arch not in CONVERTED:
        raise ValueError(hf_arch)
    arch = CONVERTED[hf_arch]
    if isinstance(hp.get("text_config"), Mapping):
        hp = {**hp, **hp["text_config"]}
    rope = dict(hp.get("rope_parameters", hp.get("rope_scaling")) or {})
    rope_theta = _find(hp, ("global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta",
                            "rotary_emb_base"))
    local_theta = _find(hp, ("local_rope_theta", "rope_local_theta", "rope_theta_local", "swa_rope_theta",
                             "rope_local_base_freq"))
    partial = _find(hp, ("partial_rotary_factor", "rope_pct", "rope_percent"))
    original = _find(hp, ("original_max_position_embeddings",))
    nested = "full_attention" in rope or "sliding_attention" in rope
    mirrored = original is not None and not nested and "original_max_position_embeddings" not in rope  # 0.3.32 on
    if "full_attention" not in rope and "sliding_attention" not in rope:
        if local_theta is not None:
            rope["sliding_attention"] = {"rope_theta": local_theta}
        if "rope_theta" not in rope and rope_theta is not None:
            rope["rope_theta"] = rope_theta
        if "rope_type" not in rope and rope.get("type") is not None:
            rope["rope_type"] = rope["type"]
        if "partial_rotary_factor" not in rope and partial is not None:
            rope["partial_rotary_factor"] = partial
        if "original_max_position_embeddings" not in rope and original is not None:
            rope["original_max_position_embeddings"] = original
    meta: dict[str, Any] = {"general.architecture": arch}
    tensors: dict[str, list[float]] = {}
    ignored: list[str] = []
    notes = [f"converted as convert_hf_to_gguf.py at the followed commit writes {hf_arch} (arch {arch!r})"]

    def put(name: str, value: Any, f32: bool = False) -> None:
        meta[f"{arch}.{name}"] = _f32(value) if f32 else value

    n_ctx = _find(hp, ("max_position_embeddings", "n_ctx", "n_positions", "max_length", "max_sequence_length",
                       "model_max_length"))
    if n_ctx is not None:
        put("context_length", int(n_ctx))
    put("embedding_length", int(_find(hp, ("hidden_size", "n_embd", "dim"))))
    put("block_count", int(_find(hp, ("n_layers", "num_hidden_layers", "n_layer", "num_layers"))))
    put("attention.head_count", int(_find(hp, ("num_attention_heads", "n_head", "n_heads"))))
    params = rope.get("full_attention", rope)
    kind, factor = params.get("rope_type"), params.get("factor")
    if kind is not None:
        if kind == "linear" and factor is not None:
            put("rope.scaling.type", "linear")
            put("rope.scaling.factor", factor, True)
        elif kind == "yarn" and factor is not None:
            put("rope.scaling.type", "yarn")
            put("rope.scaling.factor", factor, True)
            if "original_max_position_embeddings" not in params:
                raise _ConverterStops(
                    "convert_hf_to_gguf.py stops on a YaRN rope_parameters without "
                    "original_max_position_embeddings (KeyError): no GGUF is written"
                )
            put("rope.scaling.original_context_length", int(params["original_max_position_embeddings"]))
            if mirrored:
                notes.append(f"original_max_position_embeddings ({original}) is outside rope_parameters: the "
                             f"converter of llama-cpp-python >= 0.3.32 (llama.cpp b3fed31b9) writes it; that of "
                             f"0.3.31 (f449e0553) and earlier stops on the YaRN dict (KeyError)")
            for hf_key, name in (("extrapolation_factor", "yarn_ext_factor"), ("beta_fast", "yarn_beta_fast"),
                                 ("beta_slow", "yarn_beta_slow")):
                if params.get(hf_key) is not None:
                    put(f"rope.scaling.{name}", params[hf_key], True)
            attn = params.get("attention_factor", params.get("attn_factor"))
            if attn is not None:
                put("rope.scaling.yarn_attn_factor", attn, True)
            for hf_key in ("mscale", "mscale_all_dim", "truncate"):
                if hf_key in params:
                    ignored.append(f"rope_parameters.{hf_key} (not written by the converter)")
        elif kind in ("su", "longrope"):
            put("rope.scaling.type", "longrope")
            if arch != "phi3":
                ignored.append("rope_parameters.long_factor/short_factor/attention_factor (the converter writes "
                               f"LongRoPE's factors only for Phi-3 and MiniCPM, not {hf_arch})")
        elif kind == "llama3" and arch == "llama":
            tensors[gguf_rope.FREQS] = _llama3_freqs(params, hp)
            older = hp.get("original_max_position_embeddings", 8192)
            if older != params.get("original_max_position_embeddings", 8192):
                top = f"{older}" if "original_max_position_embeddings" in hp else "absent here: 8192"
                notes.append(f"Llama 3's rope_freqs use original_max_position_embeddings "
                             f"{params.get('original_max_position_embeddings', 8192)} from rope_parameters in the "
                             f"converter of llama-cpp-python >= 0.3.32 (llama.cpp b3fed31b9); that of 0.3.31 "
                             f"(f449e0553) and earlier takes the top-level one, {top}")
        elif kind != "default":
            ignored.append(f"rope_parameters.rope_type={kind!r}" + (f" factor={factor}" if factor else "") +
                           " (the converter writes no scaling for it)")
        if kind in ("linear", "yarn") and factor is None:
            ignored.append(f"rope_parameters.rope_type={kind!r} without a factor (the converter writes nothing)")
    sliding = rope["sliding_attention"] if isinstance(rope.get("sliding_attention"), Mapping) else {}
    if params.get("rope_theta") is not None:
        put("rope.freq_base", params["rope_theta"], True)
    if sliding.get("rope_theta") is not None:
        put("rope.freq_base_swa", sliding["rope_theta"], True)
    if sliding.get("rope_type", "default") != "default":
        ignored.append(f"rope_parameters.sliding_attention.rope_type={sliding['rope_type']!r} (the converter writes "
                       "the full-attention layers' scaling only)")
    if hp.get("dual_chunk_attention_config"):
        ignored.append("dual_chunk_attention_config (the converter writes no key for it and llama.cpp has no dual "
                       "chunk attention: it runs the model's plain RoPE over the whole context)")
    if hp.get("head_dim") is not None:
        put("attention.key_length", int(hp["head_dim"]))
    if params.get("partial_rotary_factor", 1.0) not in (None, 1.0):
        ignored.append(f"partial_rotary_factor={params['partial_rotary_factor']} (the converter writes no rotary "
                       f"dims for {hf_arch}: llama.cpp rotates the whole head)")
    if arch == "llama":
        head = hp.get("head_dim") or int(hp["hidden_size"]) // int(hp["num_attention_heads"])
        put("rope.dimension_count", int(head))
    if arch == "gemma3":
        put("context_length", int(hp.get("max_position_embeddings", 131072)))
        put("attention.key_length", int(hp.get("head_dim", 256)))
        put("rope.freq_base", params.get("rope_theta", 1_000_000.0), True)
        if hp.get("sliding_window_pattern") != 1:
            put("attention.sliding_window", int(hp["sliding_window"]))
        types = hp.get("layer_types")
        if isinstance(types, list):
            is_swa = _swa_layers(arch, _ARCHS[arch], meta, len(types))
            differ = [il for il, (t, s) in enumerate(zip(types, is_swa, strict=True))
                      if (t == "sliding_attention") != s]
            if differ:
                notes.append(f"config.json's layer_types differ from llama.cpp's default Gemma 3 pattern (every 6th "
                             f"layer full; the converter writes no pattern) at layers {differ}")
    return meta, tensors, ignored, notes


def _llama3_freqs(params: Mapping[str, Any], hp: Mapping[str, Any]) -> list[float]:
    """``LlamaModel.generate_extra_tensors``: Llama 3.1's scaling as ``rope_freqs`` divisors (its float32
    frequencies, Python float arithmetic, stored as float32)."""
    import torch

    base = params.get("rope_theta", 10000.0)
    dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = params.get("factor", 8.0)
    low, high = params.get("low_freq_factor", 1.0), params.get("high_freq_factor", 4.0)
    old = params.get("original_max_position_embeddings", 8192)
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(float(factor))
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(float(1 / ((1 - smooth) / factor + smooth)))
    return [_f32(v) for v in out]


def _rope_keys(meta: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in meta.items() if ".rope." in k or k.endswith(".context_length")}


def _transformers5_variant(config: Mapping[str, Any], meta: Mapping[str, Any] | None,
                           tensors: Mapping[str, Any] | None, n_ctx: int | None) -> Variant | None:
    """What ``convert_hf_to_gguf.py`` writes when run under transformers 5, where ``load_hparams`` reads
    ``AutoConfig.from_pretrained(folder).to_dict()``: transformers 5 has filled ``rope_parameters`` in by then (a
    YaRN / Llama 3 / LongRoPE dict without ``original_max_position_embeddings`` gets ``max_position_embeddings``, not
    the top-level key the converter otherwise takes). None where it writes the same RoPE keys as under transformers 4
    (``meta``, ``tensors``: the config as it is; None where the converter stops on it)."""
    try:
        from posenc.runtimes.transformers import build_config

        hp5 = build_config(config)[0].to_dict()
        meta5, tensors5, _, _ = convert(hp5)
        if meta is not None and _rope_keys(meta5) == _rope_keys(meta) and dict(tensors5) == dict(tensors or {}):
            return None
        layers5, _ = _layers(meta5, tensors5, n_ctx=n_ctx, out=_Reading())
    except (ImportError, ValueError, RuntimeError, _Refused):
        return None
    old, new = _rope_keys(meta or {}), _rope_keys(meta5)
    changed = [k for k in sorted({*old, *new}) if old.get(k) != new.get(k)]
    shown = ", ".join(f"{k} {new.get(k, 'absent')}" for k in changed) or "other RoPE factor tensors"
    was = "writes " + ", ".join(f"{k} {old.get(k, 'absent')}" for k in changed) if meta is not None else "it stops"
    fix = None
    top = config.get("original_max_position_embeddings")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if any(k.endswith("original_context_length") for k in changed) and "original_max_position_embeddings" not in rope:
        value = top if top is not None else "<the pretraining length>"
        fix = (f"write original_max_position_embeddings = {value} inside config.json's rope_parameters and "
               "rope_scaling (as every posenc export does): the converter then reads it under transformers 4 and 5")
    return Variant(
        when=f"convert_hf_to_gguf.py run under transformers 5 (its AutoConfig.to_dict(); writes {shown})",
        otherwise=f"convert_hf_to_gguf.py run under transformers 4 (llama.cpp's converter requirements; {was})",
        layers=_relative_to_folder(config, tuple(layers5)),
        fix=fix,
    )


def _relative_to_folder(config: Mapping[str, Any], layers: tuple[LayerRope, ...]) -> tuple[LayerRope, ...]:
    if (config.get("architectures") or [None])[0] not in PERMUTED:
        return layers
    return tuple(dataclasses.replace(layer, layout="half") if layer.layout == "interleaved" else layer
                 for layer in layers)


def read_config(config: Mapping[str, Any], *, n_ctx: int | None = None) -> RuntimeView:
    """What llama.cpp runs for a transformers ``config.json`` once converted with ``convert_hf_to_gguf.py`` under
    transformers 4 (the converter's requirements; the dict as ``config.json`` holds it), and in ``variants`` what it
    runs when converted under transformers 5, where that writes other RoPE keys (``_transformers5_variant``)."""
    try:
        meta, tensors, ignored, notes = convert(config)
    except _ConverterStops as err:
        variant = _transformers5_variant(config, None, None, n_ctx)
        return RuntimeView("llamacpp", FOLLOWS, (), None, (), str(err), (),
                           variants=(variant,) if variant else ())
    except ValueError as err:
        arch = (config.get("architectures") or [None])[0]
        why = str(err) if str(err) != str(arch) else f"posenc models convert_hf_to_gguf.py for {sorted(CONVERTED)} only"
        return RuntimeView("llamacpp", FOLLOWS, (), None, (), None, (f"not verified: {arch}: {why}",))
    out = _Reading(ignored=list(ignored), notes=list(notes))
    try:
        layers, context = _layers(meta, tensors, n_ctx=n_ctx, out=out)
    except _Refused as err:
        return RuntimeView("llamacpp", FOLLOWS, (), None, tuple(out.ignored), str(err), tuple(out.notes))
    if (config.get("architectures") or [None])[0] in PERMUTED:
        layers = _relative_to_folder(config, layers)
        out.notes.append("layout relative to the folder's weights: convert_hf_to_gguf.py permutes each head's q/k "
                         "rows (LlamaModel.undo_permute) so that llama.cpp's neighbouring pairs rotate what "
                         "transformers rotates as halves")
    variant = _transformers5_variant(config, meta, tensors, n_ctx)
    return RuntimeView("llamacpp", FOLLOWS, layers, context, tuple(out.ignored), None, tuple(out.notes),
                       variants=(variant,) if variant else ())


def read(source: Source, *, n_ctx: int | None = None) -> RuntimeView:
    """What llama.cpp runs for ``source``: a GGUF file as it is, a transformers folder or ``config.json`` as
    ``convert_hf_to_gguf.py`` would write it. ``n_ctx``: llama.cpp's context (default the model's)."""
    if source.kind == "gguf":
        return read_gguf(source.gguf, n_ctx=n_ctx)
    return read_config(source.config or {}, n_ctx=n_ctx)


@register("llamacpp")
def _read(source: Source) -> RuntimeView:
    return read(source)
