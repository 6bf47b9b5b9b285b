"""XDRoPE (HunYuan-VL's XD-RoPE) against vLLM's and Tencent's code written out in float64, and against transformers
5.24's ``hunyuan_vl`` rotary module; its config read from and written to HunYuan-VL configs.

Tolerances (``tests/tolerances.py``): posenc's float32 tables are within ``rope_table_atol`` of the exact float64
ones, transformers' within ``hf_rope_table_atol`` of posenc's (its float32 frequencies and angles); a rotation
moves that by ``rope_rotation_atol``.

Finding: transformers 5.24 splits ``mrope_section`` over the whole duplicated cos/sin table (each section doubled),
where Tencent's code and vLLM repeat the section list (each stream takes the same frequencies in both halves of the
head). The two agree where a token's positions are equal (text, decoding) and differ on image tokens;
``test_transformers_5_24_differs_on_image_tokens`` pins it.
"""

import copy

import pytest
import torch
from torch.testing import assert_close

import posenc
from multistream_cases import qk, x_max
from posenc import XDRoPE, XDRoPEConfig
from posenc.hf import xdrope_config_from_hf, xdrope_config_to_hf
from reference import xdrope as ref
from tolerances import attention_atol, hf_rope_table_atol, rope_rotation_atol, rope_table_atol, ulps

MAX_POSITION = 4096
# (head_dim, xdrope_section): HunyuanOCR's (16, 16, 16, 16), smaller heads, uneven and empty sections, three streams.
SECTIONS = [(128, (16, 16, 16, 16)), (64, (8, 8, 8, 8)), (32, (6, 4, 4, 2)), (16, (1, 3, 0, 4)), (24, (4, 4, 4))]
#: The keys of HunyuanOCR's released rope_scaling (config.json), with test values.
RELEASED = {
    "alpha": 1000.0,
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "type": "xdrope",
    "xdrope_section": [16, 16, 16, 16],
}


def _positions(n: int, batch: int, length: int, *, text: bool = False, seed: int = 0) -> torch.Tensor:
    """(N, B, S) positions below MAX_POSITION; ``text``: the N rows equal (text tokens)."""
    gen = torch.Generator().manual_seed(seed)
    if text:
        return torch.randint(0, MAX_POSITION, (1, batch, length), generator=gen).expand(n, -1, -1)
    return torch.randint(0, MAX_POSITION, (n, batch, length), generator=gen)


# --------------------------------------------------------------------------------------------------------------
# vLLM and Tencent's code, in float64


@pytest.mark.parametrize(("head_dim", "section"), SECTIONS)
@pytest.mark.parametrize("alpha", [1.0, 1000.0])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("batched", [True, False])
def test_matches_vllm_in_float64(head_dim, section, alpha, layout, batched):
    q, k = qk(head_dim)
    pos = _positions(len(section), 2, q.shape[2])
    if not batched:  # (N, S): one set of positions for the batch
        pos = pos[:, 0]
    enc = XDRoPE(head_dim, base=10000.0, xdrope_section=section, alpha=alpha, layout=layout)
    got_q, got_k = enc(q, k, pos)
    freqs = ref.inv_freq(head_dim, 10000.0, alpha)
    atol = rope_rotation_atol(rope_table_atol(MAX_POSITION * float(freqs.max())), x_max(q, k))
    for got, x in ((got_q, q), (got_k, k)):
        want = ref.vllm_rotate(x, pos, freqs, list(section), neox=layout == "half")
        assert_close(got.double(), want, rtol=0, atol=atol)


@pytest.mark.parametrize(("head_dim", "section"), SECTIONS)
def test_tencent_code_is_vllm(head_dim, section):
    """Tencent's list-repeated split over the duplicated table is vLLM's split over the F frequencies, twice."""
    pos = _positions(len(section), 2, 7)
    freqs = ref.inv_freq(head_dim, 10000.0, 1000.0)
    cos, sin = ref.vllm_cos_sin(pos, freqs, list(section))
    t_cos, t_sin = ref.tencent_cos_sin(pos, freqs, list(section))
    assert_close(t_cos, torch.cat((cos, cos), dim=-1), rtol=0, atol=0)
    assert_close(t_sin, torch.cat((sin, sin), dim=-1), rtol=0, atol=0)
    q, _ = qk(head_dim, s=7)
    assert_close(ref.rotate_half_tables(q, t_cos, t_sin), ref.vllm_rotate(q, pos, freqs, list(section)))


def test_vllm_comparison_catches_swapped_streams():
    q, k = qk(64)
    pos = _positions(4, 2, q.shape[2])
    freqs = ref.inv_freq(64, 10000.0)
    want = ref.vllm_rotate(q, pos, freqs, [8, 8, 8, 8])
    got, _ = XDRoPE(64, xdrope_section=(8, 8, 8, 8))(q, k, pos[[0, 2, 1, 3]])
    atol = rope_rotation_atol(rope_table_atol(MAX_POSITION), x_max(q, k))
    assert float((got.double() - want).abs().max()) > 100 * atol


# --------------------------------------------------------------------------------------------------------------
# transformers 5.24's hunyuan_vl


def _hf_rotary(enc: XDRoPE):
    """transformers' ``HunYuanVLRotaryEmbedding``, built from the config posenc writes for ``enc``."""
    hunyuan = pytest.importorskip("transformers.models.hunyuan_vl.modeling_hunyuan_vl")
    config = pytest.importorskip("transformers.models.hunyuan_vl.configuration_hunyuan_vl")
    text = config.HunYuanVLTextConfig(
        hidden_size=64, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=1, **enc.to_hf()
    )  # a fresh dict: transformers rewrites the rope dict it is given in place
    return hunyuan, hunyuan.HunYuanVLRotaryEmbedding(text)


@pytest.mark.parametrize(("head_dim", "section"), SECTIONS)
@pytest.mark.parametrize("alpha", [1.0, 1000.0])
def test_matches_transformers_on_text_tokens(head_dim, section, alpha):
    """Equal positions on every stream (text tokens, decoding): the tables and q, k of transformers' module."""
    enc = XDRoPE(head_dim, base=10000.0, xdrope_section=section, alpha=alpha)
    hunyuan, rotary = _hf_rotary(enc)
    q, k = qk(head_dim)
    pos = _positions(len(section), 2, q.shape[2], text=True)
    hf_cos, hf_sin = rotary(q, pos)  # (B, S, D)
    cos, sin = enc.cos_sin(pos)  # (B, S, F)
    table_atol = hf_rope_table_atol(MAX_POSITION * float(enc.inv_freq.max()), enc.config.base * alpha)
    assert_close(hf_cos, torch.cat((cos, cos), dim=-1), rtol=0, atol=table_atol)
    assert_close(hf_sin, torch.cat((sin, sin), dim=-1), rtol=0, atol=table_atol)
    want_q, want_k = hunyuan.apply_rotary_pos_emb(q, k, hf_cos, hf_sin)
    got_q, got_k = enc(q, k, pos)
    assert_close(got_q, want_q, rtol=0, atol=rope_rotation_atol(table_atol, x_max(q)))
    assert_close(got_k, want_k, rtol=0, atol=rope_rotation_atol(table_atol, x_max(k)))


@pytest.mark.parametrize(("head_dim", "section"), SECTIONS[:3])
def test_transformers_5_24_differs_on_image_tokens(head_dim, section):
    """transformers 5.24 runs its own split (each section doubled over the whole table; ``reference.xdrope``), which
    is not Tencent's or vLLM's once a token's positions differ (image tokens): the finding this file reports."""
    enc = XDRoPE(head_dim, xdrope_section=section, alpha=1000.0)
    _, rotary = _hf_rotary(enc)
    q, _ = qk(head_dim)
    pos = _positions(len(section), 2, q.shape[2])
    hf_cos, hf_sin = rotary(q, pos)
    freqs = ref.inv_freq(head_dim, 10000.0, 1000.0)
    want_cos, want_sin = ref.transformers_cos_sin(pos, freqs, list(section))
    table_atol = hf_rope_table_atol(MAX_POSITION * float(freqs.max()), 10000.0 * 1000.0)
    assert_close(hf_cos.double(), want_cos, rtol=0, atol=2 * table_atol)
    assert_close(hf_sin.double(), want_sin, rtol=0, atol=2 * table_atol)
    cos, _ = enc.cos_sin(pos)
    assert float((hf_cos - torch.cat((cos, cos), dim=-1)).abs().max()) > 0.1


# --------------------------------------------------------------------------------------------------------------
# The same code as RoPE and M-RoPE


@pytest.mark.parametrize(("head_dim", "section"), SECTIONS)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_equal_streams_are_rope_at_the_ntk_alpha_base(head_dim, section, layout, dtype):
    q, k = (t.to(dtype) for t in qk(head_dim))
    pos = _positions(1, 2, q.shape[2])[0]  # (B, S)
    enc = XDRoPE(head_dim, base=1e6, xdrope_section=section, alpha=1000.0, layout=layout)
    rope = posenc.RotaryEmbedding(
        head_dim, base=1e6, scaling={"rope_type": "ntk_alpha", "alpha": 1000.0}, layout=layout
    )
    for got, want in zip(enc(q, k, pos.expand(len(section), -1, -1)), rope(q, k, pos), strict=True):
        assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize(("head_dim", "section"), [(16, (2, 3, 3)), (128, (16, 24, 24)), (24, (4, 4, 4))])
def test_three_streams_at_alpha_one_are_mrope(head_dim, section):
    q, k = qk(head_dim)
    pos = _positions(3, 2, q.shape[2])
    got = XDRoPE(head_dim, base=1e6, xdrope_section=section)(q, k, pos)
    want = posenc.MRoPE(head_dim, base=1e6, mrope_section=section)(q, k, pos)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, rtol=0, atol=0)


def test_through_attention_with_a_cache():
    """``posenc.attention`` with (4, B, S) positions: the rotated-then-plain attention, and a decoding step (cached
    keys at their positions) equal to the full call's last rows."""
    enc = posenc.build("xdrope", head_dim=64, xdrope_section=(8, 8, 8, 8), alpha=1000.0)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, h, 12, 64, generator=gen) for h in (4, 2, 2))
    pos = _positions(4, 2, 12)
    out = posenc.attention(q, k, v, encoding=enc, q_positions=pos, backend="eager")
    rq, rk = enc.rotate(q, k, pos, pos)
    assert_close(out, posenc.attention(rq, rk, v, backend="eager"), rtol=0, atol=0)
    step = posenc.attention(
        q[:, :, -3:], k, v, encoding=enc, q_positions=pos[..., -3:], k_positions=pos, backend="eager"
    )
    # The 3-row step and the 12-row call reach the BLAS with different shapes, which may block the score and value
    # sums differently (an AMD EPYC did): bound by the attention's own sums, not by a few ulps.
    assert_close(step, out[:, :, -3:], rtol=0, atol=attention_atol(rq, rk, v))


def test_compiles_without_graph_breaks():
    enc = XDRoPE(16, xdrope_section=(2, 2, 2, 2), alpha=1000.0)
    q, k = qk(16)
    pos = _positions(4, 2, q.shape[2])
    for got, want in zip(torch.compile(enc, fullgraph=True)(q, k, pos), enc(q, k, pos), strict=True):
        assert_close(got, want)


# --------------------------------------------------------------------------------------------------------------
# Configs


def test_reads_the_released_form_and_transformers_rewrite_of_it():
    want = XDRoPEConfig(head_dim=128, base=10000.0, xdrope_section=(16, 16, 16, 16), alpha=1000.0)
    released = {"head_dim": 128, "rope_theta": 10000.0, "rope_scaling": RELEASED}
    assert xdrope_config_from_hf(released) == want
    assert XDRoPE.from_hf(released).config == want
    assert xdrope_config_from_hf({"text_config": released, "model_type": "hunyuan_vl"}) == want
    config = pytest.importorskip("transformers.models.hunyuan_vl.configuration_hunyuan_vl")
    # transformers rewrites the dicts it is given in place: it gets copies
    text = config.HunYuanVLTextConfig(
        hidden_size=256, num_attention_heads=2, num_hidden_layers=1, **copy.deepcopy(released)
    )
    assert text.rope_parameters["mrope_section"] == [16, 16, 16, 16]  # transformers renamed the key
    assert xdrope_config_from_hf(text) == want
    assert xdrope_config_from_hf(config.HunYuanVLConfig(text_config=text.to_dict()).to_dict()) == want
    ratios = {**released, "rope_scaling": {**RELEASED, "xdrope_section": [0.25, 0.25, 0.25, 0.25]}}
    assert xdrope_config_from_hf(ratios) == want  # Tencent's code converts fractions of the half head


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize(
    "config",
    [
        XDRoPEConfig(head_dim=128, base=10000.0, xdrope_section=(16, 16, 16, 16), alpha=1000.0),
        XDRoPEConfig(head_dim=32, base=5e5, xdrope_section=(6, 4, 4, 2)),
        XDRoPEConfig(head_dim=24, xdrope_section=(4, 4, 4), alpha=2.0),
    ],
)
def test_round_trip_through_transformers_and_vllm(config, legacy):
    written = xdrope_config_to_hf(config, legacy=legacy)
    assert xdrope_config_from_hf(written) == config
    assert XDRoPE.from_config(config).to_hf(legacy=legacy) == written
    # transformers reads what posenc wrote into the frequencies posenc runs...
    hf = pytest.importorskip("transformers.models.hunyuan_vl.configuration_hunyuan_vl")
    text = hf.HunYuanVLTextConfig(hidden_size=64, num_attention_heads=2, num_hidden_layers=1, **copy.deepcopy(written))
    assert xdrope_config_from_hf(text) == config
    enc = XDRoPE.from_config(config)
    _, rotary = _hf_rotary(enc)
    from tolerances import frequency_rtol

    assert_close(
        rotary.inv_freq.double(), enc.inv_freq.double(), rtol=frequency_rtol(config.base * config.alpha), atol=0
    )
    # ... and so does vLLM's get_rope (its "xdrope" branch, reference.xdrope.vllm_rope_parameters)
    rope = (
        written["rope_parameters"] if not legacy else {**written["rope_scaling"], "rope_theta": written["rope_theta"]}
    )
    rope = {("rope_type" if key == "type" else key): value for key, value in rope.items()}
    read = ref.vllm_rope_parameters(rope)
    assert read["xdrope_section"] == list(config.xdrope_section)
    freqs = ref.inv_freq(config.head_dim, read["base"], read["alpha"])
    assert_close(enc.inv_freq.double(), freqs, **ulps(1))


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"head_dim": 16, "rope_scaling": {"type": "xdrope", "alpha": 2.0}}, "xdrope_section"),
        (
            {"head_dim": 16, "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "mrope_section": [2] * 4}},
            "rope_type",
        ),
        (
            {"head_dim": 16, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "mrope_section": [2] * 4}},
            "rope_type",
        ),
        ({"head_dim": 16, "rope_parameters": {"xdrope_section": [2] * 4, "mrope_section": [4, 4]}}, "xdrope_section"),
        (
            {"head_dim": 16, "rope_scaling": {"type": "xdrope", "alpha": 2.0, "xdrope_section": [2, 2, 2, 1]}},
            "xdrope_section",
        ),
        ({"rope_scaling": {"type": "xdrope", "alpha": 2.0, "xdrope_section": [2] * 4}}, "head_dim"),
    ],
)
def test_bad_hf_configs(config, match):
    with pytest.raises(ValueError, match=match):
        xdrope_config_from_hf(config)


def test_writes_only_the_half_layout():
    with pytest.raises(ValueError, match="layout"):
        xdrope_config_to_hf(XDRoPEConfig(head_dim=16, layout="interleaved"))


def test_config_round_trip_and_defaults():
    config = XDRoPEConfig(head_dim=128, base=1e6, xdrope_section=[16, 16, 16, 16], alpha=1000.0)
    assert config.xdrope_section == (16, 16, 16, 16)
    assert config.to_dict()["xdrope_section"] == [16, 16, 16, 16]
    assert XDRoPEConfig.from_dict(config.to_dict()) == config
    assert XDRoPE.from_config(config.to_dict()).config == config
    assert XDRoPE(128).config.xdrope_section == (16, 16, 16, 16)  # HunyuanOCR's
    assert XDRoPE(20).config.xdrope_section == (4, 2, 2, 2)  # the remainder to the position stream
    assert XDRoPE(16).stream_names == ("position", "width", "height", "image")
    assert XDRoPE(24, xdrope_section=(4, 4, 4)).num_streams == 3


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(head_dim=15), "head_dim"),
        (dict(head_dim=2), "head_dim"),
        (dict(head_dim=16, xdrope_section=(2, 2, 2, 3)), "xdrope_section"),
        (dict(head_dim=16, xdrope_section=(2.0, 2, 2, 2)), "xdrope_section"),
        (dict(head_dim=16, xdrope_section=(-2, 4, 3, 3)), "xdrope_section"),
        (dict(head_dim=16, xdrope_section=()), "xdrope_section"),
        (dict(head_dim=16, xdrope_section="2222"), "xdrope_section"),
        (dict(head_dim=16, alpha=0.5), "alpha"),
        (dict(head_dim=16, base=1.0), "base"),
        (dict(head_dim=16, layout="neox"), "layout"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        XDRoPE(**kwargs)


def test_bad_positions_name_the_streams():
    enc = XDRoPE(16)
    q, k = qk(16, s=5)
    with pytest.raises(ValueError, match=r"^positions\.shape.*\[position, width, height, image\]"):
        enc(q, k, _positions(3, 2, 5))  # three streams for a four-stream XD-RoPE
    with pytest.raises(ValueError, match=r"^positions\.shape"):
        enc(q, k, torch.arange(5))
    with pytest.raises(ValueError, match=r"^k_positions\.shape"):
        enc(q, k, _positions(4, 2, 5), _positions(4, 2, 4))
    with pytest.raises(ValueError, match=r"^q_positions\.shape"):
        posenc.attention(q, k, k, encoding=enc)  # attention's default arange(S) is one stream
