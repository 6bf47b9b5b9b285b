"""What was written, checked: ``check_written`` (what each runtime runs from it, ``posenc check``) and
``how_to_run`` (the commands and code that load or run it, offered only where the check says they run it as
measured).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def check_written(path: Path) -> tuple[Any, ...]:
    """``posenc.runtimes.check.Row`` per runtime: what each runs from ``path`` (its ``config.json`` or GGUF header)
    against what posenc measured; kept for ``posenc check path`` (``posenc._check_cache``)."""
    from posenc import _check_cache
    from posenc.runtimes import RUNTIMES
    from posenc.runtimes.check import check

    digest = _check_cache.key(path, RUNTIMES, None)  # posenc check PATH then prints these rows without reading again
    rows = tuple(check(path))
    _check_cache.store(digest, rows)
    return rows


def print_check(rows: tuple[Any, ...], path: Path) -> None:
    """``check_written``'s rows as the table that ends an export's output."""
    from posenc.runtimes.check import print_rows

    print_rows(rows, title=f"Before you deploy: what each runtime runs for {path} (posenc check)")


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
            f"posenc check {quoted} before deploying:", *other("vllm", "vLLM"), *other("sglang", "SGLang")]
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
                     "(same dtype; RoPE in float32 in a bfloat16 model).")
    return lines
