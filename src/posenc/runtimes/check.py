"""``check``: does each runtime run what posenc measured? One ``Row`` per runtime, from config.json or a GGUF header.

What posenc measured (``reference``: its own record in a folder or GGUF it wrote, else the config as transformers
reads it) is compared with what each runtime's reader says it runs (``compare``: per layer, RoPE or none, rotary
dims and layout, ``max |Δ inv_freq|`` within ``inv_freq_tolerance``, the attention factor, the context). A verdict
is one of ``STATUSES``; ``posenc check`` exits 1 on ``FAILING`` ones (``exit_status``). Every row names the runtime
release its reader follows (``Row.version``).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from posenc._check_rows import FAILING as FAILING  # the rows and their table, importable without torch
from posenc._check_rows import HEADERS as HEADERS
from posenc._check_rows import Row as Row
from posenc._check_rows import _number
from posenc._check_rows import all_same as all_same
from posenc._check_rows import exit_status as exit_status
from posenc._check_rows import format_rows as format_rows
from posenc._check_rows import print_rows as print_rows
from posenc._checks import check_choice, check_positive_int, fail
from posenc.runtimes import RUNTIMES, LayerRope, RuntimeView, Source, inputs, read

#: float32 unit roundoff, and the roundings beyond the exponent's in the longest frequency computation
#: (``inv_freq_tolerance``).
U32 = 2.0**-24
ROUNDINGS = 8
#: The status that starts every verdict: ``same``, ``differs: ...`` (the number, and the fix: the key to add or the
#: flag to pass), ``cannot run this: ...`` (the runtime refuses the model) or ``not verified: ...`` (nothing is
#: guessed: a runtime posenc has no reader for, a layer whose frequencies depend on the length and whose reader gives
#: them at one length only, a model type outside a reader's tables). Only ``same`` is shown safe to deploy;
#: ``posenc check`` exits 1 on ``differs`` and ``cannot run this`` only (``--strict``: on ``not verified`` too).
STATUSES = ("same", "differs", "cannot run this", "not verified")


def inv_freq_tolerance(inv_freq: torch.Tensor) -> torch.Tensor:
    """Per frequency, how far two float32 computations of it may differ: ``2 (ROUNDINGS + |ln theta|) u theta``
    (zero for a pair that does not rotate, frequency 0).

    Both sides compute ``base ** (-2i/d)`` and a few scalings in float32. The exponent ``2i/d`` is rounded once
    (relative error ``u``, ``u = 2**-24``), which moves ``theta = base**-e`` by ``|ln theta| u`` relatively; ``pow``,
    the division and a scaling's blend (YaRN's ramp, Llama 3's smoothing: the longest chain) add at most 8 more
    roundings of ``u`` each. Two such computations differ by at most ``2 (8 + |ln theta|) u theta`` per frequency:
    2.6e-6 relative for theta = 1e-6, where a wrong base, factor, original length or ramp moves a frequency by 1e-3
    or more.
    """
    theta = inv_freq.abs().double()
    logs = torch.where(theta > 0, theta.clamp_min(1e-300).log().abs(), torch.zeros_like(theta))
    return 2 * (ROUNDINGS + logs) * U32 * theta


def attention_tolerance(value: float) -> float:
    """How far two readings of one attention factor may differ: ``4 u max(1, |a|)`` (float64 on every side but a
    GGUF's float32 keys)."""
    return 4 * U32 * max(1.0, abs(value))


@dataclasses.dataclass(frozen=True)
class Reference:
    """What posenc measured: ``layers`` (as a runtime's ``LayerRope``), the ``context`` it extended the model to (None:
    no limit, dynamic NTK), the extensions it ran that live in a config key of their own (``remaps``: ``{"key",
    "method", "call"}``), where it comes from (``source``) and ``notes``."""

    source: str
    layers: tuple[LayerRope, ...]
    context: int | None
    remaps: tuple[Mapping[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    path: str = ""
    original: int | None = None  # the context the model was trained at, before posenc extended it
    unverified: tuple[str, ...] = ()  # what is not verified about the reference itself (from the reading it is)
    kind: str = "folder"  # the source's kind: "folder", "config" or "gguf"
    gguf_fixes: tuple[str, ...] = ()  # a GGUF whose llama.cpp keys were edited: the keys that say the record again




# ---------------------------------------------------------------------------------------------------------------
# The reference


def _posenc_layer(
    cfg: Mapping[str, Any], layer_type: str | None, extra: Mapping[str, Any], base: float | None = None
) -> LayerRope:
    """One layer's RoPE as posenc computes it for the config dict ``cfg`` (``rotary_config_from_hf`` and posenc's
    scalings; ``base``: the layer's own, Granite-SWA's ``layer_rope_theta``), float32 like the model posenc patched,
    returned in float64."""
    from posenc.hf.rotary import rotary_config_from_hf
    from posenc.scalings import rope_frequencies

    setup = rotary_config_from_hf(dict(cfg), layer_type=layer_type)
    if base is not None:
        setup = dataclasses.replace(setup, base=base)

    def at(n: int | None) -> tuple[torch.Tensor, float]:
        inv_freq, factor = rope_frequencies(setup.head_dim, base=setup.base, scaling=setup.scaling,
                                            partial_rotary_factor=setup.partial_rotary_factor, seq_len=n)
        return inv_freq.double(), float(factor)

    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    own = params.get(layer_type) if layer_type is not None else params
    inv_freq, factor = at(None)
    dependent = setup.scaling is not None and setup.scaling.depends_on_length
    return LayerRope(inv_freq, factor, 2 * inv_freq.numel(), setup.layout,
                     setup.scaling.rope_type if setup.scaling is not None else "default",
                     {**dict(own or {}), **dict(extra)}, length_dependent=dependent,
                     at_length=at if dependent else None)


def _text(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    text = cfg.get("text_config")
    return text if isinstance(text, Mapping) and "num_hidden_layers" in text else cfg


def _posenc_layers(cfg: Mapping[str, Any], structure: Callable[[], RuntimeView] | None) -> tuple[LayerRope, ...]:
    """Every layer as posenc computes it: which layer has which RoPE type and which has none from the config
    (``layer_types``; ``posenc.hf.layers.rope_layers`` for NoPE), else from the runtime view ``structure()`` (read
    only then)."""
    from posenc.hf.layers import layer_thetas, rope_layers

    cfg = _text(cfg)
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    nested = {k for k, v in params.items() if isinstance(v, Mapping)}
    n = int(cfg["num_hidden_layers"])
    types: list[str | None] = [None] * n
    if nested:
        types = list(cfg.get("layer_types") or [])
        view = structure() if len(types) != n and structure is not None else None
        if view is not None and len(view.layers) == n:
            types = [layer.params.get("layer_type") for layer in view.layers]
        if len(types) != n:
            fail("config", "{...}", f"'layer_types' for its {n} layers (it has per-layer-type rope_parameters)")
    uses = rope_layers(cfg)
    thetas = layer_thetas(cfg) or (None,) * n  # Granite-SWA: a base per layer
    cache: dict[tuple[str | None, float | None], LayerRope] = {}
    layers = []
    for i in range(n):
        extra = {} if types[i] is None else {"layer_type": types[i]}
        if not uses[i] or (types[i] is not None and params.get(types[i]) is None):
            layers.append(LayerRope(None, 1.0, 0, "half", "nope", extra))
            continue
        key = (types[i], thetas[i])
        if key not in cache:
            cache[key] = _posenc_layer(cfg, types[i], extra, thetas[i])
        layers.append(cache[key])
    return tuple(layers)


def _record_reference(source: Source, structure: Callable[[], RuntimeView] | None) -> Reference | None:
    """What posenc measured, from the ``"posenc"`` record of a folder it wrote; None without one."""
    from posenc.hf import _record

    config = dict(source.config or {})
    entries = _record.saved_extensions(config.get(_record.CONFIG_KEY))
    if not entries:
        return None
    notes = []
    frequency = [e for e in entries if e.get("in_config")]
    measured = dict(config)
    measured.pop("rope_scaling", None)  # posenc wrote rope_parameters; a rope_scaling beside it was added later
    if frequency and isinstance(frequency[-1].get("rope_parameters"), Mapping):
        last = frequency[-1]
        layer_type = last.get("arguments", {}).get("layer_type")
        params = dict(config.get("rope_parameters") or {})
        recorded = dict(last["rope_parameters"])
        measured["rope_parameters"] = {**params, layer_type: recorded} if layer_type else recorded
        if last.get("max_position_embeddings") is not None:
            measured["max_position_embeddings"] = last["max_position_embeddings"]
        if "original_max_position_embeddings" in config and recorded.get("original_max_position_embeddings"):
            measured["original_max_position_embeddings"] = recorded["original_max_position_embeddings"]
    elif frequency:
        notes.append("posenc's record predates its rope_parameters field: the config's RoPE is taken as posenc "
                     "wrote it")
        measured["rope_parameters"] = config.get("rope_parameters") or config.get("rope_scaling")
    remaps = []
    for entry in _record.not_in_config(entries):
        key = "dual_chunk_attention_config" if entry["method"] == "dca_vllm" else _record.CONFIG_KEY
        remaps.append({"key": key, "method": _record.label(entry), "call": _record.call(entry, explicit=True),
                       "applied_by_loader": True, **_measured_dca(entry)})
    last = entries[-1]
    dynamic = last.get("in_config") and last["method"] == "dynamic"
    context = None if dynamic else last.get("max_position_embeddings")
    methods = " then ".join(_record.label(e) for e in entries)
    return Reference(f"posenc's record in config.json ({methods})", _posenc_layers(measured, structure), context,
                     tuple(remaps), tuple(notes),
                     original=entries[0].get("original_max_position_embeddings"))


def _measured_dca(entry: Mapping[str, Any]) -> dict[str, Any]:
    """``{"expected": dual_chunk_attention_config}`` for a ``dca_vllm`` record: the chunk_size, local_size and
    original length posenc ran (rebuilt as ``extend_context`` built them); empty for another method or a record that
    does not rebuild."""
    from posenc.remapping import DualChunk, remap_method

    if entry.get("method") != "dca_vllm":
        return {}
    try:
        method = remap_method("dca_vllm", original=int(entry["original_max_position_embeddings"]),
                              target=int(entry["max_position_embeddings"]), **dict(entry.get("options") or {}))
    except (ValueError, KeyError, TypeError):
        return {}
    assert isinstance(method, DualChunk)  # remap_method's class for dca_vllm
    return {"expected": {"chunk_size": method.chunk_size, "local_size": method.local_window,
                         "original_max_position_embeddings": method.original_max_position_embeddings}}


def _dca_call(dca: Mapping[str, Any], context: Any) -> str:
    """The ``extend_context`` call that runs a ``dual_chunk_attention_config`` as vLLM serves it (posenc's
    ``dca_vllm`` with its chunk_size, local_size and original length), or why posenc has none."""
    from posenc.hf._record import number
    from posenc.remapping import remap_method

    try:
        chunk, local, original = (int(dca[k]) for k in ("chunk_size", "local_size",
                                                        "original_max_position_embeddings"))
        target = int(context)
        remap_method("dca_vllm", original=original, target=target, chunk_size=chunk, local_window=local)
    except (ValueError, KeyError, TypeError) as err:
        return f"posenc has no call that runs it ({err})"
    return (f"posenc.hf.extend_context(model, 'dca_vllm', {number(target / original)}, "
            f"original_max_position_embeddings={original}, chunk_size={chunk}, local_window={local})")


def _gguf_reference(source: Source, transformers: Callable[[], RuntimeView]) -> Reference:
    """A GGUF file: posenc's own record, or the llama.cpp keys as posenc's loader reads them (Llama), else
    transformers' reading (posenc loads the other architectures with transformers' GGUF loader)."""
    from posenc.gguf import llama as gguf_llama
    from posenc.gguf import rope as gguf_rope

    header = source.gguf
    if not gguf_llama.handles(header):
        if header.architecture in gguf_rope.WRITES and gguf_rope.recorded(header.metadata) is not None:
            return _written_gguf_reference(header, transformers)
        return _runtime_reference(transformers(), "the GGUF as transformers' loader reads it (posenc loads this "
                                  "architecture with it)", None)
    params, context, exact = gguf_llama.rope_config(header)
    meta = header.metadata
    head_dim = int(meta.get("llama.rope.dimension_count") or meta["llama.embedding_length"] //
                   meta["llama.attention.head_count"])
    notes = ["layout relative to the file's weights: llama.cpp's converter permutes q/k rows to neighbouring pairs"]
    fixes: tuple[str, ...] = ()
    saved = gguf_rope.recorded(meta)
    if saved is not None:  # what posenc measured, even where the llama.cpp keys were edited after the export
        if not exact:
            fixes = tuple(gguf_rope.key_fixes(meta, gguf_llama.rope_tensors(header), *saved, head_dim=head_dim))
            notes.append("the file's llama.cpp RoPE keys no longer say what posenc's posenc.rope record says (edited "
                         "after the export); the record is the reference")
        params, context = saved
    cfg = {"model_type": "llama", "rope_parameters": params, "max_position_embeddings": context,
           "head_dim": head_dim, "num_hidden_layers": int(meta["llama.block_count"])}
    layers = tuple(dataclasses.replace(layer, layout="interleaved") for layer in _posenc_layers(cfg, None))
    kind = params.get("rope_type", "default")
    source_text = ("posenc's posenc.rope record in the GGUF" if saved is not None else
                   "the GGUF's llama.cpp keys as posenc's loader reads them") + f" ({kind})"
    return Reference(
        source_text,
        layers,
        None if kind == "dynamic" else context,
        notes=tuple(notes),
        original=params.get("original_max_position_embeddings") or context,
        gguf_fixes=fixes,
    )


def _written_gguf_reference(header: Any, transformers: Callable[[], RuntimeView]) -> Reference:
    """A Qwen2 / Gemma 3 GGUF posenc wrote (``posenc.hf.save_gguf``): its ``posenc.rope`` record, per layer type with
    the record's ``layer_types`` (else transformers' reading of the file's); the layout is the file's own (these
    converters do not permute q/k rows)."""
    from posenc.gguf import llama as gguf_llama
    from posenc.gguf import rope as gguf_rope

    meta, arch = header.metadata, header.architecture
    saved = gguf_rope.recorded(meta)
    assert saved is not None  # the caller checked
    params, context = saved
    head_dim = int(meta.get(f"{arch}.rope.dimension_count") or meta.get(f"{arch}.attention.key_length") or
                   meta[f"{arch}.embedding_length"] // meta[f"{arch}.attention.head_count"])
    cfg: dict[str, Any] = {"rope_parameters": params, "max_position_embeddings": context, "head_dim": head_dim,
                           "num_hidden_layers": int(meta[f"{arch}.block_count"]),
                           "model_type": {"gemma3": "gemma3_text"}.get(arch, arch)}
    types = gguf_rope.recorded_layer_types(meta)
    if types is not None:
        cfg["layer_types"] = types
    notes: list[str] = []
    fixes: tuple[str, ...] = ()
    tensors = gguf_llama.rope_tensors(header)
    if not gguf_rope.agrees(meta, tensors, arch=arch, path=str(header.path)):
        fixes = tuple(gguf_rope.key_fixes(meta, tensors, params, context, head_dim=head_dim, arch=arch))
        notes.append("the file's llama.cpp RoPE keys no longer say what posenc's posenc.rope record says (edited "
                     "after the export, or its layer pattern is not the record's); the record is the reference")
    main = gguf_rope.LAYER_TYPES.get(arch, (None,))[0]
    own = params.get(main) if main is not None else params
    kind = own.get("rope_type", "default") if isinstance(own, Mapping) else "default"
    where = f" on {main}" if main is not None else ""
    return Reference(
        f"posenc's posenc.rope record in the GGUF ({kind}{where})",
        _posenc_layers(cfg, transformers),
        None if kind == "dynamic" else context,
        notes=tuple(notes),
        original=(own.get("original_max_position_embeddings") if isinstance(own, Mapping) else None) or context,
        gguf_fixes=fixes,
    )


def _runtime_reference(view: RuntimeView, source: str, config: Mapping[str, Any] | None) -> Reference:
    """The reference where posenc measured nothing of its own: a runtime's reading (transformers'), with the
    extension keys the config carries for the runtimes that read them."""
    remaps = []
    if config is not None and config.get("dual_chunk_attention_config"):
        dca = config["dual_chunk_attention_config"]
        remaps.append({"key": "dual_chunk_attention_config", "method": f"Dual Chunk Attention {dict(dca)}",
                       "call": _dca_call(dca, _text(config).get("max_position_embeddings")),
                       "applied_by_loader": False})
    dynamic = any(layer.method is not None and "dynamic" in layer.method for layer in view.layers)
    context = original = None
    if config is not None:
        text = _text(config)
        context = None if dynamic else text.get("max_position_embeddings")
        own = [layer.params.get("original_max_position_embeddings") for layer in view.layers if layer.params]
        original = next((int(x) for x in own if x), None) or text.get("max_position_embeddings")
    unverified = tuple(f"the reference ({view.runtime}'s reading): {n.removeprefix('not verified: ')}"
                       for n in view.notes if n.startswith("not verified"))
    return Reference(source, view.layers, context, tuple(remaps), original=original, unverified=unverified)


def reference(source: Source, transformers: RuntimeView | None = None) -> Reference:
    """What posenc measured for ``source``; ``transformers``: its transformers view, read when not given.

    - A folder posenc wrote (``posenc.hf.save_pretrained``, ``posenc export``): its own record,
      ``config.json["posenc"]``. The RoPE is rebuilt with posenc's own scalings (``posenc.scalings``,
      ``rotary_config_from_hf``) from the ``rope_parameters`` the record holds (older records: from the config's,
      noted), per layer type; the extensions the config does not carry (a remapping method: ``dca_vllm`` as
      ``dual_chunk_attention_config``) and the context the model was extended to come from the record too.
    - A GGUF file posenc wrote (Llama, Qwen2, Gemma 3 per layer type): its ``posenc.rope`` record, also where the
      llama.cpp keys were edited after the export (each runtime is compared with what was measured; llama.cpp's fix
      names the keys that say the record again); another Llama GGUF: the llama.cpp keys as posenc's loader reads
      them; another GGUF: transformers' reading.
    - Anything else: the config as transformers reads it (``posenc.runtimes.transformers``), with the extension keys
      it carries for other runtimes (``dual_chunk_attention_config``: for transformers, the ``extend_context`` call
      that runs it as vLLM serves it, since no loader applies it without posenc's record).

    Keys no runtime computes with (a missing layer count or ``context_length``, a string or out-of-range RoPE number,
    a GGUF key stored with another type) are refused first (``posenc.runtimes.inputs``).

    Raises:
        ValueError: naming the path, where nothing can serve as the reference (transformers cannot read the model and
            posenc wrote no record).
    """
    views = [] if transformers is None else [transformers]

    def reading() -> RuntimeView:  # transformers' view, read once, only where the reference needs it
        if not views:
            views.append(read(source, "transformers"))
        return views[0]

    if source.kind == "gguf":
        ref = _gguf_reference(source, reading)
    else:
        ref = _record_reference(source, reading) or _runtime_reference(
            reading(), "the config as transformers reads it (no posenc record)", source.config
        )
    if not ref.layers:
        why = reading().refused or "; ".join(reading().notes) or "no layers read"
        fail("path", str(source.path), f"a model posenc wrote or transformers reads (transformers: {why})")
    return dataclasses.replace(ref, path=str(source.path), kind=source.kind)


# ---------------------------------------------------------------------------------------------------------------
# The comparison



def _layer_list(indices: Sequence[int], layers: Sequence[LayerRope]) -> str:
    """``layers 0, 2 (sliding_attention)``: which layers, and their type where the model has types."""
    kinds = sorted({str(layers[i].params.get("layer_type")) for i in indices if layers[i].params.get("layer_type")})
    types = f" ({', '.join(kinds)})" if kinds else ""
    if len(indices) == len(layers) and len(layers) > 2:
        return f"all {len(layers)} layers{types}"
    shown = ", ".join(str(i) for i in indices[:6]) + (f", ... ({len(indices)} in all)" if len(indices) > 6 else "")
    return f"{'layer' if len(indices) == 1 else 'layers'} {shown}{types}"


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=4 * U32, abs_tol=0.0)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _param_fixes(view: RuntimeView, ref: Reference, bad: Sequence[int]) -> list[str]:
    """The keys whose values differ between the runtime's reading and posenc's, on the layers that differ."""
    fixes: dict[str, str] = {}
    for i in bad:
        ours, theirs = ref.layers[i].params, view.layers[i].params
        layer_type = ours.get("layer_type")
        where = f"rope_parameters[{layer_type!r}]" if layer_type else "rope_parameters"
        for key, value in ours.items():
            if key in ("layer_type", "attention_chunk_size") or value is None:
                continue
            if key not in theirs or not _same_value(theirs[key], value):
                was = "absent" if key not in theirs else repr(theirs[key])
                fixes[f"{where}[{key!r}]"] = f"{where}[{key!r}] = {value!r} (read: {was})"
    return list(fixes.values())


def _compare_tables(a: LayerRope, b: LayerRope, inv_a: torch.Tensor, inv_b: torch.Tensor, fa: float, fb: float
                    ) -> tuple[float, float, float]:
    """``(max |Δ inv_freq|, its ratio to the tolerance, |Δ attention factor|)``."""
    delta = (inv_a.double() - inv_b.double()).abs()
    ratio = delta / inv_freq_tolerance(inv_b).clamp_min(torch.finfo(torch.float64).tiny)
    ratio = torch.where(delta == 0, torch.zeros_like(ratio), ratio)
    return float(delta.max()) if delta.numel() else 0.0, float(ratio.max()) if ratio.numel() else 0.0, abs(fa - fb)


def _probe_lengths(ref: Reference, length: int | None) -> list[int]:
    """The lengths at which length-dependent layers are compared: ``length``, else the context posenc extended to;
    dynamic NTK, which has none, at its factor times the original context and at twice that (where a runtime that
    serves it at one fixed base parts from it)."""
    if length is not None:
        return [length]
    if ref.context is not None:
        return [int(ref.context)]
    read = [layer.params.get("max_position_embeddings") or layer.params.get("original_max_position_embeddings")
            for layer in ref.layers if layer.length_dependent]
    originals = [int(x) for x in read if x] or ([int(ref.original)] if ref.original else [])
    if not originals:
        return []
    factors = [float(layer.params.get("factor") or 2.0) for layer in ref.layers if layer.length_dependent]
    reach = math.ceil(max(factors, default=2.0) * max(originals))
    return [reach, 2 * reach]


def _rotary_text(layers: Sequence[LayerRope]) -> str:
    if not layers:
        return "-"
    dims = sorted({layer.rotary_dim for layer in layers})
    layouts = sorted({layer.layout for layer in layers if layer.inv_freq is not None} or {layers[0].layout})
    return f"{'/'.join(str(d) for d in dims)} {'/'.join(layouts)}"


def _ignores(view: RuntimeView, key: str) -> bool:
    """Whether the runtime ignores config key ``key`` (an entry is the key, or the key and why in parentheses)."""
    return any(entry == key or entry.startswith(key + " ") for entry in view.ignored)


def _fix_for_remap(runtime: str, remap: Mapping[str, Any], path: str) -> str:
    from posenc.hf._record import CONFIG_KEY

    if runtime == "transformers" and not remap.get("applied_by_loader", True):  # no posenc record to apply it from
        return (f"after loading it (posenc.hf.load_causal_lm or from_pretrained: neither applies {remap['key']} "
                f"without posenc's record) call {remap['call']}, which runs what vLLM serves")
    if runtime == "transformers":
        return (f"load it with posenc.hf.load_causal_lm({path!r}), which applies it, or after from_pretrained call "
                f"{remap['call']}")
    if remap["key"] == CONFIG_KEY:  # DroPE: no runtime has a key for it
        return (f"none in {runtime}: no key of it runs {remap['method']}; run the folder in transformers with "
                f"posenc.hf.load_causal_lm({path!r})")
    return f"serve it with a runtime this table does not show ignoring {remap['key']}"


def _compare_variants(view: RuntimeView, ref: Reference, length: int | None) -> Row:
    """A view whose reading depends on the runtime's environment (``RuntimeView.variants``): ``same`` only where
    every environment's reading is; else ``differs``, each environment's verdict named, and the fix that makes them
    agree."""
    rows = [(view.variants[0].otherwise, compare(dataclasses.replace(view, variants=()), ref, length))]
    rows += [(v.when, compare(dataclasses.replace(view, layers=v.layers, variants=()), ref, length))
             for v in view.variants]
    first = rows[0][1]
    if all(row.verdict == first.verdict for _, row in rows):
        return first
    fixes = [v.fix for v in view.variants if v.fix]
    text = (f"differs: depends on {view.runtime}'s environment: " +
            "; ".join(f"{when}: {row.verdict}" for when, row in rows) +
            (". Fix (both then agree): " + "; ".join(fixes) if fixes else ""))
    worst = [row for _, row in rows if row.max_inv_freq_delta is not None]
    def most(name: str) -> float | None:
        return max((getattr(row, name) for row in worst), default=None)

    return dataclasses.replace(first, status="differs", verdict=text, max_inv_freq_delta=most("max_inv_freq_delta"),
                               max_inv_freq_ratio=most("max_inv_freq_ratio"),
                               attention_factor_delta=most("attention_factor_delta"))


def compare(view: RuntimeView, ref: Reference, length: int | None = None) -> Row:
    """One runtime's ``Row``: ``view`` (``posenc.runtimes.read``) against what posenc measured (``reference``).

    Per layer: RoPE or none, rotary dims and layout, ``max |Δ inv_freq|`` (float64) and the attention factor, at the
    frequencies for sequences up to the original context and, for length-dependent layers (dynamic, LongRoPE), at
    ``length`` (default: the context posenc extended to) where the reader gives ``LayerRope.at_length``; the
    extension keys the runtime ignores; and the context: the reference's and the runtime's limit against ``length``.
    A ``dca_vllm`` record is compared with the ``dual_chunk_attention_config`` each runtime that reads it serves
    (``chunk_size``, ``local_size``, the original length). A runtime whose reading depends on its environment
    (``RuntimeView.variants``: llama.cpp's converter under transformers 4 or 5) is ``same`` only where every
    environment's reading is.
    """
    if view.variants:
        return _compare_variants(view, ref, length)
    common: dict[str, Any] = dict(
        runtime=view.runtime, reference=ref.source, follows=view.follows, notes=tuple(view.notes), version=view.version,
        context=view.context, layers=len(view.layers), rotary=_rotary_text(view.layers))
    unverified = [n.removeprefix("not verified: ") for n in view.notes if n.startswith("not verified")]
    unverified += [n for n in ref.unverified if n.split(": ", 1)[-1] not in unverified]
    if view.refused is not None:
        return Row(status="cannot run this", verdict=f"cannot run this: {view.refused}", max_inv_freq_delta=None,
                   max_inv_freq_ratio=None, attention_factor_delta=None, **common)
    if not view.layers:
        why = "; ".join(unverified) or f"posenc's {view.runtime} reader read no layers"
        return Row(status="not verified", verdict=f"not verified: {why}", max_inv_freq_delta=None,
                   max_inv_freq_ratio=None, attention_factor_delta=None, **common)
    problems: list[str] = []
    fixes: list[str] = []
    max_delta = max_ratio = max_factor = 0.0
    if len(view.layers) != len(ref.layers):
        problems.append(f"reads {len(view.layers)} layers where posenc measured {len(ref.layers)}")
    pairs = list(zip(view.layers, ref.layers, strict=False))
    nope_mismatch, dims, layouts, bad_freq, bad_factor, unprobed = [], [], [], [], [], []
    probes = _probe_lengths(ref, length)
    for i, (a, b) in enumerate(pairs):
        if (a.inv_freq is None) != (b.inv_freq is None):
            nope_mismatch.append(i)
            continue
        if a.inv_freq is None or b.inv_freq is None:
            continue
        if a.rotary_dim != b.rotary_dim or a.inv_freq.numel() != b.inv_freq.numel():
            dims.append(i)
            continue
        if a.layout != b.layout:
            layouts.append(i)
        tables: list[tuple[torch.Tensor, torch.Tensor, float, float]] = [
            (a.inv_freq, b.inv_freq, a.attention_factor, b.attention_factor)]
        if a.length_dependent or b.length_dependent:
            for n in probes:
                at_a, at_b = _at(a, n), _at(b, n)
                if at_a is None or at_b is None:
                    unprobed.append(i)
                    break
                tables.append((at_a[0], at_b[0], at_a[1], at_b[1]))
        for inv_a, inv_b, fa, fb in tables:
            delta, ratio, dfactor = _compare_tables(a, b, inv_a, inv_b, fa, fb)
            max_delta, max_ratio, max_factor = max(max_delta, delta), max(max_ratio, ratio), max(max_factor, dfactor)
            if ratio > 1 and i not in bad_freq:
                bad_freq.append(i)
            if dfactor > attention_tolerance(fb) and i not in bad_factor:
                bad_factor.append(i)
    layers = ref.layers
    if nope_mismatch:
        problems.append(f"{_layer_list(nope_mismatch, layers)}: RoPE on one side, none (NoPE) on the other")
    if dims:
        i = dims[0]
        problems.append(f"{_layer_list(dims, layers)}: {view.layers[i].rotary_dim} rotary dims where posenc measured "
                        f"{layers[i].rotary_dim}")
    if layouts:
        i = layouts[0]
        problems.append(f"{_layer_list(layouts, layers)}: layout {view.layers[i].layout} where posenc measured "
                        f"{layers[i].layout}")
    frequencies = f"max |Δ inv_freq| {_number(max_delta)} ({max_ratio:.3g}x the float32 tolerance)"
    factors = ""
    if bad_factor:
        i = bad_factor[0]
        factors = (f"attention factor {view.layers[i].attention_factor:.6g} where posenc measured "
                   f"{layers[i].attention_factor:.6g}")
        if bad_freq == bad_factor:
            frequencies, factors = f"{frequencies}, {factors}", ""
    if bad_freq:
        problems.append(f"{_layer_list(bad_freq, layers)}: {frequencies}")
    if factors:
        problems.append(f"{_layer_list(bad_factor, layers)}: {factors}")
    if bad_freq or bad_factor:
        shadowed = [k for k in view.ignored if not any(k == r["key"] or k.startswith(r["key"] + " ")
                                                        for r in ref.remaps)]
        if shadowed:
            problems.append(f"{view.runtime} ignores {', '.join(shadowed)}")
        gguf = ref.kind == "gguf"  # a GGUF has no rope_parameters to edit
        bad = sorted(set(bad_freq) | set(bad_factor))
        static = [i for i in bad if ref.layers[i].length_dependent and not view.layers[i].length_dependent]
        dropped = [k for k in view.ignored if k.startswith("rope_parameters.rope_type=")]
        if static:
            kind = ref.layers[static[0]].method
            problems.append(f"{view.runtime} runs one set of frequencies at every length where posenc's {kind} "
                            "changes them with the length")
            fixes.append(f"no config key makes {view.runtime} run {kind}: extend with a method whose frequencies "
                         "are fixed (yarn, ntk, linear, llama3) to serve it there")
        elif dropped or (view.runtime == "llamacpp" and not gguf):
            if not shadowed:
                problems.append(f"{view.runtime} computes other frequencies from this config")
        else:
            keys = ([f"set the file's keys to what posenc measured: {', '.join(ref.gguf_fixes)}"] if (
                view.runtime == "llamacpp" and ref.gguf_fixes) else []) if gguf else _param_fixes(view, ref, bad)
            if gguf and view.runtime == "llamacpp" and ref.gguf_fixes:
                problems.append("the file's llama.cpp keys were edited after the export: they no longer say what "
                                "posenc measured (its posenc.rope record)")
            if not keys and not gguf:
                problems.append(f"{view.runtime} reads the same parameters and computes other frequencies from them")
            fixes += keys
        if gguf and view.runtime in ("vllm", "sglang") and not ref.gguf_fixes:
            fixes.append(f"serve a transformers folder of the model with {view.runtime} instead (posenc export ... "
                         "--save DIR writes one; its config.json carries the extension)")
        if view.runtime == "transformers" and gguf:
            edited = ("set the file's llama.cpp keys back to what posenc measured (" + ", ".join(ref.gguf_fixes) +
                      ") and " if ref.gguf_fixes else "")  # load_causal_lm reads the keys
            fixes.insert(0, f"{edited}load it with posenc.hf.load_causal_lm({ref.path!r}) (transformers' GGUF loader "
                         "drops rope.scaling.*), or run it with llama.cpp")
        elif "rope_parameters" in view.ignored:
            fixes.insert(0, "remove rope_scaling from config.json: transformers 5 reads it instead of rope_parameters")
    if unprobed:
        unverified.append(f"{_layer_list(sorted(set(unprobed)), layers)}: the frequencies change with the length and "
                          f"{view.runtime}'s reader gives them at one length only (compared up to the original "
                          "context)")
    from posenc.hf._record import CONFIG_KEY

    for remap in ref.remaps:
        if remap["key"] == CONFIG_KEY or _ignores(view, remap["key"]):  # no runtime reads posenc's own record
            problems.append(f"ignores {remap['key']}: posenc measured {remap['method']}, {view.runtime} runs the model "
                            "without it")
            fixes.append(_fix_for_remap(view.runtime, remap, ref.path))
        elif remap.get("expected"):
            for key, want, got in _remap_mismatches(view, remap):
                problems.append(f"{view.runtime} runs {remap['key']} {key}={got!r} where posenc measured {want!r}")
                fixes.append(f"{remap['key']}[{key!r}] = {want!r} (read: {got!r})")
    extended = ref.original is not None and ref.original != ref.context  # else the model's own context
    reach = "posenc extended the model to" if extended else "the model was trained for"
    if length is not None and ref.context is not None and length > ref.context:
        problems.append(f"length {length} is past the {ref.context} tokens {reach}")
        least = f"a factor of at least {length / ref.original:.4g} over its original {ref.original} tokens" if (
            ref.original) else "a larger factor"
        fixes.append(f"extend it with {least} and measure it there")
    if view.context is not None and length is not None and length > view.context:
        problems.append(f"{view.runtime} allows at most {view.context} tokens, not length {length}")
    elif view.context is not None and ref.context is not None and view.context < ref.context:
        problems.append(f"{view.runtime} allows at most {view.context} tokens, {reach} {ref.context}")
    numbers: dict[str, Any] = dict(
        max_inv_freq_delta=max_delta, max_inv_freq_ratio=max_ratio, attention_factor_delta=max_factor)
    if problems:
        text = "differs: " + "; ".join(problems)
        if fixes:
            text += ". Fix: " + "; ".join(dict.fromkeys(fixes))
        if unverified:
            text += ". Also not verified: " + "; ".join(unverified)
        return Row(status="differs", verdict=text, **numbers, **common)
    if unverified:
        return Row(status="not verified", verdict="not verified: " + "; ".join(unverified), **numbers, **common)
    return Row(status="same", verdict="same", **numbers, **common)


def _remap_mismatches(view: RuntimeView, remap: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, posenc's value, the runtime's)`` where the runtime's dual-chunk layers read other sizes than posenc
    ran (``remap["expected"]``)."""
    read = next((layer.params for layer in view.layers if "chunk_size" in layer.params), None)
    if read is None:
        return []
    return [(key, want, read.get(key)) for key, want in remap["expected"].items() if read.get(key) != want]


def _at(layer: LayerRope, n: int) -> tuple[torch.Tensor, float] | None:
    """The layer's frequencies and attention factor for ``n`` tokens; None where its reader does not say."""
    if not layer.length_dependent:
        return None if layer.inv_freq is None else (layer.inv_freq, layer.attention_factor)
    return None if layer.at_length is None else layer.at_length(n)


# ---------------------------------------------------------------------------------------------------------------
# check


def open_source(path: str | os.PathLike | Source) -> Source:
    """``path`` as ``Source.open`` reads it; a model's name (``"smollm2"``, ``"gemma3-270m"``, ...: when no such path
    exists) is its GGUF file (``posenc.hf.resolve_model``)."""
    if isinstance(path, Source):
        return path
    from posenc.hf.packaged import is_name

    if isinstance(path, str) and not os.path.exists(path) and is_name(path):
        from posenc.hf.load import resolve_model

        path = resolve_model(path).path
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        fail("path", path, "a transformers folder with a config.json, a config.json, or a .gguf file")
    if not os.path.exists(path):
        fail("path", str(path), "an existing transformers folder, config.json or .gguf file (no such path)")
    return Source.open(path)


def check_runtimes(runtimes: object) -> tuple[str, ...]:
    """``runtimes`` as a tuple of names from ``RUNTIMES`` (a sequence, or a comma-separated string), none twice."""
    if isinstance(runtimes, str):
        runtimes = [r.strip() for r in runtimes.split(",")]
    if not isinstance(runtimes, Sequence) or not runtimes:
        fail("runtimes", runtimes, f"one or more of {list(RUNTIMES)}")
    out = tuple(check_choice("runtimes", r, RUNTIMES) for r in runtimes)
    if len(set(out)) != len(out):
        fail("runtimes", list(runtimes), f"each of {list(RUNTIMES)} at most once")
    return out


def check(
    path: str | os.PathLike | Source, runtimes: Sequence[str] | str = RUNTIMES, length: int | None = None
) -> list[Row]:
    """Compare what each runtime will run for the model at ``path`` with what posenc measured; no weights are read.

    Args:
        path: a transformers folder (its ``config.json``), a ``config.json``, a ``.gguf`` file, or ``"smollm2"``.
        runtimes: names from ``posenc.runtimes.RUNTIMES`` (or ``"transformers,vllm"``), in the order of the rows.
        length: the sequence length you will run; checked against the context posenc extended the model to and each
            runtime's limit, and the length at which length-dependent RoPE (dynamic, LongRoPE) is compared.

    Returns:
        One ``Row`` per runtime; ``row.status == "same"`` only where the runtime runs what posenc measured.

    Raises:
        ValueError: naming ``path``, ``runtimes`` or ``length`` for bad input; naming the file, the key, its value
            and what is allowed for a config or GGUF key no runtime computes with (``posenc.runtimes.inputs``).
    """
    names = check_runtimes(runtimes)
    if length is not None:
        check_positive_int("length", length)
    source = open_source(path)
    inputs.check_source(source)
    views = {name: read(source, name) for name in names}  # each reader imports what it needs (transformers' does)
    ref = reference(source, views.get("transformers"))
    return [compare(views[name], ref, length) for name in names]
