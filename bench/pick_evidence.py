"""The deciding pick's evidence against the needles a committed pick measured: same keys, same prompts.

    python bench/pick_evidence.py PICK_FOLDER [--methods none:1,yarn:4,rerope:2,ntk:2] [--needles 4] [--keys 8]
                                  [--documents 1] [--out DIR]

For each model: the committed race's passkey needles at its target (``PICK_FOLDER/final/samples.csv``: the keys
rebuilt from their seeds as ``study.run`` drew them, the prompt as ``needles.passkey.prompt_ids`` fits it) scored
teacher-forced -- the answer's log-probability and whether every answer token is the argmax --, beside the committed
exact match of greedy ``generate``; then ``--documents`` documents of ``--keys`` keys at the same length
(``needles.keys``), one forward each. Prints each needle, each model's rates (committed exact match, teacher-forced
found, mean answer probability, keys found and answer probability in the documents) and the seconds: a committed
needle's forward with ``generate`` (the first model's) and without, and a document's forward, so information per
forward-second can be set beside today's. Writes ``OUT/evidence.json`` (atomically) as it goes and resumes from it.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
import time
from pathlib import Path

import torch


def committed(folder: Path, length: int) -> dict[tuple[str, float], dict[int, float]]:
    out: dict[tuple[str, float], dict[int, float]] = {}
    with (folder / "final" / "samples.csv").open() as f:
        for r in csv.DictReader(f):
            if r["metric"] == "passkey" and int(r["length"]) == length:
                out.setdefault((r["method"], float(r["factor"])), {})[int(r["index"])] = float(r["score"])
    return out


def needle_keys(seed: int, length: int, depth: float, count: int) -> list[int]:
    """The keys ``study.run.add_samples`` drew for a passkey cell: rounds of ``sampling.ROUND`` from round seeds."""
    from posenc.lab.extend.needles.passkey import KEY_HIGH, KEY_LOW
    from posenc.lab.extend.stats import sampling

    cell = seed * 1_000_003 + length * 101 + round(1000 * depth)  # study.run._passkey_seed
    keys: list[int] = []
    for start in range(0, count, sampling.ROUND):
        generator = torch.Generator().manual_seed(sampling.round_seed(cell, start))
        keys += [int(torch.randint(KEY_LOW, KEY_HIGH, (), generator=generator)) for _ in range(sampling.ROUND)]
    return keys[:count]


def needle_document(tokenizer, length: int, depth: float, key: int):  # noqa: ANN001, ANN201
    """The committed passkey prompt with its answer appended, as a one-key ``KeyDocument``."""
    from posenc.lab.extend.needles.keys import KeyDocument
    from posenc.lab.extend.needles.passkey import prompt_ids

    ids = prompt_ids(tokenizer, length, depth, key)  # (1, <= length)
    answer = tokenizer(" " + str(key), add_special_tokens=False)["input_ids"]
    start = ids.shape[1]
    full = torch.cat([ids, torch.tensor([answer])], dim=1)
    return KeyDocument(ids=full, keys=(key,), labels=("",), depths=(depth,), answers=((start, start + len(answer)),),
                       order=(0,), seed=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pick", type=Path)
    parser.add_argument("--methods", default="none:1,yarn:4,rerope:2,ntk:2")
    parser.add_argument("--needles", type=int, default=4)
    parser.add_argument("--keys", type=int, default=8)
    parser.add_argument("--documents", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from posenc.lab.common.files import write_json_atomic
    from posenc.lab.extend.needles.keys import score_document
    from posenc.lab.extend.needles.passkey import hf_accuracy
    from posenc.lab.extend.pick import evidence
    from posenc.lab.extend.settings.config import ExtendConfig
    from posenc.lab.extend.targets.load import load_target

    settings = json.loads((args.pick / "pick.json").read_text())
    length, depth, seed = settings["target"], settings["depths"][0], settings["seed"]
    found = committed(args.pick, length)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "evidence.json"
    data = json.loads(path.read_text()) if path.is_file() else {
        "pick": str(args.pick), "length": length, "depth": depth, "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(), "cpu_caps": sorted(
            k for k, v in torch.cpu.get_capabilities().items() if v and k in ("amx_bf16", "avx512_bf16", "avx2")),
        "threads": torch.get_num_threads(), "models": {}}
    cfg = ExtendConfig(model=settings["model"], corpus_bytes=settings["corpus_bytes"], device="cpu", dtype=None)
    target = load_target(cfg, args.out / "target", device="cpu", progress=False)
    target.use(cfg)
    target.load()
    keys = needle_keys(seed, length, depth, args.needles)
    for item in args.methods.split(","):
        method, factor = item.split(":")[0], float(item.split(":")[1])
        name = f"{method} x{factor:g}"
        entry = data["models"].setdefault(name, {"needles": [], "documents": []})
        model = target.model if method == "none" else target.patched(method, factor)[0]
        for i in range(len(entry["needles"]), args.needles):
            doc = needle_document(target.tokenizer, length, depth, keys[i])
            start = time.perf_counter()
            s = score_document(model, doc)
            entry["needles"].append({"index": i, "key": keys[i], "committed": found.get((method, factor), {}).get(i),
                                     "found": bool(s.found[0]), "logprob": s.logprob[0],
                                     "seconds": time.perf_counter() - start})
            write_json_atomic(path, data)
            print(name, entry["needles"][-1], flush=True)
        if "generate_seconds" not in entry and item == args.methods.split(",")[0]:  # today's needle, one key
            start = time.perf_counter()
            hf_accuracy(model, target.tokenizer, length=length, depth=depth, trials=1, seed=12345)
            entry["generate_seconds"] = time.perf_counter() - start
            write_json_atomic(path, data)
        for d in range(len(entry["documents"]), args.documents):
            start = time.perf_counter()
            s = target.keys(model, length, args.keys, evidence.document_seed(seed, length, d))
            seconds = time.perf_counter() - start
            entry["documents"].append({"document": d, "found": [bool(x) for x in s.found],
                                       "prob": [math.exp(x) for x in s.logprob], "seconds": seconds})
            write_json_atomic(path, data)
            print(name, "document", d, sum(entry["documents"][-1]["found"]), f"{seconds:.1f}s", flush=True)
        del model
    print(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
