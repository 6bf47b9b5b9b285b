"""Every registered encoding built the same way, with positions of the kind it takes: for registry-wide tests."""

from __future__ import annotations

import torch

import posenc
from posenc.functional.axial_rope import grid_positions

#: One set of model facts for every encoding; ``posenc.build`` drops what an encoding does not use.
MODEL = {"dim": 32, "num_heads": 4, "head_dim": 16, "max_len": 512, "grid_size": (16, 16)}
GRID_SIDE = 16


#: RoPE with every scaling, at an original length (8) that the test sequences (9-24 tokens) cross, so the
#: length-dependent ones (dynamic, longrope) switch regime inside a test. Named ``rope+<rope_type>`` in the sweeps.
_F = MODEL["head_dim"] // 2
SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "ntk": {"rope_type": "ntk", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 8},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
    "longrope": {
        "rope_type": "longrope",
        "short_factor": [1.0 + 0.05 * i for i in range(_F)],
        "long_factor": [1.5 + 0.4 * i for i in range(_F)],
        "original_max_position_embeddings": 8,
        "factor": 4.0,
    },
    "llama3": {
        "rope_type": "llama3",
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8,
    },
    "proportional": {"rope_type": "proportional", "partial_rotary_factor": 0.5},
}
SCALED = [f"rope+{name}" for name in SCALINGS]


def build(name: str, **overrides) -> posenc.Encoding:
    if name.startswith("rope+"):
        overrides = {"scaling": SCALINGS[name.removeprefix("rope+")], **overrides}
        name = "rope"
    encoding = posenc.build(name, **{**MODEL, **overrides})
    _randomize(encoding)
    return encoding


@torch.no_grad()
def _randomize(encoding: torch.nn.Module) -> None:
    """Learned tables start at zeros or tiny values in some inits; make them large enough to matter in a test."""
    for p in encoding.parameters():
        if p.dim() >= 2 and p.abs().max() < 0.5:
            p.normal_(0.0, 1.0)


def positions(encoding: posenc.Encoding, length: int, *, start: int = 0, batch: int | None = None) -> torch.Tensor:
    """Positions ``start .. start + length - 1`` in the form ``encoding`` takes; ``batch`` adds a batch axis."""
    kind = encoding.position_kind
    if kind == "grid":
        n_axes = getattr(getattr(encoding, "config", None), "n_axes", 2)
        pos = grid_positions(*([GRID_SIDE] * n_axes))[start : start + length]  # (length, n_axes)
    elif kind == "mrope":
        t = torch.arange(start, start + length)
        pos = torch.stack([t, t // 3, t % 5])  # (3, length): three position streams
    else:
        pos = torch.arange(start, start + length)
    if batch is None:
        return pos
    if kind == "mrope":
        return torch.stack([pos + 7 * r for r in range(batch)], dim=1)  # (3, B, length)
    return torch.stack([pos + 7 * r for r in range(batch)])  # (B, length, ...): rows differ by a shift


def content(encoding: posenc.Encoding, k: torch.Tensor) -> dict[str, torch.Tensor]:
    """``bias`` keywords beyond the positions: the keys, for encodings whose bias reads them (``needs_keys``: CoPE)."""
    return {"k": k} if encoding.needs_keys else {}


def shard(encoding: posenc.Encoding, pos: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Tokens ``start:stop`` of ``pos`` (the sequence axis depends on the position kind)."""
    if encoding.position_kind == "mrope":
        return pos[..., start:stop]
    if encoding.position_kind == "grid":
        return pos[..., start:stop, :]
    return pos[..., start:stop]
