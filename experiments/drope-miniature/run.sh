#!/usr/bin/env bash
# DroPE in miniature (issue 50, point 2): per seed, the lab's byte-level models trained with RoPE and NoPE at 64
# bytes (1000 steps; RoPE's scalings at each evaluation length come with the lab's report), then the RoPE model's
# RoPE dropped and recalibrated at 64 bytes for 50 and for 200 steps (5% and 20% of pre-training), each beside RoPE
# trained as many steps more on the same 64-byte windows (`none x1 +ftN`: --factors 1 keeps the control at the
# original context). Resumable: rerun the same command after an interruption.
set -euo pipefail
here=$(dirname "$0")
lengths=64,128,256,512,1024
for seed in ${SEEDS:-0 1 2}; do
  posenc lab --encodings rope,nope --seed "$seed" --jobs 1 --out "$here/seed$seed/lab" --resume --quiet
  for steps in ${STEPS:-50 200}; do
    posenc extend "$here/seed$seed/lab/runs/rope" --methods drope --factors 1 --finetune-steps "$steps" \
      --lengths "$lengths" --seed "$seed" --out "$here/seed$seed/drope-ft$steps" --resume --quiet
  done
done
python "$here/summarize.py" "$here"
