"""Load a Llama-architecture GGUF file as a transformers ``LlamaForCausalLM``, dequantized in memory, in one pass.

Why not ``AutoModelForCausalLM.from_pretrained(folder, gguf_file=...)``: transformers 5's loader parses the file up
to three times with ``gguf.GGUFReader`` (config, weights, tokenizer) and rebuilds its tensor-name map once per
submodule: 13.5 s and 1.24 GiB peak RSS for SmolLM2-135M on 2 cores, against 2.5 s and 1.05 GiB here. This module
reads the header once (``posenc.gguf.header``), builds the config with the keys transformers' GGUF loader uses
for ``llama`` (``GGUF_CONFIG_MAPPING["llama"]``), dequantizes each tensor with the ``gguf`` package, undoes
llama.cpp's query/key row permutation, and hands the state dict to ``from_pretrained(None, config=...,
state_dict=...)``. The result is a plain float model (no ``quantization_config``); ``tests/hf/test_load.py`` checks
it equals transformers' own GGUF load exactly (config, every weight, generation config, the tokenizer's output) on
tiny files written as llama.cpp writes them (F32, F16, and SmolLM2's Q4_1 / Q8_0 mix; tied and untied heads).

Reference: transformers ``modeling_gguf_pytorch_utils.load_gguf_checkpoint`` and ``LlamaTensorProcessor``;
llama.cpp ``convert_hf_to_gguf.py`` (``LlamaModel.permute``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import torch

from posenc._checks import fail
from posenc.gguf import rope
from posenc.gguf import weights as gguf_weights
from posenc.gguf.header import GGUFHeader, GGUFTensor
from posenc.gguf.weights import dequantize

__all__ = ["dequantize", "handles", "llama_config", "load", "permute", "rope_config", "rope_tensors", "state_dict",
           "tensor_names", "weights"]

#: (GGUF key under the architecture, config key) as in transformers' GGUF_CONFIG_MAPPING["llama"].
_CONFIG_KEYS = (
    ("context_length", "max_position_embeddings"),
    ("block_count", "num_hidden_layers"),
    ("feed_forward_length", "intermediate_size"),
    ("embedding_length", "hidden_size"),
    ("rope.dimension_count", "head_dim"),
    ("rope.freq_base", "rope_theta"),
    ("attention.head_count", "num_attention_heads"),
    ("attention.head_count_kv", "num_key_value_heads"),
    ("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
    ("vocab_size", "vocab_size"),
)
_TOKEN_IDS = (
    ("bos_token_id", "bos_token_id"),
    ("eos_token_id", "eos_token_id"),
    ("unknown_token_id", "unk_token_id"),
    ("padding_token_id", "pad_token_id"),
)


def handles(header: GGUFHeader) -> bool:
    """Whether this fast path loads the file: little-endian Llama GGUFs that transformers also reads as ``llama``
    (it reads a file named exactly ``"mistral"`` as Mistral) with a byte-level BPE (``gpt2``) tokenizer."""
    meta = header.metadata
    return (
        header.byte_order == "<"
        and header.architecture == "llama"
        and meta.get("general.name") != "mistral"
        and meta.get("tokenizer.ggml.model") == "gpt2"
    )


def rope_tensors(header: GGUFHeader) -> dict[str, tuple[float, ...]]:
    """The file's RoPE factor tensors (``rope_freqs``, LongRoPE's ``rope_factors_long/short``) as float values.

    Raises:
        ValueError: naming the tensor, when one is not a float32 vector (llama.cpp reads them as such).
    """
    import numpy as np  # only here: `import posenc` needs torch alone
    out = {}
    with header.path.open("rb") as f:
        for t in header.tensors:
            if t.name in rope.ROPE_TENSORS:
                if t.ggml_type != 0 or len(t.shape) != 1:
                    fail(t.name, f"type {t.ggml_type}, shape {t.shape}", f"an F32 vector in {header.path}")
                f.seek(t.offset)
                out[t.name] = tuple(np.frombuffer(f.read(t.n_bytes), dtype=header.byte_order + "f4").tolist())
    return out


def rope_config(header: GGUFHeader) -> tuple[dict[str, Any], int, bool]:
    """``(rope_parameters, max_position_embeddings, exact)`` of the file (``posenc.gguf.rope.from_gguf``)."""
    return rope.from_gguf(header.metadata, rope_tensors(header), arch="llama", path=str(header.path))


def llama_config(header: GGUFHeader) -> Any:
    """The ``LlamaConfig`` for this file (no weights read): what transformers builds, plus the RoPE scaling the file
    carries for llama.cpp (``posenc.gguf.rope.from_gguf``), which transformers' GGUF loader drops."""
    from transformers import LlamaConfig

    meta = header.metadata
    kwargs: dict[str, Any] = {"tie_word_embeddings": all(t.name != "output.weight" for t in header.tensors)}
    for key, name in _CONFIG_KEYS:
        if f"llama.{key}" in meta:
            kwargs[name] = meta[f"llama.{key}"]
    for key, name in _TOKEN_IDS:
        if f"tokenizer.ggml.{key}" in meta:
            kwargs[name] = meta[f"tokenizer.ggml.{key}"]
    if "vocab_size" not in kwargs and "tokenizer.ggml.tokens" in meta:  # as transformers: the vocabulary's size
        kwargs["vocab_size"] = meta["tokenizer.ggml.tokens"].count
    config = LlamaConfig(**kwargs)
    params, context, _ = rope_config(header)
    default = cast("dict[str, Any]", config.rope_parameters)  # transformers fills it from rope_theta
    if params.get("rope_type", "default") != "default" or params["rope_theta"] != default["rope_theta"]:
        config.rope_parameters = params  # an unscaled file keeps exactly the config transformers builds
        config.max_position_embeddings = context
    return config


def _unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's ``permute``: rows of each head from interleaved pairs back to the half layout HF uses.

    Shapes:
        w (heads * D, hidden) -> same; within a head, row ``2i + j`` moves to ``j * D/2 + i``.
    """
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's ``permute`` (the inverse of ``_unpermute``): each head's rows from the half layout to pairs.

    Shapes:
        w (heads * D, hidden) -> same; within a head, row ``j * D/2 + i`` moves to ``2i + j``.
    """
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def tensor_names(header: GGUFHeader, config: Any) -> list[tuple[Any, str]]:
    """``[(tensor, transformers name)]`` for the file's weights (its RoPE factors are in the config), checked
    before any data is read (``posenc.gguf.weights.tensor_names`` for ``LlamaForCausalLM``).

    Raises:
        ValueError: naming the file, if a tensor of the file has no place in the model or a model weight is missing
            from the file (a file this loader does not understand is refused rather than loaded half-initialised).
    """
    from transformers import LlamaForCausalLM

    return gguf_weights.tensor_names(header, config, LlamaForCausalLM, "llama", skip=rope.ROPE_TENSORS)


def _fix(tensor: GGUFTensor, w: torch.Tensor, config: Any) -> torch.Tensor:
    """llama.cpp's converter permutes the query and key rows; transformers' Llama wants them unpermuted."""
    if ".attn_q." in tensor.name:
        return _unpermute(w, config.num_attention_heads)
    if ".attn_k." in tensor.name:
        return _unpermute(w, config.num_key_value_heads)
    return w


def weights(header: GGUFHeader, config: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The file's tensors one at a time, ``(transformers name, float32 tensor)``, in the file's order: what
    ``state_dict`` holds, for a pass that needs one tensor at a time (the file's names are checked first).

    Raises:
        ValueError: as ``state_dict``, before any tensor is read.
    """
    return gguf_weights.weights(header, config, tensor_names(header, config), _fix)


def state_dict(header: GGUFHeader, config: Any) -> dict[str, torch.Tensor]:
    """The file's tensors under transformers' ``LlamaForCausalLM`` names, float32.

    Raises:
        ValueError: naming the file, if a tensor of the file has no place in the model or a model weight is missing
            from the file (a file this loader does not understand is refused rather than loaded half-initialised).
    """
    return dict(weights(header, config))


def load(
    header: GGUFHeader, *, dtype: torch.dtype, device: torch.device, attn_implementation: str | None,
    tokenizer: bool = True,
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from the file: the model in ``dtype`` on ``device``, in eval mode (``tokenizer``
    False: None in its place, not built)."""
    from transformers import LlamaForCausalLM, TokenizersBackend

    config = llama_config(header)
    weights = state_dict(header, config)
    kwargs: dict[str, Any] = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    model: Any = LlamaForCausalLM.from_pretrained(None, config=config, state_dict=weights, dtype=dtype, **kwargs)
    del weights
    model = model.to(device).eval()
    # The class AutoTokenizer picks for a byte-level BPE GGUF, built from the same file without re-deriving the
    # config (which costs a full GGUFReader pass in transformers 5).
    if not tokenizer:
        return model, None
    return model, TokenizersBackend.from_pretrained(
        str(header.path.parent), gguf_file=header.path.name, local_files_only=True
    )
