"""``RoPE3D``: ERNIE-4.5-VL's and Bailing's 3-D RoPE, height and width alternating over the high frequencies, time on
the low ones.

Model: Baidu ERNIE-4.5-VL (2025; ``rope_3d``, ``freq_allocation = 20`` = the temporal frequencies, HF
``rope_parameters["mrope_section"] = [22, 22, 20]`` as ``[height, width, temporal]`` at ``head_dim = 128``). Bailing's
M-RoPE (inclusionAI Ling / Ming, ``bailing_moe_v3``: ``mrope_section = [t, h, w]``, e.g. ``[8, 12, 12]`` over MLA's
64 rotary channels, base 6e6) is the same rotation with the sections written in another order: SGLang runs it with
ERNIE's kernel after reordering them, and posenc with this class.
Reference implementations: Hugging Face transformers ``Ernie4_5_VLMoeTextRotaryEmbedding`` +
``apply_rotary_pos_emb`` (``transformers/models/ernie4_5_vl_moe/modeling_ernie4_5_vl_moe.py``); vLLM
``Ernie4_5_VLRotaryEmbedding`` (``vllm/model_executor/layers/rotary_embedding/ernie45_vl_rope.py``) and
``BailingMRotaryEmbedding`` (``bailing_mrope.py``), SGLang's ``BailingMRotaryEmbedding``.

Shapes:
    q (B, H, S, D), k (B, Hkv, T, D); positions (3, S) or (3, B, S), rows [temporal, height, width] (both models'
    ``position_ids``; Bailing centres height and width on the image, so they may be negative).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from posenc._checks import check_choice, check_number, check_positive_int, fail
from posenc._config import DictConfig
from posenc.encodings._multistream import MultiStreamRoPE
from posenc.encodings.multistream_hf import config_base, config_head_dim, rope_dict, text_config_dict
from posenc.encodings.rotary_hf import as_dict
from posenc.functional.mrope import STREAMS, alternating_spatial_streams
from posenc.functional.rope import LAYOUTS, default_inv_freq
from posenc.registry import register


@dataclass(frozen=True, kw_only=True, slots=True)
class RoPE3DConfig(DictConfig):
    """Everything that defines a 3-D RoPE: validated on construction, round-trips through ``to_dict``/``from_dict``.

    ``mrope_section`` is ``(temporal, height, width)`` -- ``MRoPE``'s and Bailing's order; ERNIE's HF config writes
    ``[height, width, temporal]`` -- with ``height == width``, stored as a tuple. None takes ERNIE-4.5-VL's
    proportions, ``11/32`` of the frequencies for each spatial axis (``(20, 22, 22)`` at ``head_dim=128``).
    """

    head_dim: int
    base: float = 10000.0
    mrope_section: tuple[int, int, int] | None = None
    layout: str = "interleaved"

    def __post_init__(self) -> None:
        check_positive_int("head_dim", self.head_dim)
        if self.head_dim % 2:
            fail("head_dim", self.head_dim, "an even number (3-D RoPE rotates channel pairs)")
        check_number("base", self.base, above=1.0)
        check_choice("layout", self.layout, LAYOUTS)
        num_freqs = self.head_dim // 2
        section = self.mrope_section
        if section is None:
            spatial = 11 * num_freqs // 32
            section = (num_freqs - 2 * spatial, spatial, spatial)
        ok = isinstance(section, Sequence) and not isinstance(section, str) and len(section) == 3
        ok = ok and all(not isinstance(s, bool) and isinstance(s, int) and s >= 0 for s in section)
        if not ok or sum(cast("Sequence[int]", section)) != num_freqs or section[1] != section[2]:
            fail(
                "mrope_section",
                self.mrope_section,
                f"(temporal, height, width): non-negative integers summing to head_dim // 2 = {num_freqs}, with "
                "height == width (the two alternate over the first 2 * height frequencies)",
            )
        object.__setattr__(self, "mrope_section", tuple(section))


@register("rope_3d")
class RoPE3D(MultiStreamRoPE):
    """3-D RoPE (ERNIE-4.5-VL; Bailing's M-RoPE): ``[h w h w ... h w t ... t]`` over the frequencies, streams
    [t, h, w].

    Frequency ``f < 2 s`` (``s`` = the height section = the width section) turns by the height position when ``f`` is
    even and by the width position when odd; the last ``t`` frequencies by the temporal position. Both models pair
    channels ``(2i, 2i + 1)`` (``layout="interleaved"``). It shares ``MRoPE``'s code (``MultiStreamRoPE``) with its own
    stream layout (``posenc.functional.mrope.alternating_spatial_streams``).

    With three equal streams (text tokens) it is exactly ``RotaryEmbedding(head_dim, base=base, layout=layout)``.

    Args:
        head_dim: channels per head ``D`` (even); all of them rotate (Bailing: MLA's ``qk_rope_head_dim``).
        base: RoPE base (HF ``rope_theta``; ERNIE-4.5-VL 500000, Bailing 6e6).
        mrope_section: frequencies per stream ``(temporal, height, width)``, ``height == width``, summing to
            ``head_dim // 2``. None: ERNIE-4.5-VL's proportions.
        layout: ``"interleaved"`` (ERNIE, Bailing) pairs channel 2i with 2i + 1; ``"half"`` pairs i with i + F.

    Shapes:
        q (B, H, S, D), k (B, Hkv, T, D), positions (3, S) or (3, B, S) -> q, k of the same shapes and dtypes.
    """

    config_class = RoPE3DConfig

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        mrope_section: Sequence[int] | None = None,
        layout: str = "interleaved",
    ) -> None:
        super().__init__()
        self.config = RoPE3DConfig(
            head_dim=head_dim,
            base=base,
            mrope_section=cast("tuple[int, int, int] | None", mrope_section),  # a tuple after __post_init__
            layout=layout,
        )
        temporal, spatial, _ = cast("tuple[int, int, int]", self.config.mrope_section)
        self.stream_names = STREAMS
        self.streams = tuple(alternating_spatial_streams(temporal, spatial))
        self.register_buffer("inv_freq", self.build_inv_freq(), persistent=False)

    def build_inv_freq(self) -> torch.Tensor:
        return default_inv_freq(self.config.head_dim, base=self.config.base)

    @classmethod
    def from_hf(cls, config: Any, *, convention: str | None = None) -> RoPE3D:
        """Build from an ERNIE-4.5-VL or Bailing config; see ``posenc.hf.rope_3d_config_from_hf``."""
        return cls.from_config(rope_3d_config_from_hf(config, convention=convention))

    def to_hf(self, *, convention: str) -> dict[str, Any]:
        """The ERNIE-4.5-VL or Bailing config keys for it; see ``posenc.hf.rope_3d_config_to_hf``."""
        return rope_3d_config_to_hf(self.config, convention=convention)

    def extra_repr(self) -> str:
        c = self.config
        return f"head_dim={c.head_dim}, base={c.base}, mrope_section={c.mrope_section}, layout={c.layout!r}"


#: Whose config a 3-D RoPE is read from and written to: ERNIE-4.5-VL's ``mrope_section`` is ``[h, w, t]``,
#: Bailing's (Ling / Ming ``bailing_moe_v3``) ``[t, h, w]`` over MLA's ``qk_rope_head_dim`` rotary channels.
CONVENTIONS = ("ernie", "bailing")


def _convention(cfg: Mapping[str, Any], convention: str | None, whole: Mapping[str, Any]) -> str:
    if convention is None:
        model_type = str(cfg.get("model_type") or whole.get("model_type") or "")
        convention = next((c for c in CONVENTIONS if c in model_type), None)
        if convention is None:
            fail("convention", None, f"one of {list(CONVENTIONS)} (the config's model_type {model_type!r} names none)")
    if convention not in CONVENTIONS:
        fail("convention", convention, f"one of {list(CONVENTIONS)}")
    return convention


def rope_3d_config_from_hf(config: Any, *, convention: str | None = None) -> RoPE3DConfig:
    """A ``RoPE3DConfig`` equal to the 3-D RoPE the model runs for ``config``.

    ERNIE-4.5-VL (``convention="ernie"``): ``rope_parameters["mrope_section"] = [h, w, t]`` (transformers), else
    Baidu's ``freq_allocation = t`` with ``h = w = (head_dim // 2 - t) // 2`` (vLLM, SGLang), else transformers'
    default ``[22, 22, 20]``; ``rope_type`` must be ``"default"`` (transformers refuses any other).

    Bailing (``convention="bailing"``): as vLLM's ``bailing_moe_v3`` reads it (``_build_rope_parameters``):
    ``rope_parameters`` updated by ``rope_scaling``, ``mrope_section = [t, h, w]``, the rotary width
    ``qk_rope_head_dim`` (``partial_rotary_factor`` dropped, as vLLM drops it); ``rope_type`` must be ``"default"``
    (vLLM's Bailing M-RoPE refuses any other).

    Args:
        config: a ``PretrainedConfig`` or ``config.json`` dict (or its ``text_config``).
        convention: ``"ernie"`` or ``"bailing"``; None reads it from ``model_type``.
    """
    whole = as_dict(config)
    cfg = text_config_dict(config)
    if _convention(cfg, convention, whole) == "bailing":
        return _bailing_from_hf(cfg)
    params = rope_dict(cfg)
    if params["rope_type"] != "default":
        fail("rope_type", params["rope_type"], "'default': the only RoPE type ERNIE-4.5-VL's 3-D RoPE runs with")
    head_dim = config_head_dim(cfg, "head_dim")
    if params.get("mrope_section") is not None:
        h, w, t = (int(v) for v in params["mrope_section"])
    elif cfg.get("freq_allocation") is not None:
        t = int(cfg["freq_allocation"])
        h = w = (head_dim // 2 - t) // 2
    else:
        h, w, t = 22, 22, 20
    return RoPE3DConfig(head_dim=head_dim, base=config_base(cfg, params), mrope_section=(t, h, w), layout="interleaved")


def _bailing_from_hf(cfg: Mapping[str, Any]) -> RoPE3DConfig:
    params = dict(cfg.get("rope_parameters") or {})
    params.update(cfg.get("rope_scaling") or {})
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    if params.get("rope_type", "default") != "default":
        fail("rope_type", params["rope_type"], "'default': the only RoPE type vLLM runs Bailing's M-RoPE with")
    if params.get("mrope_section") is None:
        fail("config", "{...}", "rope_parameters['mrope_section'] = [t, h, w] (Bailing's M-RoPE)")
    t, h, w = (int(v) for v in params["mrope_section"])
    head_dim = config_head_dim(cfg, "qk_rope_head_dim", "head_dim")
    return RoPE3DConfig(head_dim=head_dim, base=config_base(cfg, params), mrope_section=(t, h, w), layout="interleaved")


def rope_3d_config_to_hf(config: RoPE3DConfig, *, convention: str) -> dict[str, Any]:
    """The text-config keys for this 3-D RoPE, ``rope_parameters = {"rope_type": "default", "rope_theta",
    "mrope_section"}`` and the rotary width: for ERNIE-4.5-VL ``head_dim`` and ``[h, w, t]`` (what transformers and
    vLLM's ERNIE read), for Bailing ``qk_rope_head_dim`` and ``[t, h, w]`` (what vLLM's ``bailing_moe_v3`` and
    SGLang read)."""
    if convention not in CONVENTIONS:
        fail("convention", convention, f"one of {list(CONVENTIONS)}")
    if config.layout != "interleaved":
        fail("layout", config.layout, f"'interleaved': {convention} pairs channels (2i, 2i + 1)")
    t, h, w = config.mrope_section or (0, 0, 0)
    if convention == "bailing":
        rope = {"rope_type": "default", "rope_theta": config.base, "mrope_section": [t, h, w]}
        return {"qk_rope_head_dim": config.head_dim, "rope_parameters": rope}
    rope = {"rope_type": "default", "rope_theta": config.base, "mrope_section": [h, w, t]}
    return {"head_dim": config.head_dim, "rope_parameters": rope}
