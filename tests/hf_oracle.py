"""Build Hugging Face transformers' own RoPE objects for a given posenc setting: the reference oracle."""

from __future__ import annotations

import logging

import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb as neox_apply

logging.getLogger("transformers").setLevel(logging.ERROR)  # HF warns on unusual-but-valid test parameters

__all__ = ["hf_config", "hf_frequencies", "hf_rotary", "neox_apply", "angle_atol"]


def hf_config(
    head_dim, *, base, rope_parameters=None, partial_rotary_factor=1.0, max_position_embeddings=2048, **extra
):
    params = {"rope_type": "default", **(rope_parameters or {}), "rope_theta": base}
    if partial_rotary_factor != 1.0:
        params["partial_rotary_factor"] = partial_rotary_factor
    return LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=params,
        **extra,
    )


def hf_frequencies(config, seq_len=None):
    """(inv_freq, attention_factor) exactly as transformers computes them at init (or for ``seq_len``)."""
    rope_type = config.rope_parameters["rope_type"]
    if rope_type == "default":
        return GPTNeoXRotaryEmbedding.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[rope_type](config, None, seq_len=seq_len)


def hf_rotary(config):
    """A fresh HF rotary module (GPT-NeoX's handles partial rotary in its default type)."""
    return GPTNeoXRotaryEmbedding(config)


def angle_atol(max_position: float, x: torch.Tensor) -> float:
    """HF computes angles in float32: error up to ~2 ulp of the largest angle (inv_freq <= 1), times |x|.

    posenc computes them in float64, so comparisons with HF's cos/sin need this much slack and no more.
    """
    return 4 * max(float(max_position), 1.0) * 2.0**-24 * float(x.abs().max()) + 1e-6
