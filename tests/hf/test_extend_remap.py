"""Remapping methods on loaded transformers models (``extend_context(model, "self_extend", ...)``): every method
against its written-out reference through the whole model, each handled architecture, generation with the KV cache
== the full forward, composition with a frequency scaling, saving (DCA's config block; the others refused naming the
call), and bad input refused before the model changes."""

from __future__ import annotations

import copy
import json
import warnings

import pytest
import torch
import transformers
from torch.testing import assert_close

import posenc.hf._remap_patch as remap_patch
from hf.tiny import ORIGINAL, tiny_model
from hf.tiny_gguf import write_llama
from posenc.hf import CacheStaleWarning, ServedOnlyWarning, extend_context, save_gguf, save_pretrained
from posenc.hf._remap_patch import REMAP_MODEL_TYPES
from posenc.remapping import METHODS, DualChunk, ReRoPE, SelfExtend, StreamingLLM, String
from reference import remapping as ref

KINDS = [k for k in REMAP_MODEL_TYPES]
#: The factor each method is applied with: 2x, STRING 1.5x (it reaches 2L - W at most: 60 tokens from 32).
FACTORS = {"string": 1.5}


def factor_of(name):
    return FACTORS.get(name, 2.0)


_OVERRIDES = {"mistral": {"sliding_window": None}, "qwen2": {"use_sliding_window": False}}


def model_of(kind, dtype=torch.float32, **overrides):
    torch.manual_seed(0)
    return tiny_model(kind, **{**_OVERRIDES.get(kind, {}), **overrides}).to(dtype)


def ids(n, seed=1):
    return torch.randint(3, 64, (1, n), generator=torch.Generator().manual_seed(seed))


def logits(model, x):
    with torch.no_grad():
        return model(input_ids=x, use_cache=False).logits


@pytest.mark.parametrize("kind", KINDS)
def test_every_architecture_inside_the_window_is_the_unpatched_model(kind):
    """Self-Extend whose neighbour window covers the sequence: the same logits as the model as loaded. In float64
    the two differ only by the unpatched model's RoPE tables, which transformers computes in float32 (posenc's are
    float64 for float64 inputs): errors of a float32 rounding of the angles (positions < 20, so ~20 u32 relative),
    far below what a wrong position moves (~1e-2)."""
    model = model_of(kind, torch.float64)
    patched = copy.deepcopy(model)
    extend_context(patched, "self_extend", 1.25, window=24, group=2)
    x = ids(20)
    expected = logits(model, x)
    tol = 64 * 20 * torch.finfo(torch.float32).eps * float(expected.abs().max())
    assert_close(logits(patched, x), expected, atol=tol, rtol=0)


def _reference_attention(method):
    """An attention function that runs ``method``'s written-out float64 reference on the layer's q, k, v."""

    def run(q, k, v, *, method, encoding, q_positions, k_positions, mask, seq_len, scale, span_dtype):
        assert span_dtype is None  # a float64 model: float64 spans
        assert mask is None and torch.equal(k_positions[0], torch.arange(k.shape[2]))
        assert torch.equal(seq_len, torch.full_like(seq_len, k.shape[2]))
        inv = encoding.inv_freq
        if isinstance(method, SelfExtend):
            return ref.self_extend(q, k, v, inv, window=method.window, group=method.group)
        if isinstance(method, DualChunk) and method.name == "dca_vllm":
            return ref.dual_chunk_vllm(
                q,
                k,
                v,
                inv,
                chunk_size=method.chunk_size,
                local_size=method.local_window,
                original_max_position_embeddings=method.original_max_position_embeddings,
            )
        if isinstance(method, DualChunk):
            return ref.dual_chunk(
                q,
                k,
                v,
                inv,
                chunk_size=method.chunk_size,
                local_window=method.local_window,
                pretraining_length=method.original_max_position_embeddings,
            )
        if isinstance(method, ReRoPE):
            return ref.rerope(
                q, k, v, inv, window=method.window, training_length=method.log_scale_length, leak=method.leak
            )
        if isinstance(method, String):
            return ref.string(
                q,
                k,
                v,
                inv,
                diag_size=method.shifted_offset,
                local_window=method.local_window,
                attention_factor_string=method.mscale,
            )
        if isinstance(method, StreamingLLM):
            return ref.streaming_llm(q, k, v, inv, start_size=method.sinks, recent_size=method.window)
        return ref.lm_infinite(q, k, v, inv, local_branch=method.window, global_branch=method.global_tokens)

    return run


@pytest.mark.parametrize("name", sorted(METHODS))
def test_each_method_through_the_model_equals_its_reference(name, monkeypatch):
    """Past the original context (48 tokens on a 32-token model, factor 2): the patched Llama equals the same model
    whose attention is the method's written-out reference (float64)."""
    model = model_of("llama", torch.float64)
    extend_context(model, name, factor_of(name))
    x = ids(48)
    fast = logits(model, x)
    monkeypatch.setattr(remap_patch, "remap_attention", _reference_attention(model._posenc_remap.method))
    assert_close(fast, logits(model, x).to(fast.dtype), atol=1e-9, rtol=0)


@pytest.mark.filterwarnings("error::posenc.hf.CacheStaleWarning")
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("name", sorted(METHODS))
def test_generation_with_the_cache_equals_the_full_forward_of_each_prefix(name, layers):
    """Greedy generation (KV cache of un-rotated keys and their recorded positions, one query per step) picks the
    tokens the full forward of each prefix ranks first, and each step's logits equal that forward's last row. DCA's
    factor follows the length: its attention at each step is the prefix's, but in a deeper layer the cached keys and
    values were computed (from the layer below) at the length of the step that wrote them, as in ChunkLlama and
    vLLM -- only a forward without the cache recomputes them -- so DCA is exact with one layer and checked there (it
    warns with two: test_cached_decoding_warns_once_where_it_leaves_the_full_forward). Nothing warns here."""
    if layers > 1 and name.startswith("dca"):
        pytest.skip("a length factor: cached hidden states of deeper layers keep the length they were written at")
    model = model_of("llama", torch.float64, num_hidden_layers=layers)
    extend_context(model, name, factor_of(name))
    prompt = ids(40, seed=2)
    with torch.no_grad():
        out = model.generate(
            prompt, max_new_tokens=12, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True
        )
    steps = torch.stack(out.logits, dim=1).double()  # (1, 12, V); generate returns them in float32
    expected = torch.stack([logits(model, out.sequences[:, :n])[:, -1] for n in range(40, 52)], dim=1)
    assert_close(steps, expected, atol=4 * torch.finfo(torch.float32).eps * float(expected.abs().max()), rtol=0)
    assert torch.equal(out.sequences[0, 40:], expected[0].argmax(-1))


def _f64_tol(expected):
    """float64 through a 2-layer model: a few hundred roundings of the logits' magnitude."""
    return 512 * torch.finfo(torch.float64).eps * float(expected.abs().max())


#: A length-dependent computation under a remapping method: dynamic NTK under each method, DCA's own logit factor,
#: and LongRoPE's switch from short to long factors.
LENGTH_DEPENDENT = [("dynamic", name) for name in sorted(METHODS)]
LENGTH_DEPENDENT += [(None, "dca"), (None, "dca_vllm"), ("longrope", "self_extend")]
LONG_FACTOR = [1.0 + 0.5 * i for i in range(4)]


def _extended(scaling, name, layers):
    model = model_of("llama", torch.float64, num_hidden_layers=layers)
    if scaling is not None:
        extend_context(model, scaling, 2.0, **({"long_factor": LONG_FACTOR} if scaling == "longrope" else {}))
    extend_context(model, name, factor_of(name))
    return model


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize(("scaling", "name"), LENGTH_DEPENDENT)
def test_cached_decoding_warns_once_where_it_leaves_the_full_forward(scaling, name, layers):
    """A 28-token prompt, then one token per call with a DynamicCache, to 40 tokens on a 32-token model: each call's
    last row against the full forward of its prefix. Past 32 tokens the frequencies (or DCA's factor) change with
    every length: the first layer's attention stays the prefix's (its cached keys are re-rotated at the current
    length), but a deeper layer's cached keys and values come from hidden states computed at an earlier length. So
    with two layers the call where the 33rd token comes is the first that differs, and the one that warns
    (CacheStaleWarning, once: the later ones differ too, silently); with one layer every call is exact, and nothing
    warns. Before posenc recorded each key's length, none of these warned."""
    from transformers import DynamicCache

    model = _extended(scaling, name, layers)
    x = ids(40, seed=5)
    cache = DynamicCache(config=model.config)
    ends = [28, *range(29, 41)]
    differs, warned = [], []
    with torch.no_grad():
        for lo, hi in zip([0, *ends], ends, strict=False):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                step = model(input_ids=x[:, lo:hi], cache=cache, use_cache=True).logits[:, -1]
            expected = logits(model, x[:, :hi])[:, -1]
            differs.append(not torch.allclose(step, expected, atol=_f64_tol(expected), rtol=0))
            warned.append(sum(issubclass(w.category, CacheStaleWarning) for w in caught))
    if layers == 1:
        assert not any(differs) and not any(warned)
        return
    first = ends.index(ORIGINAL + 1)
    assert differs == [i >= first for i in range(len(ends))]
    assert warned == [int(i == first) for i in range(len(ends))]


@pytest.mark.parametrize(("scaling", "name"), LENGTH_DEPENDENT)
def test_each_cache_that_leaves_the_full_forward_warns(scaling, name):
    """Issue 68, item 1: the warning belongs to the cache that goes stale, not to the model. Two layers, the decoding
    above twice on the same model, each with a new cache: each one warns once, at the call that passes 32 tokens."""
    from transformers import DynamicCache

    model = _extended(scaling, name, 2)
    for seed in (5, 6):
        x = ids(40, seed=seed)
        cache = DynamicCache(config=model.config)
        warned = []
        with torch.no_grad():
            for lo, hi in zip([0, 28, *range(29, 40)], [28, *range(29, 41)], strict=True):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    model(input_ids=x[:, lo:hi], cache=cache, use_cache=True)
                warned.append(sum(issubclass(w.category, CacheStaleWarning) for w in caught))
        assert warned == [int(hi == ORIGINAL + 1) for hi in [28, *range(29, 41)]], f"cache {seed}: {warned}"


@pytest.mark.filterwarnings("error::posenc.hf.CacheStaleWarning")
def test_longrope_under_a_remapping_method_generates_exactly_and_silently():
    """LongRoPE's one switch: generate re-encodes the sequence when it passes the original length (Phi-3's rule, kept
    under the remapping patch), so every step equals the full forward, and no cached key is stale: no warning."""
    model = _extended("longrope", "self_extend", 2)
    prompt = ids(28, seed=2)
    with torch.no_grad():
        out = model.generate(
            prompt, max_new_tokens=12, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True
        )
    steps = torch.stack(out.logits, dim=1).double()  # (1, 12, V); generate returns them in float32
    expected = torch.stack([logits(model, out.sequences[:, :n])[:, -1] for n in range(28, 40)], dim=1)
    assert_close(steps, expected, atol=4 * torch.finfo(torch.float32).eps * float(expected.abs().max()), rtol=0)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_explicit_positions_equal_the_implied_ones(name):
    model = model_of("llama", torch.float64)
    extend_context(model, name, factor_of(name))
    x = ids(50, seed=3)
    with torch.no_grad():
        given = model(input_ids=x, position_ids=torch.arange(50)[None], use_cache=False).logits
    implied = logits(model, x)
    assert_close(given, implied, atol=_f64_tol(implied), rtol=0)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_a_packed_row_equals_each_document_alone(name):
    """Two documents of 40 and 44 tokens (past the original 32) in one row, positions restarting: transformers
    builds the block-diagonal mask from the position resets and the patch rotates at the given positions, so each
    document (its length factor included) equals itself run alone."""
    model = model_of("llama", torch.float64)
    extend_context(model, name, factor_of(name))
    a, b = ids(40, seed=4), ids(44, seed=5)
    positions = torch.cat([torch.arange(40), torch.arange(44)])[None]
    with torch.no_grad():
        packed = model(input_ids=torch.cat([a, b], dim=1), position_ids=positions, use_cache=False).logits
    for part, alone in ((packed[:, :40], logits(model, a)), (packed[:, 40:], logits(model, b))):
        assert_close(part, alone, atol=_f64_tol(alone), rtol=0)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_a_left_padded_row_equals_the_prompt_alone(name):
    """A plain forward with an attention_mask and no position_ids (as in scoring): the positions are derived from
    the mask as generate derives them, and the padding is masked, so the padded row equals the prompt alone."""
    model = model_of("llama", torch.float64)
    extend_context(model, name, factor_of(name))
    long, short = ids(50, seed=6), ids(37, seed=7)
    batch = torch.cat([long, torch.cat([torch.zeros(1, 13, dtype=torch.long), short], dim=1)])
    mask = torch.ones_like(batch)
    mask[1, :13] = 0
    with torch.no_grad():
        out = model(input_ids=batch, attention_mask=mask, use_cache=False).logits
    for row, alone in ((out[0:1], logits(model, long)), (out[1:2, 13:], logits(model, short))):
        assert_close(row, alone, atol=_f64_tol(alone), rtol=0)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_left_padded_generation_equals_each_prompt_alone(name):
    model = model_of("llama", torch.float64)  # both rows cache at their own lengths: equal for every method
    extend_context(model, name, factor_of(name))
    long, short = ids(45, seed=8), ids(34, seed=9)
    batch = torch.cat([long, torch.cat([torch.zeros(1, 11, dtype=torch.long), short], dim=1)])
    mask = torch.ones_like(batch)
    mask[1, :11] = 0
    settings = dict(max_new_tokens=8, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        both = model.generate(batch, attention_mask=mask, **settings)
        alone = [model.generate(x, **settings) for x in (long, short)]
    for row, single in enumerate(alone):
        steps = torch.stack(both.logits, dim=1)[row].double()
        expected = torch.stack(single.logits, dim=1)[0].double()
        assert_close(steps, expected, atol=4 * torch.finfo(torch.float32).eps * float(expected.abs().max()), rtol=0)
        assert torch.equal(both.sequences[row, -8:], single.sequences[0, -8:])


@pytest.mark.parametrize("name", sorted(METHODS))
def test_a_decode_loop_with_explicit_positions_and_a_cache(name):
    """Chunked prefill then single tokens, positions passed by hand and a DynamicCache: each call's last row equals
    the full forward of the prefix so far."""
    from transformers import DynamicCache

    model = model_of("llama", torch.float64, num_hidden_layers=1 if name.startswith("dca") else 2)  # see above
    extend_context(model, name, factor_of(name))
    x = ids(52, seed=10)
    cache = DynamicCache(config=model.config)
    bounds = [0, 20, 41, *range(42, 53)]
    with torch.no_grad():
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            step = model(input_ids=x[:, lo:hi], position_ids=torch.arange(lo, hi)[None], cache=cache, use_cache=True)
            expected = logits(model, x[:, :hi])[:, -1]
            assert_close(step.logits[:, -1], expected, atol=_f64_tol(expected), rtol=0)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_a_cache_the_patched_model_did_not_fill_is_refused(name):
    from transformers import DynamicCache

    model = model_of("llama", torch.float64)
    x = ids(30, seed=11)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=x[:, :20], cache=cache, use_cache=True)  # filled before the patch: rotated keys
    extend_context(model, name, factor_of(name))
    with pytest.raises(ValueError, match="cache"), torch.no_grad():
        model(input_ids=x[:, 20:], cache=cache, use_cache=True)


def test_a_frequency_scaling_first_then_remapping_composes():
    """YaRN, then Self-Extend: the branches rotate with YaRN's frequencies and attention factor. Inside the window
    that is the YaRN model itself."""
    yarn = model_of("llama", torch.float64)
    extend_context(yarn, "yarn", 2.0)
    both = copy.deepcopy(yarn)
    description = extend_context(both, "self_extend", 2.0, window=24, group=5)
    assert description["rotary"]["scaling"]["rope_type"] == "yarn"
    x = ids(22)
    expected = logits(yarn, x)  # float32 RoPE tables in transformers (see above)
    assert_close(
        logits(both, x), expected, atol=64 * 22 * torch.finfo(torch.float32).eps * float(expected.abs().max()), rtol=0
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_spans_run_in_the_model_s_dtype(dtype, monkeypatch):
    """A bf16/fp16 model runs each span in its dtype, as its own attention would (float32 products and merge); a
    float32 model in float32. The spans' numerics are checked in ``tests/remapping/test_operator.py``."""
    seen = []

    def spy(*args, span_dtype, **kwargs):
        seen.append(span_dtype)
        return real(*args, span_dtype=span_dtype, **kwargs)

    real = remap_patch.remap_attention
    monkeypatch.setattr(remap_patch, "remap_attention", spy)
    model = model_of("llama", dtype)
    extend_context(model, "self_extend", 2.0, window=4, group=3)
    out = logits(model, ids(12))
    assert out.dtype == dtype and bool(torch.isfinite(out).all())
    assert seen and set(seen) == {None if dtype == torch.float32 else dtype}


def test_meta_model_patches_without_weights():
    with torch.device("meta"):
        model = model_of("llama")
    description = extend_context(model, "dca", 2.0)
    assert description["parameters"] == {
        "chunk_size": 24,
        "local_window": 4,
        "original_max_position_embeddings": ORIGINAL,
        "mscale": 0.05,
    }
    assert description["max_position_embeddings"] == {"old": ORIGINAL, "new": 2 * ORIGINAL}


def test_dca_vllm_on_qwen_saves_its_config_block_and_warns_that_transformers_ignores_it(tmp_path):
    model = model_of("qwen2")
    extend_context(model, "dca_vllm", 2.0)
    with pytest.warns(ServedOnlyWarning, match="transformers ignores"):
        save_pretrained(model, None, tmp_path / "dca")
    config = json.loads((tmp_path / "dca" / "config.json").read_text())
    assert config["dual_chunk_attention_config"] == {
        "chunk_size": 24,
        "local_size": 4,
        "original_max_position_embeddings": ORIGINAL,
    }
    assert config["max_position_embeddings"] == 2 * ORIGINAL
    assert model.config._attn_implementation == "posenc_remap"  # the caller's model keeps running DCA
    x = ids(50)  # past the original 32: DCA differs from the plain model there
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "dca").double().eval()
    plain = logits(model_of("qwen2", torch.float64), x)
    tol = 64 * 50 * torch.finfo(torch.float32).eps * float(plain.abs().max())  # float32 RoPE tables (see above)
    assert_close(logits(reloaded, x), plain, atol=tol, rtol=0)  # transformers runs the unextended model
    assert float((logits(model, x).double() - plain).abs().max()) > 3 * tol  # (a tiny random model: small)


def _patched(kind, name):
    model = model_of(kind)
    extend_context(model, name, factor_of(name))
    return model


@pytest.mark.parametrize("name", sorted(METHODS))
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_every_save_path_after_every_method_runs_what_was_measured_or_refuses(name, kind, tmp_path):
    """posenc.hf.save_pretrained writes only dca_vllm on Qwen2/Qwen3 (what vLLM/SGLang run as measured) and refuses
    the rest naming why and the call that re-applies the method; the model's own save_pretrained (which would reload
    as the unextended model claiming 2x its context) and save_gguf refuse every method; nothing is written."""
    model = _patched(kind, name)
    served = name == "dca_vllm" and kind == "qwen2"
    if served:
        with pytest.warns(ServedOnlyWarning):
            save_pretrained(model, None, tmp_path / "posenc")
    else:
        why = {"dca": "0.05 ln", "dca_vllm": "qwen2", "string": "string_config"}.get(
            name, f"no serving format records {name}"
        )
        with pytest.raises(ValueError, match=rf"(?s){why}.*extend_context\(model, '{name}', {factor_of(name):g}\)"):
            save_pretrained(model, None, tmp_path / "posenc")
        assert not (tmp_path / "posenc").exists()
    with pytest.raises(ValueError, match="transformers has no config key for .*reload as the unextended model"):
        model.save_pretrained(tmp_path / "plain")
    assert not (tmp_path / "plain").exists()
    if kind == "llama":  # GGUF export takes Llama models
        source = write_llama(tmp_path / "source.gguf", model_of("llama"))
        with pytest.raises(ValueError, match="GGUF"):
            save_gguf(model, tmp_path / "m.gguf", source=source)
        assert not (tmp_path / "m.gguf").exists()


#: The methods transformers 5 offers to switch a loaded model's attention: on the model, and on the model inside it
#: (the one ``get_decoder()`` returns), which shares the config and so switches every layer.
SWITCHES = {
    "model": lambda model, implementation: model.set_attn_implementation(implementation),
    "model.model": lambda model, implementation: model.model.set_attn_implementation(implementation),
    "get_decoder()": lambda model, implementation: model.get_decoder().set_attn_implementation(implementation),
}
#: Changes no patch can intercept: the config's attribute set by hand (its property, the attribute behind it,
#: ``config.update``) and the class's method called around the instance's.
CONFIG_SWITCHES = {
    "config._attn_implementation": lambda model, impl: setattr(model.config, "_attn_implementation", impl),
    "config._attn_implementation_internal": lambda model, impl: setattr(
        model.config, "_attn_implementation_internal", impl
    ),
    "config.update": lambda model, impl: model.config.update({"_attn_implementation": impl}),
    "PreTrainedModel.set_attn_implementation": lambda model, impl: transformers.PreTrainedModel.set_attn_implementation(
        model, impl
    ),
}


@pytest.mark.parametrize("name", sorted(METHODS))
@pytest.mark.parametrize("route", sorted(SWITCHES))
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_another_attention_implementation_is_refused(name, route, implementation):
    """On the model and on ``model.model`` (once accepted there: every layer switched, the rotary modules still the
    identity, a model without positions -- STRING x1.5 moved the logits by 1e-3)."""
    model = _patched("llama", name)
    with pytest.raises(ValueError, match="attn_implementation.*posenc_remap"):
        SWITCHES[route](model, implementation)
    assert model.config._attn_implementation == "posenc_remap"


def test_the_inner_model_refuses_a_save_too(tmp_path):
    model = _patched("llama", "self_extend")
    with pytest.raises(ValueError, match="transformers has no config key for .*reload as the unextended model"):
        model.model.save_pretrained(tmp_path / "inner")
    assert not (tmp_path / "inner").exists()


@pytest.mark.parametrize("name", ["string", "self_extend", "dca"])
@pytest.mark.parametrize("route", sorted(CONFIG_SWITCHES))
def test_an_attention_changed_in_the_config_is_refused_at_the_next_call(name, route):
    """A change made behind the model's back runs nothing: the next forward and ``generate`` raise, naming the
    config's value; set back, the model runs its method again (same logits)."""
    model = _patched("llama", name).double()
    x = ids(40, seed=4)
    expected = logits(model, x)
    CONFIG_SWITCHES[route](model, "sdpa")
    with pytest.raises(ValueError, match="model.config._attn_implementation='sdpa'.*'posenc_remap'"):
        logits(model, x)
    with pytest.raises(ValueError, match="model.config._attn_implementation='sdpa'"), torch.no_grad():
        model.generate(x, max_new_tokens=2, do_sample=False, pad_token_id=0)
    model.config._attn_implementation = "posenc_remap"
    assert_close(logits(model, x), expected, atol=0, rtol=0)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_a_frequency_method_then_a_remapping_method_grows_the_context_again(name):
    """YaRN x2 then a remapping method x2 (STRING x1.5): the remapping method is derived for the YaRN model's context
    (64 -> 128), so the model reaches 4x its pretraining length (the rule of every second call)."""
    model = model_of("llama")
    extend_context(model, "yarn", 2.0)
    description = extend_context(model, name, factor_of(name))
    target = int(2 * ORIGINAL * factor_of(name))
    assert description["original_max_position_embeddings"] == 2 * ORIGINAL
    assert model.config.max_position_embeddings == target
    assert model._posenc_remap.method.reach(2 * ORIGINAL) >= target


@pytest.mark.parametrize("scaling", ["dynamic", "longrope"])
@pytest.mark.parametrize("name", sorted(METHODS))
@pytest.mark.parametrize("length", [10, 50])
def test_a_length_dependent_scaling_then_any_remapping_method_runs_short_and_long_inputs(scaling, name, length):
    """dynamic x2 / LongRoPE then a remapping method: 10 tokens (inside the original 32: once refused because the
    length check read a remapped query position) and 50; each equals the same call with explicit positions, and
    the 10-token input equals the model with the remapping method's own frequencies at that length."""
    model = model_of("llama", torch.float64)
    options = {"long_factor": [1.0 + 0.5 * i for i in range(4)]} if scaling == "longrope" else {}
    extend_context(model, scaling, 2.0, **options)
    extend_context(model, name, factor_of(name))
    x = ids(length, seed=12)
    implied = logits(model, x)
    assert torch.isfinite(implied).all()
    with torch.no_grad():
        given = model(input_ids=x, position_ids=torch.arange(length)[None], use_cache=False).logits
    assert_close(given, implied, atol=_f64_tol(implied), rtol=0)


@pytest.mark.parametrize(
    "kind, name, options, match",
    [
        ("bloom", "dca", {}, "method"),
        ("gemma2", "self_extend", {}, "model"),
        ("mistral", "self_extend", {}, "sliding"),
        ("llama", "self_extend", {"group": 1}, "group"),
        ("llama", "self_extend", {"chunk_size": 8}, "chunk_size"),
        ("llama", "dca", {"chunk_size": 40}, "chunk_size"),
        ("llama", "rerope", {"window": 32}, "window"),
        ("llama", "self_extend", {"factor": 1.0}, "factor"),
        ("llama", "lm_infinite", {"global_tokens": 0}, "global_tokens"),
        ("llama", "string", {}, "at most 60 tokens"),  # 2x is past STRING's longest reach, 2L - W
        ("llama", "string", {"shifted_offset": 4, "local_window": 8}, "local_window"),
        ("llama", "streaming_llm", {"window": 30}, "window"),
        ("llama", "streaming_llm", {"factor": 1.0}, "factor"),
    ],
)
def test_bad_input_is_refused_before_the_model_changes(kind, name, options, match):
    model = tiny_model(kind)
    before = model.config.to_dict()
    options = dict(options)
    factor = options.pop("factor", 2.0)
    with pytest.raises(ValueError, match=match):
        extend_context(model, name, factor, **options)
    assert model.config.to_dict() == before
    assert getattr(model, "_posenc_remap", None) is None


def test_one_remapping_per_model_and_no_frequency_method_after_it():
    model = model_of("llama")
    extend_context(model, "rerope", 2.0)
    for method in ("dca", "yarn"):
        with pytest.raises(ValueError, match="remapping method"):
            extend_context(model, method, 2.0)


def test_string_runs_at_the_training_length_and_changes_it():
    """STRING at factor 1 (its README's use: the model's own context): the patched model equals the reference
    through the whole model and differs from the model as loaded past the offset (10 of 32 tokens)."""
    model = model_of("llama", torch.float64)
    plain = logits(model, ids(32))
    description = extend_context(model, "string", 1.0)
    assert description["parameters"]["shifted_offset"] == 10 and description["parameters"]["local_window"] == 4
    assert model.config.max_position_embeddings == ORIGINAL
    assert float((logits(model, ids(32)) - plain).abs().max()) > 1e-6


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_no_serving_format_records_string_or_streaming_llm(kind):
    from posenc.hf.save import remap_save_problem

    assert "string_config" in remap_save_problem(kind, "string")
    assert remap_save_problem(kind, "streaming_llm") == "no serving format records streaming_llm"
