"""A GGUF file's tensors as float64 torch tensors, read with the ``gguf`` package alone (no transformers, no posenc).

``gguf.GGUFReader`` maps the file; ``gguf.quants.dequantize`` decodes a quantized tensor block by block, in numpy,
to float32 -- the values every runtime multiplies by (transformers' GGUF loader calls the same function). A GGUF
tensor of shape ``[ne0, ne1]`` (innermost first) holds ``ne1`` rows of ``ne0`` values, so its rows are PyTorch's
``(out_features, in_features)`` layout as they are; a row is a whole number of quantization blocks, so a few rows
(the embeddings of a prompt's tokens, a slice of the vocabulary) decode on their own without the rest.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import gguf
import numpy as np
import torch


class GGUFTensors:
    """Header values and tensors of one GGUF file, decoded on demand (nothing is held but the mapping).

    Shapes:
        ``tensors(name)``: ``(ne1, ne0)`` for a matrix (``(out_features, in_features)``), ``(ne0,)`` for a vector;
        ``tensors(name, rows)``: ``(len(rows), ne0)``.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = str(path)
        self.reader = gguf.GGUFReader(self.path)
        self.infos = {t.name: t for t in self.reader.tensors}

    def value(self, key: str, default: Any = None) -> Any:
        """A header value (``"gemma3.attention.head_count"``), or ``default`` when the header has no such key."""
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def __contains__(self, name: str) -> bool:
        return name in self.infos

    def __call__(self, name: str, rows: torch.Tensor | None = None, *, dtype: torch.dtype = torch.float64):
        info = self.infos[name]
        data = info.data if rows is None else info.data[np.asarray(rows, dtype=np.int64)]
        values = gguf.quants.dequantize(data, info.tensor_type)  # float32, (..., ne0)
        return torch.from_numpy(np.array(values, dtype=np.float32)).to(dtype)  # a copy: the mapping is read-only


def layer_weights(t: GGUFTensors, prefix: str) -> Callable[[str, torch.dtype], torch.Tensor]:
    """``get(name, dtype)``: the tensor ``prefix + name``, dequantized once (kept in float32, exact) and cast on each
    call, so forwards in several dtypes run side by side layer by layer at the cost of one decode."""
    cache: dict[str, torch.Tensor] = {}

    def get(name: str, dtype: torch.dtype) -> torch.Tensor:
        if name not in cache:
            cache[name] = t(prefix + name, dtype=torch.float32)
        return cache[name].to(dtype)

    return get
