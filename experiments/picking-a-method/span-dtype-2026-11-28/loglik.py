"""The 16k pick's first screening round for a remapping method (passkey at 12,288 tokens, depth 0.5, keys 0-3 as the
pick draws them), with the remapped spans in bfloat16 (now) and in float32 (the 27th's screening): each key's greedy
answer and the teacher-forced log-probability of " KEY". argv: METHOD FACTOR [N]"""
import dataclasses
import sys
from pathlib import Path

import torch

import posenc.hf._remap_patch as rp
from posenc.lab.extend.needles import passkey as pk
from posenc.lab.extend.stats import sampling
from posenc.lab.extend.study import plan
from posenc.lab.extend.study.config import ExtendConfig
from posenc.lab.extend.targets.load import load_target

method, factor = sys.argv[1], float(sys.argv[2])
n = int(sys.argv[3]) if len(sys.argv) > 3 else 4
length, depth = 12288, 0.5
cfg = ExtendConfig(model="smollm2", methods=(method,), factors=(factor,), lengths=(length,), depths=(depth,), trials=4)
target = load_target(cfg, Path("/tmp/spans-target"), device="cpu", progress=False)
resolved = plan.resolve(cfg, kind=target.kind, original=target.original_len, default_methods=target.default_methods,
                        device="cpu")
resolved = dataclasses.replace(resolved, dtype=str(target.dtype).removeprefix("torch."))
target.use(resolved)
target.load()
model, _ = target.patched(method, factor)
model.eval()
seed = sampling.round_seed(cfg.seed * 1_000_003 + length * 101 + round(1000 * depth), 0)
g = torch.Generator().manual_seed(seed)
keys = [int(torch.randint(pk.KEY_LOW, pk.KEY_HIGH, (), generator=g)) for _ in range(4)][:n]
tok = target.tokenizer
halves = rp.HALF_DTYPES
for key in keys:
    ids = pk.prompt_ids(tok, length, depth, key)
    answer = tok(" " + str(key), add_special_tokens=False, return_tensors="pt")["input_ids"]
    full = torch.cat([ids, answer], 1)
    for spans in ("bf16", "f32"):
        rp.HALF_DTYPES = halves if spans == "bf16" else ()
        with torch.inference_mode():
            logits = model(full).logits[0, ids.shape[1] - 1 : -1].float()
        lp = torch.log_softmax(logits, -1).gather(1, answer[0, :, None])[:, 0]
        greedy = tok.decode(logits.argmax(-1))
        print(f"{method} x{factor:g} key {key} spans {spans}: log p(answer) {lp.sum():.3f} per token "
              f"{[round(x, 3) for x in lp.tolist()]}, greedy (teacher-forced) {greedy!r}", flush=True)
