"""Training-free context extension by remapping positions: Self-Extend, Dual Chunk Attention (ChunkLlama's form, and
vLLM's as ``dca_vllm``), ReRoPE (and Leaky ReRoPE), LM-Infinite, STRING, StreamingLLM.

Each method is a frozen description of its branches (``Branch``: a query position map, a key position map, a
region of (query, key) pairs, a ``KeyInterval`` where it is one interval of keys per query, so that tiles wholly inside
it run without a mask); ``remap_attention`` runs any of them with one exact softmax and memory linear in the
length; ``posenc.attention(..., remap=method)`` routes to it. ``remap_method(name, original=, target=, **options)``
builds a method with its paper's parameters for a pretraining length and a target length (options override them).
STRING (``WITHIN_TRAINING``) also takes a target at or within the pretraining length, where it is meant to run.
"""

from __future__ import annotations

from typing import Any

from posenc._checks import check_choice, check_positive_int, fail
from posenc.remapping._branch import Branch, KeyInterval, RemapMethod
from posenc.remapping.dual_chunk import CHUNKLLAMA_MSCALE, VLLM_MSCALE, DualChunk
from posenc.remapping.lm_infinite import LMInfinite
from posenc.remapping.operator import remap_attention
from posenc.remapping.rerope import ReRoPE
from posenc.remapping.self_extend import SelfExtend
from posenc.remapping.streaming_llm import StreamingLLM
from posenc.remapping.string import STRING_MSCALE, String

#: name -> (class, the options ``remap_method`` takes for it)
METHODS: dict[str, tuple[type[Any], tuple[str, ...]]] = {
    "self_extend": (SelfExtend, ("window", "group")),
    "dca": (DualChunk, ("chunk_size", "local_window", "mscale")),
    "dca_vllm": (DualChunk, ("chunk_size", "local_window")),
    "rerope": (ReRoPE, ("window", "log_scale")),
    "leaky_rerope": (ReRoPE, ("window", "leak", "log_scale")),
    "lm_infinite": (LMInfinite, ("window", "global_tokens")),
    "string": (String, ("shifted_offset", "local_window", "mscale")),
    "streaming_llm": (StreamingLLM, ("window", "sinks")),
}
#: Methods that change attention at and within the pretraining length too (STRING overwrites the least-trained
#: distances there); the others change nothing inside it and refuse such a target.
WITHIN_TRAINING = ("string",)


def remap_method(name: str, *, original: int, target: int, **options: Any) -> RemapMethod:
    """The method ``name`` for a model pretrained at ``original`` tokens run at ``target``, with its paper's
    parameters unless ``options`` give them; refuses parameters that reach less than ``target``."""
    check_choice("method", name, tuple(METHODS))
    original = check_positive_int("original", original)
    target = check_positive_int("target", target)
    if target <= original and name not in WITHIN_TRAINING:
        fail("target", target, f"beyond the pretraining length {original} (within it there is nothing to remap)")
    cls, allowed = METHODS[name]
    for key, value in options.items():
        if key not in allowed:
            fail(key, value, f"one of the options {list(allowed)} of {name!r} (or none)")
    if name == "leaky_rerope":
        options = {"leak": "auto", **options}
    if name == "dca_vllm":
        options = {**options, "mscale": VLLM_MSCALE}
    return cls.for_target(original, target, **options)


__all__ = [
    "CHUNKLLAMA_MSCALE",
    "METHODS",
    "Branch",
    "DualChunk",
    "KeyInterval",
    "LMInfinite",
    "ReRoPE",
    "RemapMethod",
    "STRING_MSCALE",
    "SelfExtend",
    "StreamingLLM",
    "String",
    "VLLM_MSCALE",
    "WITHIN_TRAINING",
    "remap_attention",
    "remap_method",
]
