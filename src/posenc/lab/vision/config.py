"""The settings of ``posenc vision``: ``VisionConfig`` (stored as ``OUT/vision.json``, checked on ``--resume``) and
the default encodings and evaluation resolutions.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from posenc._checks import check_choice, check_positive_int, fail
from posenc.lab.vision.vit import POOLS, registry_name, vision_encodings

DEFAULT_ENCODINGS = ("learned", "sinusoidal", "nope", "rope_axial", "rope_mixed", "alibi_2d")

#: Evaluation resolutions as multiples of the training one (rounded to whole patches): one lower, 1x, 1.5x, 2x.
EVAL_MULTIPLES = (0.75, 1.0, 1.5, 2.0)


@dataclass(frozen=True, kw_only=True)
class VisionConfig:
    """Everything that defines a vision study; stored as ``OUT/vision.json`` and checked on ``--resume``."""

    encodings: tuple[str, ...] = DEFAULT_ENCODINGS
    train_res: int = 16
    eval_res: tuple[int, ...] | None = None  # None: EVAL_MULTIPLES of train_res
    patch_size: int = 4
    steps: int = 2000
    batch_size: int = 64
    dim: int = 64
    n_layers: int = 4
    n_heads: int = 4
    lr: float = 2e-3
    weight_decay: float = 0.05
    crop_scale: float = 0.35  # random-resized-crop area range (crop_scale, 1); 1 turns the augmentation off
    pool: str = "mean"
    seed: int = 0
    data: str | None = None
    eval_images: int | None = None  # None: the whole test split
    interpolate: bool = True  # also test coordinate encodings with coordinates interpolated into the trained range
    device: str = "cpu"

    def __post_init__(self) -> None:
        object.__setattr__(self, "encodings", tuple(self.encodings))
        if self.eval_res is not None:
            object.__setattr__(self, "eval_res", tuple(self.eval_res))
        for name in ("train_res", "patch_size", "steps", "batch_size", "dim", "n_layers", "n_heads"):
            check_positive_int(name, getattr(self, name))
        if self.train_res % self.patch_size:
            fail("train_res", self.train_res, f"a multiple of patch_size={self.patch_size}")
        if self.dim % self.n_heads or (self.dim // self.n_heads) % 4:
            fail("dim", self.dim, f"a multiple of 4 * n_heads = {4 * self.n_heads} (2-D RoPE needs head width % 4)")
        check_choice("pool", self.pool, POOLS)
        if not self.encodings:
            fail("encodings", self.encodings, f"at least one of {list(DEFAULT_ENCODINGS)}")
        allowed = vision_encodings()
        for name in self.encodings:
            if registry_name(name) not in allowed:
                fail("encodings", name, f"2-D encodings: {sorted({*DEFAULT_ENCODINGS, *allowed})}")
        if len(set(self.encodings)) != len(self.encodings):
            fail("encodings", self.encodings, "each encoding once")
        for res in self.resolutions:
            check_positive_int("eval_res", res)
            if res % self.patch_size:
                fail("eval_res", res, f"multiples of patch_size={self.patch_size} (the patch size stays fixed)")
        if self.eval_images is not None:
            check_positive_int("eval_images", self.eval_images)
        if (
            isinstance(self.crop_scale, bool)
            or not isinstance(self.crop_scale, (int, float))
            or not (0 < self.crop_scale <= 1)
        ):
            fail("crop_scale", self.crop_scale, "a fraction of the image area in (0, 1]; 1 turns cropping off")
        if not isinstance(self.lr, (int, float)) or not self.lr > 0:
            fail("lr", self.lr, "a positive learning rate")

    @property
    def resolutions(self) -> tuple[int, ...]:
        if self.eval_res is not None:
            return self.eval_res
        p = self.patch_size
        return tuple(sorted({max(p, round(m * self.train_res / p) * p) for m in EVAL_MULTIPLES}))

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))
