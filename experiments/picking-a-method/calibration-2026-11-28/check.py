"""The plan's cost model against forwards timed at the lengths a pick measures.

SmolLM2 (bfloat16 where the CPU has the units, as the pick loads it) is calibrated as the pick does
(``HFTarget.calibrate``: plain forwards of 1024, 4096 and 8192 tokens; ``remap_cost``: Self-Extend x4 at 8192), then
one plain and one Self-Extend x4 forward are timed at each ``--check`` length, beside what the estimate predicts, what
the unguarded three-length fit would, and what the earlier calibration (1024 and 4096 only; the remapped forward's
excess at 4096 scaled as attention) would have. Run it on an idle machine:

    python experiments/picking-a-method/calibration-2026-11-28/check.py --check 20480
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from posenc.lab.extend.study import plan
from posenc.lab.extend.study.config import ExtendConfig
from posenc.lab.extend.targets.load import load_target


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", type=int, default=32768)
    parser.add_argument("--check", type=int, nargs="*", default=[20480])
    args = parser.parse_args()
    cfg = ExtendConfig(model="smollm2", methods=("self_extend",), factors=(4.0,), lengths=(args.target,),
                       depths=(0.5,), trials=1, device="cpu")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        target = load_target(cfg, Path(tmp) / "unused", device="cpu", progress=False)
        target.use(plan.resolve(cfg, kind="hf", original=target.original_len, default_methods=("yarn",),
                                device="cpu"))  # fmt: skip
        target.load()
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {target.dtype}, {time.ctime()}")
        start = time.perf_counter()
        spu, _, _ = target.calibrate([args.target])
        sizes, plain = target.timed
        ratio, how = target.remap_cost("self_extend", 4.0, args.target)
        print(f"calibrate + remap_cost: {time.perf_counter() - start:.1f} s")
        fit = plan.fit_forward_times(list(zip(sizes, plain, strict=True)))
        print(f"plain at {sizes}: {[round(t, 3) for t in plain]} s; fit a={fit[0]:.4g} s/token, b={fit[1]:.4g} "
              f"s/token^2 (crossover {fit[0] / fit[1]:.0f}); used: {target.l0:.0f} (the model's own "
              f"{target.dims.l0:.0f}); {how}")  # fmt: skip
        two = plan.fit_forward_times(list(zip(sizes[:2], plain[:2], strict=True)))  # the earlier calibration
        model, _ = target.patched("self_extend", 4.0)
        remap = [target._timed_forward(n, warm_up=i == 0, model=model) for i, n in enumerate(sizes[:2])]
        for n in sorted({*args.check, args.target}):
            line = f"at {n}: plain estimated {spu * target.forward_cost(n):.1f} s, self_extend x4 {ratio:.2f}x"
            line += f"; unguarded 3-length fit: plain {fit[0] * n + fit[1] * n * n:.1f} s"
            if two is not None:  # 1024 and 4096; the remapped excess at 4096 scaled as attention
                attention = max(remap[1] - two[0] * sizes[1], 0.0) / (two[1] * sizes[1] ** 2)
                old = max(1.0, (two[0] * n + attention * two[1] * n * n) / (two[0] * n + two[1] * n * n))
                line += f"; earlier: plain {two[0] * n + two[1] * n * n:.1f} s, self_extend x4 {old:.2f}x"
            if n in args.check:
                t_plain = target._timed_forward(n, warm_up=False)
                t_remap = target._timed_forward(n, warm_up=False, model=model)
                line += f"; MEASURED plain {t_plain:.1f} s, self_extend x4 {t_remap:.1f} s ({t_remap / t_plain:.2f}x)"
            print(line, flush=True)


if __name__ == "__main__":
    main()
