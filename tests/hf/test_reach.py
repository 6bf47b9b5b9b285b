"""``ReachExceededWarning``: a model patched by ``extend_context`` warns once when a sequence passes what its patch
reaches -- a remapping method's ``reach``, a frequency method's extended context -- in a prefill or in ``generate``,
and never at or below it. The reaches are written out here from each method's rule (32-token tiny models)."""

from __future__ import annotations

import warnings

import pytest
import torch

from hf.tiny import ORIGINAL, tiny_model
from posenc.hf import ReachExceededWarning, extend_context

# (frequency method first or None, remapping method or None, reach in tokens)
REACHES = [
    (None, "self_extend", 78),  # window 32 // 4 = 8, group ceil((64 - 8) / (32 - 8)) = 3: 3 * (32 - 8 + 8 // 3)
    (None, "string", 48),  # x1.5: offset 20, local window 4: 32 + 20 - 4
    (None, "leaky_rerope", 64),  # window 4, leak 2.19: 4 + (32 - 1 - 4) * 2.19 + 1 = 64.13
    ("yarn", None, 64),  # the context YaRN x2 extends to
    ("linear", None, 64),
    ("ntk", None, 64),
    ("llama3", None, 64),
    ("longrope", None, 64),
    ("yarn", "self_extend", 159),  # over YaRN's 64: window 16, group 3: 3 * (64 - 16 + 5); 160 scores (159, 0) at 64
]
#: Patches with no limit: dynamic NTK rescales with the length; DCA, ReRoPE, LM-Infinite and StreamingLLM score
#: every pair at a trained distance.
UNLIMITED = [("dynamic", None), (None, "dca"), (None, "rerope"), (None, "lm_infinite"), (None, "streaming_llm")]
UNLIMITED += [("dynamic", "dca")]
LONG_FACTOR = [1.0 + 0.5 * i for i in range(4)]


def _patched(scaling, name):
    torch.manual_seed(0)
    model = tiny_model("llama")
    if scaling is not None:
        extend_context(model, scaling, 2.0, **({"long_factor": LONG_FACTOR} if scaling == "longrope" else {}))
    if name is not None:
        extend_context(model, name, 1.5 if name == "string" else 2.0)
    return model


def _warnings(call):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            call()
    return [str(w.message) for w in caught if issubclass(w.category, ReachExceededWarning)]


def _forward(model, n):
    return lambda: model(input_ids=torch.randint(3, 64, (1, n), generator=torch.Generator().manual_seed(n)))


@pytest.mark.parametrize(("scaling", "name", "reach"), REACHES)
def test_a_prefill_past_the_reach_warns_once(scaling, name, reach):
    model = _patched(scaling, name)
    assert _warnings(_forward(model, reach)) == []
    (message,) = _warnings(_forward(model, reach + 1))
    assert f"a sequence of {reach + 1} tokens" in message and f", {reach} tokens:" in message
    assert (name or scaling) in message
    assert _warnings(_forward(model, 3 * reach)) == []  # once per model


@pytest.mark.parametrize(("scaling", "name", "reach"), REACHES)
def test_generation_warns_at_the_step_that_passes_the_reach(scaling, name, reach):
    model = _patched(scaling, name)
    prompt = torch.randint(3, 64, (1, reach - 3), generator=torch.Generator().manual_seed(1))
    messages = _warnings(lambda: model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0))
    assert len(messages) == 1 and f"a sequence of {reach + 1} tokens" in messages[0]


@pytest.mark.parametrize(("scaling", "name"), UNLIMITED)
def test_patches_without_a_limit_never_warn(scaling, name):
    model = _patched(scaling, name)
    assert _warnings(_forward(model, 6 * ORIGINAL)) == []


def test_an_unpatched_model_and_a_second_call_that_reaches_further():
    """Only a patch warns (transformers' own models are left alone); a second call sets the model's reach anew."""
    model = tiny_model("llama")
    assert _warnings(_forward(model, 4 * ORIGINAL)) == []
    extend_context(model, "yarn", 2.0)
    extend_context(model, "yarn", 2.0)  # composed: yarn x4, 128 tokens
    hooks = model.model.rotary_emb._forward_pre_hooks.values()
    assert sum(getattr(hook, "__module__", "") == "posenc.hf._reach" for hook in hooks) == 1  # one hook, not two
    assert _warnings(_forward(model, 4 * ORIGINAL)) == []
    assert len(_warnings(_forward(model, 4 * ORIGINAL + 1))) == 1


# ---------------------------------------------------------------------------------------------------------------------
# A folder posenc.hf.save_pretrained wrote, reloaded by posenc.hf.load_causal_lm, warns where the measured model does


@pytest.fixture(scope="module")
def bpe_tokenizer():
    from lab.extend.needles.test_passkey import byte_bpe_tokenizer

    return byte_bpe_tokenizer()


def _reloaded(model, tokenizer, folder):
    from posenc.hf import load_causal_lm, save_pretrained

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PosencOnlyWarning and the like: not what this file checks
        out = save_pretrained(model, tokenizer, folder, check=False)
        return load_causal_lm(out, attn_implementation="eager")[0]


@pytest.mark.parametrize(("scaling", "name", "reach"), [r for r in REACHES if r[1] is None])
def test_a_reloaded_frequency_folder_warns_past_the_same_reach(scaling, name, reach, bpe_tokenizer, tmp_path):
    model = _reloaded(_patched(scaling, name), bpe_tokenizer, tmp_path / "out")
    assert _warnings(_forward(model, reach)) == []
    (message,) = _warnings(_forward(model, reach + 1))
    assert f"a sequence of {reach + 1} tokens" in message and f", {reach} tokens:" in message and scaling in message
    assert _warnings(_forward(model, 200)) == []  # once per model


def test_a_reloaded_dynamic_folder_never_warns(bpe_tokenizer, tmp_path):
    model = _reloaded(_patched("dynamic", None), bpe_tokenizer, tmp_path / "out")
    assert _warnings(_forward(model, 6 * ORIGINAL)) == []


# ---------------------------------------------------------------------------------------------------------------------
# Per-layer-type RoPE (Gemma 3): the model reaches as far as its least-reaching layers


def _gemma(**overrides):
    torch.manual_seed(0)
    return tiny_model("gemma3_text", **overrides)  # layers: sliding (window 16), full; 32 tokens


def _first_warning(model, lengths):
    """The first length of ``lengths`` whose forward warns (None: none does)."""
    for n in lengths:
        if _warnings(_forward(model, n)):
            return n
    return None


def test_extending_the_sliding_layers_alone_leaves_the_full_layers_reach():
    """Linear x2 on the sliding layers: the full layers still reach 32, so the model's context stays 32 and a longer
    sequence warns (the model used to claim 64 and run the full layers to distance 63 unwarned)."""
    model = _gemma()
    report = extend_context(model, "linear", 2.0, layer_type="sliding_attention")
    assert model.config.max_position_embeddings == ORIGINAL
    assert report["max_position_embeddings"] == {"old": ORIGINAL, "new": ORIGINAL}
    assert report["layer_contexts"] == {"full_attention": ORIGINAL, "sliding_attention": 2 * ORIGINAL}
    assert "full_attention layers" in report["description"]
    assert _first_warning(model, [ORIGINAL, ORIGINAL + 1]) == ORIGINAL + 1


def test_each_layer_type_extends_from_its_own_context():
    """Full x2, then sliding x2: the sliding layers carry 32, so x2 takes them to 64 (not to 128 from the model's
    64), and the model reaches 64."""
    model = _gemma()
    extend_context(model, "linear", 2.0, layer_type="full_attention")
    report = extend_context(model, "linear", 2.0, layer_type="sliding_attention")
    assert report["original_max_position_embeddings"] == ORIGINAL
    assert report["layer_contexts"] == {"full_attention": 2 * ORIGINAL, "sliding_attention": 2 * ORIGINAL}
    assert model.config.max_position_embeddings == 2 * ORIGINAL
    assert _first_warning(model, [2 * ORIGINAL, 2 * ORIGINAL + 1]) == 2 * ORIGINAL + 1


def test_a_sliding_window_longer_than_its_layers_context_limits_the_model(bpe_tokenizer, tmp_path):
    """Window 48 > 32: the unextended sliding layers see distances up to 47, so full x2 leaves the model at 32; the
    saved folder reloads with that reach and its layer contexts (sliding x2 on the reloaded model reaches 64)."""
    model = _gemma(sliding_window=48)
    report = extend_context(model, "linear", 2.0, layer_type="full_attention")
    assert model.config.max_position_embeddings == ORIGINAL and "sliding_attention layers: 32" in report["description"]
    assert _first_warning(model, [ORIGINAL, ORIGINAL + 1]) == ORIGINAL + 1
    reloaded = _reloaded(_gemma(sliding_window=48), bpe_tokenizer, tmp_path / "plain")  # no extension: no warning
    assert _first_warning(reloaded, [4 * ORIGINAL]) is None
    reloaded = _reloaded(model, bpe_tokenizer, tmp_path / "full")
    assert reloaded.config.max_position_embeddings == ORIGINAL
    assert _first_warning(reloaded, [ORIGINAL, ORIGINAL + 1]) == ORIGINAL + 1
    report = extend_context(reloaded, "linear", 2.0, layer_type="sliding_attention")
    assert report["layer_contexts"] == {"full_attention": 2 * ORIGINAL, "sliding_attention": 2 * ORIGINAL}
    assert reloaded.config.max_position_embeddings == 2 * ORIGINAL
    assert _first_warning(reloaded, [2 * ORIGINAL, 2 * ORIGINAL + 1]) == 2 * ORIGINAL + 1


def test_a_dynamic_layer_type_keeps_its_threshold_when_another_type_is_extended(ids):
    """transformers' dynamic NTK starts at max_position_embeddings: extending the sliding layers must not move it,
    so the model equals the one transformers builds with the full layers dynamic from 32."""
    from hf.tiny import logits

    model = _gemma()
    extend_context(model, "dynamic", 2.0, layer_type="full_attention")
    extend_context(model, "linear", 2.0, layer_type="sliding_attention")
    assert model.config.max_position_embeddings == ORIGINAL
    params = {k: dict(v) for k, v in tiny_model("gemma3_text").config.rope_parameters.items()}
    params["full_attention"].update(rope_type="dynamic", factor=2.0)
    params["sliding_attention"].update(rope_type="linear", factor=2.0)
    native = tiny_model("gemma3_text", model.state_dict(), rope_parameters=params)
    torch.testing.assert_close(logits(model, ids), logits(native, ids), rtol=0, atol=0)
    assert _first_warning(model, [6 * ORIGINAL]) is None  # dynamic and windowed layers: no limit
