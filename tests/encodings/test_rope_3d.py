"""RoPE3D (ERNIE-4.5-VL's 3-D RoPE) against transformers 5.24's ``ernie4_5_vl_moe`` rotary module and vLLM's
``Ernie4_5_VLRotaryEmbedding`` written out in float64; its config read from and written to ERNIE configs.

Tolerances (``tests/tolerances.py``): posenc's float32 tables are within ``rope_table_atol`` of the exact float64
ones, transformers' within ``hf_rope_table_atol`` of posenc's; a rotation moves that by ``rope_rotation_atol``.
"""

import copy

import pytest
import torch
from torch.testing import assert_close

import posenc
from multistream_cases import qk, x_max
from posenc import RoPE3D, RoPE3DConfig
from posenc.hf import rope_3d_config_from_hf, rope_3d_config_to_hf
from reference import ernie_rope as ernie
from tolerances import hf_rope_table_atol, rope_rotation_atol, rope_table_atol

MAX_POSITION = 4096
BASE = 500000.0  # ERNIE-4.5-VL's rope_theta
# (head_dim, ERNIE's mrope_section [h, w, t]): ERNIE-4.5-VL's [22, 22, 20], smaller heads, odd spatial sections.
SECTIONS = [(128, [22, 22, 20]), (64, [10, 10, 12]), (32, [5, 5, 6]), (16, [2, 2, 4]), (16, [3, 3, 2])]


def _thw(section: list[int]) -> tuple[int, int, int]:
    """ERNIE's [h, w, t] as posenc's (temporal, height, width)."""
    h, w, t = section
    return (t, h, w)


def _positions(batch: int, length: int, *, low: int = 0, seed: int = 0) -> torch.Tensor:
    """(3, B, S) [temporal, height, width] positions in [low, MAX_POSITION)."""
    return torch.randint(low, MAX_POSITION, (3, batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("head_dim", "section"), SECTIONS)
@pytest.mark.parametrize("batched", [True, False])
def test_matches_vllm_in_float64(head_dim, section, batched):
    q, k = qk(head_dim)
    pos = _positions(2, q.shape[2])
    if not batched:  # (3, S): one set of positions for the batch
        pos = pos[:, 0]
    got_q, got_k = RoPE3D(head_dim, base=BASE, mrope_section=_thw(section))(q, k, pos)
    cos, sin = ernie.vllm_cos_sin(pos, head_dim, BASE, section)
    atol = rope_rotation_atol(rope_table_atol(MAX_POSITION), x_max(q, k))
    assert_close(got_q.double(), ernie.rotate_pairs(q, cos, sin), rtol=0, atol=atol)
    assert_close(got_k.double(), ernie.rotate_pairs(k, cos, sin), rtol=0, atol=atol)


@pytest.mark.parametrize(("head_dim", "section"), SECTIONS)
def test_transformers_pre_rotation_is_vllms_selection(head_dim, section):
    """transformers' pre-rotated frequencies and recomposition give vLLM's ``[h w h w ... t]`` tables, each entry
    twice (its tables span the head, pairs (2i, 2i + 1)) -- the same numbers, gathered in another order."""
    pos = _positions(2, 7)
    cos, sin = ernie.vllm_cos_sin(pos, head_dim, BASE, section)
    hf_cos, hf_sin = ernie.transformers_cos_sin(pos, head_dim, BASE, section)
    assert_close(hf_cos, cos.repeat_interleave(2, dim=-1), rtol=0, atol=0)
    assert_close(hf_sin, sin.repeat_interleave(2, dim=-1), rtol=0, atol=0)


def test_vllm_comparison_catches_swapped_height_and_width():
    q, k = qk(32)
    pos = _positions(2, q.shape[2])
    cos, sin = ernie.vllm_cos_sin(pos, 32, BASE, [5, 5, 6])
    got, _ = RoPE3D(32, base=BASE, mrope_section=(6, 5, 5))(q, k, pos[[0, 2, 1]])
    atol = rope_rotation_atol(rope_table_atol(MAX_POSITION), x_max(q, k))
    assert float((got.double() - ernie.rotate_pairs(q, cos, sin)).abs().max()) > 100 * atol


def _hf_module(enc: RoPE3D):
    """transformers' ``Ernie4_5_VLMoeTextRotaryEmbedding``, built from the config posenc writes for ``enc``."""
    modeling = pytest.importorskip("transformers.models.ernie4_5_vl_moe.modeling_ernie4_5_vl_moe")
    configuration = pytest.importorskip("transformers.models.ernie4_5_vl_moe.configuration_ernie4_5_vl_moe")
    text = configuration.Ernie4_5_VLMoeTextConfig(
        hidden_size=64, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=1,
        **enc.to_hf(convention="ernie"),
    )
    return modeling, modeling.Ernie4_5_VLMoeTextRotaryEmbedding(text)


@pytest.mark.parametrize(("head_dim", "section"), SECTIONS)
@pytest.mark.parametrize("text", [False, True])
def test_matches_transformers(head_dim, section, text):
    """The tables and rotated q, k of transformers' module, on image-like (three different) and text positions."""
    enc = RoPE3D(head_dim, base=BASE, mrope_section=_thw(section))
    modeling, rotary = _hf_module(enc)
    q, k = qk(head_dim)
    pos = _positions(2, q.shape[2])
    if text:
        pos = pos[:1].expand(3, -1, -1)
    hf_cos, hf_sin = rotary(q, pos)  # (B, S, D), float32
    cos, sin = enc.cos_sin(pos)  # (B, S, F)
    table_atol = hf_rope_table_atol(MAX_POSITION, BASE)
    assert_close(hf_cos, cos.repeat_interleave(2, dim=-1), rtol=0, atol=table_atol)
    assert_close(hf_sin, sin.repeat_interleave(2, dim=-1), rtol=0, atol=table_atol)
    want_q, want_k = modeling.apply_rotary_pos_emb(q, k, hf_cos, hf_sin)
    got_q, got_k = enc(q, k, pos)
    assert_close(got_q, want_q, rtol=0, atol=rope_rotation_atol(table_atol, x_max(q)))
    assert_close(got_k, want_k, rtol=0, atol=rope_rotation_atol(table_atol, x_max(k)))


@pytest.mark.parametrize(("head_dim", "section"), SECTIONS)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_equal_streams_are_rope(head_dim, section, layout, dtype):
    q, k = (t.to(dtype) for t in qk(head_dim))
    pos = _positions(2, q.shape[2])[0]  # (B, S)
    enc = RoPE3D(head_dim, base=BASE, mrope_section=_thw(section), layout=layout)
    rope = posenc.RotaryEmbedding(head_dim, base=BASE, layout=layout)
    for got, want in zip(enc(q, k, pos.expand(3, -1, -1)), rope(q, k, pos), strict=True):
        assert_close(got, want, rtol=0, atol=0)


def test_through_attention():
    enc = posenc.build("rope_3d", head_dim=64, base=BASE, mrope_section=(12, 10, 10))
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, h, 12, 64, generator=gen) for h in (4, 2, 2))
    pos = _positions(2, 12)
    out = posenc.attention(q, k, v, encoding=enc, q_positions=pos, backend="eager")
    rq, rk = enc.rotate(q, k, pos, pos)
    assert_close(out, posenc.attention(rq, rk, v, backend="eager"), rtol=0, atol=0)


def test_compiles_without_graph_breaks():
    enc = RoPE3D(16, mrope_section=(4, 2, 2))
    q, k = qk(16)
    pos = _positions(2, q.shape[2])
    for got, want in zip(torch.compile(enc, fullgraph=True)(q, k, pos), enc(q, k, pos), strict=True):
        assert_close(got, want)


# --------------------------------------------------------------------------------------------------------------
# Configs


def test_reads_ernie_configs():
    want = RoPE3DConfig(head_dim=128, base=BASE, mrope_section=(20, 22, 22))
    configuration = pytest.importorskip("transformers.models.ernie4_5_vl_moe.configuration_ernie4_5_vl_moe")
    rope = {"rope_type": "default", "rope_theta": BASE, "mrope_section": [22, 22, 20]}
    text = configuration.Ernie4_5_VLMoeTextConfig(
        hidden_size=2560, num_attention_heads=20, rope_parameters=copy.deepcopy(rope)
    )  # ERNIE-4.5-VL-28B-A3B's head: 2560 / 20 = 128
    assert rope_3d_config_from_hf(text) == want  # convention from model_type "ernie4_5_vl_moe_text"
    assert RoPE3D.from_hf(text).config == want
    whole = configuration.Ernie4_5_VLMoeConfig(text_config=text.to_dict()).to_dict()
    assert rope_3d_config_from_hf(whole) == want
    # Baidu's own keys (vLLM and SGLang read them): freq_allocation = the temporal frequencies
    baidu = {"hidden_size": 2560, "num_attention_heads": 20, "rope_theta": BASE, "freq_allocation": 20}
    assert rope_3d_config_from_hf(baidu, convention="ernie") == want
    # no section at all: transformers' default [22, 22, 20]
    assert rope_3d_config_from_hf({**baidu, "freq_allocation": None}, convention="ernie") == want


@pytest.mark.parametrize(
    "config",
    [
        RoPE3DConfig(head_dim=128, base=BASE, mrope_section=(20, 22, 22)),
        RoPE3DConfig(head_dim=16, base=1e4, mrope_section=(2, 3, 3)),
        RoPE3DConfig(head_dim=32),
    ],
)
def test_round_trip(config):
    written = rope_3d_config_to_hf(config, convention="ernie")
    assert written["rope_parameters"]["mrope_section"][-1] == config.mrope_section[0]  # ERNIE writes [h, w, t]
    assert rope_3d_config_from_hf(written, convention="ernie") == config
    assert RoPE3D.from_config(config).to_hf(convention="ernie") == written
    configuration = pytest.importorskip("transformers.models.ernie4_5_vl_moe.configuration_ernie4_5_vl_moe")
    text = configuration.Ernie4_5_VLMoeTextConfig(hidden_size=64, num_attention_heads=2, **copy.deepcopy(written))
    assert rope_3d_config_from_hf(text) == config


@pytest.mark.parametrize(
    ("config", "convention", "match"),
    [
        ({"head_dim": 16, "rope_parameters": {"rope_type": "yarn", "factor": 2.0}}, "ernie", "rope_type"),
        ({"head_dim": 16, "rope_parameters": {"mrope_section": [3, 2, 3]}}, "ernie", "mrope_section"),
        ({"head_dim": 16, "rope_parameters": {"mrope_section": [2, 2, 4]}}, None, "convention"),
        ({"head_dim": 16, "rope_parameters": {"mrope_section": [2, 2, 4]}}, "qwen", "convention"),
    ],
)
def test_bad_hf_configs(config, convention, match):
    with pytest.raises(ValueError, match=match):
        rope_3d_config_from_hf(config, convention=convention)


def test_writes_only_the_interleaved_layout():
    with pytest.raises(ValueError, match="layout"):
        rope_3d_config_to_hf(RoPE3DConfig(head_dim=16, layout="half"), convention="ernie")
    with pytest.raises(ValueError, match="convention"):
        rope_3d_config_to_hf(RoPE3DConfig(head_dim=16), convention="qwen")


def test_config_round_trip_and_defaults():
    config = RoPE3DConfig(head_dim=128, base=BASE, mrope_section=[20, 22, 22])
    assert config.mrope_section == (20, 22, 22)
    assert RoPE3DConfig.from_dict(config.to_dict()) == config
    assert RoPE3D.from_config(config.to_dict()).config == config
    assert RoPE3D(128).config.mrope_section == (20, 22, 22)  # ERNIE-4.5-VL's
    assert RoPE3D(16).config.mrope_section == (4, 2, 2)
    assert RoPE3D(16, mrope_section=(2, 3, 3)).streams == (1, 2, 1, 2, 1, 2, 0, 0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(head_dim=15), "head_dim"),
        (dict(head_dim=16, mrope_section=(2, 4, 2)), "mrope_section"),  # height != width
        (dict(head_dim=16, mrope_section=(2, 3, 2)), "mrope_section"),
        (dict(head_dim=16, mrope_section=(4, 2)), "mrope_section"),
        (dict(head_dim=16, mrope_section=(4.0, 2, 2)), "mrope_section"),
        (dict(head_dim=16, base=0.5), "base"),
        (dict(head_dim=16, layout="neox"), "layout"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RoPE3D(**kwargs)


def test_bad_positions():
    enc = RoPE3D(16)
    q, k = qk(16, s=5)
    with pytest.raises(ValueError, match=r"^positions\.shape.*\[temporal, height, width\]"):
        enc(q, k, torch.zeros(4, 2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^positions\.dtype"):
        enc(q, k, torch.zeros(3, 2, 5, dtype=torch.bool))
