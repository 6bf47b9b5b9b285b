"""What a packaged model's config and tokenizer cost before anything is measured: posenc's paths against transformers'.

    python bench/packaged_load.py --models gemma3-270m,qwen2.5-coder-0.5b

Per model, in one run: the header (posenc.gguf.header), the config from it (posenc.gguf.config) against
``AutoConfig.from_pretrained(..., gguf_file=...)`` (equal configs checked), and the tokenizer converted by transformers
against the one posenc.hf.gguf_tokenizer kept (a fresh cache folder, so the first call converts), and the float32
model as ``posenc.hf.load_causal_lm`` loads it (``posenc.gguf.native``) against transformers' own GGUF load (every
weight checked equal, bit for bit). Seconds are wall time on this machine, one call each; the ratios are of this run.
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
import time


def _timed(f):  # noqa: ANN001, ANN202
    start = time.perf_counter()
    value = f()
    return value, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gemma3-270m,qwen2.5-coder-0.5b")
    args = parser.parse_args()
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from posenc.gguf import config as gguf_config
    from posenc.gguf.header import read_gguf_header
    from posenc.hf import gguf_tokenizer, load_causal_lm, packaged

    print("| model | header s | config: posenc s | config: transformers s | ratio | tokenizer: converted s | "
          "tokenizer: cached s | ratio | model: posenc s | model: transformers s | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        if not packaged.available(name):
            print(f"| {name} | not at hand | | | | | | | | | |")
            continue
        path = packaged.model_file(name)
        _, t_header = _timed(lambda: read_gguf_header(path))  # noqa: B023
        ours, t_ours = _timed(lambda: gguf_config.hf_config(read_gguf_header(path)))  # noqa: B023
        theirs, t_theirs = _timed(
            lambda: AutoConfig.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)  # noqa: B023
        )
        assert ours.to_dict() == theirs.to_dict(), name  # noqa: S101
        before = os.environ.get("POSENC_CACHE")
        with tempfile.TemporaryDirectory() as cache:
            os.environ["POSENC_CACHE"] = cache  # a fresh cache: the first call converts, the second reads it back
            _, t_convert = _timed(lambda: gguf_tokenizer.gguf_tokenizer(path))  # noqa: B023
            _, t_cached = _timed(lambda: gguf_tokenizer.gguf_tokenizer(path))  # noqa: B023
        if before is None:
            os.environ.pop("POSENC_CACHE")
        else:
            os.environ["POSENC_CACHE"] = before
        loaded, t_model = _timed(lambda: load_causal_lm(path))  # noqa: B023
        model = loaded[0]
        reference, t_reference = _timed(functools.partial(
            AutoModelForCausalLM.from_pretrained, path.parent, gguf_file=path.name, config=model.config,
            local_files_only=True,
        ))
        mine, theirs_sd = model.state_dict(), reference.state_dict()
        assert mine.keys() == theirs_sd.keys() and all(torch.equal(mine[k], theirs_sd[k]) for k in mine), name  # noqa: S101
        del loaded, model, reference, mine, theirs_sd
        print(f"| {name} | {t_header:.2f} | {t_ours:.2f} | {t_theirs:.1f} | {t_theirs / t_ours:.0f}x | "
              f"{t_convert:.1f} | {t_cached:.1f} | {t_convert / t_cached:.1f}x | {t_model:.1f} | {t_reference:.1f} | "
              f"{t_reference / t_model:.1f}x |")


if __name__ == "__main__":
    main()
