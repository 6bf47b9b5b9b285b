"""``export``: one pretrained model extended by one method and factor, written, and checked (``posenc export``).

Everything is checked from the config, tokenizer and a weight-free (meta) copy before any weight is read (a path under
a regular file included); nothing but ``save`` is written, and it appears whole or not at all.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from posenc._checks import check_choice, check_positive_int, fail
from posenc.deploy.methods import check_export_method, parse, rebuild


@dataclasses.dataclass(frozen=True)
class Exported:
    """What ``export`` wrote: ``path`` (a folder or a ``.gguf`` file), the model's ``label`` (``yarn x2``), its
    original and extended contexts, the patch's description, how to load or run it (``how``), and ``weights``: what
    the written weights are (``"float32, as the source holds them"``; a GGUF's tensor types)."""

    path: Path
    label: str
    original_len: int
    context: int
    description: dict
    how: list[str]
    seconds: float
    weights: str = ""
    check: tuple = ()  # posenc.runtimes.check.Row per runtime: what each runs from PATH against what posenc measured


def export(
    model: str,
    method: str,
    factor: float,
    save: str | Path,
    *,
    save_type: str = "source",
    original_len: int | None = None,
    layer_type: str | None = None,
    device: str = "cpu",
    dtype: str | None = None,
    progress: bool = True,
) -> Exported:
    """Load ``model``, extend it by ``method`` x ``factor`` and write it to ``save``: a transformers folder (a new or
    empty one), or a GGUF file llama.cpp runs when ``save`` ends in ``.gguf`` (tensors in ``save_type``); then check
    what each runtime runs from it (``posenc.runtimes.check``), the table ending the output (``Exported.check``).

    ``model``: what ``posenc extend`` takes for a pretrained model (a ``.gguf`` file or a folder holding one, a
    transformers folder, ``smollm2``). ``original_len``: the context the model was trained for (default: its
    config's). ``layer_type``: per-layer-type RoPE (Gemma 3), as ``posenc extend --layer-type``. ``dtype``: the
    written weights' dtype; default the source's own (``posenc.hf.load.weights_dtype``: a transformers checkpoint's
    dtype, float32 for a GGUF's dequantized values), so the weights are written unchanged, bit for bit -- only the
    RoPE config changes. Another dtype converts them (a GGUF output copies the source's tensors either way).

    Raises:
        ValueError: a lab model, an ALiBi model, a method the model does not take or the format does not carry, a
            path that exists (a non-empty folder, any file): all before any weight is read.
    """
    from posenc._devices import resolve_device
    from posenc.deploy import formats, verify
    from posenc.deploy.patch import apply
    from posenc.deploy.source import layer_count, load_weights, meta_model, open_pretrained
    from posenc.hf import _record
    from posenc.hf.extend import check_factor
    from posenc.hf.load import weights_dtype

    start = time.perf_counter()
    check_export_method(method)  # before anything else: a misspelt one is not blamed on --save
    parsed = parse(method)
    factor = check_factor(factor, method, as_model=True)
    parsed = dataclasses.replace(parsed, factor=factor)
    path = Path(model).expanduser()
    model = str(path.resolve()) if path.exists() else model
    _check_settings(model, original_len, layer_type, device, dtype)
    device = resolve_device(device, allow_auto=True)
    if save is None or not str(save):
        fail("save", save, "a new folder, or a new FILE.gguf, to write the extended model to")
    folder = Path(save).expanduser()
    pretrained = open_pretrained(model, layer_type=layer_type, original_len=original_len)  # no weights
    source_dtype = weights_dtype(pretrained.source)
    if dtype is None:
        weights_as = source_dtype  # no forward runs here: the weights as the source holds them
    else:
        from posenc.hf.dtypes import check_runs_fast

        weights_as = getattr(torch, dtype)
        check_runs_fast("dtype", weights_as, device)
    original = pretrained.original_len
    written = formats.check_save(
        save, methods=(method,), factors=(float(factor),), model_type=pretrained.model_type,
        source=pretrained.source, original_len=original,
        rebuild=rebuild(model, method, float(factor), dtype=_name(weights_as), original=original,
                        layer_types=pretrained.patch_types),
        out=folder.parent / f".{folder.name}.no-study", save_type=save_type,
    )
    assert written is not None
    layers = layer_count(pretrained.config)
    where = dict(original=original, layer_types=pretrained.patch_types, config=pretrained.config, layers=layers)
    meta = meta_model(pretrained.config)
    apply(meta, parsed, factor, **where)  # on a weight-free copy: refused before the load
    if written.suffix.lower() == ".gguf":
        formats.check_gguf_model(meta, pretrained.source)  # what llama.cpp cannot run, refused before the load too
    name = parsed.label
    if progress:
        print(f"Loading {pretrained.name} ({_name(weights_as)}) to write {name}")
    loaded = load_weights(pretrained.source, device=device, dtype=weights_as, attn=pretrained.attn)  # model: its name
    description = apply(loaded, parsed, factor, **where).description
    if written.suffix.lower() == ".gguf":
        formats.save(loaded, written, source=pretrained.source, tensor_type=save_type, check=False)
        written_as = "tensors as in the source" if save_type == "source" else f"matrices as {save_type}"
    else:
        from posenc.hf import ServedOnlyWarning

        with warnings.catch_warnings():  # not repeated: how_to_run prints the same ways to load it
            warnings.simplefilter("ignore", ServedOnlyWarning)
            formats.save(loaded, written, source=pretrained.source, tokenizer=pretrained.tokenizer,
                         config=pretrained.config, dtype=loaded.dtype, check=False)
        written_as = f"{_name(loaded.dtype)} weights, " + (
            "as the source holds them" if loaded.dtype == source_dtype
            else f"converted from the source's {_name(source_dtype)} (--dtype)"
        )
    context = round(original * factor)
    rows = verify.check_written(written)  # what each runtime runs from what was written: config.json or the header
    result = Exported(
        path=written, label=name, original_len=original, context=context,
        description={k: v for k, v in description.items() if isinstance(v, (str, int, float, bool, list, dict))},
        how=verify.how_to_run(written, method, factor, context, _record.reapply(loaded),
                              {row.runtime: row.status for row in rows}),
        seconds=time.perf_counter() - start, weights=written_as, check=rows,
    )
    if progress:
        print(f"Wrote {name} of {pretrained.name} to {written} ({formats.saved_as(written)}, {written_as}; context "
              f"{original} -> {context} tokens) in {result.seconds:.1f} s")
        print("\n".join(result.how))
        verify.print_check(rows, written)
    return result


def _check_settings(model: str, original_len: object, layer_type: object, device: object, dtype: object) -> None:
    """The arguments checked as ``posenc extend`` checks its settings, with the same messages."""
    from posenc.hf.dtypes import DTYPE_CHOICES

    if not isinstance(model, str) or not model:
        fail("model", model, "a model (a lab run, a .gguf file, a transformers folder, 'smollm2', 'gemma3-270m', "
                 "'qwen2.5-coder-0.5b') or 'new'")
    if layer_type is not None and (not isinstance(layer_type, str) or not layer_type):
        fail("layer_type", layer_type, "a layer type of the model's config (e.g. 'full_attention') or 'all'")
    if original_len is not None:
        check_positive_int("original_len", original_len)
    if not isinstance(device, str) or not device:
        fail("device", device, "'auto', 'cpu', 'cuda' or 'cuda:<index>'")
    if dtype is not None:
        check_choice("dtype", dtype, [d for d in DTYPE_CHOICES if d != "auto"])


def _name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")
