"""``rotary_config_from_hf`` / ``rotary_config_to_hf``: RoPE configs in and out of Hugging Face; the translation
lives in the core (``posenc.encodings.rotary_hf``) so that ``RotaryEmbedding.from_hf`` does not import this package."""

from posenc.encodings.rotary_hf import rotary_config_from_hf, rotary_config_to_hf

__all__ = ["rotary_config_from_hf", "rotary_config_to_hf"]
