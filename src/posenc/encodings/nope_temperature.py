"""``NoPETemperature``: NoPE with Llama 4's attention temperature tuning (queries scaled by the log of position).

A NoPE layer attends more uniformly as the context grows; Llama 4's NoPE layers multiply each query by
``log(1 + floor((p + 1) / floor_scale)) * attn_scale + 1`` at its position ``p`` (``attn_temperature_tuning``) to
sharpen attention again at long range (Meta 2025, Llama 4; the formula's motivation: Nakanishi 2025,
"Scalable-Softmax Is Superior for Attention", arXiv:2501.19399). Keys and values are unchanged, so the layer still
has no positional information inside the first ``floor_scale - 1`` positions. Llama 4 and SmolLM3 use NoPE in every
4th layer and RoPE in the others (``posenc.hf.layers``; the lab's ``--encodings rope/nope_temperature:4``). How the
keys are counted: ``NoPETemperature.rotate``.

Reference implementation checked against: transformers ``Llama4TextAttention.forward`` (the NoPE branch with
``attn_temperature_tuning``), on full tensors: ``tests/encodings/test_nope_temperature.py``. Formula and numerics:
``posenc.functional.temperature``.

Shapes:
    q (B, H, S, D), k (B, Hkv, T, D); positions (S,) or (B, S), integer or float -> q scaled, k as given.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posenc._checks import check_number
from posenc._config import DictConfig
from posenc.encodings._base import RotaryModule, check_qk
from posenc.encodings.rotary import check_positions
from posenc.functional.temperature import apply_temperature
from posenc.registry import register


@dataclass(frozen=True, kw_only=True, slots=True)
class NoPETemperatureConfig(DictConfig):
    """Llama 4's temperature tuning: ``floor_scale`` tokens per step (> 0), strength ``attn_scale`` (>= 0)."""

    floor_scale: float = 8192.0
    attn_scale: float = 0.1

    def __post_init__(self) -> None:
        check_number("floor_scale", self.floor_scale, above=0.0)
        check_number("attn_scale", self.attn_scale, minimum=0.0)


@register("nope_temperature")
class NoPETemperature(RotaryModule):
    """No positional encoding, with queries scaled up by Llama 4's temperature at their positions.

    Args:
        floor_scale: the temperature steps every ``floor_scale`` tokens (Llama 4: 8192, its attention chunk size);
            at lab scale pick the training length, or the tuning never starts.
        attn_scale: strength of the tuning; 0 makes this plain NoPE.

    Shapes:
        q (B, H, S, D), k (B, Hkv, T, D), positions (S,) or (B, S), key_count (S,) or (B, S) -> q, k of the same
        shapes and dtypes.
    """

    config_class = NoPETemperatureConfig
    reads_key_count = True  # n = p + 1 in Llama 4; posenc.attention passes the keys its mask leaves each query

    def __init__(self, *, floor_scale: float = 8192.0, attn_scale: float = 0.1) -> None:
        super().__init__()
        self.config = NoPETemperatureConfig(floor_scale=floor_scale, attn_scale=attn_scale)

    def rotate(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor,
        *,
        key_count: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``Encoding`` hook: queries scaled for ``n`` keys (``key_count``, ``(S,)`` or ``(B, S)``, as
        ``posenc.attention`` counts them; None: ``q_pos + 1``); keys returned as given (``k_pos`` is only checked).

        The temperature counts the keys a query sees: ``posenc.attention`` passes them (``key_count=``, from its mask),
        so Llama 4's ``p + 1`` -- the keys of its global, causal NoPE layers over positions from 0 -- becomes ``min(p +
        1, W)`` under a window, ``(p mod C) + 1`` within chunks and the document's own count with ``document_ids``, as
        SSMax's ``n`` does (Llama 4 never masks its NoPE layers so; the lab keeps them global). Sinks are not keys.
        Called directly, ``n = p + 1``.
        """
        check_qk(q, k)
        check_positions(q_pos, q, "positions")
        check_positions(k_pos, k, "k_positions")
        self._check_position_pair(q, k, q_pos, k_pos)
        c = self.config
        return apply_temperature(q, q_pos, floor_scale=c.floor_scale, attn_scale=c.attn_scale, key_count=key_count), k

    def extra_repr(self) -> str:
        return f"floor_scale={self.config.floor_scale}, attn_scale={self.config.attn_scale}"
