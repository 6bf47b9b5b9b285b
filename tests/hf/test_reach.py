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
