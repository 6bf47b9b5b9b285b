"""DroPE on loaded transformers models (``extend_context(model, "drope")``, ``posenc.hf._drope_patch``): full logits
against three references -- a float64 Llama written out with no rotation, transformers' SmolLM3 with every layer
NoPE (``no_rope_layers``), and each architecture with ``apply_rotary_pos_emb`` made the identity --; cached decoding,
attention implementations, training, undo, the factor and argument refusals, and every save path."""

from __future__ import annotations

import copy
import json
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
import transformers
from torch.testing import assert_close

from hf.test_extend_proportional import GEMMA4, GEMMA4_ROPE
from hf.tiny import ORIGINAL, tiny_model
from posenc.hf import (
    METHODS,
    CacheStaleWarning,
    PosencOnlyWarning,
    ReachExceededWarning,
    extend_context,
    save_gguf,
    save_pretrained,
)
from posenc.hf._drope_patch import DROPE_MODEL_TYPES, dropped, remove_drope
from posenc.hf._record import extensions

#: Past the original context (32): 3x it.
LENGTH = 3 * ORIGINAL


def _model(kind: str, dtype: torch.dtype = torch.float64, **overrides):
    torch.manual_seed(0)
    if kind == "gemma4_text":
        config = transformers.Gemma4TextConfig(**{**GEMMA4, "rope_parameters": GEMMA4_ROPE, **overrides})
        config._attn_implementation = "eager"
        return transformers.Gemma4ForCausalLM(config).eval().to(dtype)
    return tiny_model(kind, **overrides).to(dtype)


def _ids(n: int = LENGTH, batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 64, (batch, n), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def _logits(model, ids, **kwargs):
    return model(input_ids=ids, use_cache=False, **kwargs).logits


def _dropped(model, **options):
    out = copy.deepcopy(model)
    extend_context(out, "drope", **options)
    return out


# ---------------------------------------------------------------------------------------------------------------
# References


def _llama_without_rotation(model, ids: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """A Llama with no rotation in any layer, written out in float64 from the model's weights (RMSNorm, GQA causal
    attention with softmax scale ``scale``, default 1/sqrt(head_dim), SwiGLU): ``(B, S)`` ids -> ``(B, S, V)``."""
    w = {k: v.double() for k, v in model.state_dict().items()}
    cfg = model.config
    heads, kv_heads, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    scale = d**-0.5 if scale is None else scale

    def rms(x, weight):
        return weight * x / torch.sqrt((x * x).mean(-1, keepdim=True) + cfg.rms_norm_eps)

    x = w["model.embed_tokens.weight"][ids]  # (B, S, Dm)
    b, s, _ = x.shape
    causal = torch.ones(s, s, dtype=torch.bool).tril()  # (S, S)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(b, s, heads, d).transpose(1, 2)  # (B, H, S, D)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(b, s, kv_heads, d).transpose(1, 2)  # (B, Hkv, S, D)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(b, s, kv_heads, d).transpose(1, 2)
        k, v = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))  # (B, H, S, D)
        scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))  # (B, H, S, S)
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, heads * d)  # (B, S, H*D)
        x = x + out @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    return rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T  # (B, S, V)


def _tolerance(expected: torch.Tensor) -> float:
    """transformers' RMSNorm runs in float32 even in a float64 model: float32 roundings, ~1e-7 relative a step."""
    return 1e-5 * float(expected.abs().max())


@pytest.mark.parametrize("scale", [None, 0.1])
def test_llama_equals_a_float64_llama_written_out_without_rotation(scale):
    """Weights 10x the default init: RoPE then moves the logits by O(1), not by 1e-3."""
    model = _model("llama", initializer_range=0.2)
    ids = _ids()
    expected = _llama_without_rotation(model, ids, scale)
    options = {} if scale is None else {"softmax_scale": scale}
    got = _logits(_dropped(model, **options), ids)
    tol = _tolerance(expected)
    assert_close(got, expected, atol=tol, rtol=0)
    assert (_logits(model, ids) - expected).abs().max() > 1e3 * tol  # RoPE moves them: the comparison means something


def _smollm3(llama, no_rope_layers):
    """transformers' SmolLM3 (a Llama with a per-layer RoPE switch) with ``llama``'s config and weights."""
    c = llama.config
    config = transformers.SmolLM3Config(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps, rope_parameters=dict(c.rope_parameters), tie_word_embeddings=False,
        no_rope_layers=no_rope_layers, use_sliding_window=False, pad_token_id=c.pad_token_id,
    )
    config._attn_implementation = llama.config._attn_implementation
    model = transformers.SmolLM3ForCausalLM(config).eval().to(llama.dtype)
    model.load_state_dict(llama.state_dict())
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_llama_equals_transformers_smollm3_with_every_layer_nope(dtype, implementation):
    """Bit for bit: ``q * 1 + rotate_half(q) * 0`` is q. SmolLM3 with RoPE in every layer is the Llama itself, so
    the two differ only by the switch."""
    llama = _model("llama", dtype)
    llama.set_attn_implementation(implementation)
    ids = _ids()
    n = llama.config.num_hidden_layers
    assert torch.equal(_logits(_smollm3(llama, [1] * n), ids), _logits(llama, ids))
    expected = _logits(_smollm3(llama, [0] * n), ids)
    assert torch.equal(_logits(_dropped(llama), ids), expected)
    assert not torch.equal(_logits(llama, ids), expected)


def _no_rotation(kind: str):
    """``apply_rotary_pos_emb`` that returns q and k (Gemma 4: x, which it rotates one tensor a call) as given. Told
    by the model kind, not read off the function: from transformers 5.25 with ``kernels`` installed the function is
    a kernels ``Func`` module whose signature is ``(*args, **kwargs)``."""
    if kind.startswith("gemma4"):
        return lambda x, *args, **kwargs: x
    return lambda q, k, *args, **kwargs: (q, k)


@pytest.mark.parametrize("kind", DROPE_MODEL_TYPES)
def test_every_architecture_equals_its_layers_computed_without_rotation(kind, monkeypatch):
    """Each architecture (Gemma 3/4: both layer types; GPT-NeoX and Gemma 4's p-RoPE: partial rotary) equals the
    same model whose modeling module's ``apply_rotary_pos_emb`` is the identity: every layer loses its rotation."""
    model = _model(kind)
    ids = _ids()
    report = extend_context(dropped_model := copy.deepcopy(model), "drope")
    assert report["layers"] == list(range(model.config.num_hidden_layers))
    got = _logits(dropped_model, ids)
    with_rope = _logits(model, ids)
    module = sys.modules[type(model).__module__]
    monkeypatch.setattr(module, "apply_rotary_pos_emb", _no_rotation(kind))
    expected = _logits(model, ids)
    assert torch.equal(got, expected)
    assert not torch.equal(with_rope, expected)


# ---------------------------------------------------------------------------------------------------------------
# Every path the model takes afterwards


@pytest.mark.parametrize("kind", ["llama", "gemma3_text"])
def test_cached_decoding_equals_the_full_forward(kind):
    """The cache holds un-rotated keys, which no length changes: prefill then one token at a time == one forward."""
    model = _dropped(_model(kind))
    ids = _ids(48, batch=1)
    full = _logits(model, ids)
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        steps = [model(input_ids=ids[:, :20], cache=cache, use_cache=True).logits]
        for i in range(20, 48):
            steps.append(model(input_ids=ids[:, i : i + 1], cache=cache, use_cache=True).logits)
    assert_close(torch.cat(steps, dim=1), full, atol=1e-10, rtol=0)
    generated = model.generate(ids[:, :40], max_new_tokens=8, do_sample=False)
    assert torch.equal(generated[:, :40], ids[:, :40]) and generated.shape == (1, 48)


def test_positions_do_not_matter():
    """No rotation: position ids shifted far past the original context give the same logits (positions that
    restart would tell transformers the rows are packed documents: another mask)."""
    model = _dropped(_model("llama"))
    ids = _ids()
    plain = _logits(model, ids)
    for start in (1, 1000, 10**6):
        positions = torch.arange(start, start + LENGTH)[None].expand(2, -1)
        assert torch.equal(_logits(model, ids, position_ids=positions), plain)


def test_another_attention_implementation_keeps_drope():
    """DroPE lives in the rotary module, before any attention: switching the attention keeps it (== DroPE applied
    to the model loaded with that attention)."""
    model = _dropped(_model("llama"))
    model.set_attn_implementation("sdpa")
    sdpa = _model("llama")
    sdpa.set_attn_implementation("sdpa")
    ids = _ids()
    assert torch.equal(_logits(model, ids), _logits(_dropped(sdpa), ids))


def test_a_frequency_method_before_drope_is_dropped_with_the_rotation():
    """YaRN's frequencies and its attention factor (which the rotary module multiplies into cos and sin, as the
    authors' ``ones_like`` drops it) go; dynamic NTK's cache re-rotation leaves the un-rotated keys alone."""
    model = _model("llama")
    ids = _ids()
    expected = _logits(_dropped(model), ids)
    yarn = copy.deepcopy(model)
    extend_context(yarn, "yarn", 4.0)
    assert yarn.model.rotary_emb.attention_scaling != 1.0
    extend_context(yarn, "drope")
    assert torch.equal(_logits(yarn, ids), expected)
    dynamic = copy.deepcopy(model)
    extend_context(dynamic, "dynamic", 2.0)
    extend_context(dynamic, "drope")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither CacheStaleWarning nor ReachExceededWarning
        cache = transformers.DynamicCache(config=dynamic.config)
        with torch.no_grad():
            first = dynamic(input_ids=ids[:1, :ORIGINAL], cache=cache, use_cache=True).logits
            rest = dynamic(input_ids=ids[:1, ORIGINAL:], cache=cache, use_cache=True).logits
    assert_close(torch.cat([first, rest], dim=1), expected[:1], atol=1e-10, rtol=0)


def test_recalibration_trains_every_parameter_without_rope():
    """The authors' recalibration: the plain LM loss, every parameter trained; the patch holds in train mode."""
    model = _dropped(_model("llama", torch.float32))
    model.train()
    ids = _ids(ORIGINAL)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    model.eval()
    reference = _smollm3(model, [0] * model.config.num_hidden_layers)
    assert torch.equal(_logits(model, ids), _logits(reference, ids))


def test_remove_drope_restores_the_model():
    model = _model("llama")
    extend_context(model, "yarn", 2.0)
    ids = _ids(ORIGINAL)
    before = _logits(model, ids)
    reach = model.model.rotary_emb.__dict__["_posenc_reach"]
    extend_context(model, "drope", softmax_scale=0.2)
    assert model.model.rotary_emb.__dict__["_posenc_reach"] is None  # no positions, no reach
    assert dropped(model) and [e["method"] for e in extensions(model)] == ["yarn", "drope"]
    assert not torch.equal(_logits(model, ids), before)
    remove_drope(model)
    assert not dropped(model) and [e["method"] for e in extensions(model)] == ["yarn"]
    assert torch.equal(_logits(model, ids), before)
    assert {m.scaling for m in model.modules() if hasattr(m, "q_proj")} == {model.config.head_dim**-0.5}
    assert model.model.rotary_emb.__dict__["_posenc_reach"] is reach
    with pytest.warns(ReachExceededWarning):  # YaRN x2's reach (64 tokens) is watched again
        _logits(model, _ids())
    extend_context(model, "drope")  # and DroPE applies again
    with pytest.raises(ValueError, match="model=.*is invalid: expected a model patched with DroPE"):
        remove_drope(_model("llama"))


# ---------------------------------------------------------------------------------------------------------------
# The factor and the other arguments


@pytest.mark.parametrize("factor", [None, 1, 1.0])
def test_drope_takes_no_factor(factor):
    model = _model("llama")
    report = extend_context(model, "drope", factor)
    assert report["factor"] is None and report["max_position_embeddings"] == {"old": ORIGINAL, "new": ORIGINAL}
    assert extensions(model)[-1]["factor"] == 1.0 and extensions(model)[-1]["in_config"] is False


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"factor": 2.0}, r"factor=2\.0 is invalid: expected None \(or 1\) for 'drope': it drops RoPE"),
        ({"factor": 0.5}, r"factor=0\.5 is invalid: expected None \(or 1\) for 'drope'"),
        ({"factor": True}, r"factor=True is invalid: expected None \(or 1\)"),
        ({"original_max_position_embeddings": 16}, r"original_max_position_embeddings=16 .*None for 'drope'"),
        ({"max_position_embeddings": 128}, r"max_position_embeddings=128 .*None for 'drope'"),
        ({"layer_type": "full_attention"}, r"layer_type='full_attention' .*None for 'drope'"),
        ({"replace": True}, r"replace=True .*False for 'drope'"),
        ({"window": 4}, r"window=4 .*one of the options \['softmax_scale'\] of method 'drope'"),
        ({"softmax_scale": 0.0}, r"softmax_scale=0\.0 .*a number > 0"),
        ({"softmax_scale": float("nan")}, r"softmax_scale=nan .*a finite number"),
    ],
)
def test_bad_input_is_refused_and_the_model_unchanged(kwargs, match):
    model = _model("llama")
    ids = _ids()
    before = _logits(model, ids)
    with pytest.raises(ValueError, match=match):
        extend_context(model, "drope", **kwargs)
    assert not dropped(model) and not extensions(model)
    assert torch.equal(_logits(model, ids), before)


def test_other_methods_still_need_a_factor():
    with pytest.raises(ValueError, match=r"factor=None is invalid: expected a number >= 1 .* for 'yarn'"):
        extend_context(_model("llama"), "yarn")


def test_what_drope_cannot_follow_or_precede():
    alibi = tiny_model("bloom")
    with pytest.raises(ValueError, match=r"model=.*bloom.*a RoPE model of a type in"):
        extend_context(alibi, "drope")
    model = _dropped(_model("llama"))
    with pytest.raises(ValueError, match="patched with DroPE.*a model that still has RoPE"):
        extend_context(model, "drope")
    for method, factor in (("yarn", 2.0), ("self_extend", 2.0), ("linear", 1.0)):
        with pytest.raises(ValueError, match="patched with DroPE.*a model that still has RoPE"):
            extend_context(model, method, factor)
    remapped = _model("llama")
    extend_context(remapped, "self_extend", 2.0)
    with pytest.raises(ValueError, match="patched with self_extend.*DroPE on a model as loaded"):
        extend_context(remapped, "drope")


def test_drope_is_a_method():
    assert "drope" in METHODS


# ---------------------------------------------------------------------------------------------------------------
# Saving


@pytest.fixture
def loaded(tmp_path):
    """A tiny Llama and its tokenizer, loaded by posenc from a GGUF (a folder posenc can save and load again)."""
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    from hf.tiny_gguf import write_llama
    from posenc.hf import load_causal_lm

    source = write_llama(tmp_path / "src" / "tiny.gguf", tiny_model("llama", tie_word_embeddings=True))
    model, tokenizer = load_causal_lm(source, attn_implementation="eager")
    return model, tokenizer, source


@pytest.mark.parametrize("scale", [None, 0.25])
def test_save_records_drope_and_load_causal_lm_reapplies_it(loaded, tmp_path, scale):
    from posenc.hf import load_causal_lm

    model, tokenizer, _ = loaded
    ids = _ids()
    rope = _logits(model, ids)
    extend_context(model, "drope", **({} if scale is None else {"softmax_scale": scale}))
    expected = _logits(model, ids)
    with pytest.warns(PosencOnlyWarning, match=r"only posenc.hf.load_causal_lm.*extend_context\(model, 'drope'"):
        out = save_pretrained(model, tokenizer, tmp_path / "out", check=False)
    record = json.loads((out / "config.json").read_text())["posenc"]["extensions"]
    assert [(e["method"], e["in_config"], e["options"]) for e in record] == [
        ("drope", False, {} if scale is None else {"softmax_scale": scale})
    ]
    again, _ = load_causal_lm(out, attn_implementation="eager")
    assert dropped(again) and torch.equal(_logits(again, ids), expected)
    plain = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")  # what the warning says
    assert torch.equal(_logits(plain.eval(), ids), rope)
    assert dropped(model)  # the caller's model is untouched by the save


def test_the_models_own_save_and_gguf_are_refused(loaded, tmp_path):
    model, _, source = loaded
    extend_context(model, "drope")
    for save in (model.save_pretrained, model.model.save_pretrained):
        with pytest.raises(ValueError, match="DroPE.*would reload with RoPE; use posenc.hf.save_pretrained"):
            save(tmp_path / "plain")
    assert not (tmp_path / "plain").exists()
    with pytest.raises(ValueError, match=r"patched with drope.*llama.cpp has no key.*invalid n_rot.*extend_context"):
        save_gguf(model, tmp_path / "m.gguf", source=source)
    assert not (tmp_path / "m.gguf").exists()


def test_posenc_check_says_no_runtime_runs_drope(loaded, tmp_path):
    """``posenc check`` on the saved folder: no runtime reads posenc's record, so every one differs (transformers:
    fixed by ``load_causal_lm``; vLLM, SGLang, llama.cpp: no fix)."""
    from posenc.runtimes.check import check

    model, tokenizer, _ = loaded
    extend_context(model, "drope")
    with pytest.warns(PosencOnlyWarning):
        out = save_pretrained(model, tokenizer, tmp_path / "out", check=False)
    rows = {row.runtime: row for row in check(out)}
    assert {r: row.status for r, row in rows.items()} == dict.fromkeys(rows, "differs")
    assert all("posenc measured drope," in row.verdict for row in rows.values())
    assert "posenc.hf.load_causal_lm" in rows["transformers"].verdict
    assert "none in llamacpp: no key of it runs drope" in rows["llamacpp"].verdict


@pytest.mark.parametrize("kind", ["llama"])
def test_no_cache_stale_warning(kind):
    """A guard: DroPE on a plain model never warns about its cache."""
    model = _dropped(_model(kind))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheStaleWarning)
        model.generate(_ids(40, batch=1), max_new_tokens=4, do_sample=False)
