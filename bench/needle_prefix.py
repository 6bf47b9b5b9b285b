"""CPU-seconds per answered passkey needle, unshared (a fresh ``generate`` per key) vs shared prefix
(``posenc.lab.extend.needles.shared_prefix``), interleaved in one run on one machine.

    python bench/needle_prefix.py --length 16384 --depth 0.5 --keys 2

The keys of one (length, depth) cell are answered both ways, alternating sample by sample, so that other load on the
machine falls on both; CPU-seconds are the process's (``time.process_time``: every thread). Shared: the prefix's
forward once (counted in full, spread over the keys) plus each key's cached suffix and decode steps. The generated
tokens of both paths are printed and compared.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import time

import torch

from posenc.hf import extend_context, keep_rope_float32, load_causal_lm
from posenc.lab.extend.needles import passkey as pk
from posenc.lab.extend.needles.shared_prefix import SharedPrefix, cache_name, split_cached_attention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--method", default="yarn")
    parser.add_argument("--factor", type=float, default=2.0)
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--depth", type=float, default=0.5)
    parser.add_argument("--keys", type=int, default=2)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    model, tokenizer = load_causal_lm(args.model, dtype=getattr(torch, args.dtype), attn_implementation="sdpa")
    keep_rope_float32(model)
    extend_context(model, args.method, args.factor)
    model.eval()
    generator = torch.Generator().manual_seed(0)
    keys = [int(torch.randint(pk.KEY_LOW, pk.KEY_HIGH, (), generator=generator)) for _ in range(args.keys)]
    prompts = [pk.prompt_ids(tokenizer, args.length, args.depth, key) for key in keys]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    shared = SharedPrefix(model, prompts)
    print(
        f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} "
        f"threads, {args.model} {args.method} x{args.factor} {args.dtype}, {prompts[0].shape[1]} tokens, depth "
        f"{args.depth}, {args.keys} keys, shared prefix {shared.length} tokens ({shared.reason or 'shared'})"
    )

    def answer(ids: torch.Tensor, cache: object, split: bool = False) -> list[int]:
        extra = {} if cache is None else {cache_name(model): cache}
        new = len(tokenizer(" 12345", add_special_tokens=False)["input_ids"]) + 2
        splitting = split_cached_attention() if split else contextlib.nullcontext()
        with torch.inference_mode(), pk.past_max_length_allowed(), splitting:
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                                 pad_token_id=pad, **extra)
        return out[0, ids.shape[1] :].tolist()

    with torch.inference_mode():
        model(prompts[0][:, :64], logits_to_keep=1)  # warm-up
    seconds: dict[str, list[float]] = {"unshared": [], "masked": [], "split": []}
    copies = {"masked": 0.0, "split": 0.0}
    each = {how: SharedPrefix(model, prompts) for how in copies}  # each path pays its own prefix forward
    for i, ids in enumerate(prompts):
        start = time.process_time()
        fresh = answer(ids, None)
        seconds["unshared"].append(time.process_time() - start)
        got = {}
        for how in ("masked", "split"):  # the shared prefix's suffix through SDPA's explicit mask, then split
            start = time.process_time()
            cache = each[how].cache_for(ids)  # the first call runs the prefix's forward; each, a deep copy
            copies[how] += time.process_time() - start
            start = time.process_time()
            got[how] = answer(ids, cache, split=how == "split")
            seconds[how].append(time.process_time() - start)
        print(
            f"key {i}: unshared {seconds['unshared'][-1]:.1f} s; after the shared prefix: masked suffix "
            f"{seconds['masked'][-1]:.1f} s, split suffix {seconds['split'][-1]:.1f} s; answers equal: "
            f"{fresh == got['masked'] == got['split']} ({tokenizer.decode(fresh)!r})",
            flush=True,
        )
    n = len(prompts)
    print(f"prefix forward once and {n} cache copies: {copies['masked']:.1f} / {copies['split']:.1f} CPU-s")
    base = sum(seconds["unshared"]) / n
    for how in ("masked", "split"):
        per = (copies[how] + sum(seconds[how])) / n
        after = sum(seconds[how]) / n
        print(f"CPU-s per answered needle: unshared {base:.1f}, shared prefix + {how} suffix {per:.1f} (prefix "
              f"amortized over {n}), {base / per:.2f}x; per key after the prefix {after:.1f}")


if __name__ == "__main__":
    main()
