"""RoPE configs in and out of Hugging Face: ``rotary_config_from_hf`` / ``rotary_config_to_hf`` (RoPE), and the
multi-stream RoPEs of vision-language models (``xdrope_config_from_hf`` / ``xdrope_config_to_hf``: HunYuan-VL;
``rope_3d_config_from_hf`` / ``rope_3d_config_to_hf``: ERNIE-4.5-VL, Bailing). The
translation lives in the core (``posenc.encodings.rotary_hf``; the encodings' own modules for the multi-stream
ones) so that the encodings' ``from_hf`` / ``to_hf`` do not import this package."""

from posenc.encodings.rope_3d import rope_3d_config_from_hf, rope_3d_config_to_hf
from posenc.encodings.rotary_hf import rotary_config_from_hf, rotary_config_to_hf
from posenc.encodings.xdrope import xdrope_config_from_hf, xdrope_config_to_hf

__all__ = [
    "rope_3d_config_from_hf",
    "rope_3d_config_to_hf",
    "rotary_config_from_hf",
    "rotary_config_to_hf",
    "xdrope_config_from_hf",
    "xdrope_config_to_hf",
]
