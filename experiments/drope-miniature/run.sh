#!/usr/bin/env bash
# DroPE in miniature (issue 50, point 2): per seed, the lab's byte-level models trained with RoPE and NoPE at 64
# bytes (1000 steps; RoPE's scalings at each evaluation length come with the lab's report), then the RoPE model's
# RoPE dropped and recalibrated for 50 steps (5% of pre-training) at 64 bytes, beside RoPE trained 50 steps more.
# Resumable: rerun the same command after an interruption.
set -euo pipefail
here=$(dirname "$0")
lengths=64,128,256,512,1024
for seed in ${SEEDS:-0 1 2}; do
  posenc lab --encodings rope,nope --seed "$seed" --jobs 1 --out "$here/seed$seed/lab" --resume --quiet
  posenc extend "$here/seed$seed/lab/runs/rope" --methods drope --finetune-steps 50 --lengths "$lengths" \
    --seed "$seed" --out "$here/seed$seed/drope" --resume --quiet
done
python "$here/summarize.py" "$here"
