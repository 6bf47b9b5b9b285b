"""Pure functions of tensors and keyword-only scalars. Imports only torch."""

from posenc.functional.rope import apply_rotary, default_inv_freq, rope_angles, rope_cos_sin
from posenc.functional.rope_scaling import (
    dynamic_ntk_frequencies,
    linear_frequencies,
    llama3_frequencies,
    longrope_frequencies,
    ntk_frequencies,
    yarn_frequencies,
)

__all__ = [
    "apply_rotary",
    "default_inv_freq",
    "rope_angles",
    "rope_cos_sin",
    "dynamic_ntk_frequencies",
    "linear_frequencies",
    "llama3_frequencies",
    "longrope_frequencies",
    "ntk_frequencies",
    "yarn_frequencies",
]
