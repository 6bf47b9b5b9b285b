"""MRoPE against Hugging Face's Qwen2-VL (and Qwen3-VL interleaved) rotary embedding, plus its properties."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from posenc.encodings.mrope import MRoPE, MRoPEConfig
from posenc.encodings.rotary import RotaryEmbedding
from posenc.functional.mrope import mrope_angles, mrope_cos_sin, mrope_streams
from posenc.functional.rope import default_inv_freq, rope_angles

qwen2_vl = pytest.importorskip("transformers.models.qwen2_vl.modeling_qwen2_vl")
qwen2_vl_config = pytest.importorskip("transformers.models.qwen2_vl.configuration_qwen2_vl")

MAX_POSITION = 512
# (head_dim, mrope_section): Qwen2-VL's (16, 24, 24) and smaller heads with uneven sections.
SECTIONS = [(128, (16, 24, 24)), (64, (8, 12, 12)), (16, (2, 3, 3)), (32, (10, 4, 2))]


def _hf_rotate(rotary_embedding, q, k, q_pos, k_pos):
    """HF's path: cos/sin from the model's rotary embedding, then ``apply_rotary_pos_emb`` (unsqueeze over heads)."""
    cos, sin = rotary_embedding(q, q_pos)  # (B, S, D)
    q_out, _ = qwen2_vl.apply_rotary_pos_emb(q, q, cos, sin)
    cos, sin = rotary_embedding(k, k_pos)  # (B, T, D)
    k_out, _ = qwen2_vl.apply_rotary_pos_emb(k, k, cos, sin)
    return q_out, k_out


def _qwen2_vl_rope(head_dim, base, section):
    config = qwen2_vl_config.Qwen2VLTextConfig(
        hidden_size=2 * head_dim,  # Qwen2-VL derives head_dim = hidden_size // num_attention_heads
        num_attention_heads=2,
        num_key_value_heads=1,
        num_hidden_layers=1,
        rope_parameters={"rope_type": "default", "rope_theta": base, "mrope_section": list(section)},
    )
    return qwen2_vl.Qwen2VLRotaryEmbedding(config)


def _three_streams(batch: int, length: int) -> torch.Tensor:
    """Random [temporal, height, width] positions, shape (3, B, S), all below MAX_POSITION."""
    return torch.randint(0, MAX_POSITION, (3, batch, length))


def _hf_tolerance(*tensors: torch.Tensor) -> dict:
    # HF rounds angles to float32 (position * float32 inv_freq); posenc computes them in float64.
    biggest = max(float(t.abs().max()) for t in tensors)
    return dict(rtol=1e-5, atol=4 * MAX_POSITION * 2**-24 * biggest)


@pytest.mark.parametrize(("head_dim", "section"), SECTIONS)
@pytest.mark.parametrize("base", [10000.0, 1e6])
@pytest.mark.parametrize("batched", [True, False])
def test_matches_qwen2_vl(head_dim, section, base, batched):
    b, s, t = 2, 9, 11
    q = torch.randn(b, 2, s, head_dim)
    k = torch.randn(b, 1, t, head_dim)
    q_pos, k_pos = _three_streams(b, s), _three_streams(b, t)
    if not batched:  # (3, S): one set of positions shared by the batch
        q_pos, k_pos = q_pos[:, 0], k_pos[:, 0]
    got_q, got_k = MRoPE(head_dim, base=base, mrope_section=section)(q, k, q_pos, k_pos)
    # HF takes (3, B, S) position_ids.
    hf_q_pos, hf_k_pos = (p if batched else p[:, None].expand(3, b, -1) for p in (q_pos, k_pos))
    want_q, want_k = _hf_rotate(_qwen2_vl_rope(head_dim, base, section), q, k, hf_q_pos, hf_k_pos)
    assert_close(got_q, want_q, **_hf_tolerance(q))
    assert_close(got_k, want_k, **_hf_tolerance(k))


@pytest.mark.parametrize("order", [(1, 0, 2), (0, 2, 1), (2, 1, 0)])
def test_hf_comparison_catches_swapped_streams(order):
    """At the tolerance used against HF, feeding the streams in the wrong order must fail."""
    q, k = torch.randn(1, 2, 9, 16), torch.randn(1, 1, 9, 16)
    pos = _three_streams(1, 9)
    want_q, _ = _hf_rotate(_qwen2_vl_rope(16, 10000.0, (2, 3, 3)), q, k, pos, pos)
    wrong_q, _ = MRoPE(16, mrope_section=(2, 3, 3))(q, k, pos[list(order)])
    with pytest.raises(AssertionError):
        assert_close(wrong_q, want_q, **_hf_tolerance(q))


@pytest.mark.parametrize(("head_dim", "section"), [(128, (24, 20, 20)), (32, (6, 5, 5)), (16, (4, 2, 2))])
def test_interleaved_sections_match_qwen3_vl(head_dim, section):
    qwen3_vl = pytest.importorskip("transformers.models.qwen3_vl.modeling_qwen3_vl")
    qwen3_vl_config = pytest.importorskip("transformers.models.qwen3_vl.configuration_qwen3_vl")
    config = qwen3_vl_config.Qwen3VLTextConfig(
        head_dim=head_dim,
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_hidden_layers=1,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 5e5,
            "mrope_section": list(section),
            "mrope_interleaved": True,
        },
    )
    b, s = 2, 13
    q, k = torch.randn(b, 2, s, head_dim), torch.randn(b, 1, s, head_dim)
    pos = _three_streams(b, s)
    got_q, got_k = MRoPE(head_dim, base=5e5, mrope_section=section, interleaved_sections=True)(q, k, pos)
    want_q, want_k = _hf_rotate(qwen3_vl.Qwen3VLTextRotaryEmbedding(config), q, k, pos, pos)
    assert_close(got_q, want_q, **_hf_tolerance(q))
    assert_close(got_k, want_k, **_hf_tolerance(k))


@pytest.mark.parametrize(("head_dim", "section"), SECTIONS)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("interleaved_sections", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_equal_streams_are_plain_rope(head_dim, section, layout, interleaved_sections, dtype):
    if interleaved_sections:
        f = head_dim // 2
        section = (f - 2 * (f // 3), f // 3, f // 3)  # a split the interleaved layout can realise
    b, s = 2, 6
    q, k = torch.randn(b, 4, s, head_dim).to(dtype), torch.randn(b, 2, s, head_dim).to(dtype)
    text = torch.randint(0, 100_000, (b, s))
    mrope = MRoPE(head_dim, base=1e6, mrope_section=section, layout=layout, interleaved_sections=interleaved_sections)
    rope = RotaryEmbedding(head_dim, base=1e6, layout=layout)
    got = mrope(q, k, text.expand(3, b, s))
    want = rope(q, k, text)
    assert_close(got[0], want[0], rtol=0, atol=0)
    assert_close(got[1], want[1], rtol=0, atol=0)
    got = mrope(q, k, text[0].expand(3, s))  # (3, S) against (S,)
    want = rope(q, k, text[0])
    assert_close(got[0], want[0], rtol=0, atol=0)
    assert_close(got[1], want[1], rtol=0, atol=0)


def test_each_frequency_uses_its_streams_position():
    """Angles from the formula: frequency f in section j is position[j] * inv_freq[f]."""
    section, head_dim = (3, 2, 3), 16
    pos = torch.tensor([[5, 70, 900], [1, 2, 3], [40_000, 7, 0]])  # (3, S)
    inv_freq = default_inv_freq(head_dim)
    per_stream = rope_angles(pos, inv_freq)  # (3, S, F)
    want = torch.cat((per_stream[0, :, :3], per_stream[1, :, 3:5], per_stream[2, :, 5:]), dim=-1)  # (S, F)
    assert_close(mrope_angles(pos, inv_freq, mrope_section=section), want, rtol=0, atol=0)
    cos, sin = mrope_cos_sin(pos, inv_freq, mrope_section=section, dtype=torch.float64)
    assert_close(cos, want.cos(), rtol=0, atol=0)
    assert_close(sin, want.sin(), rtol=0, atol=0)
    assert mrope_streams((24, 20, 20), interleaved=True).tolist() == [0, 1, 2] * 20 + [0] * 4


@given(
    section=st.sampled_from([(2, 3, 3), (1, 1, 2), (4, 0, 2), (3, 2, 2)]),
    interleaved_sections=st.booleans(),
    positions=st.lists(st.tuples(*(st.integers(0, 400),) * 3), min_size=1, max_size=5),
    seed=st.integers(0, 2**16),
)
def test_layouts_equal_up_to_channel_permutation(section, interleaved_sections, positions, seed):
    head_dim = 2 * sum(section)
    try:
        kw = dict(mrope_section=section, interleaved_sections=interleaved_sections)
        interleaved, half = MRoPE(head_dim, layout="interleaved", **kw), MRoPE(head_dim, layout="half", **kw)
    except ValueError:  # a section the interleaved frequency split cannot realise
        return
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 2, len(positions), head_dim, dtype=torch.float64, generator=gen)
    pos = torch.tensor(positions).T  # (S, 3) -> (3, S)
    to_half = torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))
    assert_close(half.rotate_one(x[..., to_half], pos), interleaved.rotate_one(x, pos)[..., to_half])


@given(
    positions=st.lists(st.tuples(*(st.integers(0, 300),) * 3), min_size=2, max_size=6),
    shift=st.tuples(*(st.integers(-1000, 1000),) * 3),
    interleaved_sections=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_scores_depend_on_per_stream_distance_only(positions, shift, interleaved_sections, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, len(positions), 16, dtype=torch.float64, generator=gen)
    k = torch.randn(1, 1, len(positions), 16, dtype=torch.float64, generator=gen)
    pos = torch.tensor(positions).T  # (S, 3) -> (3, S)
    enc = MRoPE(16, mrope_section=(4, 2, 2), interleaved_sections=interleaved_sections)
    q0, k0 = enc(q, k, pos)
    q1, k1 = enc(q, k, pos + torch.tensor(shift)[:, None])
    assert_close(q1 @ k1.mT, q0 @ k0.mT, rtol=1e-9, atol=1e-9)  # (1, 1, S, S) scores


def test_key_positions_default_to_query_positions():
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    pos = _three_streams(2, 5)
    enc = MRoPE(16, mrope_section=(2, 3, 3))
    got, want = enc(q, k, pos), enc.rotate(q, k, pos, pos)
    assert_close(got[0], want[0], rtol=0, atol=0)
    assert_close(got[1], want[1], rtol=0, atol=0)


def test_config_round_trip():
    config = MRoPEConfig(head_dim=128, base=1e6, mrope_section=[24, 20, 20], interleaved_sections=True)
    assert config.mrope_section == (24, 20, 20)
    assert config.to_dict()["mrope_section"] == [24, 20, 20]
    assert MRoPEConfig.from_dict(config.to_dict()) == config
    assert MRoPE.from_config(config.to_dict()).config == config
    assert MRoPE.from_config(config).config == config


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(head_dim=127), "head_dim"),
        (dict(head_dim=-2), "head_dim"),
        (dict(head_dim=64, mrope_section=(16, 24, 24)), "mrope_section"),  # sums to 64, not 32
        (dict(head_dim=16, mrope_section=(2, 3, 4)), "mrope_section"),
        (dict(head_dim=16, mrope_section=(8,)), "mrope_section"),
        (dict(head_dim=16, mrope_section=(2, 3, 3, 0)), "mrope_section"),
        (dict(head_dim=16, mrope_section=(-1, 5, 4)), "mrope_section"),
        (dict(head_dim=16, mrope_section=(2.0, 3, 3)), "mrope_section"),
        (dict(head_dim=16, mrope_section="233"), "mrope_section"),
        (dict(head_dim=128, interleaved_sections=True), "mrope_section"),  # (16, 24, 24) cannot interleave
        (dict(head_dim=16, mrope_section=(2, 3, 3), interleaved_sections=1), "interleaved_sections"),
        (dict(head_dim=16, mrope_section=(2, 3, 3), base=0.5), "base"),
        (dict(head_dim=16, mrope_section=(2, 3, 3), layout="neox"), "layout"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MRoPE(**kwargs)
    with pytest.raises(ValueError, match=match):
        MRoPEConfig(**kwargs)


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match="rope_theta"):
        MRoPEConfig.from_dict({"head_dim": 128, "rope_theta": 1e6})


def test_bad_inputs():
    enc = MRoPE(16, mrope_section=(2, 3, 3))
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 6, 16)
    pos, k_pos = _three_streams(2, 5), _three_streams(2, 6)
    with pytest.raises(ValueError, match=r"^positions\.shape"):
        enc(q, k, torch.arange(5), k_pos)  # (S,): one stream only
    with pytest.raises(ValueError, match=r"^positions\.shape"):
        enc(q, k, torch.zeros(2, 5, dtype=torch.long), k_pos)  # (B, S) is not (3, S)
    with pytest.raises(ValueError, match=r"^positions\.shape"):
        enc(q, k, _three_streams(2, 4), k_pos)
    with pytest.raises(ValueError, match=r"^positions\.shape"):
        enc(q, k, _three_streams(3, 5), k_pos)  # batch 3 against B = 2
    with pytest.raises(ValueError, match=r"^k_positions\.shape"):
        enc(q, k, pos, pos)
    with pytest.raises(ValueError, match=r"^k_positions=None .*6 positions and q 5"):
        enc(q, k, pos)  # T = 6 keys, positions for 5
    with pytest.raises(ValueError, match=r"^q\.shape\[-1\]=32 "):
        enc(torch.randn(2, 4, 5, 32), torch.randn(2, 2, 6, 32), pos, k_pos)
    with pytest.raises(ValueError, match=r"^q\.dim\(\)"):
        enc(q[0], k, pos, k_pos)
    with pytest.raises(ValueError, match=r"^k\.shape\[0\]"):
        enc(q, k[:1], pos, k_pos)
    with pytest.raises(ValueError, match=r"^positions\.dtype"):
        enc(q, k, pos.bool(), k_pos)


def test_functional_bad_inputs():
    inv_freq = default_inv_freq(16)
    with pytest.raises(ValueError, match=r"^positions\.shape"):
        mrope_cos_sin(torch.zeros(2, 4), inv_freq, mrope_section=(2, 3, 3))
    with pytest.raises(ValueError, match=r"^inv_freq\.shape"):
        mrope_cos_sin(torch.zeros(3, 4), inv_freq, mrope_section=(2, 3, 2))
    with pytest.raises(ValueError, match="mrope_section"):
        mrope_angles(torch.zeros(3, 4), inv_freq, mrope_section=(2, 3))
    with pytest.raises(ValueError, match="mrope_section"):
        mrope_streams((16, 24, 24), interleaved=True)


@pytest.mark.parametrize("interleaved_sections", [False, True])
def test_compiles_without_graph_breaks(interleaved_sections):
    q, k = torch.randn(2, 4, 8, 16), torch.randn(2, 2, 8, 16)
    pos = _three_streams(2, 8)
    enc = MRoPE(16, mrope_section=(4, 2, 2), interleaved_sections=interleaved_sections)
    got_q, got_k = torch.compile(enc, fullgraph=True)(q, k, pos)
    want_q, want_k = enc(q, k, pos)
    assert_close(got_q, want_q)
    assert_close(got_k, want_k)


@pytest.mark.parametrize(
    ("head_dim", "section"), [(128, (16, 24, 24)), (64, (8, 12, 12)), (16, (2, 3, 3)), (8, (2, 1, 1))]
)
def test_default_section_takes_qwen2_vl_proportions(head_dim, section):
    assert MRoPE(head_dim).config.mrope_section == section
