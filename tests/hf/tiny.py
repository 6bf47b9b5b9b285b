"""Tiny randomly initialised transformers models, built from configs (nothing is downloaded)."""

from __future__ import annotations

import logging

import torch
import transformers

logging.getLogger("transformers").setLevel(logging.ERROR)  # tiny configs trigger harmless warnings

ORIGINAL = 32  # max_position_embeddings (MPT: max_seq_len) of every tiny model
_DECODER = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, vocab_size=64, intermediate_size=64)
_GQA = dict(num_key_value_heads=2, head_dim=8)
_GEMMA = dict(**_GQA, query_pre_attn_scalar=8, sliding_window=16, pad_token_id=0)
# Granite-SWA: a NoPE full-attention layer (base 0), RoPE at two bases, sliding layers in between.
_GRANITE = dict(
    **{**_DECODER, "num_hidden_layers": 4},
    num_key_value_heads=2,
    sliding_window=16,
    layer_types=["full_attention", "sliding_attention", "full_attention", "sliding_attention"],
    layer_rope_theta=[0, 10000.0, 500000.0, 10000.0],
    bos_token_id=1,
    eos_token_id=2,
)
# MiMo-V2-Flash: full layers at base 5e6, sliding at 1e4, both rotating int(24 * 0.334) = 8 of 24 channels.
_MIMO = dict(
    **_DECODER,
    num_key_value_heads=2,
    head_dim=24,
    v_head_dim=8,
    sliding_window=16,
    layer_types=["full_attention", "sliding_attention"],
    moe_intermediate_size=16,
    n_routed_experts=4,
    num_experts_per_tok=2,
)

# model_type -> (config class, model class, config kwargs)
TINY = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {**_DECODER, **_GQA}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {**_DECODER, **_GQA}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {**_DECODER, **_GQA}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {**_DECODER, **_GQA}),
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        {**_DECODER, **_GQA, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
    ),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {**_DECODER, "rotary_pct": 0.5}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {**_DECODER, **_GQA, "pad_token_id": 0}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {**_DECODER, **_GEMMA}),
    "gemma3_text": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {**_DECODER, **_GEMMA, "layer_types": ["sliding_attention", "full_attention"]},
    ),
    "granite_swa": ("GraniteSWAConfig", "GraniteSWAForCausalLM", _GRANITE),
    "granitemoe_swa": (
        "GraniteMoeSWAConfig",
        "GraniteMoeSWAForCausalLM",
        {**_GRANITE, "num_local_experts": 4, "num_experts_per_tok": 2, "shared_intermediate_size": 32},
    ),
    "mimo_v2_flash": ("MiMoV2FlashConfig", "MiMoV2FlashForCausalLM", _MIMO),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(hidden_size=32, n_head=4, n_layer=2, vocab_size=64)),
    "mpt": ("MptConfig", "MptForCausalLM", dict(d_model=32, n_heads=4, n_layers=2, vocab_size=64, expansion_ratio=2)),
}
#: Models with RoPE per layer (a base per layer, or per layer type with partial rotary): their own test files
#: (tests/hf/test_granite_swa.py, tests/hf/test_mimo_v2_flash.py) walk extend_context over them.
PER_LAYER_KINDS = ("granite_swa", "granitemoe_swa", "mimo_v2_flash")
ROPE_KINDS = [k for k in TINY if k not in ("bloom", "mpt", *PER_LAYER_KINDS)]


def tiny_config(kind: str, **overrides):
    """The tiny config of ``kind``, with ``overrides`` (e.g. ``rope_parameters``) on top."""
    config_class, _, kwargs = TINY[kind]
    length = {"max_seq_len": ORIGINAL} if kind == "mpt" else {"max_position_embeddings": ORIGINAL}
    if kind == "bloom":
        length = {}
    return getattr(transformers, config_class)(**{**kwargs, **length, **overrides})


def tiny_model(kind: str, state_dict=None, **overrides):
    """A tiny eval-mode model (eager attention); with ``state_dict`` it takes those weights."""
    model_class = getattr(transformers, TINY[kind][1])
    config = tiny_config(kind, **overrides)
    config._attn_implementation = "eager"
    model = model_class(config).eval()
    if state_dict is not None:
        model.load_state_dict(state_dict)
    return model


@torch.no_grad()
def logits(model, ids, **kwargs):
    return model(ids, use_cache=False, **kwargs).logits
