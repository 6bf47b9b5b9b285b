"""vLLM's frequency variants (issue 40, item 5): NTK-by-alpha (Hunyuan), mixed NTK, TeleChat3's YaRN, Grok's
yarn_log, against float64 write-ups of vLLM's classes (``tests/reference/vllm_rope_scaling.py`` names the files and
commits); the released config dicts read; what posenc writes back to a Hugging Face config.

Tolerances: posenc computes each transform in float64 and rounds once to float32, so its frequencies are within one
rounding (``ulps(1)``, with a rounding's slack for float64 formula order) of the float64 reference. Its cos/sin
tables take float64 angles ``t * fl32(inv_freq)``: an angle ``theta`` is off by at most ``u |theta|`` from the
frequency's rounding, and the trig results and the attention factor multiply round once each, so a table entry is
within ``af (u max|theta| + 4 u)`` of the exact one; the bound below doubles that.
"""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.hf import rotary_config_from_hf, rotary_config_to_hf
from reference import vllm_rope_scaling as vllm
from tolerances import ulps, unit_roundoff

HEAD_DIMS = [64, 128, 80]
BASES = [10000.0, 500000.0]
PARTIAL = [1.0, 0.5]
POSITIONS = torch.tensor([0, 1, 2, 7, 100, 1023, 4096, 8191, 8192, 20000, 32767, 131071])

#: Hunyuan-7B / Hunyuan-A13B's released rope_scaling (Hunyuan-Large ships only alpha, factor and type).
HUNYUAN = {
    "alpha": 1000.0,
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "type": "dynamic",
}
#: TeleChat3-36B-Thinking's rope_scaling (max_position_embeddings 32768 at the top level).
TELECHAT3 = {"type": "telechat3-yarn", "factor": 4.0, "original_max_position_embeddings": 8192}


def _cases():
    """(id, released dict posenc reads, the vLLM reference as a function of (dim, base))."""
    for alpha in (1.0, 2.0, 1000.0):
        yield f"alpha-{alpha}", {"rope_type": "dynamic", "alpha": alpha}, lambda d, b, a=alpha: vllm.ntk_alpha(d, b, a)
    yield "hunyuan", HUNYUAN, lambda d, b: vllm.ntk_alpha(d, b, 1000.0)
    for factor, mixed_b in ((1.0, 0.625), (4.0, 0.625), (16.0, 1.5), (8.0, 1.0)):
        yield (
            f"mixed-{factor}-{mixed_b}",
            {"rope_type": "ntk", "factor": factor, "mixed_b": mixed_b},
            lambda d, b, f=factor, m=mixed_b: vllm.ntk(d, b, f, m),
        )
    yield "telechat3", TELECHAT3, lambda d, b: vllm.telechat3_yarn(d, b, 4.0, 8192)
    for factor in (1.0, 2.0, 16.0):
        yield (
            f"telechat3-{factor}-keys",
            {
                "rope_type": "telechat3-yarn",
                "factor": factor,
                "original_max_position_embeddings": 4096,
                "beta_fast": 16,
                "beta_slow": 2,
                "truncate": False,
                "attn_factor": 0.9,
            },
            lambda d, b, f=factor: vllm.telechat3_yarn(
                d, b, f, 4096, beta_fast=16, beta_slow=2, truncate=False, attn_factor=0.9
            ),
        )
    for factor in (1.0, 4.0, 16.0):
        yield (
            f"yarn_log-{factor}",
            {"rope_type": "yarn_log", "factor": factor, "original_max_position_embeddings": 8192},
            lambda d, b, f=factor: vllm.grok_yarn_log(d, b, f, 8192),
        )
    yield (
        "yarn_log-keys",
        {
            "rope_type": "yarn_log",
            "factor": 8.0,
            "original_max_position_embeddings": 2048,
            "beta_fast": 8,
            "beta_slow": 0.5,
            "extrapolation_factor": 0.75,
        },
        lambda d, b: vllm.grok_yarn_log(d, b, 8.0, 2048, beta_fast=8, beta_slow=0.5, extrapolation_factor=0.75),
    )


CASES = list(_cases())


def _table_atol(inv_freq: torch.Tensor, factor: float) -> float:
    max_angle = float(POSITIONS.max()) * float(inv_freq.max())
    return 2 * factor * (max_angle + 4) * unit_roundoff()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("partial", PARTIAL)
def test_frequencies_and_tables_match_vllm(case, head_dim, base, partial):
    _, released, reference = case
    dim = int(head_dim * partial)
    want, want_factor = reference(dim, base)
    got, got_factor = posenc.rope_frequencies(head_dim, base=base, scaling=released, partial_rotary_factor=partial)
    assert got.dtype == torch.float32 and got.shape == (dim // 2,)
    torch.testing.assert_close(got.double(), want, **ulps(1, torch.float32))
    assert got_factor == pytest.approx(want_factor, rel=4 * unit_roundoff(torch.float64))
    # The whole cos/sin tables of the module built from the released dict, against vLLM's cache rows.
    rope = posenc.RotaryEmbedding(head_dim, base=base, scaling=released, partial_rotary_factor=partial)
    cos, sin = rope.cos_sin(POSITIONS)
    want_cos, want_sin = vllm.cos_sin(POSITIONS, want, want_factor)
    atol = _table_atol(want, want_factor)
    torch.testing.assert_close(cos.double(), want_cos, rtol=0, atol=atol)
    torch.testing.assert_close(sin.double(), want_sin, rtol=0, atol=atol)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("case", CASES[3:10:3] + CASES[-2:], ids=lambda c: c[0])
def test_rotation_matches_the_float64_rotation(case, layout):
    """q and k rotated by the module == the float64 rotation at vLLM's frequencies and attention factor."""
    from reference.rope_float64 import rotate_float64

    _, released, reference = case
    head_dim = 64
    want, want_factor = reference(head_dim, 10000.0)
    rope = posenc.RotaryEmbedding(head_dim, scaling=released, layout=layout)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, len(POSITIONS), head_dim, generator=g)
    k = torch.randn(2, 1, len(POSITIONS), head_dim, generator=g)
    q_rot, k_rot = rope(q, k, POSITIONS)
    x_max = float(torch.cat([q.flatten(), k.flatten()]).abs().max())
    # each output channel is x1 c - x2 s: two table entries off by _table_atol, times |x| <= x_max, plus 3 roundings
    atol = 2 * x_max * _table_atol(want, want_factor) + 3 * unit_roundoff() * 2 * x_max * want_factor
    for got, x in ((q_rot, q), (k_rot, k)):
        exact = rotate_float64(x, POSITIONS, want, layout=layout, attention_factor=want_factor)
        torch.testing.assert_close(got.double(), exact, rtol=0, atol=atol)


# --------------------------------------------------------------------------------------------------------------
# Released dicts in, config dicts out


def test_released_dicts_parse_to_the_new_scalings():
    assert posenc.parse_scaling(HUNYUAN) == posenc.NTKAlphaScaling(alpha=1000.0)
    assert posenc.parse_scaling({"alpha": 1000.0, "factor": 1.0, "type": "dynamic"}) == posenc.NTKAlphaScaling(
        alpha=1000.0
    )
    assert posenc.parse_scaling({"rope_type": "ntk", "factor": 4.0, "mixed_b": 0.625}) == posenc.MixedNTKScaling(
        factor=4.0, mixed_b=0.625
    )
    assert posenc.parse_scaling(TELECHAT3) == posenc.TeleChat3YaRNScaling(
        factor=4.0, original_max_position_embeddings=8192
    )
    # each class reads its released form too, and the plain forms stay what they were
    assert posenc.NTKAlphaScaling.from_dict(HUNYUAN) == posenc.NTKAlphaScaling(alpha=1000.0)
    assert posenc.TeleChat3YaRNScaling.from_dict(TELECHAT3).factor == 4.0
    assert isinstance(
        posenc.parse_scaling({"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 8}),
        posenc.DynamicNTKScaling,
    )
    assert posenc.parse_scaling({"rope_type": "ntk", "factor": 2.0}) == posenc.NTKScaling(factor=2.0)


@pytest.mark.parametrize("key,value", [("factor", 2.0), ("mscale", 0.707), ("mscale_all_dim", 0.5)])
def test_alpha_refuses_keys_that_would_be_ignored(key, value):
    with pytest.raises(ValueError, match="read only alpha"):
        posenc.parse_scaling({**HUNYUAN, key: value})


def test_hunyuan_config_reads_and_exports_as_the_enlarged_base():
    """Hunyuan's config (rope_scaling or rope_parameters form) -> NTK-by-alpha; written back as default RoPE at
    ``base * alpha ** (d / (d - 2))``, which every runtime runs as this scaling."""
    legacy = {"head_dim": 128, "rope_theta": 10000.0, "rope_scaling": HUNYUAN, "max_position_embeddings": 32768}
    modern = {"head_dim": 128, "rope_parameters": {**HUNYUAN, "rope_theta": 10000.0}, "max_position_embeddings": 32768}
    for cfg in (legacy, modern):
        config = rotary_config_from_hf(cfg)
        assert config.scaling == posenc.NTKAlphaScaling(alpha=1000.0) and config.base == 10000.0
    exported = rotary_config_to_hf(config)
    assert exported["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0 * 1000.0 ** (128 / 126)}
    back = rotary_config_from_hf(exported)
    assert back.scaling is None
    a, _ = posenc.rope_frequencies(128, base=back.base)
    b, _ = posenc.rope_frequencies(128, scaling=config.scaling)
    torch.testing.assert_close(a, b, **ulps(1))


def test_telechat3_config_reads_and_exports_as_plain_yarn():
    """TeleChat3's config -> its YaRN; written back as ``"yarn"`` with the attention factor ``0.07 ln 4 + 1``
    (vLLM's config loader does the same), which gives bit-equal frequencies and the same factor."""
    cfg = {
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "rope_theta": 1e6,
        "rope_scaling": TELECHAT3,
        "max_position_embeddings": 32768,
    }
    config = rotary_config_from_hf(cfg)
    assert config.scaling == posenc.TeleChat3YaRNScaling(factor=4.0, original_max_position_embeddings=8192)
    exported = rotary_config_to_hf(config)
    assert exported["rope_parameters"]["rope_type"] == "yarn"
    assert exported["rope_parameters"]["attention_factor"] == 0.07 * math.log(4.0) + 1.0
    back = rotary_config_from_hf(exported)
    assert back.scaling == config.scaling.as_yarn()
    a, fa = posenc.RotaryEmbedding.from_config(back).inv_freq, posenc.RotaryEmbedding.from_config(back).attention_factor
    rope = posenc.RotaryEmbedding.from_config(config)
    torch.testing.assert_close(a, rope.inv_freq, rtol=0, atol=0)
    assert fa == rope.attention_factor


def test_mixed_ntk_round_trips_through_vllm_form():
    config = posenc.RotaryConfig(head_dim=64, base=10000.0, scaling=posenc.MixedNTKScaling(factor=4.0, mixed_b=0.625))
    exported = rotary_config_to_hf(config, runtime="vllm")
    assert exported["rope_parameters"] == {"rope_type": "ntk", "factor": 4.0, "mixed_b": 0.625, "rope_theta": 10000.0}
    assert rotary_config_from_hf(exported) == config
    assert rotary_config_from_hf(rotary_config_to_hf(config, legacy=True, runtime="vllm")) == config
    assert posenc.RotaryEmbedding.from_config(config).to_hf(runtime="vllm") == exported


def test_mixed_ntk_is_not_written_for_transformers():
    """vLLM's form fails in transformers (``KeyError: 'ntk'`` building the rotary module), so writing it for
    transformers -- the default -- is refused, naming where it runs."""
    transformers = pytest.importorskip("transformers")
    config = posenc.RotaryConfig(head_dim=8, base=10000.0, scaling=posenc.MixedNTKScaling(factor=4.0, mixed_b=0.625))
    vllm_form = rotary_config_to_hf(config, runtime="vllm")
    hf = transformers.LlamaConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=1, vocab_size=16,
                                  intermediate_size=16, **vllm_form)
    with pytest.raises(KeyError, match="ntk"):
        transformers.LlamaForCausalLM(hf)
    for write in (lambda: rotary_config_to_hf(config), lambda: posenc.RotaryEmbedding.from_config(config).to_hf()):
        with pytest.raises(ValueError, match=r"scaling='ntk_mixed' is invalid: .*vLLM.*runtime='vllm'"):
            write()
    with pytest.raises(ValueError, match=r"runtime='tgi' is invalid: expected one of \['transformers', 'vllm'\]"):
        rotary_config_to_hf(config, runtime="tgi")


def test_yarn_log_is_not_written_to_a_hf_config():
    config = posenc.RotaryConfig(
        head_dim=64, scaling=posenc.YaRNLogScaling(factor=4.0, original_max_position_embeddings=8192)
    )
    with pytest.raises(ValueError, match="yarn_log"):
        rotary_config_to_hf(config)


def test_posenc_ntk_is_not_vllm_fixed_ntk():
    """A ``{"rope_type": "ntk", "factor": f}`` dict means bloc97's base change in posenc but Su's fixed NTK in
    vLLM (``mixed_b`` absent): vLLM divides even the highest frequency, by ``f ** (2 / d)``. posenc's spelling of
    vLLM's is ``ntk_mixed`` with ``mixed_b = 1``."""
    d, f = 64, 4.0
    vllm_fixed, _ = vllm.ntk(d, 10000.0, f, None)
    as_mixed, _ = posenc.rope_frequencies(d, scaling=posenc.MixedNTKScaling(factor=f, mixed_b=1.0))
    torch.testing.assert_close(as_mixed.double(), vllm_fixed, **ulps(1))
    posenc_ntk, _ = posenc.rope_frequencies(d, scaling={"rope_type": "ntk", "factor": f})
    assert float(posenc_ntk[0]) == 1.0
    assert float(vllm_fixed[0]) == pytest.approx(f ** (-2 / d))


@pytest.mark.parametrize(
    "scaling",
    [
        posenc.NTKAlphaScaling(alpha=1.0),
        posenc.MixedNTKScaling(factor=1.0, mixed_b=0.625),
        posenc.TeleChat3YaRNScaling(factor=1.0, original_max_position_embeddings=64),
        posenc.YaRNLogScaling(factor=1.0, original_max_position_embeddings=64),
    ],
    ids=lambda s: s.rope_type,
)
@pytest.mark.parametrize("head_dim", [8, 64, 80])
def test_scale_one_is_the_identity(scaling, head_dim):
    got, factor = posenc.rope_frequencies(head_dim, scaling=scaling)
    plain, _ = posenc.rope_frequencies(head_dim)
    torch.testing.assert_close(got, plain, **ulps(1))
    assert factor == 1.0


def test_ntk_alpha_equals_transformers_hunyuan_rotary():
    """transformers has NTK-by-alpha in one model, HunYuan-V1-Dense (its rotary turns ``"dynamic"`` + ``alpha`` into
    ``ntk_alpha``): its ``inv_freq`` for Hunyuan's released dict equals posenc's, and both equal the float64
    reference, each to its float32 rounding (``base ** (2i / d)`` in float32: relative error about
    ``2**-24 * (2 + ln(base'))``)."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "HunYuanDenseV1Config"):
        pytest.skip("this transformers has no HunYuan-V1-Dense")
    head_dim, theta = 128, 10000.0
    config = transformers.HunYuanDenseV1Config(
        vocab_size=32, hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=head_dim,
        num_hidden_layers=1, intermediate_size=64, rope_parameters={**HUNYUAN, "rope_theta": theta},
    )
    rotary = transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense.HunYuanDenseV1RotaryEmbedding(config)
    assert rotary.rope_type == "ntk_alpha" and rotary.attention_scaling == 1.0
    ours, ours_factor = posenc.parse_scaling(HUNYUAN).frequencies(head_dim, base=theta)
    exact, factor = vllm.ntk_alpha(head_dim, theta, 1000.0)
    assert factor == ours_factor == 1.0
    base = theta * 1000.0 ** (head_dim / (head_dim - 2))
    rtol = 2**-24 * (2 + math.log(base))
    torch.testing.assert_close(rotary.inv_freq.double(), exact, rtol=rtol, atol=0)
    torch.testing.assert_close(ours.double(), exact, rtol=rtol, atol=0)


def test_grok_top_level_keys_read_as_vllms_grok_model_reads_them():
    """A Grok 2 style config.json (``rope_type`` and its numbers at the top level, no ``rope_scaling``): the scaling
    vLLM's ``get_rope_scaling`` builds, its frequencies equal to the float64 reference; defaults as vLLM's; a dict and
    a config object alike; a plain config is None; another method, a missing number, and an attn_factor that acts in
    neither are refused or warned about."""
    config = {"rope_type": "yarn_log", "scaling_factor": 16.0, "original_max_position_embeddings": 8192,
              "rope_theta": 208533496, "max_position_embeddings": 131072}
    scaling = posenc.grok_rope_scaling(config)
    assert scaling == posenc.YaRNLogScaling(factor=16.0, original_max_position_embeddings=8192)
    assert posenc.grok_rope_scaling(type("Config", (), config)()) == scaling
    inv_freq, factor = scaling.frequencies(128, base=208533496.0)
    want, want_factor = vllm.grok_yarn_log(128, 208533496.0, 16.0, 8192)
    assert factor == want_factor == 1.0
    torch.testing.assert_close(inv_freq.double(), want, **ulps(4))
    keys = {**config, "extrapolation_factor": 0.5, "beta_fast": 8, "beta_slow": 2}
    assert posenc.grok_rope_scaling(keys) == posenc.YaRNLogScaling(
        factor=16.0, original_max_position_embeddings=8192, extrapolation_factor=0.5, beta_fast=8, beta_slow=2
    )
    assert posenc.grok_rope_scaling({"rope_theta": 10000.0}) is None
    with pytest.raises(ValueError, match="rope_type='yarn_linear' is invalid"):
        posenc.grok_rope_scaling({**config, "rope_type": "yarn_linear"})
    with pytest.raises(ValueError, match="scaling_factor=None is invalid"):
        posenc.grok_rope_scaling({"rope_type": "yarn_log", "original_max_position_embeddings": 8192})
    with pytest.warns(UserWarning, match="attn_factor=2.0 has no effect"):
        assert posenc.grok_rope_scaling({**config, "attn_factor": 2.0}) == scaling
