"""What a saved file can carry of an extension, and the advice when it cannot: ``remap_save_problem`` (why no config
runs a remapping method as posenc measures it), ``DCA_SERVED_MODEL_TYPES`` (where a serving engine reads
``dual_chunk_attention_config``) and ``rebuild_advice`` (the calls that rebuild a model no file records). Used by
``posenc.hf.save``, ``posenc.hf.gguf_export`` and the remapping patch's refusals.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from posenc.hf import _record

#: Architectures whose ``dual_chunk_attention_config`` a serving engine reads (vLLM's Qwen2/Qwen3 model files pass it
#: to a dual-chunk RoPE and attention backend, SGLang's Qwen2 one too -- its qwen3.py@01b5f572 does not; Llama,
#: Mistral, Phi-3, GPT-NeoX and Gemma ignore it), among those the remapping patch handles. transformers reads it for
#: none. ``posenc.runtimes`` says per runtime what runs.
DCA_SERVED_MODEL_TYPES = ("qwen2", "qwen3")


def remap_save_problem(config: Any, method: Any, encoding: Any = None) -> str | None:
    """Why no saved config runs ``method`` (a ``RemapMethod``, or its name) as posenc measures it, or None when
    vLLM and SGLang do: Dual Chunk Attention in their form (``dca_vllm``: logits times ``max(1, 0.1 ln(S/L) +
    1)**2``) on an architecture whose ``dual_chunk_attention_config`` they read, over plain RoPE (their dual-chunk
    RoPE reads only the base)."""
    name = method if isinstance(method, str) else method.name
    kind = getattr(config, "model_type", None) if not isinstance(config, str) else config
    if name == "dca":
        return (
            "vLLM and SGLang scale DCA's logits by max(1, 0.1 ln(S/L) + 1)^2, ChunkLlama's form (this model) by "
            "max(1, 0.05 ln(S/L) + 1)^2: extend with 'dca_vllm' to measure what they serve"
        )
    if name == "string":
        return (
            "vLLM reads no string_config: only the STRING authors' fork of vLLM 0.5.0 (vllm_string) does, and "
            "vLLM's own LlamaAttention passes no such key to its RoPE or attention (transformers reads none either)"
        )
    if name != "dca_vllm":
        return f"no serving format records {name}"
    if kind not in DCA_SERVED_MODEL_TYPES:
        return (
            f"vLLM reads dual_chunk_attention_config for {list(DCA_SERVED_MODEL_TYPES)} only, not {kind!r} (SGLang "
            "for qwen2 only, transformers for none)"
        )
    scaling = getattr(getattr(encoding, "config", None), "scaling", None)
    if scaling is not None:
        return (
            "vLLM's dual-chunk RoPE rotates with the plain base and ignores rope_parameters, so the "
            f"{scaling.rope_type} scaling under DCA would be dropped"
        )
    return None


_OWNER = "_posenc_owner"  # on a transformers model inside a patched one (model.model): a weakref to the patched one


def mark_owner(model: torch.nn.Module, inner: torch.nn.Module) -> None:
    """Remember, on ``inner`` (a transformers model inside ``model``), the model ``extend_context`` was called on:
    its record, not the inner one's, says how to rebuild it."""
    if inner is not model:
        inner.__dict__[_OWNER] = weakref.ref(model)


def rebuild_advice(model: torch.nn.Module) -> str:
    """How to get ``model`` back where no saved file carries its extension: save it as loaded, then make the calls
    made since it was loaded (all of them: a frequency method before a remapping one too). For a model inside a
    patched one (``model.model``), the patched one's calls."""
    owner = model.__dict__.get(_OWNER)
    model = (owner() if owner is not None else None) or model
    calls = _record.replay(model)
    if not calls:  # everything it runs came with loading it (posenc.hf.load_causal_lm re-applied it)
        return "It runs what loading its folder applied: load that folder with posenc.hf.load_causal_lm again"
    return (
        "Save the model as loaded (before posenc.hf.extend_context) and, after loading that, rebuild this one with "
        f"{calls}"
    )
