"""Rope scaling configs: frozen, validated, round-trippable to Hugging Face ``rope_scaling`` dicts.

Each config is a thin shell over one pure function of ``posenc.functional.rope_scaling``; see there for the papers.
Keys and defaults are Hugging Face's, so a dict pasted from a model's ``config.json`` works as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch

from posenc._checks import check_number, check_positive_int, fail
from posenc.functional import rope_scaling as F
from posenc.registry import available_scalings, register_scaling, scaling_class

_Device = torch.device | str | None  # where the frequencies are built

# Keys of an HF rope dict that configure the rotary embedding itself, not the scaling.
_ROTARY_KEYS = ("rope_theta", "partial_rotary_factor")


@dataclass(frozen=True, kw_only=True, slots=True)
class RopeScaling:
    """Base class: a frequency transform ``(dim, base, seq_len) -> (inv_freq, attention_factor)``."""

    rope_type: ClassVar[str]
    #: True where the frequencies depend on the current sequence length (dynamic NTK, LongRoPE).
    depends_on_length: ClassVar[bool] = False
    #: The smallest ``factor`` this scaling takes (the context grows by it: 1 is the original context); None where its
    #: own check says otherwise (LongRoPE: any positive factor).
    factor_minimum: ClassVar[float | None] = 1.0

    def frequencies(
        self, dim: int, *, base: float, seq_len: int | torch.Tensor | None = None, device: _Device = None
    ) -> tuple[torch.Tensor, float]:
        """Float32 ``inv_freq`` of shape ``(dim // 2,)`` and the attention factor."""
        raise NotImplementedError

    def check_dim(self, dim: int) -> None:
        """Raise ``ValueError`` if this scaling cannot serve rotary dimension ``dim``."""

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``rope_scaling`` / ``rope_parameters`` dict a model's ``config.json`` carries for this scaling, in the
        form runtimes read (``to_dict`` unless a runtime spells it otherwise)."""
        return self.to_dict()

    def to_dict(self) -> dict[str, Any]:
        """HF-style dict: ``rope_type`` plus every field that is set."""
        out: dict[str, Any] = {"rope_type": self.rope_type}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> RopeScaling:
        """Build from an HF-style dict; ``rope_type`` / ``type`` may be present and must match."""
        if cls is RopeScaling:
            return cast(RopeScaling, parse_scaling(config))  # a mapping always parses to a scaling
        config = _released_form(config)
        given = config.get("rope_type") or config.get("type")
        if given is not None and given != cls.rope_type:
            fail("rope_type", given, f"{cls.rope_type!r} for {cls.__name__} (or use RopeScaling.from_dict)")
        return _from_dict(cls, config)


def _from_dict(cls: type[RopeScaling], config: Mapping[str, Any]) -> RopeScaling:
    names = {f.name for f in dataclasses.fields(cls)}
    required = {
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    # A rotary key stays when the scaling owns it (p-RoPE's partial_rotary_factor picks the pairs that rotate).
    skipped = {"rope_type", "type", *(set(_ROTARY_KEYS) - names)}
    values = {k: v for k, v in config.items() if k not in skipped and v is not None}
    # HF fills original_max_position_embeddings from the model's max_position_embeddings when it is absent.
    absent = "original_max_position_embeddings" in names and "original_max_position_embeddings" not in values
    if absent and "max_position_embeddings" in values:
        values["original_max_position_embeddings"] = values["max_position_embeddings"]
    if "max_position_embeddings" not in names:
        values.pop("max_position_embeddings", None)
    unknown = sorted(set(values) - names)
    if unknown:
        fail(
            f"rope_scaling[{unknown[0]!r}]",
            values[unknown[0]],
            f"only the keys {sorted(names)} for rope_type {cls.rope_type!r}",
        )
    if "factor" in values and cls.factor_minimum is not None:  # a wrong value given is named before a missing key
        check_number("factor", values["factor"], minimum=cls.factor_minimum)
    missing = sorted(required - set(values))
    if missing:
        fail("rope_scaling", dict(config), f"the key(s) {missing} for rope_type {cls.rope_type!r}")
    return cls(**values)


def parse_scaling(scaling: RopeScaling | Mapping[str, Any] | None) -> RopeScaling | None:
    """Normalise ``None``, a config object or an HF ``rope_scaling`` / ``rope_parameters`` dict.

    ``rope_type="default"`` (or a dict without a type) means no scaling and returns ``None``.
    """
    if scaling is None or isinstance(scaling, RopeScaling):
        return scaling
    if not isinstance(scaling, Mapping):
        fail("scaling", scaling, "None, a posenc RopeScaling config, or a Hugging Face rope_scaling dict")
    scaling = _released_form(scaling)
    rope_type, legacy = scaling.get("rope_type"), scaling.get("type")
    if rope_type is not None and legacy is not None and rope_type != legacy:
        fail("rope_scaling['type']", legacy, f"the same value as rope_scaling['rope_type'] ({rope_type!r})")
    rope_type = rope_type or legacy or "default"
    if rope_type == "default":
        extra = sorted(set(scaling) - {"rope_type", "type", *_ROTARY_KEYS, "max_position_embeddings"})
        if extra:
            fail(f"rope_scaling[{extra[0]!r}]", scaling[extra[0]], "no scaling keys for rope_type 'default'")
        return None
    if rope_type not in available_scalings():
        fail("rope_type", rope_type, f"one of {available_scalings()}")
    return _from_dict(scaling_class(rope_type), scaling)


#: Keys a released ``{"type": "dynamic", "alpha": ...}`` dict (Hunyuan) carries that vLLM's alpha path ignores:
#: accepted at the values that change nothing anywhere (Hunyuan ships exactly these), refused otherwise.
_ALPHA_NO_OP_KEYS = {"factor": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
#: ... and YaRN ramp keys, which have no meaning without a ramp (Hunyuan ships beta_fast 32, beta_slow 1).
_ALPHA_IGNORED_KEYS = ("beta_fast", "beta_slow", "max_position_embeddings")


def _released_form(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """A released config's spelling of a posenc scaling, as posenc's own ``rope_type`` (vLLM's ``get_rope`` rules):

    - ``"dynamic"`` with an ``"alpha"`` key is Hunyuan's NTK-by-alpha (``"ntk_alpha"``), not dynamic NTK;
    - ``"ntk"`` with a ``"mixed_b"`` key is mixed NTK (``"ntk_mixed"``); without it ``"ntk"`` stays posenc's
      NTK-aware base change (vLLM's fixed ``"ntk"`` is ``ntk_mixed`` with ``mixed_b = 1``, a different formula);
    - ``"telechat3-yarn"`` is ``"telechat3_yarn"``.

    Any other dict comes back as it is.
    """
    rope_type = config.get("rope_type") or config.get("type")
    if rope_type == "dynamic" and config.get("alpha") is not None:
        out = {k: v for k, v in config.items() if k not in ("rope_type", "type", *_ALPHA_IGNORED_KEYS)}
        for key, value in _ALPHA_NO_OP_KEYS.items():
            given = out.pop(key, None)
            if given is not None and float(check_number(f"rope_scaling[{key!r}]", given)) != value:
                fail(
                    f"rope_scaling[{key!r}]",
                    given,
                    f"{value} (or absent) with 'alpha': vLLM and Hunyuan read only alpha, so {key} would be ignored",
                )
        return {"rope_type": "ntk_alpha", **out}
    if rope_type == "ntk" and config.get("mixed_b") is not None:
        return {"rope_type": "ntk_mixed", **{k: v for k, v in config.items() if k not in ("rope_type", "type")}}
    if rope_type == "telechat3-yarn":
        return {"rope_type": "telechat3_yarn", **{k: v for k, v in config.items() if k not in ("rope_type", "type")}}
    return config


def _check_factor(value: float) -> float:
    return check_number("factor", value, minimum=1.0)


def _check_rotary_dim_for_ntk(dim: int) -> None:
    if dim <= 2:
        fail("rotary dim", dim, "> 2 for NTK scaling (its exponent is dim / (dim - 2))")


@register_scaling
@dataclass(frozen=True, kw_only=True, slots=True)
class LinearScaling(RopeScaling):
    """Position Interpolation (Chen et al. 2023): positions divided by ``factor``."""

    rope_type: ClassVar[str] = "linear"
    factor: float

    def __post_init__(self) -> None:
        _check_factor(self.factor)

    def frequencies(
        self, dim: int, *, base: float, seq_len: int | torch.Tensor | None = None, device: _Device = None
    ) -> tuple[torch.Tensor, float]:
        return F.linear_frequencies(dim, base=base, factor=self.factor, device=device)


@register_scaling
@dataclass(frozen=True, kw_only=True, slots=True)
class NTKScaling(RopeScaling):
    """Static NTK-aware scaling: ``base * factor ** (dim / (dim - 2))``. Not in Hugging Face."""

    rope_type: ClassVar[str] = "ntk"
    factor: float

    def __post_init__(self) -> None:
        _check_factor(self.factor)

    def check_dim(self, dim: int) -> None:
        _check_rotary_dim_for_ntk(dim)

    def frequencies(
        self, dim: int, *, base: float, seq_len: int | torch.Tensor | None = None, device: _Device = None
    ) -> tuple[torch.Tensor, float]:
        self.check_dim(dim)
        return F.ntk_frequencies(dim, base=base, factor=self.factor, device=device)


@register_scaling
@dataclass(frozen=True, kw_only=True, slots=True)
class DynamicNTKScaling(RopeScaling):
    """Dynamic NTK: the NTK base recomputed from the current length past ``max_position_embeddings``."""

    rope_type: ClassVar[str] = "dynamic"
    depends_on_length: ClassVar[bool] = True
    factor: float
    max_position_embeddings: int

    def __post_init__(self) -> None:
        _check_factor(self.factor)
        check_positive_int("max_position_embeddings", self.max_position_embeddings)

    def check_dim(self, dim: int) -> None:
        _check_rotary_dim_for_ntk(dim)

    def frequencies(
        self, dim: int, *, base: float, seq_len: int | torch.Tensor | None = None, device: _Device = None
    ) -> tuple[torch.Tensor, float]:
        self.check_dim(dim)
        return F.dynamic_ntk_frequencies(
            dim,
            base=base,
            factor=self.factor,
            max_position_embeddings=self.max_position_embeddings,
            seq_len=seq_len,
            device=device,
        )


@register_scaling
@dataclass(frozen=True, kw_only=True, slots=True)
class YaRNScaling(RopeScaling):
    """YaRN (Peng et al. 2023); ``factor`` defaults to max_position_embeddings / original_max_position_embeddings."""

    rope_type: ClassVar[str] = "yarn"
    original_max_position_embeddings: int
    factor: float | None = None
    max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None

    def __post_init__(self) -> None:
        check_positive_int("original_max_position_embeddings", self.original_max_position_embeddings)
        if self.factor is None:
            if self.max_position_embeddings is None:
                fail("factor", None, "a number >= 1, or max_position_embeddings to derive it from")
            check_positive_int("max_position_embeddings", self.max_position_embeddings)
        _check_factor(self.effective_factor)
        check_number("beta_slow", self.beta_slow, above=0.0)
        if check_number("beta_fast", self.beta_fast) <= self.beta_slow:
            fail("beta_fast", self.beta_fast, f"a number > beta_slow = {self.beta_slow}")
        if not isinstance(self.truncate, bool):
            fail("truncate", self.truncate, "True or False")
        for name in ("mscale", "mscale_all_dim"):
            if getattr(self, name) is not None:
                check_number(name, getattr(self, name))
        if self.attention_factor is not None:
            check_number("attention_factor", self.attention_factor, above=0.0)

    @property
    def effective_factor(self) -> float:
        if self.factor is not None:
            return self.factor
        # without a factor, __post_init__ requires both lengths
        return cast(int, self.max_position_embeddings) / cast(int, self.original_max_position_embeddings)

    def frequencies(
        self, dim: int, *, base: float, seq_len: int | torch.Tensor | None = None, device: _Device = None
    ) -> tuple[torch.Tensor, float]:
        return F.yarn_frequencies(
            dim,
            base=base,
            factor=self.effective_factor,
            original_max_position_embeddings=self.original_max_position_embeddings,
            beta_fast=self.beta_fast,
            beta_slow=self.beta_slow,
            truncate=self.truncate,
            mscale=self.mscale,
            mscale_all_dim=self.mscale_all_dim,
            attention_factor=self.attention_factor,
            device=device,
        )


@register_scaling
@dataclass(frozen=True, kw_only=True, slots=True)
class LongRoPEScaling(RopeScaling):
    """LongRoPE (Ding et al. 2024), as in Phi-3: ``long_factor`` once the length passes the original one."""

    rope_type: ClassVar[str] = "longrope"
    factor_minimum: ClassVar[float | None] = None  # checked in __post_init__: above 0
    depends_on_length: ClassVar[bool] = True
    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    original_max_position_embeddings: int
    factor: float | None = None
    max_position_embeddings: int | None = None
    attention_factor: float | None = None

    def __post_init__(self) -> None:
        for name in ("short_factor", "long_factor"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
                fail(name, value, "a list of positive numbers, one per rotary frequency")
            value = tuple(check_number(f"{name}[{i}]", v, above=0.0) for i, v in enumerate(value))
            object.__setattr__(self, name, value)
        if check_positive_int("original_max_position_embeddings", self.original_max_position_embeddings) < 2:
            fail("original_max_position_embeddings", self.original_max_position_embeddings, "an integer >= 2")
        if self.max_position_embeddings is not None:
            check_positive_int("max_position_embeddings", self.max_position_embeddings)
        if self.factor is not None:
            check_number("factor", self.factor, above=0.0)
        if self.attention_factor is not None:
            check_number("attention_factor", self.attention_factor, above=0.0)
        elif self.factor is None and self.max_position_embeddings is None:
            fail("factor", None, "a number, max_position_embeddings or attention_factor (to set the attention factor)")

    @property
    def effective_factor(self) -> float:
        if self.factor is not None:
            return self.factor
        if self.max_position_embeddings is not None:
            return self.max_position_embeddings / cast(int, self.original_max_position_embeddings)
        return 1.0  # only reached with an explicit attention_factor, which then overrides it

    def check_dim(self, dim: int) -> None:
        for name in ("short_factor", "long_factor"):
            if len(getattr(self, name)) != dim // 2:
                fail(f"len({name})", len(getattr(self, name)), f"rotary dim // 2 = {dim // 2}")

    def frequencies(
        self, dim: int, *, base: float, seq_len: int | torch.Tensor | None = None, device: _Device = None
    ) -> tuple[torch.Tensor, float]:
        self.check_dim(dim)
        return F.longrope_frequencies(
            dim,
            base=base,
            short_factor=self.short_factor,
            long_factor=self.long_factor,
            original_max_position_embeddings=self.original_max_position_embeddings,
            factor=self.effective_factor,
            attention_factor=self.attention_factor,
            seq_len=seq_len,
            device=device,
        )


@register_scaling
@dataclass(frozen=True, kw_only=True, slots=True)
class Llama3Scaling(RopeScaling):
    """Llama 3.1's frequency-dependent interpolation (Meta 2024)."""

    rope_type: ClassVar[str] = "llama3"
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        _check_factor(self.factor)
        check_number("low_freq_factor", self.low_freq_factor, above=0.0)
        if check_number("high_freq_factor", self.high_freq_factor) <= self.low_freq_factor:
            fail("high_freq_factor", self.high_freq_factor, f"a number > low_freq_factor = {self.low_freq_factor}")
        check_positive_int("original_max_position_embeddings", self.original_max_position_embeddings)

    def frequencies(
        self, dim: int, *, base: float, seq_len: int | torch.Tensor | None = None, device: _Device = None
    ) -> tuple[torch.Tensor, float]:
        return F.llama3_frequencies(
            dim,
            base=base,
            factor=self.factor,
            low_freq_factor=self.low_freq_factor,
            high_freq_factor=self.high_freq_factor,
            original_max_position_embeddings=self.original_max_position_embeddings,
            device=device,
        )


@register_scaling
@dataclass(frozen=True, kw_only=True, slots=True)
class ProportionalScaling(RopeScaling):
    """p-RoPE (Barbero et al. 2024), Gemma 4's ``"proportional"``: the highest-frequency fraction
    ``partial_rotary_factor`` of the channel pairs rotates, the other pairs get frequency 0 and pass through.

    Unlike partial rotary, the whole head goes through the rotation and the kept frequencies are RoPE's own
    (``base ** (-2i / head_dim)``), so the rotary embedding's own ``partial_rotary_factor`` must stay 1.0; this
    config carries the fraction, under the key Hugging Face uses. ``factor`` (optional, as in HF) divides every
    frequency, i.e. linear interpolation of the rotating pairs.
    """

    rope_type: ClassVar[str] = "proportional"
    partial_rotary_factor: float = 1.0
    factor: float | None = None

    def __post_init__(self) -> None:
        if check_number("partial_rotary_factor", self.partial_rotary_factor, minimum=0.0) > 1.0:
            fail("partial_rotary_factor", self.partial_rotary_factor, "a number in [0, 1]: the fraction that rotates")
        if self.factor is not None:
            _check_factor(self.factor)

    def frequencies(
        self, dim: int, *, base: float, seq_len: int | torch.Tensor | None = None, device: _Device = None
    ) -> tuple[torch.Tensor, float]:
        return F.proportional_frequencies(
            dim,
            base=base,
            partial_rotary_factor=self.partial_rotary_factor,
            factor=1.0 if self.factor is None else self.factor,
            device=device,
        )


@register_scaling
@dataclass(frozen=True, kw_only=True, slots=True)
class NTKAlphaScaling(RopeScaling):
    """NTK-by-alpha (Tencent Hunyuan): default RoPE at base ``base * alpha ** (dim / (dim - 2))``.

    Released configs spell it ``{"type": "dynamic", "alpha": 1000.0, ...}``, which vLLM's ``get_rope`` sends to
    ``DynamicNTKAlphaRotaryEmbedding``, a static base change (no length dependence) despite the name; posenc reads
    that form into this class. Exported to Hugging Face configs as default RoPE with the enlarged base, which
    transformers, vLLM and llama.cpp all run exactly as this.
    """

    rope_type: ClassVar[str] = "ntk_alpha"
    alpha: float

    def __post_init__(self) -> None:
        check_number("alpha", self.alpha, minimum=1.0)

    def check_dim(self, dim: int) -> None:
        _check_rotary_dim_for_ntk(dim)

    def frequencies(
        self, dim: int, *, base: float, seq_len: int | torch.Tensor | None = None, device: _Device = None
    ) -> tuple[torch.Tensor, float]:
        self.check_dim(dim)
        return F.ntk_alpha_frequencies(dim, base=base, alpha=self.alpha, device=device)


@register_scaling
@dataclass(frozen=True, kw_only=True, slots=True)
class MixedNTKScaling(RopeScaling):
    """Mixed NTK (Su 2023, kexue.fm/archives/9706): pair ``m = 1..F`` divided by ``exp(a m ** mixed_b)``,
    ``a = ln(factor) / F ** mixed_b``; the lowest frequency by exactly ``factor``.

    vLLM reads it as ``{"rope_type": "ntk", "factor": ..., "mixed_b": ...}`` (``NTKScalingRotaryEmbedding``); posenc
    reads that form into this class and writes it back for Hugging Face configs (transformers has no ``"ntk"``).
    """

    rope_type: ClassVar[str] = "ntk_mixed"
    factor: float
    mixed_b: float

    def __post_init__(self) -> None:
        _check_factor(self.factor)
        check_number("mixed_b", self.mixed_b, above=0.0)

    def to_hf_dict(self) -> dict[str, Any]:
        return {"rope_type": "ntk", "factor": self.factor, "mixed_b": self.mixed_b}

    def frequencies(
        self, dim: int, *, base: float, seq_len: int | torch.Tensor | None = None, device: _Device = None
    ) -> tuple[torch.Tensor, float]:
        return F.ntk_mixed_frequencies(dim, base=base, factor=self.factor, mixed_b=self.mixed_b, device=device)


@register_scaling
@dataclass(frozen=True, kw_only=True, slots=True)
class TeleChat3YaRNScaling(RopeScaling):
    """TeleChat3's YaRN (``"telechat3-yarn"``): YaRN's frequencies, temperature ``0.07 ln(factor) + 1`` (times
    ``attn_factor``, vLLM's multiplier) instead of ``0.1 ln(factor) + 1``.

    Exported to Hugging Face configs as plain ``"yarn"`` with that ``attention_factor`` (as vLLM's config loader now
    normalises it): the same frequencies and factor, in a form transformers reads.
    """

    rope_type: ClassVar[str] = "telechat3_yarn"
    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attn_factor: float | None = None

    def __post_init__(self) -> None:
        _check_factor(self.factor)
        check_positive_int("original_max_position_embeddings", self.original_max_position_embeddings)
        check_number("beta_slow", self.beta_slow, above=0.0)
        if check_number("beta_fast", self.beta_fast) <= self.beta_slow:
            fail("beta_fast", self.beta_fast, f"a number > beta_slow = {self.beta_slow}")
        if not isinstance(self.truncate, bool):
            fail("truncate", self.truncate, "True or False")
        if self.attn_factor is not None:
            check_number("attn_factor", self.attn_factor, above=0.0)

    @property
    def attention_factor(self) -> float:
        return F.telechat3_attention_factor(self.factor) * (1.0 if self.attn_factor is None else self.attn_factor)

    def as_yarn(self) -> YaRNScaling:
        """The same frequencies and attention factor as a plain ``YaRNScaling``."""
        return YaRNScaling(
            factor=self.factor,
            original_max_position_embeddings=self.original_max_position_embeddings,
            beta_fast=self.beta_fast,
            beta_slow=self.beta_slow,
            truncate=self.truncate,
            attention_factor=self.attention_factor,
        )

    def to_hf_dict(self) -> dict[str, Any]:
        return self.as_yarn().to_dict()

    def frequencies(
        self, dim: int, *, base: float, seq_len: int | torch.Tensor | None = None, device: _Device = None
    ) -> tuple[torch.Tensor, float]:
        return F.telechat3_yarn_frequencies(
            dim,
            base=base,
            factor=self.factor,
            original_max_position_embeddings=self.original_max_position_embeddings,
            beta_fast=self.beta_fast,
            beta_slow=self.beta_slow,
            truncate=self.truncate,
            attn_factor=1.0 if self.attn_factor is None else self.attn_factor,
            device=device,
        )


@register_scaling
@dataclass(frozen=True, kw_only=True, slots=True)
class YaRNLogScaling(RopeScaling):
    """Grok's ``yarn_log``: YaRN's ramp with the two frequencies blended in log space (a pair in the ramp divided by
    ``factor ** (1 - w)``), attention factor 1 (vLLM's ``Grok1ScalingRotaryEmbedding`` leaves mscale out).

    Grok configs carry it as top-level keys (``rope_type``, ``scaling_factor``, ``original_max_position_embeddings``,
    ``extrapolation_factor``, ``beta_fast``, ``beta_slow``), read only by vLLM's Grok model, not in ``rope_scaling``:
    ``grok_rope_scaling`` reads them; ``rotary_config_to_hf`` refuses it rather than write a dict no runtime reads.
    """

    rope_type: ClassVar[str] = "yarn_log"
    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    extrapolation_factor: float = 1.0

    def __post_init__(self) -> None:
        _check_factor(self.factor)
        check_positive_int("original_max_position_embeddings", self.original_max_position_embeddings)
        check_number("beta_slow", self.beta_slow, above=0.0)
        if check_number("beta_fast", self.beta_fast) <= self.beta_slow:
            fail("beta_fast", self.beta_fast, f"a number > beta_slow = {self.beta_slow}")
        check_number("extrapolation_factor", self.extrapolation_factor, minimum=0.0)

    def frequencies(
        self, dim: int, *, base: float, seq_len: int | torch.Tensor | None = None, device: _Device = None
    ) -> tuple[torch.Tensor, float]:
        return F.yarn_log_frequencies(
            dim,
            base=base,
            factor=self.factor,
            original_max_position_embeddings=self.original_max_position_embeddings,
            beta_fast=self.beta_fast,
            beta_slow=self.beta_slow,
            extrapolation_factor=self.extrapolation_factor,
            device=device,
        )


#: Grok's top-level config keys (``get_rope_scaling`` in vLLM's ``grok1.py``) and ``YaRNLogScaling``'s fields.
_GROK_KEYS = {
    "scaling_factor": "factor",
    "original_max_position_embeddings": "original_max_position_embeddings",
    "extrapolation_factor": "extrapolation_factor",
    "beta_fast": "beta_fast",
    "beta_slow": "beta_slow",
}


def grok_rope_scaling(config: Mapping[str, Any] | Any) -> YaRNLogScaling | None:
    """Grok's RoPE scaling read from its config's *top-level* keys, as vLLM's Grok model reads them
    (``get_rope_scaling`` in ``vllm/model_executor/models/grok1.py``, the version that serves Grok 2): ``rope_type``
    names the method (``Grok1ScalingRotaryEmbedding``'s ``extra_method``; posenc has ``"yarn_log"``),
    ``scaling_factor``, ``original_max_position_embeddings``, and ``extrapolation_factor`` (1), ``beta_fast`` (32),
    ``beta_slow`` (1) when absent. ``attn_factor`` is read too: vLLM's tables leave the attention factor out, so a
    value other than 1 has no effect there and none here, and says so in a warning. None for a config without
    ``rope_type`` (plain RoPE). ``config``: a ``config.json`` dict or a config object.

    Raises:
        ValueError: another ``rope_type``, or a missing ``scaling_factor`` / ``original_max_position_embeddings``.
    """
    get = config.get if isinstance(config, Mapping) else (lambda key, default=None: getattr(config, key, default))
    method = get("rope_type")
    if not method:
        return None
    if method != "yarn_log":
        fail("rope_type", method, "'yarn_log', the Grok scaling posenc computes (Grok1ScalingRotaryEmbedding's "
             "extra_method)")
    for key in ("scaling_factor", "original_max_position_embeddings"):
        if get(key) is None:
            fail(key, None, "a value: Grok configs with rope_type 'yarn_log' carry it at the top level")
    attn_factor = get("attn_factor", 1.0)
    if attn_factor is not None and attn_factor != 1.0:
        import warnings

        warnings.warn(
            f"attn_factor={attn_factor} has no effect: vLLM's Grok tables (and posenc's yarn_log) leave the "
            "attention factor out",
            UserWarning,
            stacklevel=2,
        )
    fields: dict[str, Any] = {field: get(key) for key, field in _GROK_KEYS.items() if get(key) is not None}
    return YaRNLogScaling(**fields)


__all__ = [
    "RopeScaling",
    "LinearScaling",
    "NTKScaling",
    "DynamicNTKScaling",
    "YaRNScaling",
    "LongRoPEScaling",
    "Llama3Scaling",
    "ProportionalScaling",
    "NTKAlphaScaling",
    "MixedNTKScaling",
    "TeleChat3YaRNScaling",
    "YaRNLogScaling",
    "grok_rope_scaling",
    "parse_scaling",
]


def check_rotary_keys(scaling: object, *, base: float, partial_rotary_factor: float) -> None:
    """An HF ``rope_parameters`` dict passed as ``scaling`` may carry ``rope_theta`` / ``partial_rotary_factor``;
    they must agree with the explicit arguments, never be silently overridden by them."""
    check_partial_rotary(scaling, partial_rotary_factor)
    if not isinstance(scaling, Mapping):
        return
    for key, name, value in (
        ("rope_theta", "base", base),
        ("partial_rotary_factor", "partial_rotary_factor", partial_rotary_factor),
    ):
        if key in _owned_keys(scaling):
            continue
        if key in scaling and scaling[key] is not None and float(scaling[key]) != float(value):
            fail(
                f"scaling[{key!r}]",
                scaling[key],
                f"the same value as {name}={value!r}: pass {name}={scaling[key]!r}"
                " (or build from the whole HF config with RotaryEmbedding.from_hf)",
            )


def _owned_keys(scaling: Mapping[str, Any]) -> set[str]:
    """The rotary keys (``_ROTARY_KEYS``) that the scaling type of an HF dict reads as its own fields."""
    rope_type = scaling.get("rope_type") or scaling.get("type")
    if rope_type in (None, "default") or rope_type not in available_scalings():
        return set()
    return {f.name for f in dataclasses.fields(scaling_class(rope_type))} & set(_ROTARY_KEYS)


def check_partial_rotary(scaling: object, partial_rotary_factor: float) -> None:
    """p-RoPE picks its rotating pairs itself: the rotary embedding must then rotate the whole head."""
    rope_type = (scaling.get("rope_type") or scaling.get("type")) if isinstance(scaling, Mapping) else None
    proportional = isinstance(scaling, ProportionalScaling) or rope_type == "proportional"
    if proportional and partial_rotary_factor != 1.0:
        fail(
            "partial_rotary_factor",
            partial_rotary_factor,
            "1.0 with rope_type 'proportional' (p-RoPE): its own partial_rotary_factor, in the scaling, picks "
            "the pairs that rotate",
        )


def rotary_dim(head_dim: int, partial_rotary_factor: float = 1.0) -> int:
    """Channels that rotate: ``int(head_dim * partial_rotary_factor)``, which must be even and >= 2."""
    check_positive_int("head_dim", head_dim)
    check_number("partial_rotary_factor", partial_rotary_factor, above=0.0)
    if partial_rotary_factor > 1.0:
        fail("partial_rotary_factor", partial_rotary_factor, "a number in (0, 1]")
    dim = int(head_dim * partial_rotary_factor)
    if dim < 2 or dim % 2:
        fail(
            "rotary dim",
            dim,
            f"an even number >= 2 (int(head_dim={head_dim} * partial_rotary_factor={partial_rotary_factor}))",
        )
    return dim


def rope_frequencies(
    head_dim: int,
    *,
    base: float = 10000.0,
    scaling: RopeScaling | Mapping[str, Any] | None = None,
    partial_rotary_factor: float = 1.0,
    seq_len: int | torch.Tensor | None = None,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, float]:
    """RoPE inverse frequencies and attention factor, with any context-extension scaling.

    Args:
        head_dim: channels per attention head.
        base: the RoPE base (HF ``rope_theta``).
        scaling: None, a ``RopeScaling`` config, or an HF ``rope_scaling`` / ``rope_parameters`` dict.
        partial_rotary_factor: fraction of ``head_dim`` that rotates.
        seq_len: current length, read by ``dynamic`` and ``longrope`` (int or 0-d tensor).

    Returns:
        ``inv_freq`` float32 of shape ``(int(head_dim * partial_rotary_factor) // 2,)`` and the attention factor,
        a multiplier for both cos and sin (Hugging Face's convention).

    Reference implementation: ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS``.
    """
    dim = rotary_dim(head_dim, partial_rotary_factor)
    check_number("base", base, above=1.0)
    if seq_len is not None and not isinstance(seq_len, torch.Tensor):
        check_number("seq_len", seq_len, minimum=0.0)
    check_rotary_keys(scaling, base=base, partial_rotary_factor=partial_rotary_factor)
    scaling = parse_scaling(scaling)
    if scaling is None:
        return F.default_frequencies(dim, base=base, device=device)
    return scaling.frequencies(dim, base=base, seq_len=seq_len, device=device)
