"""Bailing's M-RoPE (Ling / Ming ``bailing_moe_v3``) is ``RoPE3D`` (ERNIE-4.5-VL's 3-D RoPE) with its sections written
``[t, h, w]``: posenc against vLLM's ``BailingMRotaryEmbedding`` written out in float64, SGLang's reordering onto
ERNIE's rotation, transformers 5.24's ``bailing_hybrid`` (text only: it has no M-RoPE), and Bailing configs read and
written.

transformers has no Bailing M-RoPE: ``bailing_hybrid`` (Ling 3's text model) rotates MLA's ``qk_rope_head_dim``
channels by one position per token (``BailingHybridRotaryEmbedding`` + ``apply_rotary_pos_emb_interleave``), which
``test_text_tokens_are_transformers_bailing_hybrid`` checks against the equal-stream case.

Tolerances as in ``test_rope_3d.py`` (``tests/tolerances.py``).
"""

import copy

import pytest
import torch
from torch.testing import assert_close

import posenc
from multistream_cases import qk, x_max
from posenc import RoPE3D, RoPE3DConfig
from posenc.hf import rope_3d_config_from_hf, rope_3d_config_to_hf
from reference import bailing_mrope as bailing
from reference import ernie_rope as ernie
from tolerances import hf_rope_table_atol, rope_rotation_atol, rope_table_atol

MAX_POSITION = 4096
BASE = 6e6  # Ling's rope_theta (transformers' BailingHybridConfig default, vLLM's Bailing M-RoPE test)
# (qk_rope_head_dim, Bailing's mrope_section [t, h, w]): vLLM's test's [8, 12, 12] over 64, smaller, no time.
SECTIONS = [(64, [8, 12, 12]), (32, [4, 6, 6]), (16, [2, 3, 3]), (16, [0, 4, 4]), (16, [6, 1, 1])]
#: A Bailing config as vLLM's test of its factory writes it: partial_rotary_factor in both dicts, ignored.
CONFIG = {
    "model_type": "bailing_moe_v3",
    "qk_rope_head_dim": 64,
    "head_dim": 128,
    "max_position_embeddings": 128,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 6_000_000,
        "partial_rotary_factor": 0.5,
        "mrope_section": [8, 12, 12],
    },
    "rope_scaling": {"partial_rotary_factor": 0.5},
}


def _positions(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    """(3, B, S) [temporal, height, width]; height and width centred on the image (negative ones included)."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.randint(0, MAX_POSITION, (1, batch, length), generator=gen)
    return torch.cat((t, t + torch.randint(-40, 40, (2, batch, length), generator=gen)))


@pytest.mark.parametrize(("head_dim", "section"), SECTIONS)
@pytest.mark.parametrize("batched", [True, False])
def test_matches_vllm_in_float64(head_dim, section, batched):
    q, k = qk(head_dim)
    pos = _positions(2, q.shape[2])
    if not batched:
        pos = pos[:, 0]
    got_q, got_k = RoPE3D(head_dim, base=BASE, mrope_section=tuple(section))(q, k, pos)
    cos, sin = bailing.vllm_cos_sin(pos, head_dim, BASE, section)
    atol = rope_rotation_atol(rope_table_atol(MAX_POSITION + 40), x_max(q, k))
    assert_close(got_q.double(), ernie.rotate_pairs(q, cos, sin), rtol=0, atol=atol)
    assert_close(got_k.double(), ernie.rotate_pairs(k, cos, sin), rtol=0, atol=atol)


@pytest.mark.parametrize(("head_dim", "section"), [s for s in SECTIONS if s[1][0] > 0])
def test_is_ernies_rotation_with_the_sections_reordered(head_dim, section):
    """SGLang's reading: Bailing's [t, h, w] is ERNIE's [h, w, t] -- the same tables, bit for bit, in float64."""
    pos = _positions(2, 7)
    want = ernie.vllm_cos_sin(pos, head_dim, BASE, bailing.sglang_ernie_section(section))
    for got, w in zip(bailing.vllm_cos_sin(pos, head_dim, BASE, section), want, strict=True):
        assert_close(got, w, rtol=0, atol=0)
    assert RoPE3D(head_dim, mrope_section=tuple(section)).config == rope_3d_config_from_hf(
        {"head_dim": head_dim, "rope_parameters": {"mrope_section": bailing.sglang_ernie_section(section)}},
        convention="ernie",
    )


def test_text_tokens_are_vllms_one_dimensional_path():
    """vLLM takes 1-D positions for text as the plain cache rows: RoPE3D with three equal streams."""
    q, k = qk(64)
    pos = torch.randint(0, MAX_POSITION, (q.shape[2],))
    cos, sin = bailing.vllm_cos_sin(pos, 64, BASE, [8, 12, 12])
    got, _ = RoPE3D(64, base=BASE, mrope_section=(8, 12, 12))(q, k, pos.expand(3, -1))
    atol = rope_rotation_atol(rope_table_atol(MAX_POSITION), x_max(q, k))
    assert_close(got.double(), ernie.rotate_pairs(q, cos, sin), rtol=0, atol=atol)


def test_text_tokens_are_transformers_bailing_hybrid():
    """transformers 5.24's ``bailing_hybrid`` (no M-RoPE): its interleaved MLA rotation of text tokens, whose output
    lists the rotated pairs' first channels, then their second (DeepSeek's de-interleaved order)."""
    modeling = pytest.importorskip("transformers.models.bailing_hybrid.modeling_bailing_hybrid")
    configuration = pytest.importorskip("transformers.models.bailing_hybrid.configuration_bailing_hybrid")
    config = configuration.BailingHybridConfig(qk_rope_head_dim=64, num_hidden_layers=1)
    rotary = modeling.BailingHybridRotaryEmbedding(config)
    q, k = qk(64)
    pos = torch.randint(0, MAX_POSITION, (2, q.shape[2]))
    cos, sin = rotary(q, pos)
    want_q, want_k = modeling.apply_rotary_pos_emb_interleave(q, k, cos, sin)
    enc = RoPE3D(64, base=config.rope_parameters["rope_theta"], mrope_section=(8, 12, 12))
    got_q, got_k = enc(q, k, pos.expand(3, -1, -1))
    to_half = torch.cat((torch.arange(0, 64, 2), torch.arange(1, 64, 2)))
    table_atol = hf_rope_table_atol(MAX_POSITION, BASE)
    assert_close(got_q[..., to_half], want_q, rtol=0, atol=rope_rotation_atol(table_atol, x_max(q)))
    assert_close(got_k[..., to_half], want_k, rtol=0, atol=rope_rotation_atol(table_atol, x_max(k)))


def test_through_attention_with_negative_positions():
    enc = posenc.build("rope_3d", head_dim=64, base=BASE, mrope_section=(8, 12, 12))
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, h, 12, 64, generator=gen) for h in (4, 2, 2))
    t = torch.arange(12).expand(1, 2, -1)
    pos = torch.cat((t, t + torch.randint(-8, 8, (2, 2, 12), generator=gen)))  # an image at the start: centred h, w
    assert bool((pos < 0).any())
    out = posenc.attention(q, k, v, encoding=enc, q_positions=pos, backend="eager")
    rq, rk = enc.rotate(q, k, pos, pos)
    assert_close(out, posenc.attention(rq, rk, v, backend="eager"), rtol=0, atol=0)


# --------------------------------------------------------------------------------------------------------------
# Configs


def test_reads_bailing_configs_as_vllm_does():
    want = RoPE3DConfig(head_dim=64, base=6e6, mrope_section=(8, 12, 12))
    assert rope_3d_config_from_hf(CONFIG) == want  # convention from model_type "bailing_moe_v3"
    assert rope_3d_config_from_hf(CONFIG, convention="bailing") == want
    assert RoPE3D.from_hf(CONFIG).config == want
    vl = {"model_type": "bailing_moe_v3_vl", "text_config": {k: v for k, v in CONFIG.items() if k != "model_type"}}
    assert rope_3d_config_from_hf(vl) == want
    # vLLM's reading of the same dict gives the same section and base
    rope = bailing.vllm_rope_parameters(CONFIG)
    assert (rope["rope_type"], rope["rope_theta"], rope["mrope_section"]) == ("default", 6e6, [8, 12, 12])
    assert "partial_rotary_factor" not in rope
    # a released-style rope_scaling carrying the section and the legacy "type" key
    legacy = {
        "qk_rope_head_dim": 64,
        "rope_theta": 6e6,
        "rope_scaling": {"type": "default", "mrope_section": [8, 12, 12]},
    }
    assert rope_3d_config_from_hf(legacy, convention="bailing") == want


@pytest.mark.parametrize(("head_dim", "section"), SECTIONS)
def test_round_trip_through_vllms_reading(head_dim, section):
    config = RoPE3DConfig(head_dim=head_dim, base=BASE, mrope_section=tuple(section))
    written = rope_3d_config_to_hf(config, convention="bailing")
    assert written["rope_parameters"]["mrope_section"] == section  # Bailing writes [t, h, w]
    assert rope_3d_config_from_hf(written, convention="bailing") == config
    assert RoPE3D.from_config(config).to_hf(convention="bailing") == written
    rope = bailing.vllm_rope_parameters(copy.deepcopy(written))
    pos = _positions(2, 5)
    cos, _ = bailing.vllm_cos_sin(pos, written["qk_rope_head_dim"], rope["rope_theta"], rope["mrope_section"])
    got, _ = RoPE3D.from_config(config).cos_sin(pos)
    assert_close(got.double(), cos, rtol=0, atol=rope_table_atol(MAX_POSITION + 40))


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (
            {
                "qk_rope_head_dim": 64,
                "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "mrope_section": [8, 12, 12]},
            },
            "rope_type",
        ),
        ({"qk_rope_head_dim": 64, "rope_parameters": {"mrope_section": [8, 14, 10]}}, "mrope_section"),
        ({"qk_rope_head_dim": 64, "rope_parameters": {"rope_type": "default"}}, "mrope_section"),
        ({"rope_parameters": {"mrope_section": [8, 12, 12]}}, "qk_rope_head_dim"),
    ],
)
def test_bad_bailing_configs(config, match):
    with pytest.raises(ValueError, match=match):
        rope_3d_config_from_hf(config, convention="bailing")
