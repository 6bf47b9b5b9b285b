"""``ViT``: the lab's small Vision Transformer, written once for every 2-D position encoding.

Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words" (arXiv:2010.11929): non-overlapping patches embedded by a
strided convolution, pre-norm transformer blocks, a linear classifier on the class token or on the mean of the
patch tokens. Position information comes only from ``posenc`` encodings: the ``embed`` hook on the patch tokens
(2-D sin-cos, learned 2-D tables) and ``posenc.attention`` for the rest (2-D RoPE, RoPE-Mixed, 2-D ALiBi).
Reference implementation for the layout: timm ``vision_transformer.py`` (``dynamic_img_size``) and naver-ai/rope-vit.

Any resolution that is a multiple of the patch size runs: the grid is ``(W / p, H / p)`` patches and every
encoding reads the patches' integer grid coordinates ``(x, y)``. A learned table trained on another grid is
resized bicubically first (ViT sec. 3.2; ``LearnedPositions2D.resized``), the other encodings need nothing.

RoPE-Mixed has its own learnable frequencies in every block, drawn in block order from one generator, as in
RoPE-ViT; every other encoding is one module shared by all blocks.

With ``pool="cls"`` the class token takes no absolute position (it is prepended after the ``embed`` hook) and
sits at grid coordinate ``(0, 0)`` inside attention: for the rotary encodings that is exactly RoPE-ViT's unrotated
class token (a rotation by angle 0); for 2-D ALiBi it means distances from the top-left patch. ``pool="mean"``
(the default) has no such token.

Shapes:
    images (B, C, H, W) float, H and W multiples of ``patch_size`` -> logits (B, num_classes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import posenc
from posenc._checks import check_choice, check_positive_int, fail
from posenc._config import DictConfig
from posenc.functional.axial_rope import grid_positions
from posenc.lab.common.gpt import check_encoding_config

#: ``posenc vision`` names -> registry names: the study's ``learned`` and ``sinusoidal`` are the 2-D variants.
ALIASES = {"learned": "learned_2d", "sinusoidal": "sinusoidal_2d"}
POOLS = ("mean", "cls")
BACKENDS = ("auto", "eager", "sdpa", "flex")


def registry_name(name: str) -> str:
    """The ``posenc.available()`` name behind a ``posenc vision`` encoding name (``learned`` -> ``learned_2d``)."""
    return ALIASES.get(name, name)


@dataclass(frozen=True, kw_only=True)
class ViTConfig(DictConfig):
    """Architecture of a lab ``ViT``; ``to_dict``/``from_dict`` round-trip through JSON (``config.json``).

    Args:
        image_size: the training resolution in pixels (square); sizes learned tables. Other resolutions run too.
        patch_size: pixels per patch side; ``image_size`` must be a multiple.
        channels: input channels (1 for grey images).
        num_classes: classifier outputs.
        dim: model width, a multiple of ``n_heads``; head width ``dim // n_heads`` a multiple of 4 (2-D RoPE).
        n_layers: transformer blocks.
        n_heads: attention heads.
        encoding: a ``posenc vision`` name (``learned``, ``sinusoidal``) or any registered 2-D (``"grid"``)
            encoding, or ``nope``.
        encoding_config: extra keyword arguments for ``posenc.build`` (JSON values).
        pool: ``"mean"`` of the patch tokens or a ``"cls"`` token.
        mlp_ratio: MLP hidden width is ``mlp_ratio * dim``.
        backend: ``posenc.attention`` backend.
    """

    image_size: int
    patch_size: int = 4
    channels: int = 1
    num_classes: int = 10
    dim: int = 64
    n_layers: int = 4
    n_heads: int = 4
    encoding: str = "rope_axial"
    encoding_config: dict[str, Any] = field(default_factory=dict)
    pool: str = "mean"
    mlp_ratio: int = 2
    backend: str = "auto"

    def __post_init__(self) -> None:
        for name in ("image_size", "patch_size", "channels", "num_classes", "dim", "n_layers", "n_heads", "mlp_ratio"):
            check_positive_int(name, getattr(self, name))
        if self.image_size % self.patch_size:
            fail("image_size", self.image_size, f"a multiple of patch_size={self.patch_size}")
        if self.num_classes < 2:
            fail("num_classes", self.num_classes, "at least 2 classes")
        if self.dim % self.n_heads or (self.dim // self.n_heads) % 4:
            fail("dim", self.dim, f"a multiple of 4 * n_heads = {4 * self.n_heads} (head width a multiple of 4)")
        check_choice("encoding", registry_name(self.encoding), posenc.available())
        check_choice("pool", self.pool, POOLS)
        check_choice("backend", self.backend, BACKENDS)
        check_encoding_config(self.encoding_config)

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def grid(self) -> int:
        """Patches per side at the training resolution."""
        return self.image_size // self.patch_size

    @property
    def tokens(self) -> int:
        """Tokens per image at the training resolution (patches, plus the class token)."""
        return self.grid**2 + (self.pool == "cls")

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["encoding_config"] = json.loads(json.dumps(dict(self.encoding_config)))  # a deep, JSON-only copy
        return out


def build_encoding(config: ViTConfig, generator: torch.Generator | None = None) -> posenc.Encoding:
    """The encoding ``config`` names, sized for the model's training grid; it must take 2-D positions or none."""
    name = registry_name(config.encoding)
    extra = dict(config.encoding_config)
    if generator is not None and posenc.registry.takes(name, "generator"):
        extra["generator"] = generator  # RoPE-Mixed: each block's random frequencies, from the model's seed
    encoding = posenc.build(
        name,
        dim=config.dim,
        num_heads=config.n_heads,
        head_dim=config.head_dim,
        grid_size=(config.grid, config.grid),
        **extra,
    )
    if encoding.position_kind != "grid" and name != "nope":
        fail("encoding", config.encoding, "a 2-D encoding (position_kind 'grid') or 'nope'")
    return encoding


class Attention(nn.Module):
    """Bidirectional self-attention through ``posenc.attention``."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.n_heads, self.head_dim, self.backend = config.n_heads, config.head_dim, config.backend
        self.qkv = nn.Linear(config.dim, 3 * config.dim)
        self.proj = nn.Linear(config.dim, config.dim)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, encoding: posenc.Encoding) -> torch.Tensor:
        """``(B, N, dim) -> (B, N, dim)``; ``positions`` ``(N, 2)`` grid coordinates (unused by ``nope``)."""
        b, n, _ = x.shape
        positions = positions if encoding.position_kind == "grid" else None
        q, k, v = self.qkv(x).view(b, n, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # 3 x (B, H, N, D)
        y = posenc.attention(q, k, v, encoding=encoding, q_positions=positions, causal=False, backend=self.backend)
        return self.proj(y.transpose(1, 2).reshape(b, n, -1))  # (B, H, N, D) -> (B, N, dim)


class Block(nn.Module):
    """Pre-norm block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.dim)
        self.attn = Attention(config)
        self.ln2 = nn.LayerNorm(config.dim)
        hidden = config.mlp_ratio * config.dim
        self.mlp = nn.Sequential(nn.Linear(config.dim, hidden), nn.GELU(), nn.Linear(hidden, config.dim))

    def forward(self, x: torch.Tensor, positions: torch.Tensor, encoding: posenc.Encoding) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), positions, encoding)
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    """Image classifier whose only position information is a ``posenc`` encoding.

    Args:
        config: the architecture.
        seed: initialisation seed: the same config and seed give the same weights (the global RNG is untouched).

    Shapes:
        images (B, C, H, W), H and W multiples of ``patch_size`` -> logits (B, num_classes).
    """

    def __init__(self, config: ViTConfig, *, seed: int = 0) -> None:
        super().__init__()
        if not isinstance(config, ViTConfig):
            fail("config", type(config).__name__, "a posenc.lab.vision.vit.ViTConfig")
        self.config = config
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            generator = torch.Generator().manual_seed(seed)  # RoPE-Mixed: the blocks' frequencies, in order
            self.patch = nn.Conv2d(config.channels, config.dim, config.patch_size, stride=config.patch_size)
            # One encoding for all blocks, or one per block where its parameters are per layer
            # (Encoding.per_layer: RoPE-Mixed's frequencies), built in block order from the generator.
            first = build_encoding(config, generator)
            rest = [build_encoding(config, generator) for _ in range(config.n_layers - 1)] if first.per_layer else []
            self.encodings = nn.ModuleList([first, *rest])
            self.cls = nn.Parameter(torch.zeros(1, 1, config.dim)) if config.pool == "cls" else None
            self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
            self.norm = nn.LayerNorm(config.dim)
            self.head = nn.Linear(config.dim, config.num_classes)
            self._init_weights()

    @torch.no_grad()
    def _init_weights(self) -> None:
        """timm's ViT init: truncated-normal(0.02) linear weights, zero biases, class token N(0, 1e-6)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)
        if self.cls is not None:
            nn.init.normal_(self.cls, std=1e-6)

    @property
    def encoding(self) -> posenc.Encoding:
        """The encoding of the first block (the only one unless it is per layer); the progress bar names it."""
        return self.encodings[0]

    def input_encoding(self, grid: tuple[int, int]) -> posenc.Encoding:
        """The encoding whose ``embed`` hook runs on a ``(W, H)`` patch grid: a learned table is resized to it."""
        encoding = self.encodings[0]
        table_grid = getattr(getattr(encoding, "config", None), "grid_size", None)
        if table_grid is not None and tuple(table_grid) != tuple(grid):
            encoding = encoding.resized(grid)  # bicubic, as ViT fine-tuning at a new resolution (sec. 3.2)
        return encoding

    def forward(self, images: torch.Tensor, *, coordinate_scale: float = 1.0) -> torch.Tensor:
        """Class logits ``(B, num_classes)`` for ``images`` ``(B, C, H, W)``.

        ``coordinate_scale`` multiplies the patch coordinates every coordinate-based encoding reads (2-D RoPE,
        RoPE-Mixed, 2-D sin-cos, 2-D ALiBi): ``train_grid / grid`` squeezes a larger grid into the trained range,
        Position Interpolation (Chen et al. 2023) carried to images. Learned tables ignore it (they are resized).
        """
        c, p = self.config.channels, self.config.patch_size
        if not isinstance(images, torch.Tensor) or images.dim() != 4 or images.shape[1] != c:
            fail("images.shape", getattr(images, "shape", type(images).__name__), f"(B, {c}, H, W)")
        if not images.is_floating_point():
            fail("images.dtype", images.dtype, "a floating point dtype (pixels scaled to floats)")
        h, w = images.shape[-2:]
        if h % p or w % p:
            fail("images.shape", tuple(images.shape), f"H and W multiples of patch_size={p}")
        x = self.patch(images).flatten(2).transpose(1, 2)  # (B, dim, H/p, W/p) -> (B, N, dim), row-major patches
        grid = (w // p, h // p)
        positions = grid_positions(*grid, device=x.device)  # (N, 2) columns (x, y), token t = y * W/p + x
        encoding = self.input_encoding(grid)
        if coordinate_scale != 1.0 and not hasattr(getattr(encoding, "config", None), "grid_size"):
            positions = positions * coordinate_scale  # (N, 2), fractional coordinates
        x = encoding.embed(x, positions)  # absolute encodings add here; others pass through
        if self.cls is not None:
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)  # (B, 1 + N, dim)
            positions = torch.cat([positions.new_zeros(1, 2), positions])  # (1 + N, 2): the class token at (0, 0)
        for i, block in enumerate(self.blocks):
            x = block(x, positions, self.encodings[i if len(self.encodings) > 1 else 0])
        x = self.norm(x)
        pooled = x[:, 0] if self.cls is not None else x.mean(dim=1)  # (B, dim)
        return self.head(pooled)


def vision_encodings() -> list[str]:
    """Names ``ViT`` can use: ``nope`` and every registered encoding of 2-D grid positions."""
    names = []
    for name in posenc.available():
        try:
            kind = posenc.build(name, dim=64, num_heads=4, head_dim=16, grid_size=(4, 4)).position_kind
        except ValueError:
            continue
        if kind == "grid" or name == "nope":
            names.append(name)
    return names


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
