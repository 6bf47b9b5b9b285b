"""The public API, imported by the package root (``posenc``) on first use of any of its names (``posenc.__getattr__``):
every name of ``posenc.__all__``, from the module that defines it."""

# ruff: noqa: F401

from posenc import functional, hf
from posenc.attention import attention
from posenc.documents import document_lengths, packed_positions
from posenc.encodings._base import Encoding
from posenc.encodings.alibi import ALiBi, ALiBi2D, ALiBi2DConfig, ALiBiConfig
from posenc.encodings.axial_rope import AxialRoPE, AxialRoPEConfig
from posenc.encodings.cope import CoPE, CoPEConfig
from posenc.encodings.fire import FIRE, FIREConfig
from posenc.encodings.fope import FoPE, FoPEConfig
from posenc.encodings.kerple import KERPLE, KERPLEConfig
from posenc.encodings.learned import Learned2DConfig, LearnedConfig, LearnedPositions, LearnedPositions2D
from posenc.encodings.mrope import MRoPE, MRoPEConfig
from posenc.encodings.nope import NoPE
from posenc.encodings.nope_temperature import NoPETemperature, NoPETemperatureConfig
from posenc.encodings.p_rope import p_rope
from posenc.encodings.rope_3d import RoPE3D, RoPE3DConfig
from posenc.encodings.rope_mixed import RoPEMixed, RoPEMixedConfig
from posenc.encodings.rotary import RotaryConfig, RotaryEmbedding
from posenc.encodings.sandwich import Sandwich, SandwichConfig
from posenc.encodings.shaw import ShawRelative, ShawRelativeConfig
from posenc.encodings.sinusoidal import Sinusoidal, Sinusoidal2D, Sinusoidal2DConfig, SinusoidalConfig
from posenc.encodings.ssmax import SSMax, SSMaxConfig, rope_ssmax
from posenc.encodings.t5 import T5Bias, T5BiasConfig
from posenc.encodings.xdrope import XDRoPE, XDRoPEConfig
from posenc.encodings.xpos import XPos, XPosConfig
from posenc.functional.alibi import alibi_slopes
from posenc.functional.axial_rope import grid_positions
from posenc.functional.position_sampling import PoseSample, pose_sample, randomized_positions
from posenc.functional.relative import t5_relative_position_bucket
from posenc.functional.rope import apply_rotary, default_inv_freq, rope_angles, rope_cos_sin
from posenc.registry import available, available_scalings, build, register, register_scaling
from posenc.scalings import (
    DynamicNTKScaling,
    LinearScaling,
    Llama3Scaling,
    LongRoPEScaling,
    MixedNTKScaling,
    NTKAlphaScaling,
    NTKScaling,
    ProportionalScaling,
    RopeScaling,
    TeleChat3YaRNScaling,
    YaRNLogScaling,
    YaRNScaling,
    grok_rope_scaling,
    parse_scaling,
    rope_frequencies,
)
