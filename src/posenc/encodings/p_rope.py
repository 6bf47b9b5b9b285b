"""``p_rope``: p-RoPE, RoPE whose lowest-frequency channel pairs do not rotate, buildable by name for the lab.

Paper: Barbero et al. 2024, "Round and Round We Go! What makes Rotary Positional Encodings useful?"
(arXiv:2410.06205), p-RoPE; shipped in Gemma 4 as Hugging Face's ``rope_type: "proportional"``.
Reference implementation: ``transformers.modeling_rope_utils._compute_proportional_rope_parameters`` (frequencies
bit-equal, ``tests/encodings/test_prope.py``); the rotation is ``RotaryEmbedding``'s.

Shapes:
    q (B, H, S, D), k (B, Hkv, T, D); positions (S,) or (B, S), integer or float.

This is a thin factory: the result is a ``RotaryEmbedding`` with a ``ProportionalScaling``, so its config, HF
export (``to_hf``) and every RoPE code path are RoPE's own.
"""

from __future__ import annotations

from posenc.encodings.rotary import RotaryEmbedding
from posenc.registry import register
from posenc.scalings import ProportionalScaling


def p_rope(head_dim: int, *, p: float = 0.75, base: float = 10000.0, layout: str = "half") -> RotaryEmbedding:
    """RoPE in which only the highest-frequency fraction ``p`` of the ``head_dim / 2`` channel pairs rotates.

    Args:
        head_dim: channels per head ``D``.
        p: fraction of the pairs that rotate, in ``[0, 1]``: the first ``int(p * head_dim // 2)`` (the highest
            frequencies, RoPE's own values); the rest keep frequency 0 and pass through unchanged. ``p=1`` is RoPE
            and ``p=0`` is NoPE. Default 0.75, one of the paper's settings (Gemma 4 uses 0.25 with base 1e6).
        base: RoPE base (HF ``rope_theta``).
        layout: ``"half"`` (GPT-NeoX / HF) or ``"interleaved"`` (GPT-J / Meta llama) channel pairing.

    Returns:
        ``RotaryEmbedding(head_dim, base=base, scaling=ProportionalScaling(partial_rotary_factor=p), layout=layout)``.
    """
    return RotaryEmbedding(head_dim, base=base, scaling=ProportionalScaling(partial_rotary_factor=p), layout=layout)


register("p_rope", p_rope)
