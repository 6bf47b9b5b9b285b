"""``RotaryEmbedding``: RoPE for attention queries and keys, with every context-extension scaling.

Paper: Su et al. 2021, "RoFormer" (arXiv:2104.09864); scalings in ``posenc.functional.rope_scaling``.
Reference implementation: Hugging Face transformers ``LlamaRotaryEmbedding`` + ``apply_rotary_pos_emb`` (half
layout) and GPT-J ``apply_rotary_pos_emb`` / ``rotate_every_two`` (interleaved layout).

Shapes:
    q (B, H, S, D), k (B, Hkv, T, D); positions (S,) or (B, S), integer or float. With ``k_positions`` omitted,
    keys use the query positions (T == S).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch

from posenc import kernels
from posenc._checks import _readable, check_number, fail
from posenc.encodings._base import FrequencyModule, check_position_values, check_qk
from posenc.encodings.rotary_config import RotaryConfig
from posenc.encodings.rotary_hf import rotary_config_from_hf, rotary_config_to_hf
from posenc.functional.rope import angles_of, rope_cos_sin, table_dtype
from posenc.registry import register
from posenc.scalings import RopeScaling, rope_frequencies


def check_positions(positions: torch.Tensor, x: torch.Tensor, name: str = "positions") -> torch.Tensor:
    """Positions must be ``(S,)`` or ``(B, S)`` (``B`` may be 1) for ``x`` of shape ``(B, H, S, D)``."""
    if not isinstance(positions, torch.Tensor):
        fail(name, type(positions).__name__, "a torch.Tensor of shape (S,) or (B, S)")
    s, b = x.shape[-2], x.shape[0] if x.dim() >= 4 else None
    ok = positions.dim() == 1 and positions.shape[0] == s
    ok = ok or (positions.dim() == 2 and positions.shape[1] == s and b is not None and positions.shape[0] in (1, b))
    if not ok:
        batched = f" or ({b}, {s})" if b is not None else " (batched positions need x of shape (B, H, S, D))"
        fail(f"{name}.shape", tuple(positions.shape), f"({s},){batched} to match x of shape {tuple(x.shape)}")
    return positions


def check_seq_len(
    seq_len: object, positions: torch.Tensor, name: str = "seq_len", *, queries: torch.Tensor | None = None
) -> float | torch.Tensor:
    """A length for length-dependent scalings: a number or 0-d tensor ``>= 1``, or one per position (``(T,)`` or
    ``(B|1, T)`` for ``positions`` ``(T,)``/``(B, T)``). It must cover the positions it rotates: a length below
    ``position + 1`` contradicts them (checked where values can be read without a sync under compile/vmap).

    ``queries`` (the last ``S`` of the tokens) are checked against the last ``S`` lengths too.
    """
    length: float | torch.Tensor
    if isinstance(seq_len, torch.Tensor):
        if seq_len.dtype == torch.bool or seq_len.is_complex():
            fail(f"{name}.dtype", seq_len.dtype, "an integer or floating point dtype")
        t = positions.shape[-1]
        if seq_len.dim() > 0:
            rows_ok = seq_len.dim() == 1 or positions.dim() == 1 or seq_len.shape[0] in (1, positions.shape[0])
            if seq_len.dim() > 2 or seq_len.shape[-1] != t or not rows_ok:
                fail(
                    f"{name}.shape",
                    tuple(seq_len.shape),
                    f"() for one length, or ({t},) / (B|1, {t}): one length per key position",
                )
        if seq_len.device != positions.device:
            fail(f"{name}.device", seq_len.device, f"the positions' device, {positions.device}")
        length = seq_len.double()
    else:
        length = check_number(name, seq_len, minimum=1.0)
    if not (_readable(positions) and (not isinstance(length, torch.Tensor) or _readable(length))):
        return length
    for pos, lens in ((positions, length), (queries, length)):
        if pos is None:
            continue
        if isinstance(lens, torch.Tensor) and lens.dim() > 0:
            lens = lens[..., lens.shape[-1] - pos.shape[-1] :]
        need = pos.double() + 1
        short = ~(torch.as_tensor(lens, dtype=torch.float64, device=pos.device) >= need)  # NaN counts as short
        if bool(short.any()):
            where = tuple(short.nonzero()[0].tolist())
            got = lens if not isinstance(lens, torch.Tensor) else torch.broadcast_to(lens, short.shape)[where].item()
            fail(
                name,
                got,
                f"a finite length >= position + 1 = {need.broadcast_to(short.shape)[where].item():g}: the length "
                "whose frequencies rotate these tokens covers them (a context-parallel rank passes the global "
                "length, a cache its current length)",
            )
    return length


@register("rope")
class RotaryEmbedding(FrequencyModule):
    """Rotary position embedding applied to queries and keys.

    Args:
        head_dim: channels per head ``D``.
        base: RoPE base (HF ``rope_theta``).
        scaling: None, a ``posenc`` scaling config, or an HF ``rope_scaling`` / ``rope_parameters`` dict.
        layout: ``"half"`` (GPT-NeoX / HF) pairs channel i with i + F; ``"interleaved"`` (GPT-J / Meta llama)
            pairs 2i with 2i + 1.
        partial_rotary_factor: fraction of ``head_dim`` that rotates; the trailing channels pass through.

    Shapes:
        q (B, H, S, D), k (B, Hkv, T, D), positions (S,) or (B, S) -> q, k of the same shapes and dtypes.

    Frequencies are a pure function of the config and, for ``dynamic``/``longrope``, of the current length:
    ``seq_len`` where it is given (per token for packed documents, the global length for a context-parallel shard),
    else ``max(positions) + 1`` over the call. Nothing is cached or mutated in ``forward``.
    """

    inv_freq: torch.Tensor

    config_class = RotaryConfig

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        scaling: RopeScaling | Mapping[str, Any] | None = None,
        layout: str = "half",
        partial_rotary_factor: float = 1.0,
    ) -> None:
        super().__init__()
        self.config = RotaryConfig(
            head_dim=head_dim,
            base=base,
            scaling=cast("RopeScaling | None", scaling),  # a dict is read into a RopeScaling by __post_init__
            layout=layout,
            partial_rotary_factor=partial_rotary_factor,
        )
        inv_freq, self.attention_factor = self._frequencies(None, device=None)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @classmethod
    def from_hf(cls, config: Any, *, layer_type: str | None = None) -> RotaryEmbedding:
        """Build from a Hugging Face model config (``PretrainedConfig`` or its dict); see ``posenc.hf``."""
        return cls.from_config(rotary_config_from_hf(config, layer_type=layer_type))

    def to_hf(self, *, runtime: str = "transformers") -> dict[str, Any]:
        """The Hugging Face config keys that describe this RoPE, for ``runtime`` (``"transformers"`` or ``"vllm"``:
        mixed NTK has vLLM's form only); see ``posenc.hf.rotary_config_to_hf``."""
        return rotary_config_to_hf(self.config, runtime=runtime)

    def build_inv_freq(self) -> torch.Tensor:
        return self._frequencies(None, device=None)[0]

    def _frequencies(self, seq_len, device) -> tuple[torch.Tensor, float]:
        c = self.config
        return rope_frequencies(
            c.head_dim,
            base=c.base,
            scaling=c.scaling,
            partial_rotary_factor=c.partial_rotary_factor,
            seq_len=seq_len,
            device=device,
        )

    @property
    def depends_on_length(self) -> bool:  # type: ignore[override]  # Encoding's class attribute, computed here
        """True for ``dynamic``/``longrope``: the frequencies depend on the sequence length (``seq_len``)."""
        return self.config.scaling is not None and self.config.scaling.depends_on_length

    def cos_sin(
        self,
        positions: torch.Tensor,
        *,
        seq_len: int | float | torch.Tensor | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cos/sin tables (attention factor included) for ``positions``: ``(S, F)`` or ``(B, S, F)``.

        ``seq_len`` is the current length for ``dynamic``/``longrope`` (ignored by the others): a number, a 0-d
        tensor, or one length per token (a tensor broadcastable to ``positions``, e.g. per packed document); default
        ``positions.max() + 1``.
        """
        inv_freq, factor = self.inv_freq, self.attention_factor
        if self.depends_on_length:
            # The current length stays a tensor: no host sync, no graph break.
            length = positions.max() + 1 if seq_len is None else seq_len
            if isinstance(length, torch.Tensor) and length.dim() > 0:
                positions, length = torch.broadcast_tensors(positions, length.to(positions.device))
            inv_freq, factor = self._frequencies(length, device=positions.device)  # (F,) or per token (..., S, F)
        inv_freq = inv_freq.to(positions.device)
        return rope_cos_sin(positions, inv_freq, attention_factor=factor, dtype=dtype, per_token=inv_freq.dim() > 1)

    def rotate_one(
        self, x: torch.Tensor, positions: torch.Tensor, *, seq_len: int | float | torch.Tensor | None = None
    ) -> torch.Tensor:
        """Rotate one tensor ``x (B, H, S, D)`` (or ``(S, D)``, ``(H, S, D)``) at ``positions``.

        ``seq_len`` (``dynamic``/``longrope`` only): a number, a 0-d tensor or one length per position (the shape of
        ``positions``); default ``positions.max() + 1``. Keys cached already rotated must be re-rotated with
        ``rerotate`` when the length changes their frequencies (``same_frequencies`` says when).
        """
        if x.shape[-1] != self.config.head_dim:
            fail("x.shape[-1]", x.shape[-1], f"head_dim = {self.config.head_dim}")
        check_positions(positions, x)
        check_position_values(positions, x)
        if self.depends_on_length and seq_len is not None:
            seq_len = check_seq_len(seq_len, positions)
        cos, sin = self.cos_sin(positions, seq_len=seq_len, dtype=table_dtype(x.dtype))
        return self._apply_tables(x, cos, sin, batched=cos.dim() == 3)

    def rotate_mapped(
        self, x: torch.Tensor, positions: torch.Tensor, *, seq_len: int | float | torch.Tensor | None = None
    ) -> torch.Tensor:
        """Rotate ``x (B, H, S, D)`` at ``positions`` a remapping method derived from the sequence positions
        (Self-Extend's grouped positions, LM-Infinite's distance cap...), with the frequencies of the sequence's length
        ``seq_len`` (a number, a 0-d tensor or one per position; ``dynamic``/``longrope`` only). Unlike
        ``rotate_one``, ``seq_len`` is not checked against these positions (a mapped position may exceed the
        length); the caller checks it against the sequence positions (``posenc.remapping.remap_attention`` does)."""
        if x.shape[-1] != self.config.head_dim:
            fail("x.shape[-1]", x.shape[-1], f"head_dim = {self.config.head_dim}")
        check_positions(positions, x)
        check_position_values(positions, x)
        cos, sin = self.cos_sin(
            positions, seq_len=seq_len if self.depends_on_length else None, dtype=table_dtype(x.dtype)
        )
        return self._apply_tables(x, cos, sin, batched=cos.dim() == 3)

    def rotate(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor,
        *,
        seq_len: int | float | torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``Encoding`` hook: rotate queries at ``q_pos`` and keys at ``k_pos``.

        ``seq_len`` (read by ``dynamic``/``longrope`` only): the length whose frequencies to use -- a number or 0-d
        tensor for every token (the global length on a context-parallel rank, the current length of a cache), or
        one length per key, ``(T,)`` or ``(B|1, T)``, queries taking the last ``S`` (packed documents: each its own
        length; ``posenc.document_lengths``). Default: ``max(q_pos, k_pos) + 1``, one length for the whole call.
        """
        check_qk(q, k, self.config.head_dim)
        check_positions(q_pos, q, "positions")
        check_positions(k_pos, k, "k_positions")
        self._check_position_pair(q, k, q_pos, k_pos)
        q_len = k_len = None
        if self.depends_on_length:
            q_len, k_len = self._lengths(q_pos, k_pos, seq_len, q.shape[-2])
        q_tables, k_tables = self._table_pair(
            q,
            k,
            q_pos,
            k_pos,
            lambda pos, dtype: self.cos_sin(pos, seq_len=q_len if pos is q_pos else k_len, dtype=dtype),
        )
        fused = kernels.rotate_qk(q, k, q_tables, k_tables, layout=self.config.layout)  # CUDA + Triton: one launch
        if fused is not None:
            return fused
        return (
            self._apply_tables(q, *q_tables, batched=q_tables[0].dim() == 3),
            self._apply_tables(k, *k_tables, batched=k_tables[0].dim() == 3),
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor,
        k_positions: torch.Tensor | None = None,
        *,
        seq_len: int | float | torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q`` and ``k``; keys use ``k_positions`` if given, else ``positions``; ``seq_len`` as in
        ``rotate``."""
        if seq_len is None:
            return super().forward(q, k, positions, k_positions)
        self._check_key_positions(q, k, k_positions)
        return self.rotate(q, k, positions, positions if k_positions is None else k_positions, seq_len=seq_len)

    def _lengths(self, q_pos, k_pos, seq_len, s: int):  # noqa: ANN001, ANN202
        """The lengths for the query and key tables: one for both (q.k stays a function of distance when decoding
        passes fewer queries than keys), or per key with the queries taking the last ``s``."""
        if seq_len is None:
            if q_pos is k_pos:
                return None, None  # cos_sin takes positions.max() + 1, once for both
            length = torch.maximum(q_pos.max().double(), k_pos.max().to(device=q_pos.device).double()) + 1
            return length, length
        checked = check_seq_len(seq_len, k_pos, "seq_len", queries=q_pos)
        if not isinstance(checked, torch.Tensor) or checked.dim() == 0:
            return checked, checked
        return checked[..., checked.shape[-1] - s :], checked

    def same_frequencies(self, seq_len: int | float, other_seq_len: int | float) -> bool:
        """Whether lengths ``seq_len`` and ``other_seq_len`` rotate by the same angles (always, unless the scaling
        depends on the length): keys cached already rotated at one are still valid at the other."""
        if not self.depends_on_length:
            return True
        a = self._frequencies(check_number("seq_len", seq_len, minimum=1.0), device=None)
        b = self._frequencies(check_number("other_seq_len", other_seq_len, minimum=1.0), device=None)
        return a[1] == b[1] and torch.equal(a[0], b[0])

    def rerotate(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        *,
        from_seq_len: int | float | torch.Tensor,
        to_seq_len: int | float | torch.Tensor,
    ) -> torch.Tensor:
        """Keys already rotated with the frequencies of ``from_seq_len``, rotated to those of ``to_seq_len``.

        A rotation composes: ``R(p * theta_new) = R(p * (theta_new - theta_old)) R(p * theta_old)``, so a cache of
        rotated keys follows a length-dependent scaling (LongRoPE switching to its long factors, dynamic NTK growing
        its base) without keeping the unrotated keys. The angles ``p * (theta_new - theta_old)`` are float64; the
        attention factor is rescaled by ``new / old``. Each re-rotation rounds ``x`` once more in its dtype.

        Shapes:
            x (B, Hkv, T, D) or (..., T, D), positions (T,) or (B, T); lengths a number, 0-d, or one per position.
        """
        if x.shape[-1] != self.config.head_dim:
            fail("x.shape[-1]", x.shape[-1], f"head_dim = {self.config.head_dim}")
        check_positions(positions, x)
        check_position_values(positions, x)
        old = check_seq_len(from_seq_len, positions, "from_seq_len")
        new = check_seq_len(to_seq_len, positions, "to_seq_len")
        if not self.depends_on_length:
            return x
        pos = positions
        for length in (old, new):
            if isinstance(length, torch.Tensor) and length.dim() > 0:
                pos = torch.broadcast_tensors(pos, length.to(pos.device))[0]
        inv_old, factor_old = self._frequencies(old, device=positions.device)
        inv_new, factor_new = self._frequencies(new, device=positions.device)
        delta = inv_new.double() - inv_old.double()  # (F,) or per token (..., T, F)
        angles = angles_of(pos, delta)  # (..., T, F)
        ratio = factor_new / factor_old
        cos, sin = (angles.cos() * ratio).to(table_dtype(x.dtype)), (angles.sin() * ratio).to(table_dtype(x.dtype))
        return self._apply_tables(x, cos, sin, batched=cos.dim() == 3)

    def extra_repr(self) -> str:
        c = self.config
        scaling = "None" if c.scaling is None else c.scaling.rope_type
        return (
            f"head_dim={c.head_dim}, base={c.base}, layout={c.layout!r}, rotary_dim={c.rotary_dim}, scaling={scaling}"
        )
