"""Tiny GGUF files written with the ``gguf`` package's ``GGUFWriter`` the way llama.cpp's converter writes them
(``convert_hf_to_gguf.py``: tensor names from ``gguf.get_tensor_name_map``, query/key rows permuted), from the tiny
transformers models of ``tiny.py``; and broken copies of a file."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from hf.tiny import ORIGINAL

# A byte-level BPE vocabulary (``Ġ`` is GPT-2's space) with two merges and four special tokens: 64 tokens, the tiny
# models' vocab_size.
TOKENS = [chr(ord("A") + i) for i in range(26)] + [chr(ord("a") + i) for i in range(26)]
TOKENS += ["Ġ", "!", ".", ",", "?", "-", "ab", "Ġa", "<s>", "</s>", "<unk>", "<pad>"]
MERGES = ["a b", "Ġ a"]
BOS, EOS, UNK, PAD = 60, 61, 62, 63


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute``: each head's rows from HF's half layout to interleaved pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(
    path: Path,
    arch: str,
    tensors: dict[str, np.ndarray],
    *,
    kv: dict | None = None,
    endian: gguf.GGUFEndian = gguf.GGUFEndian.LITTLE,
    tokenizer: bool = True,
) -> Path:
    """A GGUF of architecture ``arch`` holding ``tensors`` (GGUF names, torch-order shapes; quantized ones as
    ``(blocks, GGMLQuantizationType)``), the ``kv`` metadata (``"llama.context_length": 32``; ints as uint32, floats
    as float32, strings, booleans, lists as arrays) and a tiny tokenizer."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(path, arch, endianess=endian)
    for key, value in (kv or {}).items():
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, (list, tuple)):
            w.add_array(key, list(value))
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_uint32(key, value)
    if tokenizer:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(TOKENS)
        w.add_token_merges(MERGES)
        w.add_token_types([1] * 60 + [3] * 4)
        w.add_bos_token_id(BOS)
        w.add_eos_token_id(EOS)
        w.add_unk_token_id(UNK)
        w.add_pad_token_id(PAD)
    for name, array in tensors.items():
        if isinstance(array, tuple):  # (quantized blocks, their type)
            w.add_tensor(name, array[0], raw_dtype=array[1])
        else:
            w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def llama_kv(config, arch: str = "llama", **extra) -> dict:
    """The ``<arch>.*`` metadata llama.cpp writes for a Llama-like config (Llama, Qwen2)."""
    return {
        "general.name": f"tiny {arch}",
        f"{arch}.context_length": config.max_position_embeddings,
        f"{arch}.embedding_length": config.hidden_size,
        f"{arch}.block_count": config.num_hidden_layers,
        f"{arch}.feed_forward_length": config.intermediate_size,
        f"{arch}.attention.head_count": config.num_attention_heads,
        f"{arch}.attention.head_count_kv": config.num_key_value_heads,
        f"{arch}.rope.dimension_count": config.hidden_size // config.num_attention_heads,
        f"{arch}.rope.freq_base": float(config.rope_parameters["rope_theta"]),
        f"{arch}.attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
        **extra,
    }


def llama_tensors(model, *, weights: str = "f16", arch: str = "llama") -> dict[str, np.ndarray | tuple]:
    """The model's weights under GGUF names; no ``output.weight`` when the embedding is tied. Llama's query/key rows
    are permuted (Qwen2's are not: llama.cpp permutes only for its Llama converter).

    ``weights``: ``"f32"``; ``"f16"`` (projections in float16, the rest float32, as an F16 conversion); or
    ``"quantized"``, SmolLM2's Q4_1 file's mix: projections Q4_1, token embedding Q8_0, the rest float32.
    """
    quantized = {"proj": gguf.GGMLQuantizationType.Q4_1, "embed_tokens": gguf.GGMLQuantizationType.Q8_0}
    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], config.num_hidden_layers)
    out = {}
    for key, value in model.state_dict().items():
        base, _, suffix = key.rpartition(".")
        name = names.get_name(base)
        if name is None or (name == "output" and config.tie_word_embeddings):
            continue
        w = value.detach().numpy()
        if arch == "llama" and ".q_proj" in key:
            w = permute(w, config.num_attention_heads)
        elif arch == "llama" and ".k_proj" in key:
            w = permute(w, config.num_key_value_heads)
        matrix = w.ndim == 2  # biases (Qwen2's q/k/v) stay float32, as llama.cpp keeps 1-D tensors
        qtype = next((q for part, q in quantized.items() if part in key), None)
        if weights == "quantized" and qtype is not None and matrix:
            out[f"{name}.{suffix}"] = (gguf.quants.quantize(w, qtype), qtype)
        else:
            out[f"{name}.{suffix}"] = w.astype(np.float16) if weights == "f16" and "proj" in key and matrix else w
    return out


def write_llama(path: Path, model, *, weights: str = "f16", arch: str = "llama", **kv) -> Path:
    """The GGUF llama.cpp would write for the tiny transformers Llama (or ``arch="qwen2"``: Qwen2) ``model``, with
    extra metadata ``kv``."""
    tensors = llama_tensors(model, weights=weights, arch=arch)
    return write_gguf(path, arch, tensors, kv=llama_kv(model.config, arch, **kv))


def write_other(path: Path, arch: str) -> Path:
    """A minimal GGUF of another architecture (one small tensor), e.g. ``"mamba"``."""
    kv = {f"{arch}.context_length": ORIGINAL, f"{arch}.block_count": 1, f"{arch}.embedding_length": 8}
    return write_gguf(path, arch, {"token_embd.weight": np.ones((64, 8), np.float32)}, kv=kv)


def broken_copy(src: Path, dst: Path, *, keep: int | None = None, at: int = 0, patch: bytes = b"") -> Path:
    """A copy of ``src`` cut to its first ``keep`` bytes and/or with ``patch`` written over it at byte ``at``."""
    data = bytearray(src.read_bytes()[:keep])
    data[at : at + len(patch)] = patch
    dst.write_bytes(bytes(data))
    return dst


#: A Gemma 3 of llama.cpp's layer pattern: every 6th layer full (the tiny config's own two layers would both be
#: sliding in llama.cpp and in transformers' GGUF loader, which read no layer types).
GEMMA3_LAYERS = 6


def tiny_gemma3(**overrides):
    """The tiny Gemma 3 of ``hf.tiny`` with ``GEMMA3_LAYERS`` layers in llama.cpp's pattern (full at layer 5)."""
    from hf.tiny import tiny_model

    types = ["sliding_attention"] * (GEMMA3_LAYERS - 1) + ["full_attention"]
    return tiny_model("gemma3_text", num_hidden_layers=GEMMA3_LAYERS, layer_types=types, **overrides)


def write_gemma3(path: Path, model, **kv) -> Path:
    """The F32 GGUF llama.cpp's converter writes for a tiny Gemma 3 (``Gemma3Model.modify_tensors``: every norm weight
    plus 1; no q/k permutation; a tied head left out), with a SentencePiece-style (``llama``) vocabulary as Gemma's
    GGUFs hold, and extra metadata ``kv``."""
    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, config.num_hidden_layers)
    tensors = {}
    for key, value in model.state_dict().items():
        base, _, suffix = key.rpartition(".")
        name = names.get_name(base)
        if name is None or (name == "output" and config.tie_word_embeddings):
            continue
        w = value.detach().numpy().astype(np.float32)
        tensors[f"{name}.{suffix}"] = w + 1 if key.endswith("norm.weight") else w
    meta = {
        "general.name": "tiny gemma3",
        "gemma3.context_length": config.max_position_embeddings,
        "gemma3.embedding_length": config.hidden_size,
        "gemma3.block_count": config.num_hidden_layers,
        "gemma3.feed_forward_length": config.intermediate_size,
        "gemma3.attention.head_count": config.num_attention_heads,
        "gemma3.attention.head_count_kv": config.num_key_value_heads,
        "gemma3.attention.key_length": config.head_dim,
        "gemma3.attention.value_length": config.head_dim,
        "gemma3.rope.freq_base": float(config.rope_parameters["full_attention"]["rope_theta"]),
        "gemma3.attention.sliding_window": config.sliding_window,
        "gemma3.attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
        **kv,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(path, "gemma3")
    for key, value in meta.items():
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, (list, tuple)):
            w.add_array(key, list(value))
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_uint32(key, value)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(["<pad>", "<eos>", "<bos>", "<unk>"] + [f"▁{t}" for t in TOKENS[:60]])
    w.add_token_scores([0.0] * 4 + [-float(i) for i in range(60)])
    w.add_token_types([3, 3, 3, 2] + [1] * 60)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    for name, array in tensors.items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def edited_copy(src: Path, dst: Path, *, drop: tuple[str, ...] = (), put: dict | None = None) -> Path:
    """A copy of the GGUF ``src`` with the metadata keys ``drop`` removed and ``put`` (``{key: (value, "FLOAT32")}``)
    set, its tensors copied byte for byte: what a converter or an editor that drops or rewrites keys leaves."""
    from posenc.gguf import write
    from posenc.gguf.header import read_gguf_header

    header = write.full_header(read_gguf_header(src))
    fields = []
    for name, value in header.metadata.items():
        if name == "general.architecture" or name in drop or name in (put or {}):
            continue
        kind = gguf.GGUFValueType[header.value_types[name].upper()]
        sub = gguf.GGUFValueType[header.array_types[name].upper()] if kind == gguf.GGUFValueType.ARRAY else None
        fields.append((name, value, kind, sub))
    fields += [(name, value, gguf.GGUFValueType[kind], None) for name, (value, kind) in (put or {}).items()]

    class _NoFactors:
        @staticmethod
        def tensors() -> dict:
            return {}

    write.write(dst, header, fields, _NoFactors(), None)
    return dst
