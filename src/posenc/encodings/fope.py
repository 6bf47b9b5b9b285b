"""``FoPE``: Fourier Position Embedding, RoPE whose channel pairs each turn by a learned Fourier series.

Paper: Hua et al. 2024, "Fourier Position Embedding: Enhancing Attention's Periodic Extension for Length
Generalization" (arXiv:2412.17739, ICML 2025); the formulas are in ``posenc.functional.fope``.
Reference implementation: vLLM ``FourierRotaryEmbedding`` (coefficient layout ``cos_coef``/``sin_coef``
``(heads, M, M)``, ``num_inv_freq``, ``fope_sep_head``, clipping at ``max_position_embeddings``); checked against the
paper's complex-number form in ``tests/reference/fope.py``, forward and gradients.

Shapes:
    q (B, H, S, D), k (B, Hkv, T, D); positions (S,) or (B, S), integer or float. With ``k_positions`` omitted,
    keys use the query positions (T == S).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from posenc._checks import check_choice, check_number, check_positive_int, fail
from posenc._config import DictConfig
from posenc.encodings._base import FrequencyModule, check_position_values, check_qk
from posenc.encodings.rotary import check_positions
from posenc.functional.fope import (
    apply_fope,
    fope_cos_sin,
    fope_frequencies,
    fope_num_frequencies,
    init_fope_coefficients,
)
from posenc.functional.rope import LAYOUTS, table_dtype
from posenc.registry import register


@dataclass(frozen=True, kw_only=True, slots=True)
class FoPEConfig(DictConfig):
    """Everything that defines a FoPE: validated on construction, round-trips through ``to_dict``/``from_dict``.

    Frequencies with wavelength at least ``train_len`` (the training length) are clipped to zero, unless
    ``num_frequencies`` fixes how many are kept (vLLM's ``num_inv_freq``, which then takes precedence); one of the two
    is required. ``init_std`` is the spread of the initial coefficients around the identity.
    """

    head_dim: int
    num_heads: int
    num_kv_heads: int | None = None
    train_len: int | None = None
    num_frequencies: int | None = None
    base: float = 10000.0
    init_std: float = 0.1
    per_head: bool = True
    learnable: bool = True
    layout: str = "half"

    def __post_init__(self) -> None:
        check_positive_int("num_heads", self.num_heads)
        if self.num_kv_heads is not None and self.num_heads % check_positive_int("num_kv_heads", self.num_kv_heads):
            fail("num_kv_heads", self.num_kv_heads, f"a divisor of num_heads={self.num_heads}, or None")
        check_number("base", self.base, above=1.0)
        fope_num_frequencies(
            self.head_dim, base=self.base, train_len=self.train_len, num_frequencies=self.num_frequencies
        )  # validates head_dim, train_len and num_frequencies
        check_number("init_std", self.init_std, minimum=0.0)
        for name in ("per_head", "learnable"):
            if not isinstance(getattr(self, name), bool):
                fail(name, getattr(self, name), "True or False")
        check_choice("layout", self.layout, LAYOUTS)

    @property
    def num_sets(self) -> int:
        """Coefficient sets ``C``: one per key/value head (or per head), or one shared."""
        if not self.per_head:
            return 1
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def kept(self) -> int:
        """``M``, the frequencies that survive clipping."""
        return fope_num_frequencies(
            self.head_dim, base=self.base, train_len=self.train_len, num_frequencies=self.num_frequencies
        )


class FoPE(FrequencyModule):
    """Each channel pair turns by a cosine series and a sine series over RoPE's unclipped frequencies.

    Pair ``d < M`` at position ``p``: ``(x_a, x_b) -> (x_a C - x_b S, x_b C + x_a S)`` with
    ``C = sum_j cos_coef[c, j, d] cos(w_j p)``, ``S = sum_j sin_coef[c, j, d] sin(w_j p)``; pairs ``d >= M`` (wavelength
    ``>= train_len``) pass through. The coefficients are ``nn.Parameter``s, trained with the model unless
    ``learnable=False`` (then fixed random, as XTuner trains them). Unlike RoPE, ``<q_m, k_n>`` is not a function of
    ``m - n`` alone once the coefficients leave the identity, and the turn does not keep norms.

    Args:
        head_dim: channels per head ``D``, even.
        num_heads: query heads ``H``.
        num_kv_heads: key/value heads; with ``per_head`` each has its own coefficients and its group of query heads
            shares them (vLLM's layout, ``cos_coef`` of shape ``(num_kv_heads, M, M)``). None: one set per query
            head, and attention repeats the key heads (``per_head_keys``).
        train_len: training length ``L``; frequencies with wavelength ``2 pi / w >= L`` are clipped to zero.
        num_frequencies: keep exactly the first ``num_frequencies`` frequencies instead (vLLM's ``num_inv_freq``).
        base: RoPE base (HF ``rope_theta``).
        init_std: coefficients start at ``I + N(0, init_std^2)``.
        per_head: separate coefficients per head (vLLM's ``fope_sep_head``) or one shared set.
        learnable: train the coefficients.
        layout: ``"half"`` (vLLM / GPT-NeoX, pairs ``(i, i + D/2)``) or ``"interleaved"`` (pairs ``(2i, 2i + 1)``).
        generator: random source for the initial coefficients (``cos_coef`` drawn first, then ``sin_coef``).

    Shapes:
        inv_freq (M,); cos_coef, sin_coef (C, M, M); q (B, H, S, D), k (B, Hkv, T, D) -> same shapes and dtypes.
    """

    inv_freq: torch.Tensor
    config_class = FoPEConfig
    # per layer, as the authors' OLMo code builds it (TsinghuaC3I/Fourier-Position-Embedding olmo/model.py: a
    # FourierEmbedding per block; @ bd94b20); vLLM shares one across layers for InternS1-Pro's checkpoint
    per_layer = True

    def __init__(
        self,
        head_dim: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        train_len: int | None = None,
        num_frequencies: int | None = None,
        base: float = 10000.0,
        init_std: float = 0.1,
        per_head: bool = True,
        learnable: bool = True,
        layout: str = "half",
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.config = FoPEConfig(
            head_dim=head_dim,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            train_len=train_len,
            num_frequencies=num_frequencies,
            base=base,
            init_std=init_std,
            per_head=per_head,
            learnable=learnable,
            layout=layout,
        )
        c = self.config
        # One coefficient set per query head: keys must then come one per query head too.
        self.per_head_keys = c.per_head and c.num_kv_heads is None and c.num_heads > 1
        self.register_buffer("inv_freq", self.build_inv_freq(), persistent=False)
        cos_coef, sin_coef = self._initial(generator)
        self.cos_coef = nn.Parameter(cos_coef, requires_grad=c.learnable)
        self.sin_coef = nn.Parameter(sin_coef, requires_grad=c.learnable)

    def build_inv_freq(self) -> torch.Tensor:
        c = self.config
        return fope_frequencies(c.head_dim, base=c.base, train_len=c.train_len, num_frequencies=c.num_frequencies)

    def _initial(self, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        draw = [init_fope_coefficients(c.num_sets, c.kept, std=c.init_std, generator=generator) for _ in range(2)]
        return draw[0], draw[1]

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Redraw the coefficients in place (e.g. after building on the meta device and ``to_empty``)."""
        cos_coef, sin_coef = self._initial(generator)
        self.cos_coef.copy_(cos_coef)
        self.sin_coef.copy_(sin_coef)

    def cos_sin(
        self, positions: torch.Tensor, *, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The series tables for ``positions (S,)`` or ``(B, S)``: ``(C, S, D/2)`` or ``(B, C, S, D/2)``.

        Differentiable with respect to the coefficients.
        """
        return fope_cos_sin(
            positions, self.inv_freq, self.cos_coef, self.sin_coef, pairs=self.config.head_dim // 2, dtype=dtype
        )

    def check_heads(self, q: torch.Tensor | None, name: str = "q") -> None:
        """``q`` must have ``num_heads`` heads (the coefficient sets are laid out for them)."""
        heads = self.config.num_heads
        if isinstance(q, torch.Tensor) and q.dim() >= 3 and q.shape[-3] != heads:
            fail(f"{name}.shape[-3]", q.shape[-3], f"num_heads = {heads} ({name}.shape={tuple(q.shape)})")

    def _check_key_heads(self, k: torch.Tensor, name: str = "k") -> None:
        c = self.config
        if c.num_sets == 1:
            return  # one shared set: any number of key heads
        allowed = sorted({c.num_heads, c.num_sets})
        if k.shape[-3] not in allowed:
            fail(
                f"{name}.shape[-3]",
                k.shape[-3],
                f"one of {allowed}: the key heads FoPE's {c.num_sets} coefficient sets are laid out for (with one set "
                "per query head, repeat the key heads to num_heads, as posenc.attention does)",
            )

    def rotate_one(self, x: torch.Tensor, positions: torch.Tensor, name: str = "x") -> torch.Tensor:
        """Turn one tensor ``x (B, H, S, D)`` (or ``(H, S, D)``) at ``positions (S,)`` or ``(B, S)``; ``H`` is any
        multiple of the coefficient sets (head ``h`` uses set ``h // (H / C)``)."""
        c = self.config
        if not isinstance(x, torch.Tensor) or x.dim() not in (3, 4):
            fail(f"{name}.shape", getattr(x, "shape", type(x).__name__), f"(B, H, S, {c.head_dim}) or (H, S, ...)")
        if x.shape[-1] != c.head_dim:
            fail(f"{name}.shape[-1]", x.shape[-1], f"head_dim = {c.head_dim}")
        check_positions(positions, x, "positions")
        check_position_values(positions, x, "positions", name)
        cos, sin = self.cos_sin(positions, dtype=table_dtype(x.dtype))
        return apply_fope(x, cos, sin, layout=c.layout)

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``Encoding`` hook: turn queries at ``q_pos`` and keys at ``k_pos``."""
        check_qk(q, k, self.config.head_dim)
        check_positions(q_pos, q, "positions")
        check_positions(k_pos, k, "k_positions")
        self.check_heads(q, "q")
        self._check_key_heads(k, "k")
        self._check_position_pair(q, k, q_pos, k_pos)
        q_tables, k_tables = self._table_pair(q, k, q_pos, k_pos, lambda pos, dtype: self.cos_sin(pos, dtype=dtype))
        layout = self.config.layout
        return apply_fope(q, *q_tables, layout=layout), apply_fope(k, *k_tables, layout=layout)

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"head_dim={c.head_dim}, num_heads={c.num_heads}, num_kv_heads={c.num_kv_heads}, "
            f"kept={self.inv_freq.numel()}/{c.head_dim // 2}, base={c.base}, per_head={c.per_head}, "
            f"learnable={c.learnable}, layout={c.layout!r}"
        )


def fope(
    head_dim: int,
    num_heads: int,
    *,
    max_len: int | None = None,
    train_len: int | None = None,
    num_kv_heads: int | None = None,
    num_frequencies: int | None = None,
    base: float = 10000.0,
    init_std: float = 0.1,
    per_head: bool = True,
    learnable: bool = True,
    layout: str = "half",
    generator: torch.Generator | None = None,
) -> FoPE:
    """``posenc.build("fope", ...)``: a ``FoPE`` clipped at the model's training length.

    ``max_len`` is the model fact ``posenc.build`` passes (the lab's training length); it sets ``train_len`` unless
    that is given. The encoding keeps it as ``train_len``, not ``max_len``: FoPE runs at any length (``max_len`` on a
    config means a table size that bounds the length, as for learned positions). Other arguments are ``FoPE``'s.
    """
    return FoPE(
        head_dim,
        num_heads,
        num_kv_heads=num_kv_heads,
        train_len=max_len if train_len is None else train_len,
        num_frequencies=num_frequencies,
        base=base,
        init_std=init_std,
        per_head=per_head,
        learnable=learnable,
        layout=layout,
        generator=generator,
    )


register("fope", fope)
