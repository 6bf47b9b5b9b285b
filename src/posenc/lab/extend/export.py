"""``posenc export MODEL --method M --factor F --save PATH``: one patched model written, no study run.

The model is extended as ``posenc extend --save`` extends it (``HFTarget``: ``posenc.hf.extend_context`` for every
layer the study would patch) and written with the same checks (``study.run.check_save``): a pretrained RoPE model
(ALiBi's slope interpolation is a forward hook no config records), a method a saved config runs as posenc measures
it (frequency methods; ``dca_vllm`` on Qwen2/Qwen3, which vLLM reads), a new or empty folder, or a new
``.gguf`` file from a GGUF source with a method llama.cpp runs (``study.run.GGUF_METHODS``). Everything is checked from
the config, tokenizer and a weight-free (meta) copy before any weight is read (a path under a regular file
included); nothing but ``PATH`` is written, and ``PATH`` appears whole or not at all (``posenc.hf.save_pretrained``
writes a folder beside it under a temporary name and renames it into place; ``posenc.hf.save_gguf`` writes a file
the same way); an interrupted export also removes the folders it created above ``PATH``. The weights are written as
the source holds them (``--dtype auto``), so only the RoPE config changes. Once written, ``PATH`` is checked as
``posenc check PATH`` checks it (``posenc.runtimes.check``: what transformers, vLLM, SGLang and llama.cpp run from its
``config.json`` or GGUF header, against what posenc measured); the table ends the export's output and
``Exported.check`` holds the rows.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from posenc._checks import fail
from posenc.hf import _record
from posenc.hf.load import weights_dtype
from posenc.lab.common.devices import resolve_device
from posenc.lab.extend.export_methods import check_export_method
from posenc.lab.extend.settings.config import ExtendConfig
from posenc.lab.extend.study.report import label


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
    empty one), or a GGUF file llama.cpp runs when ``save`` ends in ``.gguf`` (tensors in ``save_type``).

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
    from posenc.hf.extend import check_factor
    from posenc.lab.extend.settings import composed
    from posenc.lab.extend.study.run import check_save
    from posenc.lab.extend.targets.load import load_target

    start = time.perf_counter()
    check_export_method(method)  # before anything else: a misspelt one is not blamed on --save
    composed.check(method)
    check_factor(factor, method, as_model=True)
    path = Path(model).expanduser()
    cfg = ExtendConfig(
        model=str(path.resolve()) if path.exists() else model, methods=(method,), factors=(factor,),
        original_len=original_len, layer_type=layer_type, device=device, dtype=dtype,
    )  # fmt: skip
    device = resolve_device(cfg.device, allow_auto=True)
    if save is None or not str(save):
        fail("save", save, "a new folder, or a new FILE.gguf, to write the extended model to")
    folder = Path(save).expanduser()
    target = load_target(cfg, folder, device=device, progress=False)  # config, tokenizer, meta model; no weights
    if target.kind == "lab":
        fail("model", model, "a pretrained model (a .gguf file, a transformers folder, smollm2); a lab model has no "
             "format to export to")  # fmt: skip
    source_dtype = weights_dtype(target.source)
    if dtype is None:
        target.dtype = source_dtype  # no forward runs here: the weights as the source holds them, not auto's dtype
    # check_save's last check (not the study's own folder) compares with an output folder export does not have.
    written = check_save(save, cfg, target, folder.parent / f".{folder.name}.no-study", save_type)
    description = target.check_patch(method, cfg.factors[0])  # on a weight-free copy: refused before the load
    name = label(method, cfg.factors[0], 0)
    if progress:
        print(f"Loading {target.name} ({_name(target.dtype)}) to write {name}")
    weights = _load(target)
    description = target._extend(weights, method, cfg.factors[0])
    if written.suffix.lower() == ".gguf":
        target.save(weights, written, tensor_type=save_type, check=False)  # posenc.hf.save_gguf writes atomically
        written_as = "tensors as in the source" if save_type == "source" else f"matrices as {save_type}"
    else:
        _save_folder(target, weights, written)
        written_as = f"{_name(weights.dtype)} weights, " + (
            "as the source holds them" if weights.dtype == source_dtype
            else f"converted from the source's {_name(source_dtype)} (--dtype)"
        )  # fmt: skip
    context = round(target.original_len * cfg.factors[0])
    from posenc.runtimes.check import check as check_runtimes

    rows = tuple(check_runtimes(written))  # what each runtime runs from what was written: config.json or the header
    result = Exported(
        path=written, label=name, original_len=target.original_len, context=context,
        description={k: v for k, v in description.items() if isinstance(v, (str, int, float, bool, list, dict))},
        how=how_to_run(written, method, cfg.factors[0], context, _record.reapply(weights),
                       {row.runtime: row.status for row in rows}),
        seconds=time.perf_counter() - start, weights=written_as, check=rows,
    )  # fmt: skip
    if progress:
        kind = "a GGUF file llama.cpp runs" if written.suffix.lower() == ".gguf" else "a transformers folder"
        print(f"Wrote {name} of {target.name} to {written} ({kind}, {written_as}; context {target.original_len} -> "
              f"{context} tokens) in {result.seconds:.1f} s")  # fmt: skip
        print("\n".join(result.how))
        from posenc.runtimes.check import print_rows

        print_rows(rows, title=f"Before you deploy: what each runtime runs for {written} (posenc check)")
    return result


def _name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _load(target: Any) -> Any:
    """The weights, as ``HFTarget.load`` reads them (RoPE tables kept in float32), without its held-out text."""
    from posenc.hf import keep_rope_float32, load_causal_lm
    from posenc.lab.extend.targets.hf import _no_transformers_bars

    with _no_transformers_bars(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"load_causal_lm\(dtype=")  # its speed: no forward runs here
        model, _ = load_causal_lm(target.source, device=target.device, dtype=target.dtype,
                                  attn_implementation=target.attn)  # fmt: skip
    keep_rope_float32(model)
    target.model = model
    return model


def _save_folder(target: Any, model: Any, folder: Path) -> None:
    """The folder, in the loaded weights' dtype (not the config's), written whole or not at all
    (``posenc.hf.save_pretrained`` writes beside it and renames it into place). A ``ServedOnlyWarning`` is not
    repeated: ``how_to_run`` prints the same ways to load it."""
    from posenc.hf import ServedOnlyWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ServedOnlyWarning)
        target.save(model, folder, dtype=model.dtype, check=False)  # export prints the check with its own output


def how_to_run(path: Path, method: str, factor: float, context: int, reapply: str = "",
               status: Mapping[str, str] | None = None) -> list[str]:
    """How to load or run what ``export`` wrote, as commands and code to paste; ``reapply``: the
    ``extend_context`` calls a transformers load of the folder needs (``posenc.hf._record.reapply``). ``status``:
    each runtime's verdict from ``posenc check`` (``Row.status``); a runtime is offered as a way to run the model only
    where it is ``"same"``, and named with its verdict otherwise (None: no check ran, every way is offered)."""
    quoted = shlex.quote(str(path))

    def ok(runtime: str) -> bool:
        return status is None or status.get(runtime) == "same"

    def other(runtime: str, name: str) -> list[str]:
        verdict = (status or {}).get(runtime)
        return [] if verdict in (None, "same") else [f"  {name}: {verdict} (the check below says how and why)"]

    load = f"posenc.hf.load_causal_lm({str(path)!r})"
    if path.suffix.lower() == ".gguf":
        lines = []
        if ok("llamacpp"):
            lines += [
                "Run it with llama.cpp (the extension is in the file's rope.scaling keys; -c sets the context to use):",
                f"  llama-cli -m {quoted} -c {context}",
                f"  ollama: a Modelfile with 'FROM {path}' and 'PARAMETER num_ctx {context}', then ollama create",
            ]
        else:
            lines += other("llamacpp", "llama.cpp")
        return [*lines, f"In Python: {load} gives the extended transformers model."]
    serve = f"  vllm serve {quoted} --max-model-len {context}"
    if method == "dca_vllm":
        lines = ["Serve it with vLLM (it reads its dual_chunk_attention_config):", serve] if ok("vllm") else [
            "Serving engines: vLLM and SGLang read dual_chunk_attention_config for some architectures; run "
            f"posenc check {quoted} before deploying:", *other("vllm", "vLLM"), *other("sglang", "SGLang")]  # fmt: skip
        return [*lines, f"In Python: {load} gives the extended model (it re-applies DCA); transformers alone loads it "
                        f"unextended: after AutoModelForCausalLM.from_pretrained({str(path)!r}) call {reapply}."]
    lines = []
    if ok("transformers"):
        name = repr(str(path))
        lines += ["Load it with transformers (the extension is in its config's RoPE parameters):",
                  f"  AutoModelForCausalLM.from_pretrained({name}); AutoTokenizer.from_pretrained({name})"]
    else:
        lines += other("transformers", "transformers")
    lines += [serve] if ok("vllm") else other("vllm", "vLLM")
    if method == "dynamic":
        lines.append(
            "Dynamic NTK changes its frequencies with the length, and transformers' KV cache keeps keys rotated with "
            f"the old ones: {load} re-rotates them as posenc does (posenc.hf.CacheStaleWarning where that is not "
            "exact); generate(..., use_cache=False) runs the full forward each step."
        )
    else:
        lines.append(f"In Python: {load} gives what posenc.hf.extend_context makes of the source loaded the same way "
                     "(same dtype; RoPE in float32 in a bfloat16 model).")  # fmt: skip
    return lines
