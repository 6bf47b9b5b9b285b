"""The vLLM reader (issues 48, 68): per rope type and config generation, the reader's frequencies and attention factor
equal vLLM 0.33.0's classes (the release on PyPI; its wheel's ``vllm/model_executor/layers/rotary_embedding/*.py``)
written out in float64 (``tests/reference/vllm_rope_scaling.py``, which names the files) on full tensors; the model
files' per-layer rules (Gemma 3/4, Llama 4, gpt-oss, DeepSeek, Qwen2 dual chunk); the default ``max_model_len``;
and the traps the issue lists, each with a fixture the view must flag.

vLLM is not installed here (its rope modules import its custom-op and platform code, and ``DualChunkRotaryEmbedding``
builds its tables on CUDA), so the references stand in for it. Both sides compute in float64 from the same formulas in
possibly different operation orders: frequencies within a few float64 roundings (``ulps(8, float64)``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

import posenc  # noqa: E402
from posenc.runtimes import Source, read  # noqa: E402
from reference import vllm_rope_scaling as ref  # noqa: E402
from tolerances import ulps  # noqa: E402

F64 = ulps(8, torch.float64)
THETA = 500000.0
HEAD = 64  # hidden_size 256 over 4 heads

LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "intermediate_size": 512,
    "max_position_embeddings": 4096,
    "vocab_size": 128,
}


def folder(tmp_path: Path, config: dict, name: str = "model") -> Path:
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return path


def legacy(rope: dict | None, **extra) -> dict:
    """A transformers-4 config: ``rope_theta`` and ``rope_scaling`` at the top level."""
    return {**LLAMA, "rope_theta": THETA, "rope_scaling": rope, **extra}


def modern(rope: dict | None, **extra) -> dict:
    """A transformers-5 config: everything in ``rope_parameters``."""
    return {**LLAMA, "rope_parameters": {**(rope or {"rope_type": "default"}), "rope_theta": THETA}, **extra}


PHI_SHORT = [1.0 + 0.05 * i for i in range(HEAD // 2)]
PHI_LONG = [2.0 + 0.5 * i for i in range(HEAD // 2)]

#: (id, rope dict, reference(dim, base), default max_model_len, rows of the cos/sin table)
CASES = [
    ("default", None, lambda d, b: ref.default(d, b), 4096, 4096),
    ("linear", {"rope_type": "linear", "factor": 4.0}, lambda d, b: ref.linear(d, b, 4.0), 16384, 16384),
    ("dynamic", {"rope_type": "dynamic", "factor": 4.0}, lambda d, b: ref.dynamic_ntk(d, b, 4.0, 4096), 16384, 4096),
    (
        "dynamic-trained",
        {"rope_type": "dynamic", "factor": 2.0, "max_trained_positions": 1024},
        lambda d, b: ref.dynamic_ntk(d, b, 2.0, 4096, 1024),
        8192,
        4096,
    ),
    (
        "ntk-alpha",
        {"type": "dynamic", "alpha": 1000.0, "factor": 1.0, "beta_fast": 32, "beta_slow": 1},
        lambda d, b: ref.ntk_alpha(d, b, 1000.0),
        4096,
        4096,
    ),
    ("ntk-fixed", {"rope_type": "ntk", "factor": 4.0}, lambda d, b: ref.ntk(d, b, 4.0, None), 16384, 4096),
    (
        "ntk-mixed",
        {"rope_type": "ntk", "factor": 4.0, "mixed_b": 0.625},
        lambda d, b: ref.ntk(d, b, 4.0, 0.625),
        16384,
        4096,
    ),
    (  # vLLM 0.33.0 takes YaRN's max_position_embeddings as scaled already: max_model_len 4096, no factor
        "yarn",
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
        lambda d, b: ref.yarn_release(d, b, 4.0, 1024),
        4096,
        4096,
    ),
    (
        "yarn-keys",
        {
            "rope_type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 2048,
            "beta_fast": 16,
            "beta_slow": 2,
            "truncate": False,
            "attention_factor": 0.8,
        },
        lambda d, b: ref.yarn_release(d, b, 8.0, 2048, beta_fast=16, beta_slow=2, truncate=False, attention_factor=0.8),
        4096,
        16384,
    ),
    (
        "yarn-mscale",
        {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 1024, "mscale": 1.0,
         "mscale_all_dim": 0.5},
        lambda d, b: ref.yarn_release(d, b, 8.0, 1024, mscale=1.0, mscale_all_dim=0.5),
        4096,
        8192,
    ),
    (
        "llama3",
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 1024,
        },
        lambda d, b: ref.llama3(d, b, 8.0, 1.0, 4.0, 1024),
        4096,
        4096,
    ),
    (
        "longrope",
        {
            "rope_type": "longrope",
            "short_factor": PHI_SHORT,
            "long_factor": PHI_LONG,
            "original_max_position_embeddings": 1024,
        },
        lambda d, b: ref.longrope(d, b, PHI_SHORT, 4096, 1024),
        1024,  # vLLM defaults max_model_len to original_max_position_embeddings
        1024,
    ),
    (  # patch_legacy_rope_type (vLLM 0.33.0): plain YaRN with attention_factor 0.07 ln s + 1; no original length:
        #  transformers fills it with max_position_embeddings
        "telechat3",
        {"rope_type": "telechat3-yarn", "factor": 4.0},
        lambda d, b: ref.yarn_release(d, b, 4.0, 4096, attention_factor=0.07 * math.log(4.0) + 1.0),
        4096,
        16384,
    ),
]


def _layer(view):
    assert view.refused is None, view.refused
    assert len(view.layers) == LLAMA["num_hidden_layers"]
    assert all(layer is view.layers[0] for layer in view.layers)
    return view.layers[0]


@pytest.mark.parametrize("form", [legacy, modern], ids=["rope_scaling", "rope_parameters"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_frequencies_factor_and_context_match_vllm(tmp_path, case, form):
    """Both config generations read to vLLM's own frequencies and attention factor, on the whole (F,) tensor."""
    _, rope, reference, context, table = case
    config = form(rope)
    if case[0] == "longrope":  # Phi-3 keeps its original length at the top level
        config["original_max_position_embeddings"] = 1024
    view = read(folder(tmp_path, config), "vllm")
    layer = _layer(view)
    want, want_factor = reference(HEAD, THETA)
    assert layer.inv_freq.dtype == torch.float64 and layer.inv_freq.shape == (HEAD // 2,)
    torch.testing.assert_close(layer.inv_freq, want, **F64)
    assert layer.attention_factor == pytest.approx(want_factor, rel=1e-14)
    assert (layer.rotary_dim, layer.layout) == (HEAD, "half")
    assert view.context == context
    assert layer.params["table_positions"] == table
    assert ("table holds" in " ".join(view.notes)) == (table < context)
    assert view.follows.startswith("vllm 0.33.0 (wheel on PyPI)") and view.version == "vLLM 0.33.0"


def test_partial_rotary_and_cos_sin_tables(tmp_path):
    """``partial_rotary_factor`` halves the rotary dims; the cos/sin rows built from the view equal vLLM's linear
    cache (positions over the factor) and YaRN cache (times mscale)."""
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024, "partial_rotary_factor": 0.5}
    layer = _layer(read(folder(tmp_path, modern(rope)), "vllm"))
    want, factor = ref.yarn(HEAD // 2, THETA, 4.0, 1024)
    assert layer.rotary_dim == HEAD // 2
    torch.testing.assert_close(layer.inv_freq, want, **F64)
    t = torch.arange(4096, dtype=torch.float64)
    cos, sin = ref.cos_sin(t, layer.inv_freq, layer.attention_factor)
    want_cos, want_sin = ref.cos_sin(t, want, factor)
    torch.testing.assert_close(cos, want_cos, rtol=0, atol=1e-12)
    torch.testing.assert_close(sin, want_sin, rtol=0, atol=1e-12)

    linear = _layer(read(folder(tmp_path, legacy({"rope_type": "linear", "factor": 4.0}), "lin"), "vllm"))
    vllm_angles = (t / 4.0).unsqueeze(-1) * ref.default(HEAD, THETA)[0]  # LinearScalingRotaryEmbedding's cache
    torch.testing.assert_close((t.unsqueeze(-1) * linear.inv_freq).cos(), vllm_angles.cos(), rtol=0, atol=1e-9)


# --------------------------------------------------------------------------------------------------------------
# Model files


GEMMA3 = {
    "model_type": "gemma3_text",
    "architectures": ["Gemma3ForCausalLM"],
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": HEAD,
    "num_hidden_layers": 6,
    "intermediate_size": 512,
    "max_position_embeddings": 131072,
    "vocab_size": 128,
    "sliding_window_pattern": 6,
}


def test_gemma3_per_layer_type(tmp_path):
    """Gemma 3's v4 config (``rope_scaling`` + ``rope_local_base_freq``): sliding layers at the local base unscaled,
    the full layer scaled; the context is not multiplied (vLLM skips Gemma 3)."""
    config = {**GEMMA3, "rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear",
              "factor": 8.0}}
    view = read(folder(tmp_path, config), "vllm")
    assert [layer.method for layer in view.layers] == ["default"] * 5 + ["linear"]
    torch.testing.assert_close(view.layers[0].inv_freq, ref.default(HEAD, 1e4)[0], **F64)
    torch.testing.assert_close(view.layers[5].inv_freq, ref.linear(HEAD, 1e6, 8.0)[0], **F64)
    assert view.context == 131072


def test_gemma3_flat_v5_dict_loses_the_full_layers_scaling(tmp_path):
    """Trap: a flat transformers-5 ``rope_parameters`` on Gemma 3. transformers' Gemma3TextConfig adds per-layer-type
    defaults beside it and vLLM's gemma3.py reads those: the full layers run plain RoPE, the factor is unread."""
    config = {**GEMMA3, "rope_parameters": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}
    view = read(folder(tmp_path, config), "vllm")
    assert [layer.method for layer in view.layers] == ["default"] * 6
    torch.testing.assert_close(view.layers[5].inv_freq, ref.default(HEAD, 1e6)[0], **F64)
    assert any("'factor': 8.0" in key for key in view.ignored)
    measured, _ = posenc.rope_frequencies(HEAD, base=1e6, scaling={"rope_type": "linear", "factor": 8.0})
    assert not torch.allclose(view.layers[5].inv_freq, measured.double())


def test_gemma4_proportional_full_layers(tmp_path):
    """Gemma 4: full layers at the global head size with ``proportional`` RoPE (frequencies over the head size, zeros
    past the rotating pairs, the whole head rotated); sliding layers plain."""
    config = {
        **GEMMA3,
        "model_type": "gemma4_text",
        "architectures": ["Gemma4ForCausalLM"],
        "head_dim": 32,
        "global_head_dim": 128,
    }
    config.pop("sliding_window_pattern")
    view = read(folder(tmp_path, config), "vllm")
    full = view.layers[-1]
    assert full.method == "proportional" and full.rotary_dim == 128
    torch.testing.assert_close(full.inv_freq, ref.proportional(128, 32, 1e6)[0], **F64)
    assert (full.inv_freq[16:] == 0).all() and full.params["rotating_pairs"] == 16
    torch.testing.assert_close(view.layers[0].inv_freq, ref.default(32, 1e4)[0], **F64)
    # posenc's p-RoPE for the same layer
    measured, _ = posenc.rope_frequencies(128, base=1e6, scaling={"rope_type": "proportional",
                                                                   "partial_rotary_factor": 0.25})
    torch.testing.assert_close(measured.double(), full.inv_freq, rtol=1e-6, atol=0)


def test_llama4_nope_layers_and_chunks(tmp_path):
    """Llama 4: every fourth layer has no RoPE; the others run llama3 scaling on permuted rows (interleaved)."""
    config = {
        "model_type": "llama4_text",
        "architectures": ["Llama4ForCausalLM"],
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": HEAD,
        "num_hidden_layers": 8,
        "vocab_size": 128,
        "rope_theta": THETA,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 16.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
        },
    }
    view = read(folder(tmp_path, config), "vllm")
    assert [layer.inv_freq is None for layer in view.layers] == [False, False, False, True] * 2
    rope = view.layers[0]
    assert rope.layout == "interleaved" and rope.method == "llama3"
    torch.testing.assert_close(rope.inv_freq, ref.llama3(HEAD, THETA, 16.0, 1.0, 1.0, 8192)[0], **F64)
    assert view.layers[3].method == "nope" and view.layers[3].params["attn_temperature_tuning"]
    assert any("attention_chunk_size=8192" in n for n in view.notes)


def test_gpt_oss_reads_truncate(tmp_path):
    """gpt-oss always builds YaRN from five keys and ``truncate`` (False in its config)."""
    config = {
        "model_type": "gpt_oss",
        "architectures": ["GptOssForCausalLM"],
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": HEAD,
        "num_hidden_layers": 2,
        "vocab_size": 128,
        "num_local_experts": 4,
        "rope_theta": 150000.0,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 4096,
        },
    }
    view = read(folder(tmp_path, config), "vllm")
    want, factor = ref.yarn(HEAD, 150000.0, 32.0, 4096, truncate=False)
    torch.testing.assert_close(view.layers[0].inv_freq, want, **F64)
    assert view.layers[0].attention_factor == pytest.approx(factor)
    assert view.context == 131072
    truncated, _ = ref.yarn(HEAD, 150000.0, 32.0, 4096)
    assert not torch.equal(truncated, want)


def test_deepseek_mscale_ratio(tmp_path):
    """DeepSeek V3: ``yarn`` runs as ``deepseek_yarn``: the mscale / mscale_all_dim ratio, the rope head only,
    GPT-J layout; the softmax scale times ``yarn_get_mscale(s, mscale_all_dim)**2``."""
    rope = {"type": "yarn", "factor": 40.0, "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 32,
            "beta_slow": 1, "original_max_position_embeddings": 4096}
    config = {
        "model_type": "deepseek_v3",
        "architectures": ["DeepseekV3ForCausalLM"],
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "vocab_size": 128,
        "qk_rope_head_dim": 64,
        "max_position_embeddings": 163840,
        "rope_theta": 10000.0,
        "rope_scaling": rope,
    }
    view = read(folder(tmp_path, config), "vllm")
    layer = view.layers[0]
    want, factor = ref.deepseek_yarn_release(64, 10000.0, 40.0, 4096, mscale=0.707, mscale_all_dim=1.0)
    assert (layer.method, layer.layout, layer.rotary_dim) == ("deepseek_yarn", "interleaved", 64)
    torch.testing.assert_close(layer.inv_freq, want, **F64)
    assert layer.attention_factor == pytest.approx(factor)
    assert layer.params["softmax_scale_factor"] == pytest.approx(ref.yarn_get_mscale(40.0, 1.0) ** 2)
    # posenc's YaRN with the same keys gives the same ratio
    _, measured = posenc.rope_frequencies(64, base=10000.0, scaling=rope)
    assert measured == pytest.approx(factor, rel=1e-6)


QWEN2 = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "intermediate_size": 512,
    "max_position_embeddings": 1010000,
    "vocab_size": 128,
    "rope_theta": 10000000.0,
}
DCA = {"chunk_size": 262144, "local_size": 8192, "original_max_position_embeddings": 262144}


def test_qwen2_dual_chunk_is_posenc_dca_vllm(tmp_path):
    """Qwen2 with ``dual_chunk_attention_config``: ``DualChunkRotaryEmbedding`` at plain frequencies, the rope
    scaling unread; its positions equal posenc's ``dca_vllm`` branches on full tensors."""
    from posenc.remapping.dual_chunk import VLLM_MSCALE, DualChunk

    config = {**QWEN2, "dual_chunk_attention_config": DCA, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
              "original_max_position_embeddings": 262144}}
    view = read(folder(tmp_path, config), "vllm")
    layer = view.layers[0]
    assert layer.method == "dual_chunk" and layer.length_dependent
    torch.testing.assert_close(layer.inv_freq, ref.default(HEAD, 1e7)[0], **F64)
    assert any("dual-chunk branch" in key for key in view.ignored)
    assert any(n.startswith("not verified: whether vLLM's V1 engine") for n in view.notes)
    p = layer.params
    method = DualChunk(chunk_size=p["chunk_size"], local_window=p["local_size"],
                       original_max_position_embeddings=p["original_max_position_embeddings"],
                       mscale=p["logit_mscale"])
    assert method.name == p["posenc_method"] == "dca_vllm" and method.mscale == VLLM_MSCALE
    positions = torch.cat((torch.arange(0, 600000, 997), torch.tensor([253951, 253952, 507903, 507904])))
    tables = ref.dual_chunk_positions(positions, p["chunk_size"], p["local_size"])
    intra, successive, inter = method.branches()
    torch.testing.assert_close(intra.key(positions), tables["key"])
    torch.testing.assert_close(intra.query(positions), tables["query"])
    torch.testing.assert_close(successive.query(positions), tables["query_succ"])
    torch.testing.assert_close(inter.query(positions), tables["query_inter"])


def test_qwen2_ignores_head_dim_and_llama_ignores_dual_chunk(tmp_path):
    view = read(folder(tmp_path, {**QWEN2, "head_dim": 128}), "vllm")
    assert view.layers[0].rotary_dim == HEAD and any("head_dim=128" in key for key in view.ignored)
    llama = {**LLAMA, "rope_theta": 1e7, "dual_chunk_attention_config": DCA}
    view = read(folder(tmp_path, llama, "llama"), "vllm")
    assert view.layers[0].method == "default"
    assert any(key.startswith("dual_chunk_attention_config") for key in view.ignored)


# --------------------------------------------------------------------------------------------------------------
# Traps


def test_nested_per_layer_type_dict_on_a_llama_reads_default_theta(tmp_path):
    """Trap: a transformers-5 ``rope_parameters`` nested by layer type on a model whose vLLM file passes the dict
    whole (llama.py): the layer-type entries are never read; RoPE at transformers' default θ on every layer."""
    config = {**LLAMA, "layer_types": ["sliding_attention", "full_attention"], "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": THETA},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    view = read(folder(tmp_path, config), "vllm")
    assert all(layer.method == "default" for layer in view.layers)
    torch.testing.assert_close(view.layers[1].inv_freq, ref.default(HEAD, 1e4)[0], **F64)
    assert any("reads the flat keys only" in key for key in view.ignored)


def test_yarn_without_original_length_is_flagged(tmp_path):
    """Trap: YaRN without ``original_max_position_embeddings``: transformers fills in ``max_position_embeddings``;
    vLLM 0.33.0 then ramps at 4096 and allows 4096 (its ``_get_and_verify_max_len`` takes YaRN's length as scaled
    already; 41c5903d allowed 4096 * factor)."""
    view = read(folder(tmp_path, legacy({"rope_type": "yarn", "factor": 4.0})), "vllm")
    layer = _layer(view)
    torch.testing.assert_close(layer.inv_freq, ref.yarn_release(HEAD, THETA, 4.0, 4096)[0], **F64)
    assert view.context == 4096
    assert any("without original_max_position_embeddings" in n for n in view.notes)


def test_yarn_mscale_keys_read_as_transformers_reads_them(tmp_path):
    """vLLM 0.33.0's YaRN reads DeepSeek-style ``mscale`` / ``mscale_all_dim`` (the ratio, as posenc and transformers
    do) and ``attention_factor``; ``attn_factor`` and ``extrapolation_factor``, which vLLM read up to 0.29.0, are
    unread."""
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024, "mscale": 0.707,
            "mscale_all_dim": 0.707, "attn_factor": 0.9, "extrapolation_factor": 0.5}
    view = read(folder(tmp_path, legacy(rope)), "vllm")
    want, factor = ref.yarn_release(HEAD, THETA, 4.0, 1024, mscale=0.707, mscale_all_dim=0.707)
    torch.testing.assert_close(_layer(view).inv_freq, want, **F64)
    assert _layer(view).attention_factor == pytest.approx(factor, rel=1e-14)
    assert {k.split("]")[0] for k in view.ignored} == {"rope_parameters['attn_factor'",
                                                       "rope_parameters['extrapolation_factor'"}
    hf_keys = {k: v for k, v in rope.items() if k not in ("attn_factor", "extrapolation_factor")}  # posenc refuses
    _, measured = posenc.rope_frequencies(HEAD, base=THETA, scaling=hf_keys)
    assert measured == pytest.approx(factor)


def test_ntk_means_fixed_ntk_not_posenc_ntk(tmp_path):
    """Trap: ``"ntk"`` is vLLM's fixed NTK, not posenc's NTK-aware base change: different frequencies."""
    view = read(folder(tmp_path, legacy({"rope_type": "ntk", "factor": 4.0})), "vllm")
    layer = _layer(view)
    measured, _ = posenc.rope_frequencies(HEAD, base=THETA, scaling={"rope_type": "ntk", "factor": 4.0})
    assert not torch.allclose(layer.inv_freq, measured.double(), rtol=1e-3)
    assert any("vLLM's fixed NTK" in n for n in view.notes)


def test_dynamic_served_static(tmp_path):
    """Trap: dynamic NTK in vLLM: one base for every length (RoPE's own), a table of max_position_embeddings rows
    under a max_model_len of factor times that; posenc's dynamic NTK changes with the length."""
    view = read(folder(tmp_path, legacy({"rope_type": "dynamic", "factor": 4.0})), "vllm")
    layer = _layer(view)
    assert not layer.length_dependent
    long, _ = posenc.rope_frequencies(HEAD, base=THETA, scaling={"rope_type": "dynamic", "factor": 4.0,
                                      "max_position_embeddings": 4096}, seq_len=16384)
    assert not torch.allclose(layer.inv_freq, long.double(), rtol=1e-3)
    notes = " ".join(view.notes)
    assert "dynamic NTK served static" in notes and "table holds 4096 positions" in notes
    # before vLLM PR #41277: static NTK at factor**2 - factor + 1
    before, _ = ref.dynamic_ntk_before_41277(HEAD, THETA, 4.0)
    assert not torch.allclose(layer.inv_freq, before)


def test_longrope_chosen_once(tmp_path):
    """LongRoPE in vLLM: the short factors at the default max_model_len, the long ones for every position once
    --max-model-len passes the original length (transformers switches per sequence)."""
    rope = {"rope_type": "longrope", "short_factor": PHI_SHORT, "long_factor": PHI_LONG,
            "original_max_position_embeddings": 1024}
    view = read(folder(tmp_path, {**legacy(rope), "original_max_position_embeddings": 1024}), "vllm")
    layer = _layer(view)
    assert not layer.length_dependent and layer.params["long_factor"] == PHI_LONG
    assert any("picks the short or the long factors once" in n for n in view.notes)


def test_unknown_rope_type_is_refused(tmp_path):
    view = read(folder(tmp_path, legacy({"rope_type": "yarn_log", "factor": 4.0})), "vllm")
    assert view.layers == () and "Unknown RoPE scaling type 'yarn_log'" in view.refused
    # transformers' validation (which vLLM runs while loading the config) refuses before get_rope would
    view = read(folder(tmp_path, legacy({"rope_type": "dynamic"}), "dyn"), "vllm")
    assert view.refused.startswith("transformers") and "'factor'" in view.refused


def test_gguf_cannot_run(tmp_path):
    """vLLM 0.33.0 has no GGUF loader (no ``gguf`` load format or quantization method in its wheel): a GGUF file is
    'cannot run this', naming the release."""
    import numpy as np

    from hf.tiny_gguf import write_gguf

    kv = {
        "llama.context_length": 64,
        "llama.embedding_length": 32,
        "llama.block_count": 2,
        "llama.feed_forward_length": 64,
        "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2,
        "llama.rope.freq_base": 10000.0,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.rope.dimension_count": 8,
    }
    path = write_gguf(tmp_path / "plain.gguf", "llama", {"token_embd.weight": np.zeros((64, 32), np.float32)}, kv=kv)
    view = read(Source.open(path), "vllm")
    assert view.layers == () and view.version == "vLLM 0.33.0"
    assert view.refused is not None and view.refused.startswith("vLLM 0.33.0 has no GGUF loader")


def test_unknown_model_type_is_not_verified(tmp_path):
    view = read(folder(tmp_path, {**LLAMA, "model_type": "my_custom_arch"}), "vllm")
    assert view.layers == () and view.refused is None and view.notes[0].startswith("not verified")


def test_context_reads_tokenizer_max_length(tmp_path):
    path = folder(tmp_path, legacy({"rope_type": "linear", "factor": 4.0}))
    (path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 2000}))
    assert read(path, "vllm").context == 8000  # min(4096, 2000) * 4
    assert math.isclose(_layer(read(path, "vllm")).params["factor"], 4.0)
