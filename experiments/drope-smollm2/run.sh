#!/usr/bin/env bash
# DroPE on SmolLM2-135M on a 2-core CPU (issue 50, point 3): RoPE dropped and the model recalibrated at 2,048-token
# windows for as many steps as one CPU-hour allows (STEPS, measured first: see README.md), saved, then measured at
# 16,384 tokens in bfloat16 on the same held-out text, passkeys and RULER documents as the CPU 16k pick
# (experiments/picking-a-method/cpu-16k-2026-11-27), so its needles pair with the unpatched model's and YaRN's there.
# Resumable: rerun the same command after an interruption (the fine-tune checkpoints every 5 minutes and at SIGTERM).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
steps=${STEPS:?set STEPS, the recalibration steps one CPU-hour allows (README.md)}
lr=${LR:-1e-4}
model=${MODEL_DIR:-$here/model-ft$steps}  # the recalibrated model (float32, ~540 MB: not committed)
resume=()
[ -d "$here/recal-ft$steps" ] && resume=(--resume)
if [ ! -f "$model/config.json" ]; then
  # 1. Recalibration: every parameter, plain causal-LM loss on the default corpus's training split, float32 weights;
  #    measured only at 8,193 tokens (the least a study takes) -- the 16k measurement is step 2, in bfloat16.
  posenc extend smollm2 --methods drope --finetune-steps "$steps" --finetune-window 2048 --finetune-lr "$lr" \
    --lengths 8193 --depths 0.5 --trials 1 --no-baseline --seed 0 --save "$model" --out "$here/recal-ft$steps" \
    "${resume[@]}" --quiet
fi
# 2. The recalibrated model (posenc re-applies DroPE when it loads the folder) at 16k in bfloat16: perplexity past 8k,
#    passkeys at depth 0.5 and RULER niah_single_1, 8 each, drawn in rounds of 4 exactly as the pick's race drew them.
python "$here/measure.py" "$model" "$here/measured-ft$steps"
python "$here/summarize.py" "$here" "$steps"
