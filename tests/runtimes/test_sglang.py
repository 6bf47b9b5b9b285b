"""The SGLang reader (issue 48): per rope type and config generation, the reader's frequencies and attention factor
equal SGLang's classes written out in float64 (``tests/reference/sglang_rope.py``, which names the commits) on full
tensors; SGLang's context length; where SGLang reads a model differently from vLLM (static dynamic NTK, YaRN's mscale
ratio, defaults for missing keys, no ``"ntk"``, Qwen3 without dual chunk); and the traps, each with a fixture.

SGLang is not installed here (its rotary modules import its kernels and platform code), so the references stand in for
it: frequencies within a few float64 roundings (``ulps(8, float64)``).
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
from posenc.runtimes.sglang import sglang_get_rope  # noqa: E402
from reference import sglang_rope as ref  # noqa: E402
from runtimes.test_vllm import GEMMA3 as VLLM_GEMMA3  # noqa: E402
from tolerances import ulps  # noqa: E402

F64 = ulps(8, torch.float64)
THETA = 1000000.0
HEAD = 64

QWEN3 = {
    "model_type": "qwen3",
    "architectures": ["Qwen3ForCausalLM"],
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": HEAD,
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


def legacy(rope: dict | None, base: dict = QWEN3, **extra) -> dict:
    return {**base, "rope_theta": THETA, "rope_scaling": rope, **extra}


def modern(rope: dict | None, base: dict = QWEN3, **extra) -> dict:
    return {**base, "rope_parameters": {**(rope or {"rope_type": "default"}), "rope_theta": THETA}, **extra}


SHORT = [1.0 + 0.05 * i for i in range(HEAD // 2)]
LONG = [2.0 + 0.5 * i for i in range(HEAD // 2)]

#: (id, rope dict, reference(dim, base), SGLang's context length)
CASES = [
    ("default", None, lambda d, b: ref.default(d, b), 4096),
    ("linear", {"rope_type": "linear", "factor": 4.0}, lambda d, b: ref.linear(d, b, 4.0), 16384),
    ("dynamic", {"rope_type": "dynamic", "factor": 4.0}, lambda d, b: ref.dynamic_ntk(d, b, 4.0), 16384),
    (
        "ntk-alpha",
        {"type": "dynamic", "alpha": 1000.0, "factor": 1.0, "beta_fast": 32, "beta_slow": 1},
        lambda d, b: ref.ntk_alpha(d, b, 1000.0),
        4096,
    ),
    (
        "yarn",
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
        lambda d, b: ref.yarn(d, b, 4.0, 1024),
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
            "attn_factor": 0.9,
            "extrapolation_factor": 0.5,
        },
        lambda d, b: ref.yarn(
            d, b, 8.0, 2048, beta_fast=16, beta_slow=2, truncate=False, attn_factor=0.9, extrapolation_factor=0.5
        ),
        4096,
    ),
    (
        "yarn-mscale",
        {
            "rope_type": "yarn",
            "factor": 40.0,
            "original_max_position_embeddings": 1024,
            "mscale": 0.707,
            "mscale_all_dim": 1.0,
        },
        lambda d, b: ref.yarn(d, b, 40.0, 1024, mscale=0.707, mscale_all_dim=1.0),
        4096,
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
    ),
    (
        "longrope",
        {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG, "original_max_position_embeddings": 1024},
        lambda d, b: ref.longrope(d, b, SHORT, LONG, 4096, 1024)[0::2],
        4096,
    ),
]


@pytest.mark.parametrize("form", [legacy, modern], ids=["rope_scaling", "rope_parameters"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_frequencies_factor_and_context_match_sglang(tmp_path, case, form):
    _, rope, reference, context = case
    view = read(folder(tmp_path, form(rope)), "sglang")
    assert view.refused is None, view.refused
    layer = view.layers[0]
    assert all(other is layer for other in view.layers)
    want, want_factor = reference(HEAD, THETA)
    assert layer.inv_freq.dtype == torch.float64
    torch.testing.assert_close(layer.inv_freq, want, **F64)
    assert layer.attention_factor == pytest.approx(want_factor, rel=1e-14)
    assert (layer.rotary_dim, layer.layout) == (HEAD, "half")
    assert view.context == context
    assert layer.length_dependent == (case[0] == "longrope")
    assert view.follows.startswith("sglang 0.5.23 (wheel on PyPI)") and view.version == "SGLang 0.5.23"
    assert not any(n.startswith("not verified: SGLang's model file") for n in view.notes)  # qwen3.py was read


def test_context_matches_get_context_length(tmp_path):
    """SGLang's context for a YaRN model is max_position_embeddings (transformers 5 puts the original length in every
    YaRN dict); so is vLLM 0.33.0's (41c5903d's was original_max_position_embeddings * factor)."""
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    path = folder(tmp_path, legacy(rope, max_position_embeddings=40960))
    sglang, vllm = read(path, "sglang"), read(path, "vllm")
    assert sglang.context == ref.get_context_length({"max_position_embeddings": 40960}, {**rope, "rope_theta": THETA})
    assert (sglang.context, vllm.context) == (40960, 40960)
    # without the original length, both read the YaRN at max_position_embeddings: flagged
    path = folder(tmp_path, legacy({"rope_type": "yarn", "factor": 4.0}), "no-original")
    view = read(path, "sglang")
    torch.testing.assert_close(view.layers[0].inv_freq, ref.yarn(HEAD, THETA, 4.0, 4096)[0], **F64)
    assert any("without original_max_position_embeddings" in n for n in view.notes)


def test_missing_keys_default_with_a_warning():
    """``_get_rope_param``: a rope dict transformers does not validate may lack keys; SGLang defaults them."""
    built = sglang_get_rope(HEAD, HEAD, 4096, THETA, {"rope_type": "yarn"})
    torch.testing.assert_close(built.layer.inv_freq, ref.yarn(HEAD, THETA, 1.0, 4096)[0], **F64)
    assert sum("SGLang defaults it" in n for n in built.notes) == 2
    built = sglang_get_rope(HEAD, HEAD, 4096, THETA, {"rope_type": "llama3", "factor": 8.0})
    torch.testing.assert_close(built.layer.inv_freq, ref.llama3(HEAD, THETA, 8.0, orig_max_position=4096)[0], **F64)


def test_proportional_and_partial_rotary():
    built = sglang_get_rope(128, 128, 4096, THETA, {"rope_type": "proportional"}, partial_rotary_factor=0.25)
    assert built.layer.rotary_dim == 128
    torch.testing.assert_close(built.layer.inv_freq, ref.proportional(128, 32, THETA)[0], **F64)


def test_longrope_switch_is_per_batch():
    """The long factors apply to a whole batch once any position exceeds the original length (``>``, not ``>=``)."""
    assert not ref.longrope_uses_long(torch.arange(1025), 1024)
    assert ref.longrope_uses_long(torch.arange(1026), 1024)
    built = sglang_get_rope(HEAD, HEAD, 4096, THETA, {"rope_type": "longrope", "short_factor": SHORT,
                            "long_factor": LONG, "original_max_position_embeddings": 1024})
    _, long, _, long_mscale = ref.longrope(HEAD, THETA, SHORT, LONG, 4096, 1024)
    assert built.layer.params["long_factor"] == LONG
    assert built.layer.params["long_mscale"] == pytest.approx(long_mscale)
    assert any("position > L" in n for n in built.notes)


def test_deepseek_yarn(tmp_path):
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
    view = read(folder(tmp_path, config), "sglang")
    layer = view.layers[0]
    want, factor = ref.deepseek_yarn(64, 10000.0, 40.0, 4096, mscale=0.707, mscale_all_dim=1.0)
    assert (layer.method, layer.layout) == ("deepseek_yarn", "interleaved")
    torch.testing.assert_close(layer.inv_freq, want, **F64)
    assert layer.attention_factor == pytest.approx(factor)
    assert any(n.startswith("not verified: SGLang's deepseek_v3") for n in view.notes)


# --------------------------------------------------------------------------------------------------------------
# Traps


def test_dynamic_is_static_ntk(tmp_path):
    """Trap: SGLang's dynamic NTK is static NTK at base * (f**2 - f + 1) ** (d / (d - 2)) for every length: not
    posenc's (transformers') dynamic NTK, nor vLLM's (RoPE's own base)."""
    path = folder(tmp_path, legacy({"rope_type": "dynamic", "factor": 4.0}))
    sglang, vllm = read(path, "sglang").layers[0], read(path, "vllm").layers[0]
    assert not sglang.length_dependent
    assert sglang.params["base_used"] == pytest.approx(THETA * 13.0 ** (HEAD / (HEAD - 2)))
    short, _ = posenc.rope_frequencies(HEAD, base=THETA, scaling={"rope_type": "dynamic", "factor": 4.0,
                                       "max_position_embeddings": 4096}, seq_len=100)
    assert not torch.allclose(sglang.inv_freq, short.double(), rtol=1e-3)
    assert not torch.allclose(sglang.inv_freq, vllm.inv_freq, rtol=1e-3)


def test_ntk_is_unknown(tmp_path):
    """Trap: ``"ntk"`` (vLLM's fixed or mixed NTK) is not a rope type SGLang knows."""
    view = read(folder(tmp_path, legacy({"rope_type": "ntk", "factor": 4.0, "mixed_b": 0.625})), "sglang")
    assert view.layers == () and "Unknown RoPE scaling type 'ntk'" in view.refused
    assert view.context == 16384


def test_yarn_attention_keys_sglang_and_vllm_read_differently(tmp_path):
    """Trap: SGLang 0.5.23 reads DeepSeek-style mscale keys (the ratio, as vLLM 0.33.0 does) and ``attn_factor`` (which
    vLLM 0.33.0 no longer reads), but not ``attention_factor`` (which vLLM 0.33.0 does)."""
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024, "mscale": 1.0,
            "mscale_all_dim": 1.0}
    path = folder(tmp_path, legacy(rope))
    assert read(path, "sglang").layers[0].attention_factor == pytest.approx(1.0)
    assert read(path, "vllm").layers[0].attention_factor == pytest.approx(1.0)
    plain = 0.1 * math.log(4.0) + 1
    path = folder(tmp_path, legacy({**rope, "mscale": None, "mscale_all_dim": None, "attn_factor": 0.9}), "attn")
    assert read(path, "sglang").layers[0].attention_factor == pytest.approx(plain * 0.9)
    assert read(path, "vllm").layers[0].attention_factor == pytest.approx(plain)
    path = folder(tmp_path, legacy({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                                    "attention_factor": 0.8}), "attention")
    assert read(path, "sglang").layers[0].attention_factor == pytest.approx(plain)
    assert read(path, "vllm").layers[0].attention_factor == pytest.approx(0.8)


def test_qwen3_drops_dual_chunk_qwen2_keeps_it(tmp_path):
    """Trap: SGLang's qwen3.py passes no ``dual_chunk_attention_config`` to ``get_rope``: a Qwen3 saved with posenc's
    dca_vllm runs plain RoPE in SGLang (vLLM's qwen3.py passes it). Qwen2 is read with it (not verified)."""
    dca = {"chunk_size": 262144, "local_size": 8192, "original_max_position_embeddings": 262144}
    view = read(folder(tmp_path, legacy(None, dual_chunk_attention_config=dca)), "sglang")
    assert view.layers[0].method == "default"
    assert any(key.startswith("dual_chunk_attention_config (qwen3.py") for key in view.ignored)
    assert read(folder(tmp_path, legacy(None, dual_chunk_attention_config=dca), "v"), "vllm").layers[0].method == (
        "dual_chunk"
    )
    qwen2 = {**QWEN3, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}
    view = read(folder(tmp_path, legacy(None, base=qwen2, dual_chunk_attention_config=dca), "q2"), "sglang")
    assert view.layers[0].method == "dual_chunk" and view.layers[0].params["posenc_method"] == "dca_vllm"
    assert any("not verified" in n for n in view.notes)


def test_nested_per_layer_type_dict_breaks_get_rope_config(tmp_path):
    """Trap: a transformers-5 dict nested by layer type on a Qwen3: SGLang 0.5.23's qwen3.py passes the whole dict to
    ``get_rope``, which finds no rope type in it (ValueError at start-up). vLLM's qwen3.py instead puts a default
    ``rope_theta`` beside the entries and runs plain RoPE at 1e6."""
    config = {**QWEN3, "layer_types": ["sliding_attention", "full_attention"], "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": THETA},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    path = folder(tmp_path, config)
    view = read(path, "sglang")
    assert view.layers == () and "Unknown RoPE scaling type" in view.refused
    vllm = read(path, "vllm")
    assert all(layer.method == "default" and layer.params["rope_theta"] == 1e6 for layer in vllm.layers)


GEMMA3 = VLLM_GEMMA3  # six layers in transformers' 5:1 pattern: 0-4 sliding, 5 global; head_dim HEAD


def _gemma3(rope: dict) -> dict:
    return {**GEMMA3, "rope_parameters": {"full_attention": {"rope_theta": 1e6, **rope},
                                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}


def test_gemma3_is_read_per_layer_type_as_gemma3_causal_builds_it(tmp_path):
    """Google's linear x8 on the global layers, written in the transformers 4 form (rope_theta, rope_local_base_freq,
    rope_scaling) as the hub's Gemma 3 4B-27B configs are: SGLang's sliding layers run default RoPE at 1e4, its
    global layer linear x8 at 1e6 -- the reference formulas -- and its context is max_position_embeddings."""
    config = {**GEMMA3, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
              "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    view = read(folder(tmp_path, config), "sglang")
    assert view.refused is None and len(view.layers) == 6
    local, _ = ref.default(HEAD, 1e4)
    scaled, _ = ref.linear(HEAD, 1e6, 8.0)
    for i, layer in enumerate(view.layers):
        want = scaled if i == 5 else local
        # the global rotary is transformers' init function, in float32 as SGLang runs it; the local one a formula
        torch.testing.assert_close(layer.inv_freq, want, **(ulps(8, torch.float32) if i == 5 else F64))
        assert layer.attention_factor == 1.0 and layer.rotary_dim == HEAD and layer.layout == "half"
        assert layer.method == ("linear" if i == 5 else "default")
    assert view.context == 131072  # get_context_length on the nested dict: no top-level factor
    assert any("forward_cpu" in n and "linear scaling is not applied" in n for n in view.notes)


@pytest.mark.parametrize("rope", [
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    {"rope_type": "dynamic", "factor": 4.0},
    {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 32768},
])
def test_gemma3_global_layers_run_transformers_formulas(tmp_path, rope):
    """gemma3_causal.py's global rotary is transformers' ROPE_INIT_FUNCTIONS on the full_attention dict (not SGLang's
    own get_rope, whose YaRN and dynamic NTK differ): every layer equals what transformers' Gemma 3 reads, dynamic
    also past the context."""
    path = folder(tmp_path, _gemma3(rope))
    sglang, transformers_view = read(path, "sglang"), read(path, "transformers")
    assert sglang.refused is None and len(sglang.layers) == len(transformers_view.layers) == 6
    for ours, theirs in zip(sglang.layers, transformers_view.layers, strict=True):
        torch.testing.assert_close(ours.inv_freq, theirs.inv_freq, **ulps(8, torch.float32))
        assert ours.attention_factor == pytest.approx(theirs.attention_factor, rel=1e-12)
        assert ours.length_dependent == theirs.length_dependent
        if ours.length_dependent:
            for n in (131072, 200000, 400000):
                (a, fa), (b, fb) = ours.at_length(n), theirs.at_length(n)
                torch.testing.assert_close(a, b, **ulps(8, torch.float32))
                assert fa == pytest.approx(fb, rel=1e-12)
    if rope["rope_type"] == "dynamic":
        assert any("largest position of the whole forward batch" in n for n in sglang.notes)


def test_gemma3_without_per_layer_type_rope_is_refused():
    from types import SimpleNamespace

    from posenc.runtimes import vllm as v
    from posenc.runtimes.sglang import _gemma3_layers

    flat = SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 1e6}, head_dim=HEAD,
                           layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(v._Refused, match="KeyError in Gemma3TextModel"):
        _gemma3_layers(flat)


def test_gguf_drops_the_rope_scaling_keys(tmp_path):
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
        "llama.rope.scaling.type": "linear",
        "llama.rope.scaling.factor": 4.0,
    }
    path = write_gguf(tmp_path / "lin.gguf", "llama", {"token_embd.weight": np.zeros((64, 32), np.float32)}, kv=kv)
    view = read(Source.open(path), "sglang")
    assert view.layers[0].method == "default" and view.context == 64
    torch.testing.assert_close(view.layers[0].inv_freq, ref.default(8, 10000.0)[0], **F64)
    assert set(view.ignored) >= {"llama.rope.scaling.type", "llama.rope.scaling.factor"}


def test_llama_is_read_from_sglang_0_5_23s_llama_py(tmp_path):
    """SGLang 0.5.23's ``llama.py`` builds the rotary embedding from ``rope_parameters`` (``rope_theta`` in it, the
    whole dict as the scaling), ``head_dim``, ``partial_rotary_factor``, ``rope_is_neox_style`` (default GPT-NeoX) and
    a top-level ``original_max_position_embeddings``, which replaces the dict's: read, so no "not verified" note."""
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}
    llama = {**QWEN3, "model_type": "llama", "architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096}
    view = read(folder(tmp_path, {**llama, "rope_parameters": {**rope, "rope_theta": THETA}}), "sglang")
    layer = view.layers[0]
    want, factor = ref.yarn(HEAD, THETA, 4.0, 1024)
    torch.testing.assert_close(layer.inv_freq, want, **F64)
    assert layer.attention_factor == pytest.approx(factor, rel=1e-14) and layer.layout == "half"
    assert not any(n.startswith("not verified") for n in view.notes), view.notes
    top = {**llama, "rope_parameters": {**rope, "rope_theta": THETA}, "original_max_position_embeddings": 2048}
    view = read(folder(tmp_path, top, "top"), "sglang")
    torch.testing.assert_close(view.layers[0].inv_freq, ref.yarn(HEAD, THETA, 4.0, 2048)[0], **F64)
    assert any("top-level original_max_position_embeddings=2048" in n for n in view.notes)


def test_a_llama_gguf_differs_in_layout_on_what_was_read(tmp_path):
    """SGLang 0.5.23 loads a GGUF's q/k rows unpermuted (``gguf_quant_weights_iterator``) and rotates them GPT-NeoX
    style (``llama.py``): "differs" on the layout, and the row no longer says that layout was not verified."""
    import numpy as np

    from hf.tiny_gguf import write_gguf
    from posenc.runtimes.check import check

    kv = {"llama.context_length": 64, "llama.embedding_length": 32, "llama.block_count": 2,
          "llama.feed_forward_length": 64, "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2,
          "llama.rope.freq_base": 10000.0, "llama.attention.layer_norm_rms_epsilon": 1e-5,
          "llama.rope.dimension_count": 8}
    path = write_gguf(tmp_path / "plain.gguf", "llama", {"token_embd.weight": np.zeros((64, 32), np.float32)}, kv=kv)
    row = check(path, ["sglang"])[0]
    assert row.status == "differs" and "layout half where posenc measured interleaved" in row.verdict, row.verdict
    assert "not verified" not in row.verdict and not any("layout" in n and "not verified" in n for n in row.notes)
