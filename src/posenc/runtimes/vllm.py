"""What vLLM runs for a model: its RoPE per layer, read the way vLLM reads a transformers folder, a ``config.json``
or a GGUF file.

Follows the vLLM release on the package index, 0.33.0 (``VLLM_VERSION``, with what changed across releases; the
files of its wheel, ``FOLLOWS`` names each): the configuration path (``transformers_utils/config.py``:
``patch_rope_parameters``, ``patch_legacy_rope_type``; ``config/model.py``: ``_get_and_verify_max_len``;
``transformers_utils/model_arch_config_convertor.py``: ``derive_max_model_len_and_key``), the model files that build
the rotary embedding (``models/llama.py``, ``qwen2.py``, ``qwen3.py``, ``gemma3.py``, ``gemma4.py``, ``llama4.py``,
``gpt_oss.py``, ``deepseek_v2.py``) and ``layers/rotary_embedding/__init__.py`` ``get_rope`` with the classes it
builds. posenc cannot import vLLM (its rope modules import its custom-op and platform machinery), so this module is
written from that code; ``tests/reference/vllm_rope_scaling.py`` holds the formulas copied line by line, and the tests
hold this reader to them on full tensors. (Until issue 68 it followed the commit 41c5903d, whose YaRN read
``attn_factor``.) Each step is described where it is read: ``parse_config`` and ``_patch_rope_parameters`` (config),
``_vllm_layers`` (per layer type), ``vllm_get_rope``, ``vllm_max_model_len`` (context), ``read_vllm`` (GGUF, and what
is not verified).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import torch

from posenc.runtimes import LayerRope, RuntimeView, Source, register

#: The vLLM release this reader follows: the files of its wheel on the package index (``FOLLOWS``).
#:
#: Where the reading changed across releases (read in the wheels of 0.26.0, 0.29.0, 0.30.0, 0.31.0, 0.32.0, 0.33.0):
#: from 0.30.0 YaRN reads transformers' ``attention_factor``, ``mscale`` and ``mscale_all_dim`` and no longer
#: ``attn_factor``, ``extrapolation_factor``, ``apply_yarn_scaling`` (DeepSeek's YaRN no ``attn_factor`` either, and
#: ``deepseek_v2.py`` picks ``deepseek_llama_scaling`` by ``attention_factor == 1.0``), ``telechat3-yarn`` is
#: rewritten to ``yarn`` with ``attention_factor = 0.07 ln s + 1``, and a YaRN model's default ``max_model_len`` is
#: its ``max_position_embeddings`` (0.29.0: ``original_max_position_embeddings * factor``). No release read has a
#: GGUF loader.
VLLM_VERSION = "0.33.0"
#: How ``posenc check`` names it in every row.
RELEASE = f"vLLM {VLLM_VERSION}"

#: The code this reader follows (``RuntimeView.follows``).
FOLLOWS = (
    f"vllm {VLLM_VERSION} (wheel on PyPI): vllm/model_executor/layers/rotary_embedding/__init__.py (get_rope), "
    "base.py, common.py (yarn_get_mscale, yarn_find_correction_range), yarn_scaling_rope.py (attention_factor, "
    "mscale, mscale_all_dim, beta_fast, beta_slow, truncate), deepseek_scaling_rope.py, dynamic_ntk_scaling_rope.py, "
    "dynamic_ntk_alpha_rope.py, ntk_scaling_rope.py, linear_scaling_rope.py, llama3_rope.py, "
    "phi3_long_rope_scaled_rope.py, gemma4_rope.py, dual_chunk_rope.py; vllm/transformers_utils/config.py "
    "(patch_rope_parameters, patch_legacy_rope_type); vllm/config/model.py (_get_and_verify_max_len); "
    "vllm/transformers_utils/model_arch_config_convertor.py; vllm/model_executor/model_loader/__init__.py "
    "(LoadFormats: no gguf); vllm/model_executor/models/{llama,qwen2,qwen3,gemma3,gemma4,llama4,gpt_oss,"
    "deepseek_v2}.py"
)

#: Keys of a RoPE dict that are not scaling parameters (read by every type, or by ``get_rope`` itself).
_ROTARY_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor", "rope_dim"})


class _Refused(Exception):
    """The runtime raises while building the model: the message says what and where."""


# --------------------------------------------------------------------------------------------------------------
# Frequencies in float64, one function per rotary class (the formulas of the files FOLLOWS names)


def inv_freq(dim: int, base: float) -> torch.Tensor:
    """``RotaryEmbedding._compute_inv_freq``: ``1 / base ** (arange(0, dim, 2) / dim)``, (dim // 2,) float64."""
    return 1.0 / (float(base) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """``yarn_get_mscale``: ``0.1 mscale ln(scale) + 1``, 1 for ``scale <= 1``."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def vllm_yarn_attention_factor(
    factor: float, mscale: float | None, mscale_all_dim: float | None, attention_factor: float | None
) -> float:
    """``YaRNScalingRotaryEmbedding.__init__`` (``VLLM_VERSION``): ``attention_factor`` where given, else the ratio
    ``yarn_mscale(s, mscale) / yarn_mscale(s, mscale_all_dim)`` where both are non-zero, else ``0.1 ln s + 1``."""
    if attention_factor is not None:
        return float(attention_factor)
    if mscale and mscale_all_dim:
        return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
    return yarn_mscale(factor)


def yarn_inv_freq(
    dim: int,
    base: float,
    factor: float,
    original: int,
    *,
    beta_fast: float = 32,
    beta_slow: float = 1,
    truncate: bool = True,
    extrapolation_factor: float = 1.0,
) -> torch.Tensor:
    """YaRN's blend (``YaRNScalingRotaryEmbedding._compute_inv_freq``, ``yarn_find_correction_range``,
    ``yarn_linear_ramp_mask``): pairs below the ramp keep RoPE's frequency, pairs above it are divided by ``factor``;
    the extrapolated share is multiplied by ``extrapolation_factor``."""

    def corr(rot: float) -> float:
        return dim * math.log(original / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = corr(beta_fast), corr(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolated = (1 - ramp) * extrapolation_factor
    pos = float(base) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    return (1.0 / (factor * pos)) * (1 - extrapolated) + (1.0 / pos) * extrapolated


def yarn_kw_inv_freq(dim: int, base: float, factor: float, original: int, kw: Mapping[str, Any]) -> torch.Tensor:
    """``yarn_inv_freq`` with the keyword arguments a rope dict gives (``truncate`` True where it has none)."""
    return yarn_inv_freq(
        dim,
        base,
        factor,
        original,
        beta_fast=kw["beta_fast"],
        beta_slow=kw["beta_slow"],
        truncate=bool(kw.get("truncate", True)),
        extrapolation_factor=kw["extrapolation_factor"],
    )


def llama3_inv_freq(dim: int, base: float, factor: float, low: float, high: float, original: int) -> torch.Tensor:
    """``Llama3RotaryEmbedding._compute_inv_freq``."""
    freqs = inv_freq(dim, base)
    wavelen = 2 * math.pi / freqs
    smooth = (original / wavelen - low) / (high - low) if low != high else torch.zeros_like(freqs)
    blended = (1 - smooth) * freqs / factor + smooth * freqs
    return torch.where(wavelen < original / high, freqs, torch.where(wavelen > original / low, freqs / factor, blended))


def ntk_inv_freq(dim: int, base: float, factor: float, mixed_b: float | None) -> torch.Tensor:
    """``NTKScalingRotaryEmbedding._compute_inv_freq``: fixed NTK (``mixed_b`` None) or mixed NTK."""
    if mixed_b is None:
        return inv_freq(dim, base * factor) / factor ** (2 / dim)
    a = math.log(factor) / (dim / 2) ** mixed_b
    return inv_freq(dim, base) / torch.exp(a * torch.arange(1, dim // 2 + 1, dtype=torch.float64) ** mixed_b)


def ntk_base(base: float, dim: int, scale: float) -> float:
    """The NTK base change ``base * scale ** (d / (d - 2))`` (dynamic NTK's and NTK-by-alpha's cache base)."""
    return float(base) * scale ** (dim / (dim - 2))


def longrope_inv_freq(dim: int, base: float, factors) -> torch.Tensor:
    """``Phi3LongRoPEScaledRotaryEmbedding._compute_inv_freq``: RoPE's frequencies over the per-pair factors."""
    return inv_freq(dim, base) / torch.tensor([float(f) for f in factors], dtype=torch.float64)


def longrope_mscale(max_position: int, original: int) -> float:
    """``sqrt(1 + ln(max_position / original) / ln(original))``, 1 when ``max_position <= original``."""
    scale = max_position / original
    return 1.0 if scale <= 1.0 else math.sqrt(1 + math.log(scale) / math.log(original))


def proportional_inv_freq(head_size: int, rotary_dim: int, base: float) -> torch.Tensor:
    """``Gemma4RotaryEmbedding._compute_inv_freq``: ``rotary_dim // 2`` frequencies ``base ** (-2i / head_size)``,
    zeros for the other pairs of the head: (head_size // 2,)."""
    rope = rotary_dim // 2
    freqs = 1.0 / (float(base) ** (torch.arange(0, 2 * rope, 2, dtype=torch.float64) / head_size))
    return torch.cat((freqs, torch.zeros(head_size // 2 - rope, dtype=torch.float64)))


# --------------------------------------------------------------------------------------------------------------
# The config as vLLM (and SGLang) get it: transformers' AutoConfig, then the runtime's own standardization


@dataclasses.dataclass
class ParsedConfig:
    """A model's config as transformers parses it for a runtime (``config`` is the transformers object)."""

    config: Any  # the top-level transformers config
    text: Any  # the language model's config (``get_text_config()``)
    raw: Mapping[str, Any]  # the dict the config was built from (config.json, or the GGUF loader's)
    notes: list[str]
    ignored: list[str]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """transformers' warnings (unknown rope types, deprecated keys) are not the user's business here."""
    import transformers

    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        transformers.logging.set_verbosity(level)


def transformers_version() -> str | None:
    try:
        import transformers
    except ImportError:
        return None
    return transformers.__version__


def parse_config(source: Source, runtime: str) -> ParsedConfig:
    """``source`` parsed as ``runtime`` parses it: transformers' config class for the model type (what
    ``AutoConfig.from_pretrained`` builds), from config.json or from a GGUF header through transformers' GGUF loader.

    vLLM parses ``config.json`` with transformers' ``AutoConfig`` and then standardizes the RoPE keys
    (``patch_rope_parameters``, here ``_patch_rope_parameters``): with transformers 5 everything ends up in
    ``rope_parameters`` (a v4 ``rope_scaling`` and a top-level ``rope_theta`` are moved in; ``rotary_emb_base`` and
    ``rotary_pct`` / ``rotary_emb_fraction`` are read as ``rope_theta`` and ``partial_rotary_factor``), and
    transformers fills ``original_max_position_embeddings`` with ``max_position_embeddings`` for ``llama3``, ``yarn``
    and ``longrope`` when it is absent. Parsing with the installed transformers the same way (``AutoConfig``'s
    config class, ``from_dict``) makes a model-specific config class (Gemma 3's ``rope_local_base_freq``, Llama 4's
    ``no_rope_layers``) do here what it does in vLLM. vLLM's transformers 4 path is not modelled.

    Raises:
        _Refused: transformers is not installed, the model type is unknown to it, or its config class refuses the
            config (the runtime fails the same way at start-up).
    """
    version = transformers_version()
    if version is None or int(version.split(".")[0]) < 5:
        raise _Refused(
            f"not verified: {runtime} parses config.json with transformers' AutoConfig and posenc reads it with "
            f"transformers >= 5 (installed: {version or 'none'}; pip install 'posenc[hf]')"
        )
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    notes: list[str] = []
    ignored: list[str] = []
    with _quiet():
        if source.kind == "gguf":
            raw, config = _gguf_config(source, runtime, notes, ignored)
        else:
            raw = dict(source.config or {})
            model_type = raw.get("model_type")
            if model_type not in CONFIG_MAPPING:
                raise _Refused(
                    f"not verified: model_type={model_type!r} is unknown to transformers {version}: {runtime} needs "
                    "the model's own config class (--trust-remote-code), which posenc does not run"
                )
            try:
                config = CONFIG_MAPPING[cast(str, model_type)].from_dict(json.loads(json.dumps(raw)))
            except Exception as err:  # the config class refuses it: so does the runtime
                raise _Refused(f"transformers {version} refuses the config ({type(err).__name__}: {err})") from err
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if not getattr(config, "architectures", None):
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

        arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type) or MODEL_MAPPING_NAMES.get(config.model_type)
        if arch:
            config.architectures = [arch]
    return ParsedConfig(config, text, raw, notes, ignored)


def _gguf_config(source: Source, runtime: str, notes: list[str], ignored: list[str]) -> tuple[dict, Any]:
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from posenc.runtimes.transformers import _gguf_config as transformers_gguf_config

    path = Path(source.path)
    # AutoConfig.from_pretrained(folder, gguf_file=name) is load_gguf_checkpoint's config dict through the class's
    # from_dict; the dict is built from posenc's header reader (seconds less: GGUFReader parses the vocabulary too)
    built, _, why = transformers_gguf_config(source.gguf)
    if built is None:
        raise _Refused(f"transformers' GGUF loader refuses {path.name} ({why})")
    try:
        config = CONFIG_MAPPING[built["model_type"]].from_dict(dict(built))
    except Exception as err:
        raise _Refused(f"transformers' GGUF loader refuses {path.name} ({type(err).__name__}: {err})") from err
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise _Refused(f"{runtime} cannot get a GGUF config for model_type {config.model_type!r}")
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    meta = dict(getattr(source.gguf, "metadata", {}) or {})
    arch = meta.get("general.architecture", config.model_type)
    scaling = sorted(k for k in meta if k.startswith(f"{arch}.rope.scaling."))
    if scaling and config.model_type != "gpt_oss":
        ignored.extend(scaling)
        notes.append(
            f"GGUF: transformers' GGUF loader (which {runtime} uses to build the config) reads {arch}.rope.freq_base "
            f"and drops {', '.join(scaling)}: the model runs without its RoPE scaling"
        )
    if runtime != "SGLang":  # SGLang's gguf_native.py builds its own config for muse-glimmer files only
        notes.append(f"not verified: {runtime}'s own GGUF config patches (not read)")
    return config.to_dict(), config


def rope_parameters(config: Any) -> dict | None:
    """``config.rope_parameters`` as a plain dict (None when absent)."""
    rp = getattr(config, "rope_parameters", None)
    return None if rp is None else dict(rp)


def is_nested(rp: Mapping[str, Any] | None, config: Any) -> bool:
    """True where ``rp`` is keyed by layer type (vLLM's ``is_rope_parameters_nested``: every key a layer type)."""
    from transformers import configuration_utils as cu

    types = getattr(cu, "ALLOWED_ATTENTION_LAYER_TYPES", None) or cu.ALLOWED_LAYER_TYPES
    return bool(rp) and set(cast("Mapping[str, Any]", rp)).issubset(types)


def _patch_rope_parameters(config: Any) -> None:
    """vLLM's ``patch_rope_parameters`` with transformers 5: non-standard names moved in, legacy types renamed, then
    transformers' ``standardize_rope_params`` and ``validate_rope``."""
    theta = next((getattr(config, n) for n in ("rope_theta", "rotary_emb_base") if getattr(config, n, None)), None)
    names = ("partial_rotary_factor", "rotary_pct", "rotary_emb_fraction")
    partial = next((getattr(config, n) for n in names if getattr(config, n, None) is not None), None)
    if theta is None and not getattr(config, "rope_parameters", None):
        return
    if theta is not None:
        config.rope_theta = theta
    if partial is not None:
        config.partial_rotary_factor = partial
    rp = getattr(config, "rope_parameters", None)
    for d in (rp.values() if is_nested(rp, config) else [rp]) if rp else []:
        if not isinstance(d, dict):
            continue
        renamed = (d.get("type") == "su" and d.get("rope_type") == "longrope") or d.get("type") == "mrope"
        if "rope_type" in d and "type" in d and d["rope_type"] != d["type"] and not renamed:
            raise _Refused(f"rope_parameters has rope_type={d['rope_type']!r} and type={d['type']!r}")
        if "rope_type" not in d and "type" in d:
            d["rope_type"] = d["type"]
        if "rope_type" not in d:
            continue
        if d["rope_type"] == "su":
            d["rope_type"] = "longrope"
        elif d["rope_type"] == "mrope":
            if "mrope_section" not in d:
                raise _Refused("patch_legacy_rope_type raises ValueError: rope_type 'mrope' needs 'mrope_section'")
            d["rope_type"] = "default"
        elif d["rope_type"] == "telechat3-yarn":  # plain YaRN with TeleChat3's 0.07 coefficient precomputed
            if "factor" not in d:
                raise _Refused("patch_legacy_rope_type raises KeyError 'factor': rope_type 'telechat3-yarn' lacks it")
            d["rope_type"] = "yarn"
            d["attention_factor"] = 0.07 * math.log(d["factor"]) + 1.0
            d.pop("type", None)
    with _quiet():
        try:
            config.standardize_rope_params()
            config.validate_rope()
        except Exception as err:
            raise _Refused(f"transformers' RoPE validation refuses the config ({type(err).__name__}: {err})") from err


def missing_original_note(parsed: ParsedConfig, where: str = "rope_scaling") -> str | None:
    """The trap of YaRN (and llama3, longrope) without ``original_max_position_embeddings``: transformers fills it
    with ``max_position_embeddings``, so the ramp (and vLLM's context) use that length."""
    raw = dict(parsed.raw.get("text_config") or parsed.raw)
    given = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(given, Mapping) or is_nested(given, None):
        return None
    kind = given.get("rope_type") or given.get("type")
    key = "original_max_position_embeddings"
    if kind in ("yarn", "llama3", "longrope") and key not in given and key not in raw:
        return (
            f"{kind} without original_max_position_embeddings: transformers fills it with max_position_embeddings"
            f" ({raw.get('max_position_embeddings')}), so the runtime takes that as the pretraining length"
        )
    return None


# --------------------------------------------------------------------------------------------------------------
# get_rope: what one call builds


@dataclasses.dataclass
class Built:
    """One rotary embedding as a runtime builds it."""

    layer: LayerRope
    table: int | None  # rows of its cos/sin table (positions it holds); None where it grows on demand
    ignored: list[str]
    notes: list[str]


#: SGLang's YaRN keyword arguments and their defaults (``posenc.runtimes.sglang``; vLLM 0.29.0 and before read the same
#: names, ``attn_factor`` among them).
YARN_DEFAULTS = {"extrapolation_factor": 1.0, "attn_factor": 1.0, "beta_fast": 32, "beta_slow": 1}
#: The keyword arguments vLLM's ``get_rope`` passes to ``YaRNScalingRotaryEmbedding`` (``VLLM_VERSION``), with the
#: class's defaults: transformers' names (``attention_factor``, ``mscale``, ``mscale_all_dim``), not ``attn_factor``,
#: ``extrapolation_factor`` or ``apply_yarn_scaling``.
_VLLM_YARN = {"beta_fast": 32, "beta_slow": 1, "mscale": None, "mscale_all_dim": None, "attention_factor": None,
              "truncate": True}
#: ``DeepseekScalingRotaryEmbedding``'s keyword arguments (``VLLM_VERSION``): no ``attn_factor``, always truncated.
DEEPSEEK_DEFAULTS = {"beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.0}

#: The keys ``get_rope`` reads for each rope type (beyond ``_ROTARY_KEYS``).
_VLLM_READS = {
    "default": {
        "mrope_section",
        "mrope_interleaved",
        "use_fope",
        "num_key_value_heads",
        "num_inv_freq",
        "fope_sep_head",
        "fope_init_factor",
    },
    "proportional": set(),
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "linear": {"factor"},
    "ntk": {"factor", "mixed_b"},
    "dynamic": {"alpha", "factor", "max_trained_positions"},
    "yarn": {
        "factor",
        "original_max_position_embeddings",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "attention_factor",
        "truncate",
        "mrope_section",
        "mrope_interleaved",
    },
    "deepseek_yarn": {
        "factor",
        "original_max_position_embeddings",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "is_deepseek_v4",
    },
    "longrope": {"short_factor", "long_factor", "original_max_position_embeddings", "short_mscale", "long_mscale"},
}
_VLLM_READS["deepseek_llama_scaling"] = _VLLM_READS["deepseek_yarn"]


def unread(rp: Mapping[str, Any], reads: set[str], where: str, rope_type: str) -> list[str]:
    """``where[key]=value`` for the keys of ``rp`` that the runtime does not read for ``rope_type``."""
    layer_types = ("full_attention", "sliding_attention", "chunked_attention")  # reported by the model files
    return [
        f"{where}[{k!r}]={v!r} (not read for rope_type {rope_type!r})"
        for k, v in rp.items()
        if k not in reads and k not in _ROTARY_KEYS and k not in layer_types and v is not None
    ]


def _need(rp: Mapping[str, Any], key: str, rope_type: str, where: str) -> Any:
    if key not in rp:
        raise _Refused(f"get_rope raises KeyError {key!r}: {where} of rope_type {rope_type!r} lacks it")
    return rp[key]


def _layout(is_neox_style: bool) -> str:
    return "half" if is_neox_style else "interleaved"


def vllm_get_rope(
    head_size: int,
    max_position: int,
    rp: Mapping[str, Any] | None,
    *,
    is_neox_style: bool = True,
    dual_chunk: Mapping[str, Any] | None = None,
    where: str = "rope_parameters",
) -> Built:
    """What vLLM's ``get_rope(head_size, max_position, is_neox_style, rope_parameters, dual_chunk_attention_config)``
    builds, in float64.

    ``rope_theta`` (10000 when absent), ``partial_rotary_factor`` or ``rope_dim``, then the ``rope_type``:
    ``default``, ``linear`` (positions over ``factor``), ``ntk`` (vLLM's *fixed* NTK: base times ``factor``, every
    frequency over ``factor ** (2 / d)``; with ``mixed_b`` mixed NTK), ``dynamic`` (with ``alpha``: base times
    ``alpha ** (d / (d - 2))``; with ``factor``: one static base for ``max_position`` against
    ``max_trained_positions``, which defaults to ``max_position``, i.e. the base unchanged: dynamic NTK is served as
    plain RoPE, and its cos/sin table holds ``max_position_embeddings`` rows while the context allowed is ``factor``
    times that), ``yarn`` (``beta_fast``, ``beta_slow``, ``truncate``; the factor is ``attention_factor``, else the
    ``mscale`` / ``mscale_all_dim`` ratio where both are non-zero, else ``0.1 ln s + 1``; ``attn_factor``,
    ``extrapolation_factor`` and ``apply_yarn_scaling`` unread), ``deepseek_yarn`` (the ``mscale`` /
    ``mscale_all_dim`` ratio, truncated ramp), ``longrope`` (short or long factors chosen once from
    ``max_model_len``, not per sequence), ``llama3``, ``proportional`` (Gemma 4: frequencies over the head size,
    zeros past the rotating pairs; ``factor`` unread); anything else raises (``telechat3-yarn`` is rewritten to
    ``yarn`` before). A ``dual_chunk_attention_config`` (Qwen2/Qwen3) takes precedence over the rope type:
    ``DualChunkRotaryEmbedding`` at plain RoPE frequencies, the rope scaling unread.

    Before vLLM PR #41277 (merged 2026-04-29, the fix of #41236) ``DynamicNTKScalingRotaryEmbedding`` served dynamic
    NTK as static NTK at the constant base ``base * (factor**2 - factor + 1) ** (d / (d - 2))`` over ``factor *
    max_position_embeddings`` positions; SGLang still does (``posenc.runtimes.sglang``).

    Raises:
        _Refused: where ``get_rope`` raises (unknown rope type, missing key, bad partial rotary factor).
    """
    rp = dict(rp or {})
    base = float(rp.get("rope_theta", 10000))
    rope_type = rp.get("rope_type", "default")
    notes: list[str] = []
    if rp.get("rope_dim"):
        dim = int(rp["rope_dim"])
    else:
        partial = rp.get("partial_rotary_factor", 1.0)
        if partial <= 0.0 or partial > 1.0:
            raise _Refused(f"get_rope: partial_rotary_factor={partial} must be between 0.0 and 1.0")
        dim = int(head_size * partial)
    if "rope_theta" not in rp:
        notes.append(f"{where} has no rope_theta: get_rope uses 10000")
    params: dict[str, Any] = {"rope_theta": base, "rope_type": rope_type, "max_position": max_position}
    layout = _layout(is_neox_style)
    if dual_chunk is not None:
        for key in ("chunk_size", "local_size"):
            if key not in dual_chunk:
                raise _Refused(f"DualChunkRotaryEmbedding needs dual_chunk_attention_config[{key!r}] (TypeError)")
        params.update(
            method="dual_chunk",
            chunk_size=int(dual_chunk["chunk_size"]),
            local_size=int(dual_chunk["local_size"]),
            original_max_position_embeddings=dual_chunk.get("original_max_position_embeddings", 0),
            logit_mscale=0.1,
            posenc_method="dca_vllm",
        )
        ignored = []
        if rope_type != "default":
            ignored.append(f"{where} (rope_type {rope_type!r}): the dual-chunk branch of get_rope comes first")
        notes.append(
            "Dual Chunk Attention: DualChunkRotaryEmbedding at plain RoPE frequencies; keys rotated at j mod "
            "(chunk_size - local_size), three query positions per chunk relation; past "
            "dual_chunk_attention_config['original_max_position_embeddings'] logits times "
            "max(1, 0.1 ln(S / L) + 1)**2 (posenc's dca_vllm)"
        )
        notes.append(
            "not verified: whether vLLM's V1 engine serves DCA's attention (the DualChunkFlashAttention"
            " backend came with the V0 engine, vLLM #11844; #20484 reports DCA broken by #18437); CUDA only"
        )
        layer = LayerRope(inv_freq(dim, base), 1.0, dim, layout, "dual_chunk", params, length_dependent=True)
        return Built(layer, max_position, ignored, notes)
    reads = _VLLM_READS.get(rope_type)
    if reads is None:
        raise _Refused(f"get_rope raises ValueError: Unknown RoPE scaling type {rope_type!r} ({where})")
    ignored = unread(rp, reads, where, rope_type)
    factor_af, table, length_dependent = 1.0, max_position, False
    if rope_type == "default":
        if "mrope_section" in rp or rp.get("use_fope"):
            notes.append("not verified: M-RoPE / Fourier RoPE (read here as plain RoPE for text positions)")
        freqs = inv_freq(dim, base)
    elif rope_type == "proportional":
        freqs = proportional_inv_freq(head_size, dim, base)
        params["rotating_pairs"] = dim // 2
        dim = head_size
    elif rope_type == "llama3":
        f, hi, lo = (
            _need(rp, "factor", rope_type, where),
            _need(rp, "high_freq_factor", rope_type, where),
            _need(rp, "low_freq_factor", rope_type, where),
        )
        orig = _need(rp, "original_max_position_embeddings", rope_type, where)
        params.update(factor=f, low_freq_factor=lo, high_freq_factor=hi, original_max_position_embeddings=orig)
        freqs = llama3_inv_freq(dim, base, f, lo, hi, orig)
    elif rope_type == "linear":
        f = _need(rp, "factor", rope_type, where)
        params["factor"] = f
        freqs, table = inv_freq(dim, base) / f, math.ceil(max_position * f)
    elif rope_type == "ntk":
        f = _need(rp, "factor", rope_type, where)
        mixed_b = rp.get("mixed_b")
        params.update(factor=f, mixed_b=mixed_b)
        freqs = ntk_inv_freq(dim, base, f, mixed_b)
        if mixed_b is None:
            notes.append(
                "rope_type 'ntk' is vLLM's fixed NTK (ntk_scaling_rope.py): base times factor, every frequency over "
                "factor ** (2 / d); not posenc's 'ntk' (NTK-aware base change base * factor ** (d / (d - 2)))"
            )
    elif rope_type == "dynamic":
        if "alpha" in rp:
            params["alpha"] = rp["alpha"]
            params["base_used"] = ntk_base(base, dim, rp["alpha"])
            freqs = inv_freq(dim, params["base_used"])
        elif "factor" in rp:
            f = rp["factor"]
            trained = rp.get("max_trained_positions", max_position)
            inner = f * max_position / trained - (f - 1)
            params.update(factor=f, max_trained_positions=trained)
            if inner <= 0:
                notes.append(
                    f"dynamic NTK's base factor {inner:g} <= 0 (max_position {max_position} below "
                    f"max_trained_positions {trained}): vLLM's cache is garbage (vLLM #52665)"
                )
                freqs = torch.full((dim // 2,), math.nan, dtype=torch.float64)
            else:
                params["base_used"] = ntk_base(base, dim, inner)
                freqs = inv_freq(dim, params["base_used"])
            notes.append(
                f"dynamic NTK served static: one base for max_position {max_position} against max_trained_positions "
                f"{trained} ({'the base unchanged: plain RoPE' if inner == 1 else f'base x {inner:g}^(d/(d-2))'}), "
                "not recomputed per sequence length (dynamic_ntk_scaling_rope.py after PR #41277; before it: static "
                "NTK at base * (factor**2 - factor + 1) ** (d / (d - 2)))"
            )
        else:
            raise _Refused("get_rope raises ValueError: Dynamic rope scaling must contain either 'alpha' or 'factor'")
    elif rope_type == "yarn":
        f = _need(rp, "factor", rope_type, where)
        orig = _need(rp, "original_max_position_embeddings", rope_type, where)
        kw = {k: rp.get(k, d) for k, d in _VLLM_YARN.items()}
        params.update(factor=f, original_max_position_embeddings=orig, **kw)
        freqs = yarn_kw_inv_freq(dim, base, f, orig, {**kw, "extrapolation_factor": 1.0})
        factor_af = vllm_yarn_attention_factor(f, kw["mscale"], kw["mscale_all_dim"], kw["attention_factor"])
        table = math.ceil(orig * f)
        old = [k for k in ("attn_factor", "extrapolation_factor", "apply_yarn_scaling") if k in rp]
        new = [k for k in ("attention_factor", "mscale", "mscale_all_dim") if k in rp]
        if old or new:
            notes.append(
                f"YaRN: vLLM >= 0.30.0 reads {', '.join(new) or 'attention_factor, mscale, mscale_all_dim'}"
                + (f" and not {', '.join(old)}" if old else "")
                + "; vLLM 0.29.0 and before read attn_factor, extrapolation_factor, apply_yarn_scaling instead"
            )
        if "mrope_section" in rp:
            notes.append("not verified: YaRN with M-RoPE (MRotaryEmbedding)")
    elif rope_type in ("deepseek_yarn", "deepseek_llama_scaling"):
        f = _need(rp, "factor", rope_type, where)
        orig = _need(rp, "original_max_position_embeddings", rope_type, where)
        kw = {k: rp.get(k, d) for k, d in DEEPSEEK_DEFAULTS.items()}
        params.update(factor=f, original_max_position_embeddings=orig, **kw)
        freqs = yarn_kw_inv_freq(dim, base, f, orig, {**kw, "extrapolation_factor": 1.0, "truncate": True})
        factor_af = yarn_mscale(f, float(kw["mscale"] or 0)) / yarn_mscale(f, float(kw["mscale_all_dim"] or 0))
        table = math.ceil(orig * f)
        if rp.get("is_deepseek_v4"):
            notes.append("not verified: DeepseekV4ScalingRotaryEmbedding")
    elif rope_type == "longrope":
        short = _need(rp, "short_factor", rope_type, where)
        long = _need(rp, "long_factor", rope_type, where)
        orig = _need(rp, "original_max_position_embeddings", rope_type, where)
        if len(short) != dim // 2 or len(long) != dim // 2:
            raise _Refused(f"longrope factors of lengths {len(short)}, {len(long)} for {dim // 2} rotary pairs")
        m = longrope_mscale(max_position, orig)
        params.update(original_max_position_embeddings=orig, long_factor=list(long), short_factor=list(short))
        params.update(short_mscale=rp.get("short_mscale", m), long_mscale=rp.get("long_mscale", m))
        freqs = longrope_inv_freq(dim, base, short)  # the long ones replace them for a max_model_len past orig
        factor_af = params["short_mscale"]
        table = orig  # the short table; the long one (max_position rows) follows it
    else:  # a type listed in _VLLM_READS without a branch
        raise AssertionError(rope_type)
    params["table_positions"] = table
    layer = LayerRope(freqs, float(factor_af), dim, layout, rope_type, params, length_dependent)
    return Built(layer, table, ignored, notes)


# --------------------------------------------------------------------------------------------------------------
# The model files


#: architecture -> the vLLM model file whose RoPE construction this module follows.
_FAMILIES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",
    "Gemma4ForCausalLM": "gemma4",
    "Gemma4ForConditionalGeneration": "gemma4",
    "Llama4ForCausalLM": "llama4",
    "Llama4ForConditionalGeneration": "llama4",
    "GptOssForCausalLM": "gpt_oss",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v2",
}


def attr(config: Any, raw: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """``getattr(config, name)``, or the config.json value where transformers refuses a global read (heterogeneous
    configs raise for a per-layer attribute)."""
    try:
        value = getattr(config, name, default)
    except Exception:
        return raw.get(name, default)
    return raw.get(name, default) if value is None else value


def _ambiguous(config: Any, name: str) -> bool:
    try:
        getattr(config, name, None)
    except Exception:
        return True
    return False


def _head_dim(text: Any) -> int:
    return getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads


def _vllm_layers(parsed: ParsedConfig, gguf: bool) -> tuple[list[Built], list[str], list[str]]:
    """Per layer, what vLLM's model file builds; plus notes and ignored config keys.

    Only the model files that look a layer type up in ``rope_parameters`` use per-layer-type RoPE (Gemma 3 and 4
    here); the others pass the whole dict to ``get_rope``, which then finds no ``rope_theta`` in a dict nested by
    layer type and falls back to 10000. Model files other than those of ``FOLLOWS`` are read as ``llama.py`` reads
    its config (not verified).
    """
    text, config = parsed.text, parsed.config
    arch = (getattr(config, "architectures", None) or ["?"])[0]
    family = _FAMILIES.get(arch)
    notes: list[str] = []
    ignored: list[str] = []
    n = int(text.num_hidden_layers)
    mpe = int(getattr(text, "max_position_embeddings", 8192) or 8192)
    rp = rope_parameters(text)
    dca = getattr(text, "dual_chunk_attention_config", None)
    if dca is not None and family not in ("qwen2", "qwen3"):
        why = "not passed to get_rope by this model file" if family else "this model file not read: not verified"
        ignored.append(f"dual_chunk_attention_config ({why}; vLLM's qwen2.py and qwen3.py pass it)")
    if family is None:
        family = "llama"
        notes.append(f"not verified: vLLM's model file for {arch} was not read; read as llama.py reads its config")

    if family in ("llama", "qwen2", "qwen3"):
        if family == "qwen2":
            head = text.hidden_size // text.num_attention_heads
            if getattr(text, "head_dim", None) not in (None, head):
                ignored.append(f"head_dim={text.head_dim} (qwen2.py uses hidden_size // num_attention_heads = {head})")
            if rp is None or "rope_theta" not in rp:  # set_default_rope_theta(config, 1000000)
                rp = {**(rp or {"rope_type": "default"}), "rope_theta": 1000000.0}
        else:
            head = _head_dim(text)
            if family == "qwen3" and (rp is None or "rope_theta" not in rp):
                rp = {**(rp or {"rope_type": "default"}), "rope_theta": 1000000.0}
        neox = not (gguf and family == "llama" and text.model_type == "llama")
        if is_nested(rp, text):
            notes.append(
                "rope_parameters is nested by layer type and this model file passes it whole to get_rope: the "
                "layer-type entries are not read (rope_theta 10000, rope_type default)"
            )
        elif rp and any(k in rp for k in ("full_attention", "sliding_attention", "chunked_attention")):
            extra = [k for k in rp if k in ("full_attention", "sliding_attention", "chunked_attention")]
            ignored.extend(f"rope_parameters[{k!r}] (this model file reads the flat keys only)" for k in extra)
        built = vllm_get_rope(head, mpe, rp, is_neox_style=neox, dual_chunk=dca if family != "llama" else None)
        if not neox:
            notes.append("GGUF Llama: is_neox_style=False on the GGUF's permuted q/k rows (as llama.cpp rotates them)")
        return [built] * n, notes, ignored

    if family == "gemma3":
        built_by_type: dict[str, Built] = {}
        for kind in sorted(set(text.layer_types)):
            if rp and kind in rp:
                layer_rp = rp[kind]
                where = f"rope_parameters[{kind!r}]"
            else:  # transformers 4 form: flat dict, sliding layers at rope_local_base_freq
                layer_rp, where = rp, "rope_parameters"
                if kind == "sliding_attention":
                    if getattr(text, "rope_local_base_freq", None) is None:
                        raise _Refused("gemma3.py reads config.rope_local_base_freq for the sliding layers: absent")
                    layer_rp = {"rope_type": "default", "rope_theta": text.rope_local_base_freq}
            built_by_type[kind] = vllm_get_rope(text.head_dim, mpe, layer_rp, where=where)
        if rp and is_nested_plus_flat(rp):
            flat = {k: v for k, v in rp.items() if k not in text.layer_types and k not in _ROTARY_KEYS}
            if flat:
                ignored.append(
                    f"rope_parameters {flat} beside the per-layer-type entries: gemma3.py reads "
                    "rope_parameters[layer_type] only"
                )
        return [built_by_type[k] for k in text.layer_types], notes, ignored

    if family == "gemma4":
        built_by_type = {}
        raw = dict(parsed.raw.get("text_config") or parsed.raw)
        sliding_head = attr(text, raw, "head_dim")
        full_head = attr(text, raw, "global_head_dim") or sliding_head
        if _ambiguous(text, "head_dim"):
            notes.append(
                f"transformers {transformers_version()} makes Gemma 4's head_dim a per-layer attribute; "
                "head_dim and global_head_dim read from config.json (not verified with this transformers)"
            )
        for kind in sorted(set(text.layer_types)):
            head = full_head if kind == "full_attention" else sliding_head
            if rp and kind in rp:
                layer_rp, where = dict(rp[kind]), f"rope_parameters[{kind!r}]"
            else:
                layer_rp, where = dict(rp or {}), "rope_parameters"
                if kind == "sliding_attention":
                    layer_rp["rope_theta"] = getattr(text, "rope_local_base_freq", 10000.0)
            built_by_type[kind] = vllm_get_rope(head, mpe, layer_rp, where=where)
        return [built_by_type[k] for k in text.layer_types], notes, ignored

    if family == "llama4":
        rope = vllm_get_rope(text.head_dim, mpe, rp)
        rope = dataclasses.replace(rope, layer=dataclasses.replace(rope.layer, layout="interleaved"))
        chunk = getattr(text, "attention_chunk_size", None)
        nope_params = {
            "attn_temperature_tuning": bool(getattr(text, "attn_temperature_tuning", False)),
            "floor_scale": getattr(text, "floor_scale", 8192.0),
            "attn_scale": getattr(text, "attn_scale", 0.1),
        }
        nope = Built(LayerRope(None, 1.0, 0, "half", "nope", nope_params), None, [], [])
        layers = [nope if text.no_rope_layers[i] == 0 else rope for i in range(n)]
        notes.append(
            "Llama 4: layers with no_rope_layers[i] == 0 have no RoPE (queries times log(floor((pos + 1) / "
            "floor_scale) + 1) * attn_scale + 1 when attn_temperature_tuning); vLLM permutes q/k rows on load and "
            "rotates GPT-NeoX style: the interleaved rotation of the checkpoint's channels"
        )
        if chunk:
            notes.append(f"Llama 4: RoPE layers attend within chunks of attention_chunk_size={chunk}")
        return layers, notes, ignored

    if family == "gpt_oss":
        rp = rp or {}
        for key in ("rope_theta", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow"):
            _need(rp, key, "yarn", "rope_parameters (gpt_oss.py)")
        picked = {
            k: rp[k] for k in ("rope_theta", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow")
        }
        given = rp.get("rope_type")
        built = vllm_get_rope(text.head_dim, mpe, {**picked, "rope_type": "yarn", "truncate": rp.get("truncate", True)})
        if given != "yarn":
            ignored.append(f"rope_parameters['rope_type']={given!r} (gpt_oss.py always builds YaRN)")
        ignored.extend(
            f"rope_parameters[{k!r}]={v!r} (gpt_oss.py passes only rope_theta, factor, "
            "original_max_position_embeddings, beta_fast, beta_slow, truncate)"
            for k, v in rp.items()
            if k not in picked and k not in ("rope_type", "type", "truncate") and v is not None
        )
        return [built] * n, notes, ignored

    if family == "deepseek_v2":
        rp = dict(rp or {})
        if rp.get("rope_type", "default") != "default":
            rp["rope_type"] = "deepseek_llama_scaling" if rp.get("attention_factor") == 1.0 else "deepseek_yarn"
        built = vllm_get_rope(text.qk_rope_head_dim, mpe, rp, is_neox_style=False)
        if rp.get("rope_type") == "deepseek_yarn":
            m = yarn_mscale(rp["factor"], float(rp.get("mscale_all_dim", 0) or 0))
            cast("dict[str, Any]", built.layer.params)["softmax_scale_factor"] = m * m  # a dict at runtime
            built.notes.append(
                "DeepSeek: any non-default rope_type runs as deepseek_yarn; the softmax scale is also multiplied by "
                f"yarn_get_mscale(factor, mscale_all_dim)**2 = {m * m:.6g} (as in transformers' DeepSeek)"
            )
        return [built] * n, notes, ignored
    raise AssertionError(family)


def is_nested_plus_flat(rp: Mapping[str, Any]) -> bool:
    """A dict with layer-type entries and flat keys beside them (a flat v5 dict standardized by Gemma 3's config)."""
    return any(isinstance(v, Mapping) for v in rp.values()) and any(not isinstance(v, Mapping) for v in rp.values())


# --------------------------------------------------------------------------------------------------------------
# The context vLLM allows


_LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


#: Rope types whose ``factor`` ``_get_and_verify_max_len`` does not apply to the config's length (``VLLM_VERSION``).
_UNSCALED_CONTEXT = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def vllm_max_model_len(parsed: ParsedConfig, folder: Path | None) -> tuple[int, dict[str, Any]]:
    """vLLM's default ``max_model_len`` (``_get_and_verify_max_len`` with no ``--max-model-len``) and how it was
    derived.

    The smallest of the config's length keys (and the tokenizer's ``model_max_length``), times ``factor`` for every
    rope type but ``longrope``, ``llama3``, ``yarn``, ``deepseek_yarn`` and ``deepseek_llama_scaling``; Gemma 3
    unscaled; ``longrope`` defaults to the config's ``original_max_position_embeddings``.
    """
    text, config = parsed.text, parsed.config
    derived, key = math.inf, None
    for k in _LENGTH_KEYS:
        value = getattr(text, k, None)
        if value is not None:
            if value < derived:
                key = k
            derived = min(derived, value)
    if getattr(text, "model_max_length", None):
        derived, key = text.model_max_length, "model_max_length"
    how: dict[str, Any] = {"key": key}
    if folder is not None and (folder / "tokenizer_config.json").is_file():
        try:
            tok = json.loads((folder / "tokenizer_config.json").read_text()).get("model_max_length")
        except (OSError, ValueError):
            tok = None
        if isinstance(tok, (int, float)) and tok < derived:
            derived, how["key"] = tok, "tokenizer_config.json model_max_length"
    if derived == math.inf:
        derived = 2048
        how["key"] = "none (vLLM assumes 2048)"
    rp = rope_parameters(config)
    layered = cast(dict, rp).values() if is_nested(rp, config) else ([rp] if rp else [])
    if rp and "gemma3" not in config.model_type:
        scaling = 1.0
        for d in layered:
            if not isinstance(d, Mapping):
                continue
            # YaRN's max_position_embeddings is taken as already scaled (VLLM_VERSION; 41c5903d used
            # original_max_position_embeddings * factor)
            if d.get("rope_type") not in _UNSCALED_CONTEXT:
                scaling = d.get("factor", scaling)
        scaling = 1.0 if scaling is None else scaling
        how["factor"] = scaling
        derived *= scaling
    how["derived"] = int(derived)
    if rp and any(isinstance(d, Mapping) and d.get("rope_type") == "longrope" for d in layered):
        return int(getattr(config, "original_max_position_embeddings", derived)), how
    return int(derived), how


# --------------------------------------------------------------------------------------------------------------
# The reader

#: Why vLLM cannot serve a GGUF file (read in ``vllm/model_executor/model_loader/__init__.py`` of the release).
GGUF_REFUSED = (
    f"vLLM {VLLM_VERSION} has no GGUF loader: its load formats (model_loader/__init__.py LoadFormats) and "
    "quantization methods name no gguf (none in 0.26.0, 0.29.0, 0.30.0, 0.31.0, 0.32.0 either); serve the "
    "transformers folder, or the GGUF with llama.cpp"
)


@register("vllm")
def read_vllm(source: Source) -> RuntimeView:
    """What vLLM (``FOLLOWS``) runs for ``source``: per layer, the RoPE its model file builds; its default
    ``max_model_len``; the keys it does not read; why it would refuse.

    No load format or quantization method of the release reads GGUF: a GGUF file is "cannot run this". Not verified
    (said in the notes of the views concerned): whether the V1 engine serves Dual Chunk Attention's attention (its
    backend came with the V0 engine, vLLM #11844; #20484 reports it broken by #18437); the multimodal, Fourier and XD
    RoPE variants; model files other than those named.
    """
    follows = f"{FOLLOWS}; config parsed by transformers {transformers_version()} as installed"
    if source.kind == "gguf":
        return RuntimeView("vllm", follows, (), None, refused=GGUF_REFUSED, version=RELEASE)
    try:
        parsed = parse_config(source, "vLLM")
        for cfg in {id(parsed.config): parsed.config, id(parsed.text): parsed.text}.values():
            _patch_rope_parameters(cfg)
        built, notes, ignored = _vllm_layers(parsed, gguf=source.kind == "gguf")
    except _Refused as err:
        message = str(err)
        if message.startswith("not verified"):
            return RuntimeView("vllm", follows, (), None, notes=(message,), version=RELEASE)
        return RuntimeView("vllm", follows, (), None, refused=message, version=RELEASE)
    folder = source.path if source.kind == "folder" else None
    context, how = vllm_max_model_len(parsed, folder)
    notes = [*parsed.notes, *notes]
    if (note := missing_original_note(parsed)) is not None:
        notes.append(note)
    for b in _unique(built):
        notes.extend(b.notes)
        ignored.extend(b.ignored)
        if b.table is not None and b.table < context:
            notes.append(
                f"vLLM allows {context} tokens but the {b.layer.method} cos/sin table holds {b.table} positions: "
                "positions past it read beyond the table (not verified what the kernel then reads)"
            )
        if b.layer.method == "longrope":
            orig = b.layer.params["original_max_position_embeddings"]
            notes.append(
                f"LongRoPE: vLLM picks the short or the long factors once, from max_model_len (default {context}): "
                f"with --max-model-len above {orig} every position, short prompts included, uses the long factors "
                f"(times long_mscale {b.layer.params['long_mscale']:.6g})"
            )
    notes.append(f"context: vLLM's default max_model_len from {how}")
    return RuntimeView(
        "vllm",
        follows,
        tuple(b.layer for b in built),
        context,
        tuple(_dedupe([*parsed.ignored, *ignored])),
        None,
        tuple(_dedupe(notes)),
        version=RELEASE,
    )


def _unique(built: list[Built]) -> list[Built]:
    seen: dict[int, Built] = {}
    for b in built:
        seen.setdefault(id(b), b)
    return list(seen.values())


def _dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))
