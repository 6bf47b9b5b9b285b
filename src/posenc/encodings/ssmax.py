"""``SSMax``: Scalable-Softmax, queries scaled by ``s * log(n)`` (``+ b``) with ``s`` (``b``) learned per head;
over NoPE or RoPE.

Paper: Nakanishi 2025, "Scalable-Softmax Is Superior for Attention" (arXiv:2501.19399): ``softmax((s log n) z)``
over the ``n`` keys a query sees, ``s`` a learnable scalar per layer and head; and its variant with a bias,
``softmax((s log n + b) z)`` (``bias=True``, or ``posenc.build("ssmax_bias")`` / ``"rope_ssmax_bias"``). How ``n`` is
counted, ``window=``, and how it differs from Llama 4's temperature: ``SSMax``. Formula and numerics:
``posenc.functional.ssmax``.

Reference implementation checked against: axolotl ``src/axolotl/monkeypatch/scaled_softmax_attn.py`` (commit
258ce8d4fa04c27ab49e169ba7751d8f4f1a423e: ``score * (s * log(n) + b)``), written out in float64 in
``tests/reference/ssmax.py``; compared on full attention outputs and gradients (in ``s`` and ``b``) in
``tests/encodings/test_ssmax.py``.

Shapes:
    q (B, H, S, D), k (B, Hkv, T, D); positions (S,) or (B, S), integer or float; key_count (S,) or (B, S) integer
    -> q scaled (and, with RoPE, q and k rotated), shapes and dtypes kept; ``s`` (H,) float32, ``b`` (H,) float32
    with ``bias=True``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from posenc._checks import check_number, check_positive_int, fail
from posenc._config import DictConfig
from posenc.encodings._base import RotaryModule, check_qk
from posenc.encodings.rotary import RotaryConfig, RotaryEmbedding, check_positions
from posenc.functional.ssmax import S_INIT, apply_ssmax
from posenc.registry import register


@dataclass(frozen=True, kw_only=True, slots=True)
class SSMaxConfig(DictConfig):
    """SSMax for ``num_heads`` heads: initial ``s`` (``s_init``), a learned bias ``b`` per head or not (``bias``),
    an optional sliding ``window`` (keys) capping ``n``, and an optional RoPE under it (``rope``:
    ``RotaryEmbedding``'s keywords, ``{}`` for the defaults; needs ``head_dim``). ``rope`` is stored normalised (every
    RoPE field, the scaling as a dict)."""

    num_heads: int
    head_dim: int | None = None
    s_init: float = S_INIT
    bias: bool = False
    window: int | None = None
    rope: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        check_positive_int("num_heads", self.num_heads)
        if self.head_dim is not None:
            check_positive_int("head_dim", self.head_dim)
        check_number("s_init", self.s_init)
        if not isinstance(self.bias, bool):
            fail("bias", self.bias, "True (a learned b per head: the factor s log n + b) or False (s log n)")
        if self.window is not None:
            check_positive_int("window", self.window)
        if self.rope is not None:
            if not isinstance(self.rope, Mapping):
                fail("rope", self.rope, "None (NoPE + SSMax) or a dict of RotaryEmbedding keywords ({} for RoPE)")
            if self.head_dim is None:
                fail("head_dim", None, "the head size, which RoPE under SSMax needs (rope= is given)")
            if "head_dim" in self.rope:
                fail("rope['head_dim']", self.rope["head_dim"], "no head_dim inside rope=: SSMax's head_dim is used")
            rope = RotaryConfig.from_dict({**self.rope, "head_dim": self.head_dim}).to_dict()
            del rope["head_dim"]
            object.__setattr__(self, "rope", rope)

    def to_dict(self) -> dict[str, Any]:
        out = DictConfig.to_dict(self)
        out["rope"] = None if self.rope is None else dict(self.rope)
        return out


@register("ssmax")
class SSMax(RotaryModule):
    """Scalable-Softmax: queries multiplied by ``s[h] * log(n)`` (``+ b[h]`` with ``bias=True``), ``n`` the keys
    each query sees (``posenc.attention`` counts them from its mask; ``min(p + 1, window)`` when called alone); NoPE
    or RoPE under it.

    ``b`` starts at 0 (axolotl's default, so training starts from plain SSMax) and ``s`` at 0.43 (``S_INIT``: the
    value of the paper's Figure 1 and axolotl's default ``scaling_softmax_factor``). One module per attention layer
    gives the paper's per-layer-and-head parameters; a model that shares one encoding module across its layers
    should build an SSMax per layer instead (``per_layer = True`` says so; the lab's ``GPT`` does).

    ``n`` is the number of keys the query sees, as the paper defines it (the size of the softmax's input):
    ``posenc.attention`` counts it from its own mask -- causal, ``document_ids``, ``chunk_size`` and ``window`` -- and
    passes it to ``rotate`` (``key_count=``), so a windowed or chunked layer gets ``min(p + 1, W)`` or ``(p mod C) +
    1`` without being told, on every backend and in a KV-cache decode alike. GPT-OSS's learned sinks are not counted
    (a sink adds a logit to the denominator, not a key whose score SSMax scales; as ``sinks -> -inf`` the layer
    becomes SSMax without sinks exactly). Counted from the mask, ``n`` is the keys the softmax really spreads over:
    with position-skipping fine-tuning (PoSE, randomized positions) or a cache that dropped keys, that is the tokens
    present, not the simulated ``p + 1`` that axolotl's ``position_ids + 1`` gives (the two agree for rows of
    positions from 0, axolotl's packed training rows). Called directly (``rotate``/``forward`` without
    ``key_count``), ``n`` is read from the query's position, ``p + 1`` capped at ``window``: the keys of a causal
    query over positions from 0. ``causal_only``: a bidirectional query is not what the paper scales. ``window=``
    (optional) declares the sliding window the layer attends over: ``posenc.attention`` refuses any other ``window``
    with it (``check_mask``), rather than silently computing another ``n``; leave it out to take whatever window
    attention masks.

    Llama 4's temperature tuning (``posenc.build("nope_temperature")``) cites SSMax but is a different thing: a
    fixed, unlearned factor ``log(1 + floor((p + 1) / floor_scale)) * attn_scale + 1`` on the queries of NoPE layers
    only, equal to 1 for the first ``floor_scale - 1`` positions. SSMax scales every query by a learned ``s log(n)``,
    from the first position, and composes with RoPE: ``rope=`` (or ``posenc.build("rope_ssmax")``) rotates queries
    and keys by RoPE, then scales the queries.

    Args:
        num_heads: query heads ``H``; ``s`` (and ``b``) has one entry per head.
        head_dim: channels per head ``D``; needed with ``rope=``.
        s_init: initial value of every ``s[h]`` (default 0.43, ``posenc.functional.ssmax.S_INIT``).
        bias: learn a bias ``b[h]`` per head, initialised to 0 (the paper's SSMax with bias); False (default): no
            ``b`` parameter at all, the factor is ``s[h] * log(n)``.
        window: the sliding window (in keys) of the attention this SSMax serves, or None (any window): attention
            refuses another ``window`` with it; ``rotate`` without ``key_count`` caps ``n`` there.
        rope: None for NoPE + SSMax, or ``RotaryEmbedding``'s keywords (``{}``, ``{"base": 500.0}``,
            ``{"scaling": {...}}``) for RoPE + SSMax.

    Attributes:
        s: the learned scaling parameter, ``nn.Parameter`` of shape ``(H,)``.
        b: the learned bias, ``nn.Parameter`` of shape ``(H,)`` with ``bias=True``; None otherwise.
        rope: the ``RotaryEmbedding`` under SSMax, or None.

    Shapes:
        q (B, H, S, D), k (B, Hkv, T, D), positions (S,) or (B, S), key_count (S,) or (B, S) -> q, k of the same
        shapes and dtypes.
    """

    config_class = SSMaxConfig
    causal_only = True  # the paper's causal language models; a bidirectional query would see every key
    per_layer = True  # the paper learns s (and b) per layer and head: one module per attention layer
    reads_key_count = True  # n: posenc.attention passes the keys its mask leaves each query

    def __init__(
        self,
        *,
        num_heads: int,
        head_dim: int | None = None,
        s_init: float = S_INIT,
        bias: bool = False,
        window: int | None = None,
        rope: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.config = SSMaxConfig(
            num_heads=num_heads,
            head_dim=head_dim,
            s_init=s_init,
            bias=bias,
            window=window,
            rope=cast("dict[str, Any] | None", rope),  # copied into a dict by __post_init__
        )
        self.s = nn.Parameter(torch.empty(num_heads))
        # not named `bias`: that is the Encoding hook adding to the scores, which SSMax does not use
        self.b = nn.Parameter(torch.empty(num_heads)) if bias else None
        self.rope = None if self.config.rope is None else RotaryEmbedding(cast(int, head_dim), **self.config.rope)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """``s`` back to ``s_init``, ``b`` (if any) to 0 (after ``to_empty()``, e.g. a meta-device build)."""
        self.s.fill_(self.config.s_init)
        if self.b is not None:
            self.b.zero_()

    @property
    def depends_on_length(self) -> bool:  # type: ignore[override]  # Encoding's class attribute, computed here
        """True when the RoPE under SSMax is ``dynamic``/``longrope`` (``rotate`` then takes ``seq_len``)."""
        return self.rope is not None and self.rope.depends_on_length

    def check_mask(self, *, window: int | None = None, chunk_size: int | None = None) -> None:
        """An SSMax built with ``window=W`` serves attention over that window only: any other ``window`` (None
        included) would leave ``n`` contradicting the keys the mask leaves, so it is refused."""
        built = self.config.window
        if built is not None and window != built:
            fail(
                "window",
                window,
                f"{built}, the window this SSMax was built with (SSMax(window={built})): n counts the keys attention "
                "masks, so pass the same window to posenc.attention, or build SSMax without window= to take any",
            )

    def rotate(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor,
        *,
        seq_len: int | float | torch.Tensor | None = None,
        key_count: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``Encoding`` hook: RoPE (if any) on ``q`` and ``k``, then queries scaled by ``s log n + b``.

        ``key_count``: ``n``, the keys each query sees, ``(S,)`` or ``(B, S)`` (``posenc.attention`` counts them
        from its mask); None: ``min(q_pos + 1, window)``. ``seq_len`` goes to a length-dependent RoPE
        (``dynamic``/``longrope``) and is ignored otherwise.
        """
        check_qk(q, k, self.config.head_dim)
        check_positions(q_pos, q, "positions")
        check_positions(k_pos, k, "k_positions")
        self._check_position_pair(q, k, q_pos, k_pos)
        self.check_heads(q)
        if self.rope is not None:
            extra = {"seq_len": seq_len} if self.rope.depends_on_length else {}
            q, k = self.rope.rotate(q, k, q_pos, k_pos, **extra)
        b = 0.0 if self.b is None else self.b  # the number 0 adds nothing: without a bias, exactly s log n
        if key_count is not None:  # attention's count holds every window and chunk it masks (check_mask agreed)
            return apply_ssmax(q, q_pos, self.s, b=b, key_count=key_count), k
        return apply_ssmax(q, q_pos, self.s, b=b, window=self.config.window), k

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"num_heads={c.num_heads}, s_init={c.s_init}, bias={c.bias}, window={c.window}, rope={c.rope is not None}"
        )


def rope_ssmax(
    *,
    num_heads: int,
    head_dim: int,
    s_init: float = S_INIT,
    bias: bool = False,
    window: int | None = None,
    base: float = 10000.0,
    scaling: Mapping[str, Any] | None = None,
    layout: str = "half",
    partial_rotary_factor: float = 1.0,
) -> SSMax:
    """RoPE + SSMax, buildable by name (``posenc.build("rope_ssmax", ...)``, the lab's ``rope_ssmax``).

    ``SSMax(num_heads=, head_dim=, s_init=, bias=, window=, rope={"base": base, "scaling": scaling, "layout": layout,
    "partial_rotary_factor": partial_rotary_factor})``: RoPE's keywords as ``posenc.build("rope")`` takes them.
    """
    rope = {"base": base, "scaling": scaling, "layout": layout, "partial_rotary_factor": partial_rotary_factor}
    return SSMax(num_heads=num_heads, head_dim=head_dim, s_init=s_init, bias=bias, window=window, rope=rope)


def ssmax_bias(
    *,
    num_heads: int,
    head_dim: int | None = None,
    s_init: float = S_INIT,
    window: int | None = None,
    rope: Mapping[str, Any] | None = None,
) -> SSMax:
    """NoPE + SSMax with a learned bias (the factor ``s log n + b``), by name: ``posenc.build("ssmax_bias")``, the
    lab's ``ssmax_bias`` (whose encodings are names). ``SSMax(..., bias=True)``."""
    return SSMax(num_heads=num_heads, head_dim=head_dim, s_init=s_init, bias=True, window=window, rope=rope)


def rope_ssmax_bias(
    *,
    num_heads: int,
    head_dim: int,
    s_init: float = S_INIT,
    window: int | None = None,
    base: float = 10000.0,
    scaling: Mapping[str, Any] | None = None,
    layout: str = "half",
    partial_rotary_factor: float = 1.0,
) -> SSMax:
    """RoPE + SSMax with a learned bias, by name: ``posenc.build("rope_ssmax_bias")``, the lab's ``rope_ssmax_bias``.
    :func:`rope_ssmax` with ``bias=True``."""
    return rope_ssmax(num_heads=num_heads, head_dim=head_dim, s_init=s_init, bias=True, window=window, base=base,
                      scaling=scaling, layout=layout, partial_rotary_factor=partial_rotary_factor)


register("rope_ssmax", rope_ssmax)
register("ssmax_bias", ssmax_bias)
register("rope_ssmax_bias", rope_ssmax_bias)
