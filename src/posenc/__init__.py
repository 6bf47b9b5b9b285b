"""posenc: positional encodings for PyTorch transformers, each verified against its reference implementation."""

from posenc.encodings.rotary import RotaryConfig, RotaryEmbedding
from posenc.functional.rope import apply_rotary, default_inv_freq, rope_angles, rope_cos_sin
from posenc.registry import available_scalings, register_scaling
from posenc.scalings import (
    DynamicNTKScaling,
    LinearScaling,
    Llama3Scaling,
    LongRoPEScaling,
    NTKScaling,
    RopeScaling,
    YaRNScaling,
    parse_scaling,
    rope_frequencies,
)

__version__ = "0.1.0"

__all__ = [
    "RotaryConfig",
    "RotaryEmbedding",
    "apply_rotary",
    "default_inv_freq",
    "rope_angles",
    "rope_cos_sin",
    "available_scalings",
    "register_scaling",
    "DynamicNTKScaling",
    "LinearScaling",
    "Llama3Scaling",
    "LongRoPEScaling",
    "NTKScaling",
    "RopeScaling",
    "YaRNScaling",
    "parse_scaling",
    "rope_frequencies",
]
