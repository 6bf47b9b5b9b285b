"""Pure functions of tensors and keyword-only scalars. Imports only torch."""

from posenc.functional.alibi import alibi_2d_bias, alibi_bias, alibi_slopes, interpolated_slopes
from posenc.functional.axial_rope import axial_angles, axial_cos_sin, axial_inv_freq, grid_positions
from posenc.functional.cope import cope_bias, cope_gates, cope_positions
from posenc.functional.fire import fire_bias
from posenc.functional.fope import (
    apply_fope,
    fope_cos_sin,
    fope_frequencies,
    fope_num_frequencies,
    init_fope_coefficients,
)
from posenc.functional.kerple import kerple_bias
from posenc.functional.learned import resize_table_1d, resize_table_2d
from posenc.functional.mrope import mrope_angles, mrope_cos_sin, mrope_streams
from posenc.functional.relative import shaw_bias, shaw_value_term, t5_bias, t5_relative_position_bucket
from posenc.functional.rope import angle_dtype, apply_rotary, default_inv_freq, rope_angles, rope_cos_sin, table_dtype
from posenc.functional.rope_mixed import init_mixed_freqs, mixed_angles, mixed_cos_sin
from posenc.functional.rope_scaling import (
    default_frequencies,
    dynamic_ntk_frequencies,
    linear_frequencies,
    llama3_frequencies,
    longrope_frequencies,
    ntk_frequencies,
    proportional_frequencies,
    yarn_frequencies,
)
from posenc.functional.rope_shared_kv import (
    apply_rotary_tail,
    compressed_positions,
    compressed_visible,
    shared_kv_rope_attention,
)
from posenc.functional.sandwich import sandwich_bias, sandwich_frequencies
from posenc.functional.sinusoidal import sinusoidal_2d_encoding, sinusoidal_encoding
from posenc.functional.ssmax import apply_ssmax, ssmax_key_count, ssmax_scale
from posenc.functional.temperature import apply_temperature, attention_temperature
from posenc.functional.xpos import check_xpos_positions, xpos_cos_sin, xpos_max_distance, xpos_scale, xpos_zeta

__all__ = [
    "alibi_2d_bias",
    "alibi_bias",
    "alibi_slopes",
    "angle_dtype",
    "apply_fope",
    "apply_rotary",
    "apply_rotary_tail",
    "apply_ssmax",
    "apply_temperature",
    "attention_temperature",
    "axial_angles",
    "axial_cos_sin",
    "axial_inv_freq",
    "compressed_positions",
    "compressed_visible",
    "cope_bias",
    "cope_gates",
    "cope_positions",
    "default_frequencies",
    "default_inv_freq",
    "dynamic_ntk_frequencies",
    "fire_bias",
    "fope_cos_sin",
    "fope_frequencies",
    "fope_num_frequencies",
    "grid_positions",
    "init_fope_coefficients",
    "init_mixed_freqs",
    "interpolated_slopes",
    "kerple_bias",
    "linear_frequencies",
    "llama3_frequencies",
    "longrope_frequencies",
    "mixed_angles",
    "mixed_cos_sin",
    "mrope_angles",
    "mrope_cos_sin",
    "mrope_streams",
    "ntk_frequencies",
    "proportional_frequencies",
    "resize_table_1d",
    "resize_table_2d",
    "rope_angles",
    "rope_cos_sin",
    "sandwich_bias",
    "sandwich_frequencies",
    "shared_kv_rope_attention",
    "shaw_bias",
    "shaw_value_term",
    "sinusoidal_2d_encoding",
    "sinusoidal_encoding",
    "ssmax_key_count",
    "ssmax_scale",
    "t5_bias",
    "t5_relative_position_bucket",
    "table_dtype",
    "xpos_cos_sin",
    "xpos_max_distance",
    "check_xpos_positions",
    "xpos_scale",
    "xpos_zeta",
    "yarn_frequencies",
]
