"""posenc: positional encodings for PyTorch transformers, each verified against its reference implementation."""

from posenc import functional, hf
from posenc.attention import attention
from posenc.encodings._base import Encoding
from posenc.encodings.axial_rope import AxialRoPE, AxialRoPEConfig
from posenc.encodings.mrope import MRoPE, MRoPEConfig
from posenc.encodings.nope import NoPE
from posenc.encodings.rope_mixed import RoPEMixed, RoPEMixedConfig
from posenc.encodings.rotary import RotaryConfig, RotaryEmbedding
from posenc.encodings.xpos import XPos, XPosConfig
from posenc.functional.axial_rope import grid_positions
from posenc.functional.rope import apply_rotary, default_inv_freq, rope_angles, rope_cos_sin
from posenc.registry import available, available_scalings, build, register, register_scaling
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
    "AxialRoPE",
    "Encoding",
    "NoPE",
    "AxialRoPEConfig",
    "DynamicNTKScaling",
    "LinearScaling",
    "Llama3Scaling",
    "LongRoPEScaling",
    "MRoPE",
    "MRoPEConfig",
    "NTKScaling",
    "RoPEMixed",
    "RoPEMixedConfig",
    "RopeScaling",
    "RotaryConfig",
    "RotaryEmbedding",
    "XPos",
    "XPosConfig",
    "YaRNScaling",
    "apply_rotary",
    "attention",
    "available",
    "build",
    "register",
    "available_scalings",
    "default_inv_freq",
    "functional",
    "grid_positions",
    "hf",
    "parse_scaling",
    "register_scaling",
    "rope_angles",
    "rope_cos_sin",
    "rope_frequencies",
]
