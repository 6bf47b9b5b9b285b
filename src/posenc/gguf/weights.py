"""A GGUF file's tensors under a transformers model's parameter names, dequantized to float32, one at a time.

The pieces every one-pass loader shares (``posenc.gguf.llama``, ``posenc.gguf.native``): the map from GGUF tensor
names to transformers names (``gguf.get_tensor_name_map``, as transformers' ``get_gguf_hf_weights_map`` builds it),
checked before any data is read, and dequantization with the ``gguf`` package from a read-only map of the file.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Collection, Iterator
from typing import Any

import torch

from posenc._checks import fail
from posenc.gguf.header import GGUFHeader, GGUFTensor

#: ``fix(tensor, values, config)``: what the converter did to a tensor, undone (llama.cpp permutes Llama's query
#: and key rows, stores Gemma's norm weights plus one, ...).
Fix = Callable[[GGUFTensor, torch.Tensor, Any], torch.Tensor]


def dequantize(buf: mmap.mmap, tensor: GGUFTensor) -> torch.Tensor:
    """One tensor of the file as float32 (a fresh array: the map is read-only)."""
    import numpy as np  # only here: `import posenc` needs torch alone
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    qtype = GGMLQuantizationType(tensor.ggml_type)
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    raw = np.frombuffer(buf, dtype=np.uint8, count=tensor.n_bytes, offset=tensor.offset)
    raw = raw.reshape(*tensor.shape[:-1], tensor.shape[-1] // block * block_bytes)  # (..., bytes per row)
    values = dequantize(raw, qtype)
    values = values if values.flags.writeable else values.copy()  # F32 comes back as a view of the map
    return torch.from_numpy(values.astype(np.float32, copy=False))


def tensor_names(
    header: GGUFHeader, config: Any, model_class: Any, arch: str, *, skip: Collection[str] = ()
) -> list[tuple[GGUFTensor, str]]:
    """``[(tensor, transformers name)]`` for the file's weights, ``model_class(config)``'s names through gguf's
    name map for ``arch`` (a ``gguf.MODEL_ARCH_NAMES`` value, e.g. ``"qwen2"``); tensors named in ``skip`` (RoPE
    factors, read into the config) are left out.

    Raises:
        ValueError: naming the file, if a tensor of the file has no place in the model or a model weight is missing
            from the file (a file the loader does not understand is refused rather than loaded half-initialised).
    """
    import gguf

    label = model_class.__name__
    with torch.device("meta"):  # only the parameter names are needed; building on meta costs nothing
        expected = model_class(config).state_dict()
    model_arch = next(key for key, name in gguf.MODEL_ARCH_NAMES.items() if name == arch)
    names = gguf.get_tensor_name_map(model_arch, config.num_hidden_layers)
    to_hf = {}
    for hf_name in expected:
        base, _, suffix = hf_name.rpartition(".")
        gguf_name = names.get_name(base)
        if gguf_name is not None:
            to_hf[f"{gguf_name}.{suffix}"] = hf_name
    kept = [t for t in header.tensors if t.name not in skip]
    unknown = [t.name for t in kept if t.name not in to_hf]
    if unknown:
        fail("path", str(header.path), f"a {arch} GGUF whose tensors all map to {label} (not {unknown[:5]})")
    found = {to_hf[t.name] for t in kept}
    tied = bool(getattr(config, "tie_word_embeddings", False))
    missing = [k for k in expected if k not in found and not (k == "lm_head.weight" and tied)]
    if missing:
        fail("path", str(header.path), f"a {arch} GGUF holding every weight of {label} (missing {missing[:5]})")
    return [(t, to_hf[t.name]) for t in kept]


def weights(
    header: GGUFHeader, config: Any, names: list[tuple[GGUFTensor, str]], fix: Fix | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(transformers name, float32 tensor)`` for each of ``names`` (from :func:`tensor_names`), in the file's
    order, each passed through ``fix`` when given."""
    with header.path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        for tensor, hf_name in names:
            w = dequantize(buf, tensor)
            yield hf_name, w if fix is None else fix(tensor, w, config)
