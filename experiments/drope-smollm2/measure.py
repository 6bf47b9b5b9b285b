"""Step 2 of run.sh: the recalibrated DroPE model measured at 16,384 tokens in bfloat16, paired with the CPU 16k pick.

The folder ``run.sh`` saved reloads as the recalibrated NoPE model (``posenc.hf.load_causal_lm`` re-applies DroPE
from its config's ``"posenc"`` entry), so the study measures it as its unpatched model (``units=[]``: no method is
applied on top; it is labelled ``none`` in the files). ``methods=("yarn",)`` only fills the setting, which must
name a method ("none" is refused there): with ``units=[]`` no method is measured.
The settings are the pick's (``pick.json``): seed 0, the
default corpus and its held-out text, 16,384 evaluation tokens, passkeys at depth 0.5 and RULER ``niah_single_1``
sampled in rounds of 4 (adaptive: the rounds' seeds are the race's), 8 needles per cell.

Usage: python measure.py MODEL_DIR OUT
"""

import sys
from pathlib import Path

from posenc.lab.extend.study.config import ExtendConfig
from posenc.lab.extend.study.run import run_extend

model, out = sys.argv[1], sys.argv[2]
cfg = ExtendConfig(
    model=model, methods=("yarn",), factors=(2.0,), lengths=(16384,), depths=(0.5,), trials=8, task="ruler",
    ruler_tasks=("niah_single_1",), ruler_samples=8, dtype="bfloat16", seed=0,
)  # fmt: skip
run_extend(cfg, out, units=[], resume=Path(out, "results.csv").exists())
