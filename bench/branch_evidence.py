"""Documents of K keys asked apart (``needles.keys.score_branches``: each question blind to the other needles)
against the one-key documents a deciding pick measured: does the evidence of one forward rank methods as one key
per forward does, and at what cost?

    python bench/branch_evidence.py PICK_FOLDER --length 16384 --keys 16 --documents 2 \\
        --methods none:1,yarn:4,rerope:2 [--ways apart,blind,split,together] --out DIR

For each model (``PICK_FOLDER``'s model, loaded as the pick loads it, in the dtype its stages ran): ``--documents``
documents of ``--keys`` keys at ``--length`` (drawn at seeds the race never uses, so no key is one the pick saw), each
scored in one forward per way asked (``--ways``: ``apart``, each question blind to the other needles; ``blind``, also no
filler token reading a needle; ``split``, the same blind branches as a causal prefill of the filler and one
masked suffix, ``needles.blind.score_blind``; ``together``, RULER's multi-key task; ``one``, a one-key document of the
same seed, as the race reads, for the time of its forward on this machine), beside the pick's own one-key documents at
that length (``needles.csv``: keys found over documents). Each document's keys found, mean answer probability and
seconds go to ``OUT/branches.json`` (written atomically after each document, resumed from it). Measurements only; the
comparison's statistics are in the experiment's README.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import time
from pathlib import Path

import torch

#: Documents are drawn at ``evidence.document_seed(seed, length, OFFSET + d)``: the race draws d = 0, 1, 2, ...
OFFSET = 10_000


def one_key(folder: Path, length: int) -> dict[str, list[int]]:
    """The pick's one-key documents at ``length``: per model (``method xfactor``), each document's key found (0/1)."""
    out: dict[str, list[int]] = {}
    with (folder / "needles.csv").open() as f:
        for r in csv.DictReader(f):
            if int(r["length"]) == length:
                name = "none x1" if r["method"] == "none" else f"{r['method']} x{float(r['factor']):g}"
                out.setdefault(name, []).append(int(float(r["found"])))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pick", type=Path)
    parser.add_argument("--length", type=int, required=True)
    parser.add_argument("--keys", type=int, default=16)
    parser.add_argument("--documents", type=int, default=1)
    parser.add_argument("--methods", default="none:1,yarn:4,rerope:2")
    parser.add_argument("--ways", default="apart", help="comma-separated: apart (each question blind to the other "
                        "needles), blind (apart, and no filler token reads a needle), split (blind, as a causal "
                        "prefill and a masked suffix), together (RULER's multi-key), one (a one-key document: its "
                        "time)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    ways = args.ways.split(",")
    if unknown := [w for w in ways if w not in ("apart", "blind", "split", "together", "one")]:
        parser.error(f"--ways: {unknown} is not among apart, blind, split, together, one")
    from posenc.lab.common.files import write_json_atomic
    from posenc.lab.extend.needles import blind as bl
    from posenc.lab.extend.needles import keys as kd
    from posenc.lab.extend.pick import evidence
    from posenc.lab.extend.settings.config import ExtendConfig
    from posenc.lab.extend.targets.load import load_target

    settings = json.loads((args.pick / "pick.json").read_text())
    seed = settings["seed"]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "branches.json"
    data = json.loads(path.read_text()) if path.is_file() else {
        "pick": str(args.pick), "length": args.length, "keys": args.keys, "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(), "cpu_caps": sorted(
            k for k, v in torch.cpu.get_capabilities().items() if v and k in ("amx_bf16", "avx512_bf16", "avx2")),
        "threads": torch.get_num_threads(), "models": {}}
    if (data["length"], data["keys"]) != (args.length, args.keys):
        raise SystemExit(f"{path} holds --length {data['length']} --keys {data['keys']}: another --out")
    ran = json.loads((args.pick / "screen-ppl" / "extend.json").read_text()).get("dtype")  # as the pick resumes
    data.setdefault("dtype_run", ran)
    cfg = ExtendConfig(model=settings["model"], corpus_bytes=settings["corpus_bytes"], device="cpu", dtype=ran)
    target = load_target(cfg, args.out / "target", device="cpu", progress=False)
    target.use(cfg)
    target.load()
    docs = {}
    scorers = {"apart": kd.score_branches, "together": kd.score_document,
               "blind": lambda m, doc: kd.score_branches(m, doc, filler_sees_needles=False),
               "split": bl.score_blind,
               "one": lambda m, doc: kd.score_document(m, kd.key_document(  # its first key alone: the time
                   target.tokenizer, args.length, 1, doc.seed))}
    for item in args.methods.split(","):
        method, factor = item.split(":")[0], float(item.split(":")[1])
        name = f"{method} x{factor:g}"
        entry = data["models"].setdefault(name, {"documents": []})
        todo = [d for d in range(args.documents)
                if not any(r["document"] == d and all(w in r for w in ways) for r in entry["documents"])]
        if not todo:
            continue
        model = target.model if method == "none" else target.patched(method, factor)[0]
        for d in todo:
            if d not in docs:
                docs[d] = kd.key_document(target.tokenizer, args.length, args.keys,
                                          evidence.document_seed(seed, args.length, OFFSET + d))
            row = next((r for r in entry["documents"] if r["document"] == d), None)
            if row is None:
                row = {"document": d, "depths": list(docs[d].depths)}
                entry["documents"].append(row)
            for how in (w for w in ways if w not in row):
                start = time.perf_counter()
                s = scorers[how](model, docs[d])
                row[how] = {"found": [int(x) for x in s.found], "prob": list(s.prob),
                            "seconds": time.perf_counter() - start}
            write_json_atomic(path, data)
            told = {how: f"{sum(row[how]['found'])}/{len(row[how]['found'])} in {row[how]['seconds']:.0f} s"
                    for how in scorers if how in row}
            print(name, "document", d, told, flush=True)
        del model
    committed = one_key(args.pick, args.length)
    shown = [w for w in ("apart", "blind", "split", "together") if any(
        w in r for e in data["models"].values() for r in e["documents"])]
    print("\n| model | " + " | ".join(f"asked {w}: keys found (per document)" for w in shown)
          + " | one-key documents of the pick |\n|---|" + "---|" * (len(shown) + 1))
    for name, entry in data["models"].items():
        cells = []
        for w in shown:
            found = [sum(r[w]["found"]) for r in entry["documents"] if w in r]
            cells.append(f"{sum(found)}/{args.keys * len(found)} ({', '.join(map(str, found))})" if found else "-")
        mine = committed.get(name, [])
        print(f"| {name} | {' | '.join(cells)} | {sum(mine)}/{len(mine)} |")


if __name__ == "__main__":
    main()
