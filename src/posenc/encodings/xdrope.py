"""``XDRoPE``: HunYuan-VL's XD-RoPE, M-RoPE over N position streams (four: position, width, height, image).

Model: Tencent HunYuan-VL / HunyuanOCR (2025-2026), ``rope_scaling = {"type": "xdrope", "alpha": ...,
"xdrope_section": [16, 16, 16, 16]}`` at ``head_dim = 128``.
Reference implementations: vLLM ``XDRotaryEmbedding`` (``vllm/model_executor/layers/rotary_embedding/xdrope.py``)
and Tencent's ``HunYuanVLRotaryEmbedding`` + ``apply_rotary_pos_emb_xdrope`` (``Tencent-Hunyuan/HunyuanOCR``,
``train/modeling_hunyuan_vl.py``): stream ``j`` takes the next ``xdrope_section[j]`` frequencies of both halves of
each head, at NTK-by-alpha's base ``base * alpha ** (D / (D - 2))``. It is ``MRoPE``'s contiguous layout with N
streams instead of three, so it shares ``MRoPE``'s code (``MultiStreamRoPE``) and differs only in its sections and
frequencies. transformers 5.24's ``hunyuan_vl`` lays the sections over the whole duplicated table instead (each
section doubled, not the list), which agrees with this only where the streams are equal (text tokens); see
``tests/encodings/test_xdrope.py``.

Shapes:
    q (B, H, S, D), k (B, Hkv, T, D); positions (N, S) or (N, B, S), N = len(xdrope_section), rows in the model's
    order (HunYuan-VL: [position, width, height, image]; Hugging Face ``position_ids``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from posenc._checks import check_choice, check_number, check_positive_int, fail
from posenc._config import DictConfig
from posenc.encodings._multistream import MultiStreamRoPE
from posenc.encodings.multistream_hf import config_base, config_head_dim, rope_dict, text_config_dict
from posenc.functional.mrope import contiguous_streams
from posenc.functional.rope import LAYOUTS
from posenc.functional.rope_scaling import ntk_alpha_frequencies
from posenc.registry import register

#: HunYuan-VL's stream names for its four- and three-stream configs (``HunYuanVLTextConfig``'s docstring).
STREAM_NAMES = {4: ("position", "width", "height", "image"), 3: ("width", "height", "image")}


@dataclass(frozen=True, kw_only=True, slots=True)
class XDRoPEConfig(DictConfig):
    """Everything that defines an XD-RoPE: validated on construction, round-trips through ``to_dict``/``from_dict``.

    ``xdrope_section`` is stored as a tuple and written out as a list. None takes HunyuanOCR's proportions: four
    equal streams (``(16, 16, 16, 16)`` at ``head_dim=128``), the remainder of ``head_dim // 2`` to the first.
    """

    head_dim: int
    base: float = 10000.0
    xdrope_section: tuple[int, ...] | None = None
    alpha: float = 1.0
    layout: str = "half"

    def __post_init__(self) -> None:
        check_positive_int("head_dim", self.head_dim)
        if self.head_dim % 2 or self.head_dim < 4:
            fail("head_dim", self.head_dim, "an even number >= 4 (XD-RoPE rotates channel pairs at an NTK base)")
        check_number("base", self.base, above=1.0)
        check_number("alpha", self.alpha, minimum=1.0)
        check_choice("layout", self.layout, LAYOUTS)
        num_freqs = self.head_dim // 2
        section = self.xdrope_section
        if section is None:
            section = (num_freqs - 3 * (num_freqs // 4),) + (num_freqs // 4,) * 3
        ok = isinstance(section, Sequence) and not isinstance(section, str) and len(section) >= 1
        ok = ok and all(not isinstance(s, bool) and isinstance(s, int) and s >= 0 for s in section)
        if not ok or sum(cast("Sequence[int]", section)) != num_freqs:
            fail(
                "xdrope_section",
                self.xdrope_section,
                f"non-negative integers, one per position stream, summing to head_dim // 2 = {num_freqs}",
            )
        object.__setattr__(self, "xdrope_section", tuple(section))


@register("xdrope")
class XDRoPE(MultiStreamRoPE):
    """XD-RoPE (HunYuan-VL): frequency ``f`` of section ``j`` rotates by position stream ``j``, at an NTK-alpha base.

    With N equal streams (text tokens) it is exactly ``RotaryEmbedding(head_dim, base=base,
    scaling={"rope_type": "ntk_alpha", "alpha": alpha})``; with three streams it is ``MRoPE``'s contiguous layout.

    Args:
        head_dim: channels per head ``D`` (even); all of them rotate.
        base: RoPE base (HF ``rope_theta``).
        xdrope_section: frequencies per stream, in the positions' row order, summing to ``head_dim // 2`` (HF
            ``rope_scaling["xdrope_section"]``, which transformers 5 renames ``mrope_section``; HunyuanOCR:
            ``(16, 16, 16, 16)``). None: four equal streams.
        alpha: NTK-by-alpha's factor (HF ``rope_scaling["alpha"]``): the base becomes ``base * alpha ** (D/(D-2))``.
        layout: ``"half"`` (HunYuan) pairs channel i with i + F; ``"interleaved"`` pairs 2i with 2i + 1.

    Shapes:
        q (B, H, S, D), k (B, Hkv, T, D), positions (N, S) or (N, B, S) -> q, k of the same shapes and dtypes.
    """

    config_class = XDRoPEConfig

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        xdrope_section: Sequence[int] | None = None,
        alpha: float = 1.0,
        layout: str = "half",
    ) -> None:
        super().__init__()
        self.config = XDRoPEConfig(
            head_dim=head_dim,
            base=base,
            xdrope_section=cast("tuple[int, ...] | None", xdrope_section),  # a tuple after __post_init__
            alpha=alpha,
            layout=layout,
        )
        section = cast("tuple[int, ...]", self.config.xdrope_section)
        self.stream_names = STREAM_NAMES.get(len(section), tuple(f"stream {j}" for j in range(len(section))))
        self.streams = tuple(contiguous_streams(section))
        self.register_buffer("inv_freq", self.build_inv_freq(), persistent=False)

    def build_inv_freq(self) -> torch.Tensor:
        c = self.config
        return ntk_alpha_frequencies(c.head_dim, base=c.base, alpha=c.alpha)[0]

    @classmethod
    def from_hf(cls, config: Any) -> XDRoPE:
        """Build from a HunYuan-VL config (``PretrainedConfig`` or dict); see ``posenc.hf.xdrope_config_from_hf``."""
        return cls.from_config(xdrope_config_from_hf(config))

    def to_hf(self, *, legacy: bool = False) -> dict[str, Any]:
        """The HunYuan-VL config keys for this XD-RoPE; see ``posenc.hf.xdrope_config_to_hf``."""
        return xdrope_config_to_hf(self.config, legacy=legacy)

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"head_dim={c.head_dim}, base={c.base}, xdrope_section={c.xdrope_section}, alpha={c.alpha}, "
            f"layout={c.layout!r}"
        )


def xdrope_config_from_hf(config: Any) -> XDRoPEConfig:
    """An ``XDRoPEConfig`` equal to the XD-RoPE HunYuan-VL runs for ``config``.

    Reads ``rope_scaling = {"type": "xdrope", "alpha", "xdrope_section"}`` (released HunyuanOCR) and transformers 5's
    rewrite ``rope_parameters = {"rope_type": "dynamic", "alpha", "mrope_section"}``; a top-level ``xdrope_section``
    (vLLM also looks there); sections given as fractions of the half head (Tencent's code converts
    ``[0.25] * 4`` to ``int(r * head_dim / 2)``).

    Args:
        config: a HunYuan-VL ``PretrainedConfig`` or ``config.json`` dict (or its ``text_config``).
    """
    cfg = text_config_dict(config)
    params = rope_dict(cfg)
    head_dim = config_head_dim(cfg, "head_dim", "attention_head_dim")
    given = {k: params[k] for k in ("xdrope_section", "mrope_section") if params.get(k) is not None}
    if cfg.get("xdrope_section") is not None:
        given.setdefault("xdrope_section", cfg["xdrope_section"])
    if not given:
        fail("config", "{...}", "rope_scaling['xdrope_section'] (or transformers 5's rope_parameters['mrope_section'])")
    sections = [[float(v) for v in s] for s in given.values()]
    if any(s != sections[0] for s in sections):
        fail("xdrope_section", list(given.values()), "one section list (xdrope_section and mrope_section differ)")
    section = sections[0]
    if abs(sum(section) - 1.0) < 1e-9 and sum(section) * 2 != head_dim:  # fractions of the half head
        section = [int(v * head_dim / 2) for v in section]
    if any(v != int(v) for v in section):
        fail("xdrope_section", list(given.values())[0], f"integers summing to head_dim // 2 = {head_dim // 2}")
    rope_type = params["rope_type"]
    alpha = params.get("alpha")
    if rope_type not in ("xdrope", "dynamic", "default") or (rope_type == "dynamic" and not alpha):
        fail(
            "rope_type",
            rope_type,
            "'xdrope' or 'dynamic' with an 'alpha' (NTK-by-alpha), or 'default': the RoPE types HunYuan-VL runs "
            "XD-RoPE with",
        )
    return XDRoPEConfig(
        head_dim=head_dim,
        base=config_base(cfg, params),
        xdrope_section=tuple(int(v) for v in section),
        alpha=float(alpha) if alpha and rope_type != "default" else 1.0,
        layout="half",
    )


def xdrope_config_to_hf(config: XDRoPEConfig, *, legacy: bool = False) -> dict[str, Any]:
    """The HunYuan-VL text-config keys for this XD-RoPE: ``head_dim`` and ``rope_parameters`` (transformers >= 5),
    or with ``legacy=True`` the released form, ``rope_theta`` and ``rope_scaling`` with ``"type": "xdrope"``.

    Both carry ``{"rope_type"/"type": "xdrope", "alpha", "factor": 1.0, "xdrope_section"}``: vLLM's ``get_rope``
    builds ``XDRotaryEmbedding`` from ``rope_type "xdrope"``, ``alpha`` and ``xdrope_section``; transformers rewrites it
    to NTK-by-alpha with ``mrope_section`` (its ``dynamic`` type requires the ``factor`` key).
    """
    if config.layout != "half":
        fail("layout", config.layout, "'half' for Hugging Face (HunYuan-VL pairs channel i with i + head_dim / 2)")
    rope: dict[str, Any] = {
        "alpha": config.alpha,
        "factor": 1.0,
        "xdrope_section": list(config.xdrope_section or ()),
    }
    if legacy:
        return {"head_dim": config.head_dim, "rope_theta": config.base, "rope_scaling": {"type": "xdrope", **rope}}
    return {"head_dim": config.head_dim, "rope_parameters": {"rope_type": "xdrope", "rope_theta": config.base, **rope}}
