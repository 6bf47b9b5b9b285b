"""``Encoding``, the one interface every positional encoding implements, and the shared base classes.

A model is written once against four hooks and works with every encoding (``posenc.available()``):

- ``embed(x, positions)``: absolute encodings add to the token embeddings (sinusoidal, learned);
- ``rotate(q, k, q_pos, k_pos)``: the rotary family turns queries and keys;
- ``bias(q_pos, k_pos, q=, scale=)``: relative encodings add ``(B|1, H, S, T)`` to the attention scores (ALiBi,
  T5, Shaw) -- the materialised reference form; encodings with ``needs_keys`` (CoPE) also take ``k=``, ``mask=``;
- ``score_mod(q_pos, k_pos, q=, scale=)``: the same bias as a FlexAttention ``score_mod`` closure, so attention
  never builds the L x L matrix;
- ``value_term(weights, q_pos, k_pos)``: the rare encoding that also adds to the values (Shaw et al.).

Positions are explicit tensors: ``(S,)`` or ``(B, S)`` for sequences, ``(S, n)`` or ``(B, S, n)`` for grids,
``(3, S)`` for M-RoPE; integers or finite float32/float64 (``posenc._checks.check_positions``), on the device of the
tensors they place. Nothing is cached or mutated in a hook, so KV-cache decoding (cached keys with their
positions), packing (per-document positions) and context parallelism (a shard's positions) need no special mode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import torch
from torch import nn

from posenc._checks import check_positions, check_same_device, fail
from posenc.functional.rope import apply_rotary, table_dtype

ScoreMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class Encoding(nn.Module):
    """A positional encoding: every hook defaults to "no positional information" (NoPE).

    Subclasses override the hooks they need. ``bias`` and ``score_mod`` must describe the same bias: attention's
    ``eager``/``sdpa`` backends use ``bias``, ``flex`` uses ``score_mod``, and the tests check they agree. A
    ``score_mod`` captures tensors, ints, bools and strings only, never a Python float: torch traces a captured float
    as a ``SymFloat`` once its value changes between compilations, which compiled FlexAttention refuses (torch 2.15)
    or fails to lower (torch 2.13); keep such a constant as a float32 0-d buffer (``FIRE``'s ``eps``).

    Class attributes read by ``posenc.attention``:
        has_bias: the encoding adds to the scores (``bias``/``score_mod`` return non-None).
        has_value_term: the encoding adds to the values (``value_term``); only the ``eager`` backend runs it.
        per_head_keys: keys need one head per query head (per-head rotations); attention repeats GQA key heads.
        position_kind: what positions look like: ``"sequence"`` ``(S,)``/``(B, S)``, ``"grid"`` ``(S, n)``/
            ``(B, S, n)`` coordinates (``grid_positions``), ``"mrope"`` ``(3, S)``/``(3, B, S)`` streams.
        needs_keys: ``bias`` reads every key, not just positions (CoPE counts gates ``sigmoid(q . k)``): attention
            also passes ``k=`` (the keys, ``(B, Hkv, T, D)``) and ``mask=`` (``(B|1, 1, S, T)`` bool, True where
            attention is allowed: causal and documents), and no ``score_mod`` can express it (no ``flex``).
        causal_only: the encoding is defined for causal attention only; attention refuses ``causal=False``.
        depends_on_length: the rotation depends on the sequence length, not only on positions (RoPE with ``dynamic``
            or ``longrope`` scaling): ``rotate`` then takes ``seq_len=`` and attention passes it (per document
            with ``document_ids``).
        reads_key_count: the queries' factor depends on how many keys each query sees (SSMax's ``s log n``, Llama
            4's temperature): ``rotate`` then takes ``key_count=``, ``(S,)`` or ``(B, S)`` int64, and attention
            passes the count of its mask (causal, documents, chunks, window; sinks are not keys). Called without
            it, such an encoding counts from the query's position (``p + 1``, a causal query's keys from 0).
        check_mask(window=, chunk_size=): refuses a mask the encoding contradicts (an ``SSMax(window=8)`` attending
            over another window); attention calls it first.

    Read by models, not by attention:
        per_layer: its learned parameters belong to one attention layer (SSMax's ``s``, learned per layer and head):
            a model that shares one encoding module across its layers builds one per layer instead (the lab's
            ``GPT`` does).

    Shapes:
        x (B, S, Dm); q (B, H, S, D), k (B, Hkv, T, D); bias (B|1, H, S, T) float32;
        score_mod(score, b, h, q_idx, kv_idx) -> score (FlexAttention's signature, scalars per element).
    """

    has_bias: ClassVar[bool] = False
    has_value_term: bool = False  # a class attribute; an instance may set its own (ShawRelative(values=...))
    per_head_keys: bool = False  # likewise (FoPE per head)
    position_kind: ClassVar[str] = "sequence"
    needs_keys: ClassVar[bool] = False
    causal_only: ClassVar[bool] = False
    per_layer: ClassVar[bool] = False
    reads_key_count: ClassVar[bool] = False
    depends_on_length: bool = False
    #: The encoding's config dataclass (``ConfiguredModule``s and most others set it in ``__init__``).
    config: Any

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Token embeddings with absolute position information added: ``(B, S, Dm) -> (B, S, Dm)``."""
        return x

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries at ``q_pos`` and keys at ``k_pos``, rotated (the rotary family); identity otherwise."""
        return q, k

    def bias(
        self,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor,
        *,
        q: torch.Tensor | None = None,
        scale: float | None = None,
    ) -> torch.Tensor | None:
        """Additive score bias ``(B|1, H, S, T)`` in float32, or None. ``q``/``scale`` are for content terms."""
        return None

    def score_mod(
        self,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor,
        *,
        q: torch.Tensor | None = None,
        scale: float | None = None,
    ) -> ScoreMod | None:
        """FlexAttention ``score_mod`` adding ``bias(q_pos, k_pos)[b, h, q_idx, kv_idx]``, or None."""
        return None

    def value_term(self, weights: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        """Extra attention output from the weights ``(B, H, S, T)``: ``(B, H, S, Dv)``, or None."""
        return None

    def check_mask(self, *, window: int | None = None, chunk_size: int | None = None) -> None:
        """Refuse an attention mask this encoding contradicts (``posenc.attention`` calls it); every mask by default."""

    def check_positions(self, positions: torch.Tensor, length: int, batch: int, name: str = "positions") -> None:
        """Positions for ``length`` tokens of a batch of ``batch``: ``(length,)`` or ``(1|batch, length)``."""
        check_sequence_positions(positions, length, batch, name)

    def check_heads(self, q: torch.Tensor | None, name: str = "q") -> None:
        """``q (B, H, S, D)`` must have the ``num_heads`` this encoding was built for, if its config has one.

        Per-head encodings (ALiBi's slopes, T5's table, RoPE-Mixed's frequencies) would otherwise fail with a
        broadcasting error, or, in a FlexAttention ``score_mod`` that indexes by head, silently use the wrong heads.
        """
        heads = getattr(getattr(self, "config", None), "num_heads", None)
        if heads is None or not isinstance(q, torch.Tensor) or q.dim() < 3 or q.shape[-3] == heads:
            return
        fail(
            "num_heads",
            heads,
            f"the number of heads of {name}, {q.shape[-3]} ({name}.shape={tuple(q.shape)}): build "
            f"{type(self).__name__} with num_heads={q.shape[-3]}, or pass {name} with {heads} heads",
        )


def shape_stub(batch: int, length: int) -> torch.Tensor:
    """A storage-free ``(batch, 1, length, 1)`` tensor, to reuse the checks written against ``q``/``k``."""
    return torch.empty(batch, 1, length, 1, device="meta")


def check_sequence_positions(positions: object, length: int, batch: int, name: str = "positions") -> torch.Tensor:
    """One position per token: a tensor ``(length,)`` or ``(1|batch, length)``."""
    if not isinstance(positions, torch.Tensor):
        fail(name, type(positions).__name__, f"a torch.Tensor of shape ({length},) or ({batch}, {length})")
    ok = positions.dim() == 1 and positions.shape[0] == length
    ok = ok or (positions.dim() == 2 and positions.shape[1] == length and positions.shape[0] in (1, batch))
    if not ok:
        fail(f"{name}.shape", tuple(positions.shape), f"({length},) or ({batch}, {length}), one position per token")
    return positions


def check_position_values(positions: torch.Tensor, x: torch.Tensor, name: str = "positions", x_name: str = "x") -> None:
    """Exact, finite positions (``posenc._checks.check_positions``) on the device of ``x``, the tensor they place."""
    check_positions(positions, name)
    check_same_device(name, positions, x.device, f"{x_name}'s device")


def check_grid_positions(positions: torch.Tensor, x: torch.Tensor, n_axes: int, name: str = "positions") -> None:
    """Positions must be ``(S, n_axes)`` or ``(B, S, n_axes)`` (``B`` may be 1) for ``x`` of shape ``(B, H, S, D)``.

    Batched positions need a 4-D ``x``; an unbatched ``x`` (``(S, D)`` or ``(H, S, D)``) takes ``(S, n_axes)``.
    """
    if not isinstance(positions, torch.Tensor):
        fail(name, type(positions).__name__, f"a torch.Tensor of shape (S, {n_axes}) or (B, S, {n_axes})")
    s, b = x.shape[-2], x.shape[0] if x.dim() >= 4 else None
    ok = positions.dim() == 2 and positions.shape == (s, n_axes)
    ok = ok or (
        positions.dim() == 3 and positions.shape[1:] == (s, n_axes) and b is not None and positions.shape[0] in (1, b)
    )
    if not ok:
        fail(
            f"{name}.shape",
            tuple(positions.shape),
            f"({s}, {n_axes})"
            + (f" or ({b}, {s}, {n_axes})" if b is not None else "")
            + f" to match x of shape {tuple(x.shape)} and n_axes={n_axes}"
            + ("" if b is not None else " (batched positions need x of shape (B, H, S, D))"),
        )


def check_tokens(x: object, dim: int, name: str = "x") -> None:
    """``x`` must be a floating point ``(B, S, dim)`` tensor of token embeddings."""
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        fail(f"{name}.shape", getattr(x, "shape", type(x).__name__), f"(B, S, {dim}): token embeddings")
    if x.shape[-1] != dim:
        fail(f"{name}.shape[-1]", x.shape[-1], f"dim = {dim}")
    if not x.is_floating_point():
        fail(f"{name}.dtype", x.dtype, "a floating point dtype")


def check_embed(encoding: Encoding, x: torch.Tensor, positions: torch.Tensor) -> None:
    """The arguments of an ``embed`` hook: tokens ``(B, S, dim)``, positions of the encoding's kind for them, of an
    exact dtype and on x's device. Finiteness is left to the encoding function, which checks it where it reads the
    values anyway."""
    check_tokens(x, encoding.config.dim)
    encoding.check_positions(positions, x.shape[1], x.shape[0])
    check_positions(positions, finite=False)
    check_same_device("positions", positions, x.device, "x's device")


def check_grid(positions: torch.Tensor, length: int, batch: int, name: str = "positions") -> None:
    """Grid positions for ``length`` tokens of a batch of ``batch``: ``(length, 2)`` or ``(1|batch, length, 2)``."""
    check_grid_positions(positions, shape_stub(batch, length), 2, name)


def position_reader(positions: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``read(b, i)`` -> the position of token ``i`` of batch row ``b``, for use inside a ``score_mod``.

    ``positions`` is ``(S,)`` (shared by every row), ``(1, S)`` or ``(B, S)``.
    """
    if positions.dim() == 1:
        return lambda b, i: positions[i]
    if positions.shape[0] == 1:
        row = positions[0]
        return lambda b, i: row[i]
    return lambda b, i: positions[b, i]


_Configured = TypeVar("_Configured", bound="ConfiguredModule")


class ConfiguredModule(Encoding):
    """An encoding whose constructor arguments are exactly the fields of ``config_class``."""

    config_class: ClassVar[Any]  # a config dataclass with from_dict

    @classmethod
    def from_config(cls: type[_Configured], config: Any, **kwargs: Any) -> _Configured:
        """Build from a config object or its dict (``to_dict()`` output); ``kwargs`` go to the constructor."""
        if isinstance(config, Mapping):
            config = cls.config_class.from_dict(config)
        if not isinstance(config, cls.config_class):
            fail("config", config, f"a {cls.config_class.__name__} or its dict")
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(config)}, **kwargs)


def check_qk(q: torch.Tensor, k: torch.Tensor, head_dim: int | None = None) -> None:
    """``q`` and ``k`` must be 4-D ``(B, heads, S, head_dim)`` with the same batch size (and ``head_dim``)."""
    for name, t in (("q", q), ("k", k)):
        if t.dim() != 4:
            fail(f"{name}.dim()", t.dim(), "4, a tensor of shape (B, heads, S, head_dim)")
        if head_dim is not None and t.shape[-1] != head_dim:
            fail(f"{name}.shape[-1]", t.shape[-1], f"head_dim = {head_dim}")
    if q.shape[0] != k.shape[0]:
        fail("k.shape[0]", k.shape[0], f"the batch size of q, {q.shape[0]}")


class RotaryModule(ConfiguredModule):
    """Shared shell of the rotary family: ``forward`` delegates to the ``rotate(q, k, q_pos, k_pos)`` hook."""

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError  # defined by each encoding

    def _check_position_pair(self, q, k, q_pos, k_pos) -> None:  # noqa: ANN001
        """Exact, finite query and key positions on the devices of q and k (after their shapes were checked)."""
        check_position_values(q_pos, q, "positions", "q")
        check_position_values(k_pos, k, "k_positions", "k")

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, k_positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q`` and ``k``; keys use ``k_positions`` if given, else ``positions``."""
        self._check_key_positions(q, k, k_positions)
        return self.rotate(q, k, positions, positions if k_positions is None else k_positions)

    @staticmethod
    def _check_key_positions(q: torch.Tensor, k: torch.Tensor, k_positions: torch.Tensor | None) -> None:
        if k_positions is None and k.dim() >= 2 and q.dim() >= 2 and k.shape[-2] != q.shape[-2]:
            fail("k_positions", None, f"the keys' positions, since k has {k.shape[-2]} positions and q {q.shape[-2]}")

    def _table_pair(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        q_pos: torch.Tensor,
        k_pos: torch.Tensor,
        tables: Callable[[torch.Tensor, torch.dtype], tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """``tables(positions, dtype)`` for q and for k, built once when they share positions and table dtype."""
        q_tables = tables(q_pos, table_dtype(q.dtype))
        if k_pos is q_pos and table_dtype(k.dtype) == table_dtype(q.dtype):
            return q_tables, q_tables
        return q_tables, tables(k_pos, table_dtype(k.dtype))

    def _apply_tables(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batched: bool) -> torch.Tensor:
        """Rotate ``x (..., S, D)`` by tables ``(S, F)``, or ``(B, S, F)`` for per-row positions."""
        if batched:
            cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)  # (B, S, F) -> (B, 1, S, F), broadcast over heads
        return apply_rotary(x, cos, sin, layout=self.config.layout)


class FrequencyModule(RotaryModule):
    """Keeps ``inv_freq`` float32 and exact through ``.to(dtype)``, ``.half()``, device moves and ``to_empty()``.

    ``model.to(torch.bfloat16)`` would otherwise round the frequencies to bf16 and rotate long positions by wrong
    angles; ``to_empty()`` after a meta-device build would leave them uninitialised. Instead of casting, the buffer
    is rebuilt from the config on the new device.
    """

    inv_freq: torch.Tensor

    def build_inv_freq(self) -> torch.Tensor:
        """The float32 frequencies for this module's config (on CPU)."""
        raise NotImplementedError

    def _apply(self, fn, recurse=True):  # noqa: ANN001 - nn.Module's hook for .to/.cuda/.half/to_empty
        super()._apply(fn, recurse)
        self.inv_freq = self.build_inv_freq().to(self.inv_freq.device)
        return self
