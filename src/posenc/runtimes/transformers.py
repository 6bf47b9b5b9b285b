"""What transformers (5.x, the installed version) runs for a model: its RoPE per layer, computed by transformers itself.

The reading *is* transformers' computation, not a re-implementation of it (``read_config`` says how): the config
class, the model file's own ``*RotaryEmbedding`` module, and the model files' per-layer rules. The channel layout is
in no config: ``LAYOUTS`` says it per model type. ``context`` is None: transformers does not limit the sequence length
(``max_position_embeddings`` is not enforced; the view's notes give it). ``read_transformers4`` models how
transformers < 5 reads the same folder, for the trap of a v5-only config served by a stack pinned to transformers 4.

Reference: transformers 5.24 ``modeling_rope_utils.py`` (``ROPE_INIT_FUNCTIONS``, ``dynamic_rope_update``,
``RotaryEmbeddingConfigMixin``), ``configuration_utils.py``, ``modeling_gguf_pytorch_utils.py``, and the model files
named in ``LAYOUTS``; checked in ``tests/runtimes/test_transformers_reader.py`` against the cos/sin each layer's
attention receives in a forward of the model transformers builds.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any, cast

import torch

from posenc.hf.layers import LAYER_THETA_MODEL_TYPES
from posenc.runtimes import LayerRope, RuntimeView, Source, register

#: The channel layout each model type's attention applies RoPE in, from its model file (transformers 5.24):
#: "half" where ``apply_rotary_pos_emb`` rotates ``x[..., :D/2]`` against ``x[..., D/2:]`` (``rotate_half``, or
#: gpt-oss's ``_apply_rotary_emb`` chunking the head in two); "interleaved" where pairs are neighbouring channels
#: (Llama 4: ``torch.view_as_complex`` of ``(..., D/2, 2)``). DeepSeek V3 depends on ``config.rope_interleave``.
LAYOUTS: dict[str, str] = {
    **dict.fromkeys(
        (
            "llama",
            "mistral",
            "mixtral",
            "qwen2",
            "qwen2_moe",
            "qwen3",
            "qwen3_moe",
            "phi3",
            "gpt_neox",
            "gemma",
            "gemma2",
            "gemma3_text",
            "gemma4_text",
            "hunyuan_v1_dense",
            "hunyuan_v1_moe",
            "smollm3",
            "gpt_oss",
            "granite_swa",
            "granitemoe_swa",
            "mimo_v2_flash",
        ),
        "half",
    ),
    "llama4_text": "interleaved",
    "deepseek_v3": "rope_interleave",
}
#: Model types whose attention rotates only the rotary channels and passes the rest through (``q_rot, q_pass``);
#: the others rotate the whole head, so a ``partial_rotary_factor`` below 1 fails there (shape mismatch).
PARTIAL_ROTARY = ("phi3", "gpt_neox", "deepseek_v3", "mimo_v2_flash")
#: Model types whose attention skips RoPE where ``config.no_rope_layers[i] == 0`` (``self.use_rope``); Granite-SWA's
#: model skips it where ``layer_rope_theta[i] == 0`` (``posenc.hf.layers.LAYER_THETA_MODEL_TYPES``).
NOPE_LAYERS = ("llama4_text", "smollm3")
#: The rotary module of model types whose model file holds several (the vision tower's is not the text model's).
ROTARY_CLASSES = {"llama4_text": "Llama4TextRotaryEmbedding", "gemma4_text": "Gemma4TextRotaryEmbedding"}
#: Config keys that extend a model in some runtime but that no transformers model reads.
UNREAD_KEYS = {
    "dual_chunk_attention_config": "vLLM (Qwen2/Qwen3) and SGLang (Qwen2) read it for Dual Chunk Attention; no "
    "transformers model reads it",
}


def _version() -> str:
    import transformers

    return transformers.__version__


def _refused(follows: str, reason: str, *, ignored: tuple[str, ...] = (), notes: tuple[str, ...] = ()) -> RuntimeView:
    return RuntimeView("transformers", follows, (), None, ignored=ignored, refused=reason, notes=notes)


def _not_verified(follows: str, reason: str) -> RuntimeView:
    return RuntimeView("transformers", follows, (), None, notes=(f"not verified: {reason}",))


@contextlib.contextmanager
def _transformers_log() -> Iterator[list[str]]:
    """Collect what transformers logs while a config is built (its validation only logs), without printing it."""
    messages: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger = logging.getLogger("transformers")
    handler, level, propagate = _Keep(logging.WARNING), logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    old_handlers = [h for h in logger.handlers if h is not handler]
    for h in old_handlers:
        logger.removeHandler(h)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        for h in old_handlers:
            logger.addHandler(h)
        logger.setLevel(level)
        logger.propagate = propagate


def build_config(config: Mapping[str, Any]) -> tuple[Any, list[str]]:
    """``(PretrainedConfig, messages transformers logged)``: the config ``AutoConfig.from_pretrained`` builds from this
    ``config.json`` dict (``CONFIG_MAPPING[model_type].from_dict``).

    Raises:
        ValueError: naming ``model_type`` when transformers has no config class for it; ``RuntimeError`` carrying
            transformers' own exception when the class refuses the config.
    """
    from transformers import CONFIG_MAPPING

    from posenc._checks import fail

    model_type = config.get("model_type")
    if model_type not in CONFIG_MAPPING:
        fail("model_type", model_type, f"a model type transformers {_version()} has a config class for")
    with _transformers_log() as messages:
        try:
            # a deep copy: transformers fills rope_parameters in place, which would change the source for later readers
            built = CONFIG_MAPPING[cast(str, model_type)].from_dict(copy.deepcopy(dict(config)))
        except Exception as err:  # noqa: BLE001 - transformers raises KeyError, ValueError, TypeError ...
            raise RuntimeError(f"{type(err).__name__}: {err}") from err
    return built, messages


def _rotary_class(text: Any) -> tuple[type | None, str, str]:
    """``(class, modeling file, why not)``: the ``*RotaryEmbedding`` of the text model's own model file."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    name = model_type_to_module_name(text.model_type)
    path = f"transformers.models.{name}.modeling_{name}"
    try:
        module = importlib.import_module(path)
    except ImportError as err:
        return None, path, f"transformers cannot import {path} ({err})"
    wanted = ROTARY_CLASSES.get(text.model_type)
    if wanted is None:
        found = [n for n in vars(module) if n.endswith("RotaryEmbedding") and "Vision" not in n]
        if len(found) != 1:
            return None, path, f"{path} defines {len(found)} text rotary embedding classes ({found}), not one"
        wanted = found[0]
    return getattr(module, wanted, None), f"models/{name}/modeling_{name}.py {wanted}", ""


def _layout(text: Any) -> str | None:
    layout = LAYOUTS.get(text.model_type)
    if layout == "rope_interleave":
        return "interleaved" if getattr(text, "rope_interleave", False) else "half"
    return layout


def _as64(x: torch.Tensor) -> torch.Tensor:
    return x.detach().to("cpu", torch.float64).clone()


def _at_length(rotary: Any, layer_type: str | None, rope_type: str) -> Any:
    """``n -> (inv_freq, attention_factor)`` as ``dynamic_rope_update`` sets them for a sequence of ``n`` tokens (the
    rotary module starts at ``max_position_embeddings`` and is called with the positions of the whole sequence)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    prefix = "" if layer_type is None else f"{layer_type}_"
    original = _as64(getattr(rotary, f"{prefix}original_inv_freq"))
    scaling = float(getattr(rotary, f"{prefix}attention_scaling", getattr(rotary, "attention_scaling", 1.0)))
    kwargs = {} if layer_type is None else {"layer_type": layer_type}
    init = ROPE_INIT_FUNCTIONS[rope_type]

    def at(n: int) -> tuple[torch.Tensor, float]:
        if "dynamic" in rope_type:  # recomputed past the cached length; reset to the original below it
            if n > rotary.original_max_seq_len:
                inv_freq, factor = init(rotary.config, "cpu", seq_len=n, **kwargs)
                return _as64(inv_freq), float(factor)
            return original, scaling
        params = rotary.config.rope_parameters if layer_type is None else rotary.config.rope_parameters[layer_type]
        if n > params["original_max_position_embeddings"]:  # longrope: the long factors, same attention factor
            inv_freq, _ = init(rotary.config, "cpu", seq_len=params["original_max_position_embeddings"] + 1, **kwargs)
            return _as64(inv_freq), scaling
        return original, scaling

    return at


def _head_dim(text: Any) -> int | None:
    return getattr(text, "head_dim", None) or (
        text.hidden_size // text.num_attention_heads if getattr(text, "num_attention_heads", None) else None
    )


def _per_layer_rotary(text: Any, cls: type, rotary: Any) -> list[Any]:
    """The rotary module each decoder layer reads: Granite-SWA's model builds one per distinct non-zero
    ``layer_rope_theta`` from a copy of the config at that base (``GraniteSWAModel.__init__``) and gives a layer whose
    base is 0 no position embeddings (None here); every other model, its one rotary module."""
    n = int(text.num_hidden_layers)
    if text.model_type not in LAYER_THETA_MODEL_TYPES:
        return [rotary] * n
    from posenc.hf._layer_theta import theta_config

    thetas = list(text.layer_rope_theta)
    with _transformers_log(), torch.device("cpu"):
        by_theta = {t: cls(config=theta_config(text, t)) for t in sorted({t for t in thetas if t})}
    return [by_theta[t] if t else None for t in thetas]


def _layers(text: Any, rotaries: list[Any], layout: str) -> tuple[list[LayerRope], list[str]]:
    """One ``LayerRope`` per decoder layer from the rotary module it reads (None: none), by the model files' rules;
    and notes."""
    n = int(text.num_hidden_layers)
    first = next((r for r in rotaries if r is not None), None)
    per_type = isinstance(getattr(first, "rope_type", None), Mapping)
    layer_types = list(getattr(text, "layer_types", None) or [])
    uses_rope = [r is not None for r in rotaries]
    notes: list[str] = []
    if text.model_type in NOPE_LAYERS:
        uses_rope = [bool(f) for f in text.no_rope_layers]
    chunk = getattr(text, "attention_chunk_size", None) if text.model_type == "llama4_text" else None
    layers: list[LayerRope] = []
    for i in range(n):
        layer_type = layer_types[i] if per_type else None
        extra: dict[str, Any] = {} if layer_type is None else {"layer_type": layer_type}
        if chunk and uses_rope[i]:
            extra["attention_chunk_size"] = int(chunk)  # RoPE layers attend within chunks of this many tokens
        params_all = text.rope_parameters
        params = params_all.get(layer_type) if per_type else params_all
        rotary = rotaries[i]
        if not uses_rope[i] or rotary is None or params is None or (per_type and layer_type not in rotary.rope_type):
            if text.model_type == "llama4_text" and getattr(text, "attn_temperature_tuning", False):
                extra.update(attn_temperature_tuning=True, floor_scale=text.floor_scale, attn_scale=text.attn_scale)
            layers.append(LayerRope(None, 1.0, 0, layout, "nope", extra))
            continue
        params = rotary.config.rope_parameters if rotary.config is not text else params  # Granite-SWA: its base
        prefix = "" if layer_type is None else f"{layer_type}_"
        rope_type = rotary.rope_type[layer_type] if per_type else rotary.rope_type
        inv_freq = _as64(getattr(rotary, f"{prefix}inv_freq"))
        factor = float(getattr(rotary, f"{prefix}attention_scaling"))
        dependent = "dynamic" in rope_type or rope_type == "longrope"
        layers.append(
            LayerRope(
                inv_freq=inv_freq,
                attention_factor=factor,
                rotary_dim=2 * inv_freq.numel(),
                layout=layout,
                method=rope_type,
                params={**dict(params), **extra},
                length_dependent=dependent,
                at_length=_at_length(rotary, layer_type, rope_type) if dependent else None,
            )
        )
    return layers, notes


def _ignored_in_config(config: Mapping[str, Any], messages: list[str]) -> tuple[str, ...]:
    """Keys of a ``config.json`` that change what posenc measured but that transformers does not read (the view's
    ``ignored``): ``dual_chunk_attention_config`` (no transformers model reads it; vLLM's Qwen2/Qwen3 and SGLang's
    Qwen2 read it), posenc's own record where it holds an extension the config does not carry
    (``posenc.hf.load_causal_lm`` applies it, transformers does not), ``rope_parameters`` beside a ``rope_scaling``
    (transformers 5 takes ``rope_scaling``), and keys transformers' validation calls unrecognized. For a GGUF file,
    its ``rope.scaling.*`` keys and RoPE factor tensors are ignored too (``_gguf_config``)."""
    from posenc.hf import _record

    ignored = [key for key in UNREAD_KEYS if config.get(key)]
    if _record.not_in_config(_record.saved_extensions(config.get(_record.CONFIG_KEY))):
        ignored.append(_record.CONFIG_KEY)  # an extension only posenc.hf.load_causal_lm re-applies
    scaling, params = config.get("rope_scaling"), config.get("rope_parameters")
    if scaling and params and dict(scaling) != dict(params):
        ignored.append("rope_parameters")  # transformers 5: rope_scaling wins (convert_rope_params_to_dict)
    for message in messages:
        if message.startswith("Unrecognized keys in `rope_parameters`"):
            keys = message.rsplit(": ", 1)[-1].strip("{} ").replace("'", "").split(", ")
            ignored.extend(f"rope_parameters[{k!r}]" for k in keys if k)
    return tuple(dict.fromkeys(ignored))


def _gguf_config(header: Any) -> tuple[dict[str, Any] | None, tuple[str, ...], str]:
    """``(config dict, ignored keys, why not)`` as transformers' GGUF loader builds the config from this header
    (``load_gguf_checkpoint(path, return_tensors=False)["config"]``), from posenc's header reader (no tensor data, no
    ``GGUFReader`` pass over the vocabulary)."""
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING

    from posenc.gguf.header import GGUFArray

    meta = header.metadata
    arch = meta.get("general.architecture")
    name = meta.get("general.name")
    updated = "mistral" if "llama" in str(arch) and name == "mistral" else arch  # `"mistral" in [name]`
    for old, new in (("qwen2moe", "qwen2_moe"), ("gpt_oss", "gpt_oss"), ("gpt-oss", "gpt_oss"),
                     ("qwen3moe", "qwen3_moe"), ("minimax-m2", "minimax_m2")):
        if old in str(arch):
            updated = new
            break
    if "t5" in str(arch):
        return None, (), f"architecture {arch!r}: T5 has no RoPE"
    if arch not in GGUF_CONFIG_MAPPING and updated not in GGUF_CONFIG_MAPPING:
        return None, (), f"transformers' GGUF loader does not load architecture {arch!r} (GGUF_SUPPORTED_ARCHITECTURES)"
    config: dict[str, Any] = {
        "tie_word_embeddings": all(t.name != "output.weight" for t in header.tensors) or arch in ("falcon", "bloom")
    }
    defaults = GGUF_CONFIG_DEFAULTS_MAPPING.get(updated, GGUF_CONFIG_DEFAULTS_MAPPING.get(arch) or {})
    value: Any  # a GGUF metadata value of any type
    for key, value in defaults.items():
        config.setdefault(key, value)
    for key, value in meta.items():
        gguf_key = key.replace(arch, updated)
        prefix, _, config_key = gguf_key.partition(".")
        renames = cast("dict[str, Any] | None", GGUF_CONFIG_MAPPING.get(prefix))
        if renames is None or config_key not in renames:
            continue
        renamed = renames[config_key]
        if renamed is None or renamed == -1 or isinstance(value, GGUFArray):
            continue
        if isinstance(value, tuple):
            value = list(value)
        if isinstance(value, str) and arch in value:
            value = value.replace(arch, updated)
        config[renamed] = value
    if config.get("model_type") == "gemma3":
        config["model_type"] = "gemma3_text"
    if config.get("model_type") == "gemma4":
        config["model_type"] = "gemma4_text"
    dropped = tuple(k for k in meta if k.startswith(f"{arch}.rope.scaling.") or k == f"{arch}.rope.scale_linear")
    if updated == "gpt_oss":
        scaling_type = meta.get("gpt-oss.rope.scaling.type")
        if scaling_type is not None:
            scaling: dict[str, Any] = {"rope_type": scaling_type}
            for key, value in meta.items():
                if key.startswith("gpt-oss.rope.scaling.") and key != "gpt-oss.rope.scaling.type":
                    suffix = key[len("gpt-oss.rope.scaling.") :]
                    if suffix in ("factor", "attention_factor", "beta_fast", "beta_slow"):
                        value = float(value)
                    elif suffix in ("original_context_length", "original_max_position_embeddings"):
                        suffix, value = "original_max_position_embeddings", int(value)
                    scaling[suffix] = value
            config["rope_scaling"] = scaling
        dropped = ()
    if "vocab_size" not in config and isinstance(meta.get("tokenizer.ggml.tokens"), GGUFArray):
        config["vocab_size"] = meta["tokenizer.ggml.tokens"].count
    from posenc.gguf.rope import POSENC_KEY, ROPE_TENSORS

    tensors = tuple(t.name for t in header.tensors if t.name in ROPE_TENSORS)
    record = (POSENC_KEY,) if POSENC_KEY in meta else ()
    return config, (*dropped, *tensors, *record), ""


def _relative_to_file(view: RuntimeView, arch: str) -> RuntimeView:
    """A GGUF's layout is relative to the weights the file holds: where transformers' loader un-permutes the query
    and key rows llama.cpp's converter permuted (``TENSOR_PROCESSORS[arch]`` is ``LlamaTensorProcessor``), its half
    rotation of the un-permuted rows is the interleaved rotation of the file's rows."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, LlamaTensorProcessor

    if not view.layers or TENSOR_PROCESSORS.get(arch) is not LlamaTensorProcessor:
        return view
    flip = {"half": "interleaved", "interleaved": "half"}
    layers = tuple(dataclasses.replace(layer, layout=flip[layer.layout]) for layer in view.layers)
    note = ("layout relative to the file's weights: transformers' GGUF loader un-permutes the q/k rows llama.cpp's "
            "converter interleaved, then rotates halves")
    return dataclasses.replace(view, layers=layers, notes=(*view.notes, note))


def read_config(config: Mapping[str, Any], follows_source: str, ignored: tuple[str, ...] = ()) -> RuntimeView:
    """The view of a ``config.json`` dict (or the dict transformers' GGUF loader builds).

    - The config: ``CONFIG_MAPPING[model_type].from_dict(config.json)``, as ``AutoConfig.from_pretrained`` builds it
      (both config generations: ``rope_scaling``/``rope_theta`` and ``rope_parameters``, flat or per layer type;
      Gemma 3's ``rope_local_base_freq``; Phi-3's top-level ``original_max_position_embeddings``; the multimodal
      wrappers' ``text_config``); for a GGUF file, the config transformers' GGUF loader builds from the header
      (``modeling_gguf_pytorch_utils.load_gguf_checkpoint``'s mapping, ``integrations.ggml.GGUF_CONFIG_MAPPING``),
      which drops ``rope.scaling.*`` for every architecture but gpt-oss.
    - The frequencies: the model file's own ``*RotaryEmbedding`` module built from that config
      (``ROPE_INIT_FUNCTIONS`` or its own ``compute_default_rope_parameters``; HunYuan's ``alpha``, gpt-oss's
      ``truncate``, DeepSeek's ``mscale``/``mscale_all_dim`` ratio, Gemma 4's per-layer-type head dims all come from
      there), and for the length-dependent types (``dynamic``, ``longrope``) ``dynamic_rope_update``'s rule at a
      given length.
    - The layers: the rules of the model files, one per layer: per-layer-type tables where the rotary module keeps
      one per type (Gemma 3/4: ``config.layer_types[i]``), no RoPE where the attention reads
      ``config.no_rope_layers[i] == 0`` (Llama 4, SmolLM3), Llama 4's chunked attention on its RoPE layers
      (``attention_chunk_size``, in ``params``), Granite-SWA's rotary module per base (``config.layer_rope_theta[i]``,
      built as its model builds it; 0: no RoPE). A model type outside ``LAYOUTS`` is still read with its rotary
      module, noted ``not verified``.
    """
    follows = f"transformers {_version()}: {follows_source}"
    if config.get("auto_map") and config.get("model_type") not in _config_mapping():
        return _refused(follows, "the model ships its own code (auto_map) and its model_type is not in transformers: "
                        "only trust_remote_code=True runs it, with code posenc does not read")
    try:
        built, messages = build_config(config)
    except ValueError as err:
        return _refused(follows, str(err))
    except RuntimeError as err:
        return _refused(follows, f"{config.get('model_type')}'s config class refuses this config ({err})")
    text = built.get_text_config() if hasattr(built, "get_text_config") else built
    from posenc.hf.alibi import ALIBI_MODEL_TYPES

    if text.model_type in ALIBI_MODEL_TYPES:
        return _not_verified(follows, f"{text.model_type} uses ALiBi, not RoPE: posenc's runtime readers compare RoPE")
    cls, where, why = _rotary_class(text)
    follows = f"{follows}; {where}; modeling_rope_utils.ROPE_INIT_FUNCTIONS"
    ignored = tuple(dict.fromkeys((*ignored, *_ignored_in_config(config, messages))))
    if cls is None:
        return RuntimeView("transformers", follows, (), None, ignored=ignored,
                           notes=(f"not verified: {why}",))
    try:
        with _transformers_log(), torch.device("cpu"):
            rotary = cls(config=text)
    except Exception as err:  # noqa: BLE001 - what transformers raises building the model, as it raises it
        return _refused(follows, f"{cls.__name__}(config) raises {type(err).__name__}: {err}", ignored=ignored)
    notes: list[str] = []
    layout = _layout(text)
    if layout is None:
        notes.append(f"not verified: model_type {text.model_type!r} is outside posenc's table of transformers' "
                     "layouts and per-layer rules (posenc.runtimes.transformers.LAYOUTS); read with its rotary "
                     "module as 'half', one table for every layer")
        layout = "half"
    try:
        rotaries = _per_layer_rotary(text, cls, rotary)
    except Exception as err:  # noqa: BLE001 - what transformers raises building the model, as it raises it
        return _refused(follows, f"{cls.__name__}(config) raises {type(err).__name__}: {err}", ignored=ignored)
    layers, more = _layers(text, rotaries, layout)
    notes += more
    uniform = not isinstance(rotary.rope_type, Mapping) and not getattr(text, "is_heterogeneous", False)
    head_dim = _head_dim(text) if uniform else None  # Gemma 4's per-layer head dims are in its per-layer tables
    if text.model_type not in PARTIAL_ROTARY and head_dim:
        widths = {layer.rotary_dim for layer in layers if layer.inv_freq is not None}
        if widths and widths != {head_dim}:
            return _refused(
                follows,
                f"{text.model_type}'s attention rotates the whole head ({head_dim} channels) but its RoPE tables have "
                f"{sorted(widths)[0]} (partial_rotary_factor): apply_rotary_pos_emb fails on the shapes",
                ignored=ignored,
            )
    context = getattr(text, "max_position_embeddings", None)
    notes.append(f"transformers does not limit the sequence length: max_position_embeddings ({context}) is "
                 "not enforced")
    old = _transformers4_note(config)
    if old:
        notes.append(old)
    return RuntimeView("transformers", follows, tuple(layers), None, ignored=ignored, notes=tuple(notes))


def _config_mapping() -> Any:
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING


@register("transformers")
def read_transformers(source: Source) -> RuntimeView:
    """What the installed transformers runs for ``source``: a folder or ``config.json`` as ``from_pretrained`` reads
    its config, a GGUF file as ``from_pretrained(..., gguf_file=...)`` does."""
    try:
        _version()
    except ImportError:
        return _not_verified("transformers (not installed)", "transformers is not installed (pip install 'posenc[hf]')")
    if source.kind == "gguf":
        config, ignored, why = _gguf_config(source.gguf)
        follows = "modeling_gguf_pytorch_utils.load_gguf_checkpoint (integrations/ggml.py GGUF_CONFIG_MAPPING)"
        if config is None:
            return _refused(f"transformers {_version()}: {follows}", why)
        return _relative_to_file(read_config(config, follows, ignored), source.gguf.architecture)
    config_json = cast("Mapping[str, Any]", source.config)  # a transformers folder's config.json
    return read_config(config_json, "configuration_auto CONFIG_MAPPING[model_type].from_dict")


# ---------------------------------------------------------------------------------------------------------------
# transformers < 5, modeled


def _v4_reading(config: Mapping[str, Any]) -> tuple[float, Mapping[str, Any] | None, float]:
    """``(rope_theta, rope_scaling, partial_rotary_factor)`` as transformers 4.x reads a config.json: the top-level
    keys only (a v5 ``rope_parameters`` is an unknown attribute there), the config class's default base when absent."""
    theta = config.get("rope_theta")
    if theta is None:
        default = getattr(_config_mapping().get(config.get("model_type")), "default_theta", 10000.0)
        theta = default.get("global", 10000.0) if isinstance(default, Mapping) else default
    partial = config.get("partial_rotary_factor") or config.get("rotary_pct") or 1.0
    return float(theta), config.get("rope_scaling") or None, float(partial)


def _transformers4_note(config: Mapping[str, Any]) -> str | None:
    """A note where transformers 4 (and the stacks pinned to it) would run another RoPE than transformers 5."""
    params = config.get("rope_parameters")
    if not isinstance(params, Mapping) or not params or any(isinstance(v, Mapping) for v in params.values()):
        return None
    theta, scaling, _ = _v4_reading(config)
    v5_type = params.get("rope_type", params.get("type", "default"))
    v4_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    v5_theta = params.get("rope_theta", config.get("rope_theta"))
    if v4_type == v5_type and (v5_theta is None or float(v5_theta) == theta):
        return None
    return (f"transformers < 5 reads only rope_theta and rope_scaling, which say {v4_type} RoPE with base {theta:g} "
            f"(this config's rope_parameters: {v5_type}, base {v5_theta}): a stack pinned to transformers 4 runs "
            "another RoPE; add rope_scaling (and rope_theta) beside rope_parameters for it")


def read_transformers4(source: Source) -> RuntimeView:
    """A model of how transformers 4.x (``modeling_rope_utils`` up to 4.57: ``config.rope_theta``,
    ``config.rope_scaling``, ``config.partial_rotary_factor``) reads a folder: the same formulas as 5.x (posenc's
    scalings, which follow them), from the top-level keys only. Not registered: transformers 4 is not installed here,
    so this is a model of it, for ``posenc.runtimes.check.compare`` and the note in ``read_transformers``."""
    from posenc.scalings import rope_frequencies

    follows = "modeled on transformers 4.57 modeling_rope_utils (not installed): rope_theta and rope_scaling only"
    if source.kind == "gguf" or source.config is None:
        return _not_verified(follows, "a GGUF file (transformers 4's GGUF loader is not modeled)")
    config = dict(source.config)
    theta, scaling, partial = _v4_reading(config)
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    params = dict(scaling or {})
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in ("yarn", "longrope", "llama3"):
        params.setdefault("original_max_position_embeddings", config.get("original_max_position_embeddings")
                          or config.get("max_position_embeddings"))
    if kind in ("dynamic", "yarn", "longrope"):
        params.setdefault("max_position_embeddings", config.get("max_position_embeddings"))
    inv_freq, factor = rope_frequencies(head_dim, base=theta, scaling=params or None, partial_rotary_factor=partial)
    read_as = {"rope_type": kind, "rope_theta": theta, **{k: v for k, v in params.items() if k != "type"}}
    layer = LayerRope(inv_freq.double(), float(factor), 2 * inv_freq.numel(), "half", kind, read_as)
    n = int(config.get("num_hidden_layers", 1))
    return RuntimeView("transformers", follows, (layer,) * n, None)
