"""Load a Qwen2 or Gemma 3 GGUF as transformers' own model class, dequantized in memory, reading the header once.

Why not ``AutoModelForCausalLM.from_pretrained(folder, gguf_file=...)``: transformers 5's loader parses the file
with ``gguf.GGUFReader``, which makes a numpy view of every string of the vocabulary: 17 s of a 27 s load of
Gemma 3 270M (262,144 tokens) on an idle 2-core Xeon, before one weight is read. Here the config comes from
``posenc.gguf.config`` (transformers' own tables on posenc's header reader), each tensor is dequantized with the
``gguf`` package, and what llama.cpp's converter changed is undone as transformers' tensor processors undo it
(``modeling_gguf_pytorch_utils.TENSOR_PROCESSORS``: none for ``qwen2``; ``Gemma2TensorProcessor`` for ``gemma3``,
every ``*norm.weight`` stored plus one, as Gemma's RMSNorm scales by ``1 + w``). ``tests/hf/test_load.py`` checks the
result equals transformers' own GGUF load exactly on tiny files of each architecture; the packaged models' tests
check it weight for weight and in full logits against float64 references read from the files.

Reference: transformers ``modeling_gguf_pytorch_utils.load_gguf_checkpoint`` (5.24); llama.cpp
``convert_hf_to_gguf.py`` (``Gemma3Model.modify_tensors``: ``data_torch + 1`` on the norms).
"""

from __future__ import annotations

from typing import Any

import torch

from posenc.gguf import weights as gguf_weights
from posenc.gguf.header import GGUFHeader, GGUFTensor


def _gemma_norms(tensor: GGUFTensor, w: torch.Tensor, config: Any) -> torch.Tensor:
    """Gemma's norms scale by ``1 + w``; llama.cpp stores ``1 + w`` itself."""
    return w - 1 if "norm.weight" in tensor.name else w


#: GGUF architecture -> what its converter changed, undone (None: nothing).
FIXES: dict[str, gguf_weights.Fix | None] = {"qwen2": None, "gemma3": _gemma_norms}


def handles(header: GGUFHeader) -> bool:
    """Whether this loader reads the file: a little-endian ``qwen2`` or ``gemma3`` GGUF (``posenc.gguf.config``
    builds their configs)."""
    return header.byte_order == "<" and header.architecture in FIXES


def model_class(config: Any) -> Any:
    """The causal-LM class transformers' ``AutoModelForCausalLM`` picks for ``config``."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]


def state_dict(header: GGUFHeader, config: Any) -> dict[str, torch.Tensor]:
    """The file's tensors under the model class's names, float32, as transformers' GGUF loader gives them.

    Raises:
        ValueError: naming the file, if a tensor has no place in the model or a weight is missing from the file.
    """
    arch = header.architecture
    names = gguf_weights.tensor_names(header, config, model_class(config), arch)
    return dict(gguf_weights.weights(header, config, names, FIXES[arch]))


def load(
    header: GGUFHeader, config: Any, *, dtype: torch.dtype, device: torch.device, attn_implementation: str | None
) -> Any:
    """The model of the file with ``config`` (``posenc.hf.load.load_config``'s: transformers' config plus the RoPE
    posenc recorded), in ``dtype`` on ``device``, in eval mode."""
    weights = state_dict(header, config)
    kwargs: dict[str, Any] = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    model: Any = model_class(config).from_pretrained(None, config=config, state_dict=weights, dtype=dtype, **kwargs)
    del weights
    model.config._name_or_path = str(header.path.parent)  # as transformers' own GGUF load names it
    return model.to(device).eval()
