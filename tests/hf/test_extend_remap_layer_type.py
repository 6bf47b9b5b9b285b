"""Remapping methods on one layer type of a per-layer-type model: Gemma 3's global layers
(``extend_context(model, "self_extend", 2, layer_type="full_attention")``).

Tiny Gemma 3 models (window 16 on a 32-token context), float64: every method through the whole model equals the same
model whose global layers run the method's written-out reference (``tests/reference/remapping.py``); the sliding
layers equal the unpatched model's (same hidden input, their own RoPE and window); generation with the cache equals
the full forward; the reach and ``max_position_embeddings`` follow the remapped layers; what cannot be remapped alone
is refused before anything changes. The real Gemma 3 270M: ``tests/hf/test_gemma3_extend.py``.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.testing import assert_close

import posenc.hf._remap_patch as remap_patch
from hf.test_extend_remap import _reference_attention, factor_of
from hf.tiny import ORIGINAL, tiny_model
from posenc.hf import ReachExceededWarning, extend_context, save_pretrained
from posenc.remapping import METHODS

FULL = "full_attention"
#: sliding, full, sliding, full: a sliding layer both before and after a remapped one.
FOUR = dict(num_hidden_layers=4, layer_types=["sliding_attention", FULL, "sliding_attention", FULL])


def model_of(**overrides):
    """A tiny float64 Gemma 3 (SDPA, the attention the layers a remapping method leaves alone run)."""
    torch.manual_seed(0)
    model = tiny_model("gemma3_text", **{**FOUR, **overrides}).double()
    model.set_attn_implementation("sdpa")
    return model


def ids(n, seed=1):
    return torch.randint(3, 64, (1, n), generator=torch.Generator().manual_seed(seed))


def logits(model, x):
    with torch.no_grad():
        return model(input_ids=x, use_cache=False).logits


def attention_calls(model, x):
    """Each attention module's call in one forward: ``{layer_idx: (hidden_states, kwargs, output)}``."""
    calls, handles = {}, []
    for layer in model.model.layers:
        def hook(module, args, kwargs, output):  # noqa: ANN001, ANN202
            calls[module.layer_idx] = (kwargs["hidden_states"], kwargs, output[0])
        handles.append(layer.self_attn.register_forward_hook(hook, with_kwargs=True))
    try:
        logits(model, x)
    finally:
        for handle in handles:
            handle.remove()
    return calls


@pytest.mark.parametrize("name", sorted(METHODS))
def test_each_method_on_the_global_layers_equals_its_reference(name, monkeypatch):
    """48 tokens (past the original 32 and the window 16): the patched model equals the same model whose global layers
    run the method's float64 reference -- called for those two layers only -- and differs from the model as loaded."""
    plain = model_of()
    model = model_of()
    description = extend_context(model, name, factor_of(name), layer_type=FULL)
    assert description["layer_type"] == FULL and description["layers"] == [1, 3]
    x = ids(48)
    fast = logits(model, x)
    reference = _reference_attention(model._posenc_remap.method)
    calls = []

    def counted(*args, **kwargs):
        calls.append(kwargs["encoding"].config.base)
        return reference(*args, **kwargs)

    monkeypatch.setattr(remap_patch, "remap_attention", counted)
    expected = logits(model, x)
    assert calls == [1e6, 1e6]  # the two global layers, at their own base; the sliding layers never remap
    assert_close(fast, expected, atol=1e-9, rtol=0)
    assert float((expected - logits(plain, x)).abs().max()) > 1e-4  # the method changes the global layers here


@pytest.mark.parametrize("name", ["self_extend", "dca", "streaming_llm"])
def test_the_sliding_layers_run_as_loaded(name):
    """Each sliding layer's attention, given the hidden states it got in the patched model's forward, equals the
    unpatched model's attention module with that model's own cos/sin and sliding mask: the same SDPA call, exactly."""
    plain, model = model_of(), model_of()
    extend_context(model, name, factor_of(name), layer_type=FULL)
    x = ids(48, seed=2)
    patched, loaded = attention_calls(model, x), attention_calls(plain, x)
    for i in (0, 2):  # layer 2 follows a remapped layer: its input differs from the unpatched model's
        hidden, _, out = patched[i]
        _, kwargs, _ = loaded[i]
        with torch.no_grad():
            expected = plain.model.layers[i].self_attn(**{**kwargs, "hidden_states": hidden})[0]
        assert torch.equal(out, expected)
    assert not torch.equal(patched[2][0], loaded[2][0])


@pytest.mark.filterwarnings("error::posenc.hf.CacheStaleWarning")
@pytest.mark.filterwarnings("ignore::posenc.hf.ReachExceededWarning")  # STRING x1.5 reaches 48 of the 50 tokens
@pytest.mark.parametrize("layers", [2, 4])
@pytest.mark.parametrize("name", sorted(METHODS))
def test_generation_with_the_cache_equals_the_full_forward(name, layers):
    """Greedy generation past the original length (sliding-window cache layers beside the remapped layers' dynamic
    ones): each step's logits equal the full forward of the prefix. DCA's length factor is exact with one remapped
    layer (the sliding layer below it does not depend on the length), and with two it warns, as on Llama
    (``tests/hf/test_extend_remap.py``)."""
    if layers > 2 and name.startswith("dca"):
        pytest.skip("a length factor: the second remapped layer's cached keys keep the length they were written at")
    overrides = {} if layers == 4 else dict(num_hidden_layers=2, layer_types=["sliding_attention", FULL])
    model = model_of(**overrides)
    extend_context(model, name, factor_of(name), layer_type=FULL)
    prompt = ids(40, seed=3)
    with torch.no_grad():
        out = model.generate(
            prompt, max_new_tokens=10, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True
        )
    steps = torch.stack(out.logits, dim=1).double()  # (1, 10, V); generate returns them in float32
    expected = torch.stack([logits(model, out.sequences[:, :n])[:, -1] for n in range(40, 50)], dim=1)
    assert_close(steps, expected, atol=4 * torch.finfo(torch.float32).eps * float(expected.abs().max()), rtol=0)


def _reach_warnings(model, position):
    """The ReachExceededWarning messages of a one-token forward at ``position`` (the sequence's length: position+1)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            model(input_ids=ids(1), position_ids=torch.tensor([[position]]), use_cache=False)
    return [str(w.message) for w in caught if issubclass(w.category, ReachExceededWarning)]


def test_the_context_and_the_reach_follow_the_remapped_layers():
    """Self-Extend x2 on the global layers over their 32 tokens (window 8, group 3: 3 * (32 - 8 + 8 // 3) = 78, as on
    Llama in tests/hf/test_reach.py): the context is 64, the sliding layers (window 16) reach any length, so the model
    warns past 78; with a window of 48 on the 32-token context the sliding layers limit it to 32."""
    model = model_of()
    description = extend_context(model, "self_extend", 2.0, layer_type=FULL)
    assert model.config.max_position_embeddings == 2 * ORIGINAL
    assert description["original_max_position_embeddings"] == ORIGINAL
    assert _reach_warnings(model, 77) == []
    (message,) = _reach_warnings(model, 78)
    assert "a sequence of 79 tokens" in message and ", 78 tokens:" in message and "full_attention layers" in message

    wide = model_of(sliding_window=48)
    extend_context(wide, "self_extend", 2.0, layer_type=FULL)
    assert _reach_warnings(wide, ORIGINAL - 1) == []
    (message,) = _reach_warnings(wide, ORIGINAL)
    assert f", {ORIGINAL} tokens:" in message and "sliding_attention layers: 32 tokens" in message


def test_a_frequency_method_then_remapping_on_the_same_layers():
    """``linear+string`` on the global layers: linear x2 there (the sliding layers keep base 1e4, unscaled), then
    STRING within the global layers' stretched 64 tokens, rotating with the scaled frequencies."""
    model = model_of()
    description = extend_context(model, "linear+string", 2.0, layer_type=FULL)
    params = model.config.rope_parameters
    assert params[FULL]["rope_type"] == "linear" and params["sliding_attention"]["rope_type"] == "default"
    assert description["original_max_position_embeddings"] == 2 * ORIGINAL
    scaling = model._posenc_remap.encoding.config.scaling
    assert scaling.rope_type == "linear" and scaling.factor == 2.0
    assert torch.isfinite(logits(model, ids(70))).all()


@pytest.mark.parametrize(
    ("kind", "layer_type", "extra", "match", "composed"),
    [
        ("gemma3_text", None, {}, r"layer_type=None.*\['full_attention'\].*one layer type", "layer_type=None"),
        ("gemma3_text", "sliding_attention", {}, r"sliding_window=16 tokens back", "sliding_window=16"),
        ("gemma3_text", "global", {}, r"layer_type='global'", "layer_type='global'"),
        ("gemma3_text", FULL, {"replace": True}, r"replace=True", None),  # composed: replace is the frequency part's
        ("gemma3_text", FULL, {"attn_logit_softcapping": 50.0}, r"soft-capping", "soft-capping"),
        ("gemma2", None, {}, r"Gemma 2 and 4", r"remaps the attention of .*gemma3_text.* on one layer type"),
        ("llama", FULL, {}, r"layer_type='full_attention'.*one RoPE for every layer", "one RoPE for every layer"),
    ],
)
def test_what_cannot_be_remapped_alone_is_refused_before_anything_changes(kind, layer_type, extra, match, composed):
    """Alone and composed (``linear+string``: checked before the frequency part changes anything)."""
    extra = dict(extra)
    replace = extra.pop("replace", False)
    model = tiny_model(kind, **extra)
    before = model.config.to_dict()
    with pytest.raises(ValueError, match=match):
        extend_context(model, "self_extend", 2.0, layer_type=layer_type, replace=replace)
    if composed is not None:
        with pytest.raises(ValueError, match=composed):
            extend_context(model, "linear+string", 2.0, layer_type=layer_type)
    assert model.config.to_dict() == before
    assert getattr(model, "_posenc_remap", None) is None


def test_saves_and_attention_switches_are_refused_naming_the_call(tmp_path):
    """No config records a remapping method on Gemma 3: both saves refuse (posenc's names the call that rebuilds the
    model, layer type included), as does another attention implementation or a frequency method after it."""
    model = model_of()
    extend_context(model, "rerope", 2.0, layer_type=FULL)
    with pytest.raises(ValueError, match=r"extend_context\(model, 'rerope', 2, layer_type='full_attention'\)"):
        save_pretrained(model, None, tmp_path / "posenc")
    with pytest.raises(ValueError, match="transformers has no config key for rerope"):
        model.save_pretrained(tmp_path / "plain")
    with pytest.raises(ValueError, match="attn_implementation.*posenc_remap"):
        model.set_attn_implementation("eager")
    with pytest.raises(ValueError, match="remapping method"):
        extend_context(model, "linear", 2.0, layer_type=FULL)
    assert not (tmp_path / "posenc").exists() and not (tmp_path / "plain").exists()


def test_the_product_path_names_the_layers_it_changed():
    """``posenc.deploy.apply`` (``posenc extend`` / ``posenc export``): Gemma 3 defaults to its global layers."""
    from posenc.deploy.methods import parse
    from posenc.deploy.patch import apply

    model = model_of()
    applied = apply(model, parse("self_extend"), 2.0, original=ORIGINAL, layer_types=(FULL,))
    assert applied.description["layers_changed"] == [1, 3]
    assert applied.layers_note.startswith("the full_attention layers only: 2 of 4 (layers 1, 3; remapping")
    assert "sliding_attention layers unchanged" in applied.layers_note
