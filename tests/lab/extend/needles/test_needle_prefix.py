"""A shared haystack's KV cache, computed once (``posenc.lab.extend.needles.shared_prefix``): every method's answers,
sample by sample, equal those of a fresh ``generate`` on the whole prompt, for the passkey and for lm-eval's RULER."""

from __future__ import annotations

import copy

import pytest
import torch

from posenc.hf.extend import METHODS
from posenc.lab.extend.needles import passkey as pk
from posenc.lab.extend.needles import shared_prefix
from posenc.lab.extend.needles.shared_prefix import SharedPrefix

# dynamic NTK's unshared answers come from generate with the cache, which says so once (CacheStaleWarning): expected.
pytestmark = pytest.mark.filterwarnings("ignore::posenc.hf.CacheStaleWarning")

ORIGINAL = 64
UNSHARED = ("dynamic", "longrope", "dca", "dca_vllm")


@pytest.fixture(scope="module")
def tiny():
    """A tiny random Llama (64-token context, float32) whose large initial weights make its answers depend on the
    prompt, and a byte-level BPE tokenizer trained on the passkey's text."""
    transformers = pytest.importorskip("transformers")
    from lab.extend.needles.test_passkey import byte_bpe_tokenizer

    tokenizer = byte_bpe_tokenizer()
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=ORIGINAL, bos_token_id=0, eos_token_id=1,
        initializer_range=0.5,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval(), tokenizer


def _patched(model, method: str):  # noqa: ANN001, ANN202
    from posenc.hf import extend_context

    if method == "none":
        return model
    patched = copy.deepcopy(model)
    if method == "drope":  # no factor: RoPE dropped from every layer (the cache holds un-rotated keys)
        extend_context(patched, method)
        return patched
    options = {"long_factor": [1.0 + 1.5 * i for i in range(4)]} if method == "longrope" else {}
    factor = 1.5 if method == "string" else 4.0  # STRING reaches 2L - W at most
    extend_context(patched, method, factor, original_max_position_embeddings=ORIGINAL, **options)
    return patched


@pytest.fixture
def counted(monkeypatch):
    """How many answers were generated from a shared prefix."""
    used = []
    original = SharedPrefix.cache_for

    def cache_for(self, ids):  # noqa: ANN001, ANN202
        cache = original(self, ids)
        used.append(cache is not None)
        return cache

    monkeypatch.setattr(SharedPrefix, "cache_for", cache_for)
    return used


@pytest.mark.parametrize("method", ["none", *METHODS])
def test_passkey_answers_from_a_shared_prefix_equal_the_unshared_ones(tiny, method, counted):
    model, tokenizer = tiny
    prompts: dict = {}
    for depth in (0.25, 0.75):
        answers: dict[bool, list] = {True: [], False: []}
        for share in (False, True):  # a fresh copy each: dynamic's rotary module keeps the longest length it saw
            pk.hf_accuracy(
                _patched(model, method), tokenizer, length=200, depth=depth, trials=6, seed=1, prompts=prompts,
                share_prefix=share, answers=answers[share],
            )
        assert answers[True] == answers[False]
        assert (
            len({tuple(a) for a in answers[False]}) > 1
        )  # answers differ with the key: comparing them means something
    # This BPE merges digits, so some keys' prompts are fitted with another front cut and share nothing; SmolLM2's
    # tokenizer has one token per digit and shares every key's prefix.
    assert sum(counted) >= 4 if method not in UNSHARED else sum(counted) == 0


def test_what_is_shared_and_why_not():
    assert shared_prefix.LENGTH_DEPENDENT_ROPE + shared_prefix.LENGTH_DEPENDENT_REMAP == UNSHARED


def test_prefixes_follow_the_common_haystack(tiny):
    model, _ = tiny
    haystack = torch.arange(2, 300)
    prompts = [torch.cat([haystack[:n], torch.tensor([1, 1, 1]), haystack[n:]])[None] for n in (100, 200, 150)]
    other = [torch.cat([torch.tensor([7, 7]), p[0]])[None] for p in prompts[:2]]  # another front: a second family
    shared = SharedPrefix(model, [*prompts, *other, torch.arange(5, 50)[None]])
    assert shared.reason is None and shared.length == 150 and len(shared.families) == 2
    assert [shared.shared[tuple(p[0].tolist())][1] for p in prompts + other] == [100, 150, 150, 102, 102]
    assert shared.cache_for(prompts[1]).get_seq_length() == 150
    cache = shared.cache_for(prompts[0])
    assert cache.get_seq_length() == 100 and shared.cache_for(torch.arange(5, 50)[None]) is None
    assert shared.cache_for(other[1]).get_seq_length() == 102
    alone = SharedPrefix(model, prompts[:1])
    assert alone.reason == "no two prompts share a prefix" and alone.cache_for(prompts[0]) is None


# ---------------------------------------------------------------------------------------------------------------------
# RULER through lm-eval


@pytest.fixture(scope="module")
def suite(tiny):
    pytest.importorskip("lm_eval", reason="needs lm-evaluation-harness")
    from posenc.lab.extend.needles import ruler

    ruler.require()
    return ruler.build(["niah_single_1"], tiny[1], [512], 3)


@pytest.mark.parametrize("method", ["none", *METHODS])
def test_ruler_answers_from_a_shared_prefix_equal_lm_evals_own(tiny, suite, method, counted):
    from posenc.lab.extend.needles import ruler

    model, tokenizer = tiny
    scores = {
        share: ruler.evaluate(
            suite, _patched(model, method), tokenizer, "niah_single_1", 512, device="cpu", share_prefix=share
        )
        for share in (False, True)
    }
    assert scores[True] == scores[False]
    assert sum(counted) == (0 if method in UNSHARED else 3)


class _Attention(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_split_cached_attention_equals_sdpa_with_transformers_mask(dtype, tolerance):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    torch.manual_seed(0)
    s, p = 37, 70  # queries after p cached keys
    q = torch.randn(1, 9, s, 16, dtype=dtype)  # (B, H, S, D)
    k, v = torch.randn(2, 1, 3, p + s, 16, dtype=dtype)  # (B, Hkv, T, D) each
    causal = torch.ones(s, p + s, dtype=torch.bool).tril(p)[None, None]  # (1, 1, S, T)
    padded = causal.clone()
    padded[..., :3] = False  # a left-padded row: not the causal mask, so transformers' own attention
    for mask in (causal, padded, torch.zeros(1, 1, s, p + s).masked_fill(~causal, float("-inf"))):
        want, _ = sdpa_attention_forward(_Attention(), q, k, v, mask, scaling=0.25)  # (B, S, H, D)
        with shared_prefix.split_cached_attention():
            got, _ = ALL_ATTENTION_FUNCTIONS["sdpa"](_Attention(), q, k, v, mask, scaling=0.25)
        torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is sdpa_attention_forward  # restored
