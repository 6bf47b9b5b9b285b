#!/usr/bin/env bash
# DroPE in miniature on the passkey task (issue 50, point 2): per seed a fresh lab GPT trained with RoPE on the
# passkey task at 128 bytes (1000 steps), then RoPE dropped and recalibrated on the same task at 128 bytes for 200
# steps (20%), beside RoPE trained as long (`none +ft200`); 20 keys per length and depth, 5 depths. Resumable.
set -euo pipefail
here=$(dirname "$0")
for seed in ${SEEDS:-0 1 2}; do
  posenc extend new:rope --task passkey --train-len 128 --methods drope --factors 1 --finetune-steps 200 \
    --lengths 128,256,512,1024 --trials 20 --stop-width 0 --seed "$seed" --out "$here/seed$seed" --resume --quiet
done
