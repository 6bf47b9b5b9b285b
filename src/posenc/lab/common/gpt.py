"""``GPT``: the lab's tiny byte-level decoder, written once for every sequence encoding.

A nanoGPT-style pre-norm transformer (Radford et al. 2019, GPT-2; reference implementation karpathy/nanoGPT
``model.py``) in which position information comes only from ONE ``posenc.Encoding`` shared by all layers: its
``embed`` hook after the token embedding (sinusoidal, learned) and ``posenc.attention`` for the rest (``rotate`` for
the rotary family, ``bias``/``score_mod`` for ALiBi/T5/Shaw, Shaw's value term). Evaluation swaps the encoding
(``set_encoding``) to run RoPE scalings or ALiBi interpolation past the training length without retraining.

Or from two, chosen per layer: ``encoding="BASE/OTHER:N"`` puts OTHER in every N-th layer (layers N, 2N, ...,
counting from 1) and BASE in the others, as the NoPE/RoPE hybrids do (Yang et al. 2025, "Rope to Nope and Back
Again", arXiv:2501.18795; SmolLM3 and Llama 4: ``rope/nope:4``, Llama 4 with temperature tuning
``rope/nope_temperature:4``). The layers of each kind share one encoding, so ``set_encoding`` (a RoPE scaling)
swaps every BASE layer's at once. Absolute encodings act once, before the first layer, and cannot be chosen per
layer.

Except an encoding whose learned parameters belong to one layer (``Encoding.per_layer``, as its reference code has
them: Shaw's tables, CoPE's, FoPE's coefficients, SSMax's ``s`` and ``b``): each layer of its kind gets its own
module, held by its block (``blocks[i].encoding``, state-dict keys ``blocks.<i>.encoding.*``), and the model's shared
one for that kind is None.

Two departures from nanoGPT, both for a fair comparison of encodings: token embeddings are scaled by ``sqrt(dim)``
(Vaswani et al. 2017, sec. 3.4) and initialised ``N(0, 1/dim)``, so the token signal has unit size next to
sinusoidal's unit-amplitude positions while the tied output head still starts with logits of unit scale; and there
is no position table unless the encoding brings one.

Shapes:
    tokens (B, S) int64 byte ids; positions (S,) or (B, S) -> logits (B, S, vocab_size) in the model's dtype.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import posenc
from posenc._checks import check_choice, check_positive_int, fail
from posenc._config import DictConfig
from posenc.attention import MAX_SPAN

#: ``posenc.attention`` backends (``"auto"``: SDPA for training on CPU, FlexAttention for long biased evaluation).
BACKENDS = ("auto", "eager", "sdpa", "flex")


def check_encoding_config(value: object) -> None:
    """``encoding_config`` must be keyword arguments for ``posenc.build`` that survive a JSON round trip."""
    if not isinstance(value, Mapping):
        fail("encoding_config", value, "a dict of keyword arguments for posenc.build")
    try:
        json.dumps(dict(value))
    except (TypeError, ValueError):
        fail("encoding_config", value, "JSON values only (numbers, strings, lists, dicts)")


#: ``BASE/OTHER:N``: OTHER in every N-th layer (layers N, 2N, ... counting from 1), BASE in the rest.
_LAYER_SPEC = re.compile(r"(\w+)/(\w+):(\w+)")
LAYER_SYNTAX = "BASE/OTHER:N (OTHER in every N-th layer, e.g. 'rope/nope:4': NoPE in layers 4, 8, ...)"

#: How every number in a spec (N, C, W) is written: ASCII digits, no leading zero. One spelling per number, so one
#: spec per model: 'rope@016' would otherwise be 'rope@16' under another name in the CSV, sharing its run folder.
_NUMBER = re.compile(r"0|[1-9][0-9]*")
NUMBER_SYNTAX = "written in the digits 0-9 without a leading zero"


def _spec_number(text: str) -> int | None:
    """``text`` as a spec's number (``_NUMBER``), or None when it is not one (``'016'``, ``'²'``, ``'٤'``, ``''``)."""
    return int(text) if _NUMBER.fullmatch(text) else None


def split_encoding(spec: object, name: str = "encoding") -> tuple[str, str | None, int | None]:
    """``"rope"`` -> ``("rope", None, None)``; ``"rope/nope:4"`` -> ``("rope", "nope", 4)``. Syntax only: the
    names and the interval are checked by :func:`check_layer_spec`."""
    if not isinstance(spec, str):
        fail(name, spec, f"a name from posenc.available() or {LAYER_SYNTAX}")
    if "/" not in spec and ":" not in spec:
        return spec, None, None
    match = _LAYER_SPEC.fullmatch(spec)
    if match is None:
        fail(name, spec, LAYER_SYNTAX)
    interval = _spec_number(match[3])
    if interval is None:
        fail(name, spec, f"{LAYER_SYNTAX}, N {NUMBER_SYNTAX}")
    return match[1], match[2], interval


CHUNK_SYNTAX = "SPEC@C (chunked attention of C tokens in SPEC's non-NoPE layers, e.g. 'rope/nope_temperature:2@16')"


def split_chunk(spec: object, name: str = "encoding") -> tuple[object, int | None]:
    """A lab spec's chunk suffix: ``"rope/nope_temperature:4@16"`` -> ``("rope/nope_temperature:4", 16)`` (Llama 4's
    iRoPE: ``ModelConfig.attention_chunk_size``); ``"rope"`` -> ``("rope", None)``."""
    if not isinstance(spec, str) or "@" not in spec:
        return spec, None
    encoding, _, size = spec.rpartition("@")
    chunk = _spec_number(size)
    if not encoding or chunk is None or chunk < 1:
        fail(name, spec, f"{CHUNK_SYNTAX}, C a positive whole number {NUMBER_SYNTAX}")
    return encoding, chunk


WINDOW_SYNTAX = (
    "SPEC~W (sliding-window attention over the W most recent positions in SPEC's non-NoPE layers, last in the spec, "
    "e.g. 'rope~16' (Mistral) or 'rope/nope:4~16' (RNoPE-SWA))"
)


def split_window(spec: object, name: str = "encoding") -> tuple[object, int | None]:
    """A lab spec's window suffix, its last part: ``"rope/nope:4~16"`` -> ``("rope/nope:4", 16)``
    (``ModelConfig.sliding_window``); ``"rope"`` -> ``("rope", None)``."""
    if not isinstance(spec, str) or "~" not in spec:
        return spec, None
    encoding, _, size = spec.rpartition("~")
    window = _spec_number(size)
    if not encoding or "~" in encoding or window is None or window < 1:
        fail(name, spec, f"{WINDOW_SYNTAX}, W a positive whole number {NUMBER_SYNTAX}")
    return encoding, window


SINKS_SUFFIX = "+sinks"
SINKS_SYNTAX = (
    "SPEC+sinks (learned attention sinks in every layer, last in the spec, e.g. 'rope+sinks', 'rope~16+sinks')"
)


def split_local(spec: object, name: str = "encoding") -> tuple[object, int | None, int | None, bool]:
    """``SPEC[@C][~W][+sinks]`` -> ``(SPEC, C, W, sinks)``: the layers' spec, the chunk size and the window (None
    where absent), and whether every layer learns attention sinks (``ModelConfig.sinks``)."""
    sinks = isinstance(spec, str) and spec.endswith(SINKS_SUFFIX)
    if sinks:
        spec = spec[: -len(SINKS_SUFFIX)]
    if isinstance(spec, str) and ("+" in spec or (sinks and not spec)):
        fail(name, spec + SINKS_SUFFIX if sinks else spec, SINKS_SYNTAX)
    rest, window = split_window(spec, name)
    layers, chunk = split_chunk(rest, name)
    return layers, chunk, window, sinks


def check_layer_spec(spec: object, *, n_layers: int, name: str = "encoding") -> tuple[str, str | None, int | None]:
    """:func:`split_encoding`, with a per-layer spec's names, interval and layer count checked.

    A single name is returned as is (its caller checks it); in ``BASE/OTHER:N`` both names must be registered and
    differ, and ``2 <= N <= n_layers`` so that each of them gets at least one layer.
    """
    base, other, interval = split_encoding(spec, name)
    if other is None:
        return base, None, None
    for part in (base, other):
        if part not in posenc.available():
            fail(name, spec, f"names from {posenc.available()} in BASE/OTHER:N; {part!r} is not one")
    if base == other:
        fail(name, spec, f"two different encodings in BASE/OTHER:N; this is just {base!r}")
    if n_layers < 2:
        fail(name, spec, f"a single encoding name: n_layers={n_layers} leaves no room for two")
    if not 2 <= interval <= n_layers:
        fail(
            name,
            spec,
            f"an interval N from 2 to n_layers={n_layers} in BASE/OTHER:N (N=1 leaves no {base} layer, "
            f"N > n_layers no {other} layer)",
        )
    return base, other, interval


def layer_names(spec: str, *, n_layers: int) -> tuple[str, ...]:
    """The encoding name of each of ``n_layers`` layers: transformers' rule for ``no_rope_layer_interval``."""
    base, other, interval = check_layer_spec(spec, n_layers=n_layers)
    if other is None:
        return (base,) * n_layers
    return tuple(other if (i + 1) % interval == 0 else base for i in range(n_layers))


def is_absolute(encoding: posenc.Encoding) -> bool:
    """Whether ``encoding`` adds positions to the token embeddings (its ``embed`` hook), once for all layers."""
    return type(encoding).embed is not posenc.Encoding.embed


def check_layer_part(encoding: posenc.Encoding, part: str, spec: str, name: str = "encoding") -> None:
    """A per-layer spec may hold only encodings that act inside attention, not absolute ones."""
    if is_absolute(encoding):
        fail(
            name,
            spec,
            f"encodings that act inside attention in BASE/OTHER:N: {part!r} adds positions to the token "
            f"embeddings once, before the first layer, so it cannot be chosen per layer (use it alone)",
        )


#: Encodings whose layers attend globally under ``attention_chunk_size`` (Llama 4 chunks only its RoPE layers).
GLOBAL_ENCODINGS = ("nope", "nope_temperature")

#: ``config.json``'s record that the model's key-count encodings (SSMax: ``Encoding.reads_key_count``) in windowed or
#: chunked layers take ``n`` from attention's mask, ``{"key_count": "mask"}``; written only for such models. Before
#: (issue 46), ``posenc.attention`` did not tell the encoding what it masked, and an SSMax in a layer with a window or
#: chunks used ``n = p + 1`` (the lab's ``ssmax~8`` did): a run saved so has no record, and is refused rather than
#: reloaded as a model it was not trained as (``ModelConfig.from_dict``).
KEY_COUNT_KEY = "key_count"
KEY_COUNT_FROM_MASK = "mask"


@dataclass(frozen=True, kw_only=True)
class ModelConfig(DictConfig):
    """Architecture of a lab ``GPT``; ``to_dict``/``from_dict`` round-trip through JSON (``config.json``).

    Args:
        vocab_size: token ids in ``[0, vocab_size)``; 256 for bytes.
        dim: model width, a multiple of ``n_heads``.
        n_layers: transformer blocks.
        n_heads: query heads; head width is ``dim // n_heads``.
        n_kv_heads: key/value heads (grouped-query attention), dividing ``n_heads``; None means ``n_heads``.
        max_len: the training length (the size of learned position tables; other encodings ignore it).
        encoding: a name from ``posenc.available()`` whose encoding takes 1-D positions, or two chosen per layer,
            ``"BASE/OTHER:N"``: OTHER in every N-th layer (layers N, 2N, ... counting from 1; ``2 <= N <=
            n_layers``), BASE in the others, e.g. ``"rope/nope:4"``. Neither may be absolute (sinusoidal, learned).
        encoding_config: extra keyword arguments for ``posenc.build`` (JSON values), e.g. ``{"base": 500.0}``; for
            ``BASE/OTHER:N``, a dict of them per name, e.g. ``{"nope_temperature": {"floor_scale": 64}}``.
        mlp_ratio: MLP hidden width is ``mlp_ratio * dim``.
        backend: ``posenc.attention`` backend, one of ``BACKENDS``.
        sinks: learned attention sinks (GPT-OSS): a trainable logit per head and layer added to each softmax's
            denominator (``posenc.attention(sinks=)``), initialised to 0. Written to ``to_dict`` only when True, so
            the configs of earlier runs (which have no such key) still compare equal on resume.
        attention_chunk_size: chunked local attention in the layers whose encoding is not NoPE (``GLOBAL_ENCODINGS``):
            a query sees only the keys in its own chunk of this many positions (``posenc.attention(chunk_size=)``),
            while NoPE layers attend globally: Llama 4's iRoPE with ``encoding="rope/nope_temperature:4"``. None
            (the default, left out of ``to_dict`` so earlier runs resume): every layer attends globally.
        sliding_window: sliding-window attention in the layers whose encoding is not NoPE: a query at position p sees
            the keys at ``p - W < k <= p`` (``posenc.attention(window=)``), NoPE layers attend globally. With
            ``encoding="rope"`` every layer is windowed (Mistral 7B, Jiang et al. 2023, arXiv:2310.06825); with
            ``"rope/nope:4"`` it is RNoPE-SWA (Yang et al. 2025, "Rope to Nope and Back Again", arXiv:2501.18795:
            windowed RoPE layers, global NoPE layers, as Cohere's Command A). None (the default, left out of
            ``to_dict``): global attention. Combines with ``attention_chunk_size``.

    Both are at most ``2**63 - 1`` (int64 positions). An SSMax layer under either counts, as its ``n``, the keys the
    window and chunks leave each query (``posenc.attention`` passes them); ``to_dict`` records that
    (``KEY_COUNT_KEY``) and ``from_dict`` refuses a model saved before, whose SSMax used ``n = p + 1`` there.
    """

    vocab_size: int = 256
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = None
    max_len: int
    encoding: str = "rope"
    encoding_config: dict[str, Any] = field(default_factory=dict)
    mlp_ratio: int = 4
    backend: str = "auto"
    sinks: bool = False
    attention_chunk_size: int | None = None
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "max_len", "mlp_ratio"):
            check_positive_int(name, getattr(self, name))
        if self.dim % self.n_heads:
            fail("dim", self.dim, f"a multiple of n_heads={self.n_heads} (head width = dim // n_heads)")
        if self.n_kv_heads is not None:
            check_positive_int("n_kv_heads", self.n_kv_heads)
            if self.n_heads % self.n_kv_heads:
                fail("n_kv_heads", self.n_kv_heads, f"a divisor of n_heads={self.n_heads}, or None")
        base, other, _ = check_layer_spec(self.encoding, n_layers=self.n_layers)
        if other is None:
            check_choice("encoding", self.encoding, posenc.available())
        check_choice("backend", self.backend, BACKENDS)
        if not isinstance(self.sinks, bool):
            fail("sinks", self.sinks, "True or False")
        for local in ("attention_chunk_size", "sliding_window"):
            value = getattr(self, local)
            whole = isinstance(value, int) and not isinstance(value, bool)
            if value is not None and not (whole and 0 < value <= MAX_SPAN):
                fail(local, value, "a positive integer up to 2**63 - 1 (positions are compared as int64), or None")
        check_encoding_config(self.encoding_config)
        if other is not None:
            for key, value in self.encoding_config.items():
                if key not in (base, other) or not isinstance(value, Mapping):
                    fail(
                        "encoding_config",
                        self.encoding_config,
                        f"for encoding={self.encoding!r}, keyword arguments per name: "
                        f"{{{base!r}: {{...}}, {other!r}: {{...}}}} (either may be left out)",
                    )

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def base_encoding(self) -> str:
        """The encoding of every layer, or BASE in ``"BASE/OTHER:N"`` (the one RoPE scalings and swaps act on)."""
        return split_encoding(self.encoding)[0]

    @property
    def layer_encodings(self) -> tuple[str, ...]:
        """The encoding name of each layer, first to last."""
        return layer_names(self.encoding, n_layers=self.n_layers)

    @property
    def layer_chunk_sizes(self) -> tuple[int | None, ...]:
        """Each layer's ``chunk_size`` for ``posenc.attention``: ``attention_chunk_size``, or None (global) for the
        NoPE layers and when ``attention_chunk_size`` is None."""
        return self._in_local_layers(self.attention_chunk_size)

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's ``window`` for ``posenc.attention``: ``sliding_window``, or None (global) for the NoPE layers
        and when ``sliding_window`` is None."""
        return self._in_local_layers(self.sliding_window)

    def _in_local_layers(self, value: int | None) -> tuple[int | None, ...]:
        """``value`` for each layer that attends locally (not NoPE: ``GLOBAL_ENCODINGS``), None for the others."""
        return tuple(None if name in GLOBAL_ENCODINGS else value for name in self.layer_encodings)

    def key_count_layers(self) -> list[int]:
        """The layers (from 0) whose encoding reads the key count (SSMax) and whose window or chunks cap it beyond
        what the encoding itself declares (an ``SSMax(window=W)`` in a layer windowed by W alone is not one): where
        runs saved before issue 46 computed ``n = min(p + 1, SSMax's window)`` instead (see ``KEY_COUNT_KEY``)."""
        layers = zip(self.layer_encodings, self.layer_chunk_sizes, self.layer_windows, strict=True)
        local = [(i, name, c, w) for i, (name, c, w) in enumerate(layers) if c is not None or w is not None]
        if not local:
            return []
        with torch.random.fork_rng(devices=[]):  # a learned table's init draws nothing from the caller's stream
            built = {name: build_encoding(self, name) for name in {name for _, name, _, _ in local}}
        return [
            i
            for i, name, c, w in local
            if built[name].reads_key_count and (c is not None or w != getattr(built[name].config, "window", None))
        ]

    def to_dict(self) -> dict[str, Any]:
        """Every field by name, JSON-able; ``KEY_COUNT_KEY`` where ``key_count_layers`` has any."""
        out = super().to_dict()
        out["encoding_config"] = json.loads(json.dumps(dict(self.encoding_config)))  # a deep, JSON-only copy
        if not self.sinks:
            del out["sinks"]  # the default: earlier runs' config.json files have no such key
        for local in ("attention_chunk_size", "sliding_window"):
            if out[local] is None:
                del out[local]  # likewise
        if self.key_count_layers():
            out[KEY_COUNT_KEY] = KEY_COUNT_FROM_MASK
        return out

    @classmethod
    def from_dict(cls, config: Mapping[str, Any], *, where: str = "config") -> ModelConfig:
        """The config ``to_dict`` wrote. A saved model whose SSMax layers attend over a window or chunks and that
        lacks ``KEY_COUNT_KEY`` was trained with ``n = p + 1`` there, which posenc no longer computes: refused
        (``where`` names the dict in that error, e.g. its file)."""
        marker = config.get(KEY_COUNT_KEY) if isinstance(config, Mapping) else None
        if isinstance(config, Mapping):
            config = {k: v for k, v in config.items() if k != KEY_COUNT_KEY}
        built = super().from_dict(config)
        check_key_count_record(built, marker, where)
        return built


def check_key_count_record(
    config: ModelConfig, marker: object, where: str = "config", remedy: str = "retrain it"
) -> None:
    """``marker``, a saved ``config``'s ``KEY_COUNT_KEY`` (None: absent), must say ``n`` came from the mask wherever
    ``config`` has SSMax layers with a window or chunks (``where`` names the dict or file in the error, ``remedy``
    what to do about it)."""
    layers = config.key_count_layers()
    if not layers:
        if marker is not None:
            fail(f"{where}[{KEY_COUNT_KEY!r}]", marker, f"no such key: encoding={config.encoding!r} has no SSMax layer "
                 "with a window or chunks")
        return
    if marker == KEY_COUNT_FROM_MASK:
        return
    if marker is not None:
        fail(f"{where}[{KEY_COUNT_KEY!r}]", marker, repr(KEY_COUNT_FROM_MASK))
    local = ", ".join(f"{k}={v}" for k, v in (("attention_chunk_size", config.attention_chunk_size),
                                               ("sliding_window", config.sliding_window)) if v is not None)
    fail(
        f"{where}[{KEY_COUNT_KEY!r}]",
        None,
        f"{KEY_COUNT_FROM_MASK!r}: this model (encoding={config.encoding!r}, {local}) was saved by a posenc that gave "
        f"the SSMax of layers {layers} an n read from the query's position (p + 1) whatever the window or chunks "
        f"masked (issue 46); posenc now counts the keys each query sees and cannot rebuild the model it trained as: "
        f"{remedy}",
    )


def build_encodings(config: ModelConfig) -> tuple[posenc.Encoding, posenc.Encoding | None]:
    """The encodings ``config`` names, sized for the model: ``(BASE, OTHER)`` of ``"BASE/OTHER:N"``, or
    ``(encoding, None)``. Each must take 1-D sequence positions; in a per-layer spec, neither may be absolute."""
    base, other, _ = split_encoding(config.encoding)
    if other is None:
        return build_encoding(config, base), None
    built = []
    for part in (base, other):
        encoding = build_encoding(config, part)
        check_layer_part(encoding, part, config.encoding)
        built.append(encoding)
    return built[0], built[1]


def build_encoding(config: ModelConfig, name: str) -> posenc.Encoding:
    """``name``'s encoding (a name in ``config.encoding``), sized for the model, with its ``encoding_config``."""
    per_name = split_encoding(config.encoding)[1] is not None
    kwargs = config.encoding_config.get(name, {}) if per_name else config.encoding_config
    encoding = posenc.build(
        name, dim=config.dim, num_heads=config.n_heads, head_dim=config.head_dim, max_len=config.max_len, **kwargs
    )
    check_sequence_encoding(encoding, "encoding")
    if encoding.per_layer and is_absolute(encoding):
        fail("encoding", name, "per-layer parameters inside attention; this one adds positions to the embeddings")
    return encoding


def check_sequence_encoding(encoding: object, name: str) -> None:
    """``encoding`` must be a ``posenc.Encoding`` reading 1-D positions (not a grid or M-RoPE encoding)."""
    if not isinstance(encoding, posenc.Encoding):
        fail(name, type(encoding).__name__, "a posenc.Encoding (posenc.build(name, ...))")
    if encoding.position_kind != "sequence":
        fail(
            name,
            type(encoding).__name__,
            f"an encoding of 1-D token positions; this one takes {encoding.position_kind!r} positions",
        )


class Attention(nn.Module):
    """Causal self-attention through ``posenc.attention`` with the model's shared encoding."""

    def __init__(self, config: ModelConfig, *, chunk_size: int | None = None, window: int | None = None) -> None:
        super().__init__()
        self.n_heads, self.kv_heads, self.head_dim = config.n_heads, config.kv_heads, config.head_dim
        self.chunk_size = chunk_size  # chunked local attention (``posenc.attention(chunk_size=)``), None: global
        self.window = window  # sliding-window attention (``posenc.attention(window=)``), None: global
        self.backend = config.backend
        self.qkv = nn.Linear(config.dim, (self.n_heads + 2 * self.kv_heads) * self.head_dim, bias=False)
        self.proj = nn.Linear(config.dim, config.dim, bias=False)
        # GPT-OSS's learned attention sinks: one logit per head (H,), 0 at the start (a sink worth one key of score 0).
        self.sinks = nn.Parameter(torch.zeros(self.n_heads)) if config.sinks else None

    def forward(self, x: torch.Tensor, positions: torch.Tensor, encoding: posenc.Encoding) -> torch.Tensor:
        """``(B, S, dim) -> (B, S, dim)``; ``positions`` ``(S,)`` or ``(B, S)``, passed to ``encoding``'s hooks."""
        b, s, _ = x.shape
        hd = self.head_dim
        q, k, v = self.qkv(x).split([self.n_heads * hd, self.kv_heads * hd, self.kv_heads * hd], dim=-1)
        q = q.view(b, s, self.n_heads, hd).transpose(1, 2)  # (B, H, S, D)
        k = k.view(b, s, self.kv_heads, hd).transpose(1, 2)  # (B, Hkv, S, D)
        v = v.view(b, s, self.kv_heads, hd).transpose(1, 2)  # (B, Hkv, S, D)
        y = posenc.attention(
            q,
            k,
            v,
            encoding=encoding,
            q_positions=positions,
            causal=True,
            backend=self.backend,
            sinks=self.sinks,
            chunk_size=self.chunk_size,
            window=self.window,
        )
        y = y.transpose(1, 2).reshape(b, s, self.n_heads * hd)  # (B, H, S, D) -> (B, S, dim)
        return self.proj(y)


class MLP(nn.Module):
    """``proj(gelu(fc(x)))`` with hidden width ``mlp_ratio * dim``, no biases."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.dim, config.mlp_ratio * config.dim, bias=False)
        self.proj = nn.Linear(config.mlp_ratio * config.dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, S, dim) -> (B, S, dim)``."""
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-norm block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``.

    ``encoding``: this layer's own encoding module (one whose parameters are per layer, ``Encoding.per_layer``), which
    ``GPT`` passes to ``forward`` unless swapped; None where the layer uses the model's shared one.
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        chunk_size: int | None = None,
        window: int | None = None,
        encoding: posenc.Encoding | None = None,
    ) -> None:
        super().__init__()
        self.encoding = encoding
        self.ln1 = nn.LayerNorm(config.dim, bias=False)
        self.attn = Attention(config, chunk_size=chunk_size, window=window)
        self.ln2 = nn.LayerNorm(config.dim, bias=False)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, encoding: posenc.Encoding) -> torch.Tensor:
        """``(B, S, dim) -> (B, S, dim)``."""
        x = x + self.attn(self.ln1(x), positions, encoding)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Byte-level decoder LM with one positional encoding shared by every layer (or two, ``"BASE/OTHER:N"``: see
    ``ModelConfig.encoding``); tied input/output embeddings.

    ``encoding`` is the shared encoding, BASE for a per-layer spec; ``nth_encoding`` is OTHER, shared by every N-th
    layer, or None; ``layer_encodings()`` lists what each block uses. A kind whose parameters are per layer
    (``Encoding.per_layer``: SSMax) is shared by none: each of its layers holds its own (``blocks[i].encoding``), and
    ``encoding`` (or ``nth_encoding``) is None for it.

    Args:
        config: the architecture.
        seed: initialisation seed: the same config and seed give the same weights on every run (the global RNG is
            left untouched).

    Shapes:
        tokens (B, S) integer ids < vocab_size; positions (S,) or (B, S), default ``arange(S)``
        -> logits (B, S, vocab_size).
    """

    def __init__(self, config: ModelConfig, *, seed: int = 0) -> None:
        super().__init__()
        if not isinstance(config, ModelConfig):
            fail("config", type(config).__name__, "a posenc.lab.common.gpt.ModelConfig")
        self.config = config
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # the encoding's own parameters (learned tables, T5/Shaw biases) draw from it
            self.wte = nn.Embedding(config.vocab_size, config.dim)
            base, other = build_encodings(config)
            self._nth = tuple(name != config.base_encoding for name in config.layer_encodings)  # OTHER's layers
            owned = _own_encodings(config, base, other, self._nth)  # per layer: its own module, or None (shared)
            self.encoding = None if base.per_layer else base
            self.nth_encoding = None if other is None or other.per_layer else other
            local = list(zip(config.layer_chunk_sizes, config.layer_windows, owned, strict=True))
            for (c, w, own), nth in zip(local, self._nth, strict=True):
                # an SSMax(window=W) in encoding_config must sit in a layer windowed by W: refused now, not at step 1
                (own or (other if nth else base)).check_mask(window=w, chunk_size=c)
            self.blocks = nn.ModuleList(Block(config, chunk_size=c, window=w, encoding=e) for c, w, e in local)
            self.ln_f = nn.LayerNorm(config.dim, bias=False)
            self._init_weights()
        self.embed_scale = math.sqrt(config.dim)

    @torch.no_grad()
    def _init_weights(self) -> None:
        """GPT-2 init: linear weights N(0, 0.02), residual projections scaled by 1/sqrt(2 * n_layers)."""
        nn.init.normal_(self.wte.weight, std=self.config.dim**-0.5)
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layers)
        for block in self.blocks:
            nn.init.normal_(block.attn.qkv.weight, std=0.02)
            nn.init.normal_(block.mlp.fc.weight, std=0.02)
            nn.init.normal_(block.attn.proj.weight, std=residual_std)
            nn.init.normal_(block.mlp.proj.weight, std=residual_std)

    def set_encoding(self, encoding: posenc.Encoding | None) -> None:
        """Replace the shared encoding (e.g. a RoPE scaling or ALiBi at an evaluation length); in a per-layer
        model, BASE's, in all of its layers (every N-th layer keeps OTHER).

        The new module is used as given: learned parameters are not copied over, so swap only parameter-free
        encodings or ones built from the trained module (``model.encoding.resized(n)``). ``config`` keeps
        describing the trained model. Where BASE's layers hold their own modules (``Encoding.per_layer``), those
        are kept while another one is swapped in, and ``set_encoding(None)`` (``model.encoding`` as it was) goes
        back to them.
        """
        if encoding is None:
            if any(block.encoding is None for block, nth in zip(self.blocks, self._nth, strict=True) if not nth):
                fail("encoding", None, "an encoding: BASE's layers have no encoding of their own to go back to")
        else:
            check_sequence_encoding(encoding, "encoding")
            if split_encoding(self.config.encoding)[1] is not None:
                check_layer_part(encoding, type(encoding).__name__, self.config.encoding)
        self.encoding = encoding

    def upgrade_state_dict(self, weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``weights`` saved before SSMax's parameters were per layer (one module shared by every layer of its kind,
        keys ``encoding.*`` / ``nth_encoding.*``) as this model holds them: each of those layers gets the shared
        tensors, which is what every one of them used. Other weights are returned as they are."""
        out = dict(weights)
        for shared, is_nth in (("encoding.", False), ("nth_encoding.", True)):
            if getattr(self, shared[:-1]) is not None:
                continue
            for key in [k for k in out if k.startswith(shared)]:
                value = out.pop(key)
                for i, nth in enumerate(self._nth):
                    if nth == is_nth:
                        out[f"blocks.{i}.encoding.{key[len(shared):]}"] = value.clone()
        return out

    def layer_encodings(self) -> list[posenc.Encoding]:
        """The encoding each block uses, first to last: the same object for the layers of one kind, or each layer's
        own for a kind whose parameters are per layer."""
        out = []
        for nth, block in zip(self._nth, self.blocks, strict=True):
            shared = self.nth_encoding if nth else self.encoding
            out.append(block.encoding if shared is None else shared)
        return out

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Next-token logits ``(B, S, vocab_size)`` for ``tokens`` ``(B, S)`` at ``positions`` (default 0..S-1)."""
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
            fail("tokens.shape", getattr(tokens, "shape", type(tokens).__name__), "(B, S) token ids")
        if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
            fail("tokens.dtype", tokens.dtype, "an integer dtype (token ids)")
        s = tokens.shape[1]
        if positions is None:
            positions = torch.arange(s, device=tokens.device)
        x = self.wte(tokens) * self.embed_scale  # (B, S, dim)
        encodings = self.layer_encodings()
        # (B, S, dim): absolute encodings add here (only ever the model's one encoding), others pass through
        x = encodings[0].embed(x, positions)
        for block, encoding in zip(self.blocks, encodings, strict=True):
            x = block(x, positions, encoding)
        x = self.ln_f(x)
        return F.linear(x, self.wte.weight)  # (B, S, vocab): tied head, so the state dict holds the table once


def _own_encodings(
    config: ModelConfig, base: posenc.Encoding, other: posenc.Encoding | None, nth: tuple[bool, ...]
) -> list[posenc.Encoding | None]:
    """Each layer's own encoding module where its kind's parameters are per layer (``Encoding.per_layer``), else None:
    the first such layer takes the module already built, every later one a new one (built from the same config)."""
    names = config.layer_encodings
    taken: set[bool] = set()
    owned: list[posenc.Encoding | None] = []
    for name, is_nth in zip(names, nth, strict=True):
        template = other if is_nth else base
        if not template.per_layer:
            owned.append(None)
        elif is_nth not in taken:
            taken.add(is_nth)
            owned.append(template)
        else:
            owned.append(build_encoding(config, name))
    return owned


def sequence_encodings() -> list[str]:
    """Names in ``posenc.available()`` whose encoding takes 1-D positions, i.e. that a ``GPT`` can use."""
    names = []
    for name in posenc.available():
        try:
            encoding = posenc.build(name, dim=64, num_heads=4, head_dim=16, max_len=16)
        except ValueError:
            continue  # needs configuration a sequence model cannot give (e.g. a grid size)
        if encoding.position_kind == "sequence":
            names.append(name)
    return names
