#!/usr/bin/env bash
# GPU call 2 of 2 (carry .gguf_b and .whl; run part1.sh first, within 30 s of it): the GPU tests, the pick resumed
# from experiments/picking-a-method/h200-2026-11-27 (or started), the benchmarks alone. Every stage has a limit
# inside the call's 600 s; logs and a tarball of the results come back under $OUT.
set -u
T0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - T0) )); }   # seconds from now until second $1 of this script
. bench/gpu/setup.sh > "$OUT/setup.txt" 2>&1
picks=experiments/picking-a-method/h200-2026-11-27
# 1. Correct: everything marked gpu, and the Triton tests (compiled on the GPU), beside the pick.
( timeout -s TERM $(left 200) python3 -m pytest -p no:cacheprovider -n 6 -q -rfEs --timeout 240 -k "gpu or test_triton" \
    tests/kernels/test_triton.py tests/test_attention.py tests/test_attention_local_grad.py tests/remapping/test_cuda.py \
    tests/test_cli_cuda.py tests/encodings > "$OUT/tests.log" 2>&1; echo "exit $?" >> "$OUT/tests.log" ) &
# 2. The question: the 16k pick resumed (its folder holds screening and the race's first round).
timeout -s TERM $(left 420) python3 -m posenc extend smollm2 --pick --target 16384 --task ruler --trials 20 \
  --depths 0.5 --device cuda --out $picks/pick-16k --resume > "$OUT/pick-16k.log" 2>&1
wait
tar czf "$OUT/picks.tgz" $picks
# 3. Fast, alone on the GPU.
timeout -s TERM $(left 530) python3 -m posenc bench --device cuda --compile --lengths 1024,4096,16384,32768 \
  --head-dims 128 --layouts half,interleaved --min-run-time 0.25 --attention-lengths 8192,32768 --out /tmp/bench \
  > "$OUT/bench.log" 2>&1
tar czf "$OUT/bench.tgz" -C /tmp bench
echo "done after $(( $(date +%s) - T0 )) s"; tail -n 4 "$OUT/tests.log" "$OUT/pick-16k.log"
