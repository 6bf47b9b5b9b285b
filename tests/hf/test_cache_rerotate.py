"""Cached decoding of models whose RoPE frequencies change with the length (``dynamic``, ``longrope``):
``posenc.hf._cache_rerotate`` re-rotates the cached keys to each call's frequencies.

What a KV cache can match: a full forward at length L computes every token's hidden states with the frequencies of
L, while a cache keeps keys and values computed at earlier steps. Re-rotation makes the keys of the first
length-dependent layer exact; every later layer's keys and values come from hidden states computed at an earlier
length. So cached decoding equals the full forward step for step where the first length-dependent attention layer is
the last one (one-layer models here; Gemma 3/4 with only their last, full-attention layer extended), and elsewhere it
equals the reference that caches un-rotated keys and rotates them at every call (dynamic scaling with a KV cache as
YaRN, Peng et al. 2023, section 3.3, defines it), with a ``CacheStaleWarning``. LongRoPE's ``generate`` re-encodes
the sequence once at the switch (Phi-3's rule), which makes it equal the full forward on every model.

Tolerance ``ATOL = 1e-7`` on float64 models: everything is float64 (~1e-16) except what transformers computes in
float32 in both paths -- the RoPE tables (identical bits in both, since the re-rotation undoes the tables the key
was written with) and eager attention's softmax, whose probabilities carry a relative rounding of up to 2^-24 ~ 6e-8;
through the tiny models' O(1) weights and activations that bounds logit differences near 1e-7 (measured <= 2e-8).
``generate`` returns its logits in float32, which adds at most 2^-24 |logit| <= 3e-8 (|logits| < 0.5 here).
The stale cache drifts by 1e-5 or more at the same steps (``test_unpatched_transformers_drifts``).
"""

from __future__ import annotations

import copy
import sys
import warnings

import pytest
import torch
import transformers
from transformers import DynamicCache, StaticCache

from hf.test_extend_proportional import GEMMA4
from hf.tiny import ORIGINAL, tiny_model
from posenc.hf import CacheStaleWarning, extend_context
from posenc.hf._cache_positions import implied_positions
from posenc.hf._cache_rerotate import rerotate_keys

ATOL = 1e-7
U_BF16 = 2.0**-8  # bfloat16's unit roundoff (8 significant bits)
FACTOR = 4.0

# (kind, method): every RoPE architecture extend_context handles with a KV cache; Phi-3's config class takes only
# longrope, Gemma 4's rejects longrope (transformers: head_dim is per layer).
KINDS = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gpt_neox", "gemma", "gemma2", "gemma3_text", "gemma4_text")
CASES = [
    (kind, method)
    for kind in KINDS
    for method in ("dynamic", "longrope")
    if not (kind == "phi3" and method == "dynamic") and not (kind == "gemma4_text" and method == "longrope")
]
CROSSING = (ORIGINAL - 4, 12)  # (prompt length, new tokens): from inside the original length to past it
PAST = (ORIGINAL + 5, 6)  # a prompt already past it
GEMMA4_ROPE = {  # both layer types plain RoPE, so the full-attention layers can take dynamic NTK
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "default", "rope_theta": 1e6},
}


def _rotary_pairs(kind: str) -> int:
    return {"gpt_neox": 2, "gemma4_text": 8}.get(kind, 4)  # GPT-NeoX rotates half its head; Gemma 4 full: head 16


def _options(kind: str, method: str) -> dict:
    options = {"long_factor": [1.0 + 1.5 * i for i in range(_rotary_pairs(kind))]} if method == "longrope" else {}
    if kind in ("gemma3_text", "gemma4_text"):
        options["layer_type"] = "full_attention"
    return options


def _model(kind: str, method: str | None, *, dtype=torch.float64, layers: int = 1, **overrides):
    """A tiny model extended by ``method``. With ``layers=1`` its only length-dependent attention layer is its last
    (Gemma 2: one sliding-window layer, window 16; Gemma 3/4: a sliding layer of plain RoPE, then the extended
    full-attention layer), so a cache can match the full forward."""
    if kind == "gemma4_text":
        config = transformers.Gemma4TextConfig(
            **{**GEMMA4, "layer_types": ["sliding_attention", "full_attention"], "rope_parameters": GEMMA4_ROPE}
        )
        config._attn_implementation = "eager"
        model = transformers.Gemma4ForCausalLM(config).eval()
    elif kind == "gemma3_text":
        model = tiny_model(kind, **overrides)  # (sliding, full): only the full layer is extended
    elif kind == "gemma2" and layers == 1:
        model = tiny_model(kind, num_hidden_layers=1, layer_types=["sliding_attention"], **overrides)
    else:
        model = tiny_model(kind, num_hidden_layers=layers, **overrides)
    model = model.to(dtype)
    if method is not None:
        extend_context(model, method, FACTOR, **_options(kind, method))
    return model


def _prompt(length: int, batch: int = 1, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 64, (batch, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def _reset(model) -> None:
    """A call below the original length: transformers' dynamic NTK keeps the largest length it has seen since its
    last call below the original one (``max_seq_len_cached``), so each comparison starts from the same state."""
    model(torch.tensor([[3]]), use_cache=False)


def _generate(model, prompt, new_tokens, **kwargs):
    _reset(model)
    return model.generate(
        prompt,
        max_new_tokens=new_tokens,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
        eos_token_id=None,
        **kwargs,
    )


@torch.no_grad()
def _full_forward_steps(model, sequences, start: int, steps: int, attention_mask=None) -> list[torch.Tensor]:
    """The last row of a no-cache forward over each prefix ``sequences[:, :start + i]``, in increasing length."""
    _reset(model)
    rows = []
    for i in range(steps):
        ids = sequences[:, : start + i]
        kwargs = {}
        if attention_mask is not None:
            mask = attention_mask[:, : start + i]
            kwargs = {"attention_mask": mask, "position_ids": implied_positions(mask, ids.shape[1])}
        rows.append(model(ids, use_cache=False, **kwargs).logits[:, -1])
    return rows


def _assert_steps_equal(cached, full, atol=ATOL):
    for step, (a, b) in enumerate(zip(cached, full, strict=True)):
        a, b = a.double(), b.double()  # generate hands out its logits in float32
        torch.testing.assert_close(a, b, rtol=0, atol=atol, msg=lambda m, step=step: f"step {step}: {m}")


# ---------------------------------------------------------------------------------------------------------------
# Where a cache can equal the full forward, generate does


@pytest.mark.parametrize(("prompt_length", "new_tokens"), [CROSSING, PAST], ids=["crossing", "past"])
@pytest.mark.parametrize(("kind", "method"), CASES)
def test_generate_equals_full_forwards(kind, method, prompt_length, new_tokens):
    model = _model(kind, method)
    prompt = _prompt(prompt_length)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheStaleWarning)
        out = _generate(model, prompt, new_tokens)
    full = _full_forward_steps(model, out.sequences, prompt_length, new_tokens)
    _assert_steps_equal(out.logits, full)
    assert torch.equal(out.sequences[:, prompt_length:], torch.stack([f.argmax(-1) for f in full], dim=1))


@pytest.mark.parametrize(("kind", "method"), [(k, m) for k, m in CASES if k in ("llama", "gpt_neox", "phi3", "gemma2")])
def test_manual_decode_loop(kind, method):
    """Explicit position_ids and a DynamicCache: a prefill, chunks of 3 and single tokens across the switch, a crop
    (assisted decoding's rollback) and more tokens; each call's last row equals the full forward's."""
    model = _model(kind, method)
    ids = _prompt(ORIGINAL + 12)
    calls = [(0, 20), (20, 23), (23, 26), *((t, t + 1) for t in range(26, 36)), (34, 35), (35, 38), (38, 39)]
    cache = DynamicCache()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error", CacheStaleWarning)
        _reset(model)
        for start, end in calls:
            if start < cache.get_seq_length():
                if kind == "gemma2":
                    break  # a full sliding window cannot be cropped without activate_past_recording
                cache.crop(start - cache.get_seq_length())
            positions = torch.arange(start, end)[None]
            cached = model(ids[:, start:end], cache=cache, position_ids=positions, use_cache=True).logits[:, -1]
            full = model(ids[:, :end], use_cache=False).logits[:, -1]
            torch.testing.assert_close(cached, full, rtol=0, atol=ATOL, msg=lambda m, end=end: f"length {end}: {m}")


@pytest.mark.parametrize("method", ["dynamic", "longrope"])
def test_left_padded_batch(method):
    """Two prompts of different lengths, left-padded, through generate: each row equals the no-cache forward of the
    padded batch (positions from the mask, as generate makes them) at every step. transformers' rotary module takes
    one length for the batch (``max(position_ids) + 1``), so a shorter row runs at the longer row's frequencies."""
    model = _model("llama", method)
    long, short = _prompt(ORIGINAL - 2, seed=1), _prompt(ORIGINAL - 7, seed=2)
    ids = torch.cat([long, torch.cat([torch.zeros(1, 5, dtype=torch.long), short], dim=1)])
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheStaleWarning)
        out = _generate(model, ids, 10, attention_mask=mask)
    mask = torch.cat([mask, torch.ones(2, 10, dtype=torch.long)], dim=1)
    full = _full_forward_steps(model, out.sequences, ids.shape[1], 10, attention_mask=mask)
    _assert_steps_equal(out.logits, full)


def test_left_padded_batch_equals_each_prompt_alone():
    """Where the frequencies do not depend on which row sets the batch's length (LongRoPE past its switch for both
    rows), a padded batch generates what each prompt generates alone."""
    model = _model("mistral", "longrope")
    prompts = [_prompt(ORIGINAL + 6, seed=1), _prompt(ORIGINAL + 2, seed=2)]
    ids = torch.cat([prompts[0], torch.cat([torch.zeros(1, 4, dtype=torch.long), prompts[1]], dim=1)])
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheStaleWarning)
        batch = _generate(model, ids, 8, attention_mask=mask)
        for row, prompt in enumerate(prompts):
            alone = _generate(model, prompt, 8)
            assert torch.equal(batch.sequences[row, -8:], alone.sequences[0, -8:])
            _assert_steps_equal([step[row : row + 1] for step in batch.logits], alone.logits)


def test_a_composed_extension_continues_the_cache():
    """The cache records the frequencies each key was rotated with, not a length: a cache filled at dynamic x2 goes
    on exactly after a second call composes it to x4."""
    model = _model("llama", None)
    extend_context(model, "dynamic", 2.0)
    ids = _prompt(ORIGINAL + 12)
    cache = DynamicCache()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", CacheStaleWarning)
        _reset(model)
        model(ids[:, :36], cache=cache, use_cache=True)
        extend_context(model, "dynamic", 2.0)  # composed: x4
        for t in range(36, 40):
            cached = model(ids[:, t : t + 1], cache=cache, use_cache=True).logits[:, -1]
            full = model(ids[:, : t + 1], use_cache=False).logits[:, -1]
            torch.testing.assert_close(cached, full, rtol=0, atol=ATOL)


def test_a_copied_prompt_cache():
    """A prompt cache copied (copy.deepcopy) and continued two ways: each continuation equals its full forward."""
    model = _model("qwen2", "dynamic")
    ids = _prompt(ORIGINAL + 8)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", CacheStaleWarning)
        _reset(model)
        prompt_cache = DynamicCache()
        model(ids[:, :30], cache=prompt_cache, use_cache=True)
        for token in (5, 9):
            cache = copy.deepcopy(prompt_cache)
            seq = torch.cat([ids[:, :30], torch.tensor([[token]]), ids[:, 30:34]], dim=1)
            for t in range(30, 35):
                cached = model(seq[:, t : t + 1], cache=cache, use_cache=True).logits[:, -1]
                torch.testing.assert_close(cached, model(seq[:, : t + 1]).logits[:, -1], rtol=0, atol=ATOL)
        assert prompt_cache.get_seq_length() == 30


def test_a_copied_model_reads_its_own_rotary_module():
    """copy.deepcopy of a patched model: the copy's hooks follow the copy's rotary module (the original's has seen a
    longer sequence, so transformers' dynamic NTK keeps other frequencies there), and re-extending the copy replaces
    the copy's hooks, not the original's."""
    model = _model("gemma", "dynamic")
    twin = copy.deepcopy(model)
    with torch.no_grad():
        model(_prompt(3 * ORIGINAL), use_cache=False)  # the original's max_seq_len_cached: 96
    prompt_length, new_tokens = CROSSING
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheStaleWarning)
        twin_out = twin.generate(
            _prompt(prompt_length),
            max_new_tokens=new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
            eos_token_id=None,
        )
    _assert_steps_equal(twin_out.logits, _full_forward_steps(twin, twin_out.sequences, prompt_length, new_tokens))
    extend_context(twin, "dynamic", 2.0)
    for original, copied in zip(model.model.layers, twin.model.layers, strict=True):
        assert len(original.self_attn._forward_pre_hooks) == len(copied.self_attn._forward_pre_hooks) == 2


# ---------------------------------------------------------------------------------------------------------------
# Deeper layers: the un-rotated-key cache of YaRN section 3.3, and the warning


class _UnrotatedKeyCache(DynamicCache):
    """The reference: keys stored before RoPE, rotated at every call by the rotary module's tables of that call
    (transformers' own ``*RotaryEmbedding.forward`` and ``apply_rotary_pos_emb``)."""

    def __init__(self, rotary, apply_rotary_pos_emb):
        super().__init__()
        self.rotary, self.apply_rotary_pos_emb = rotary, apply_rotary_pos_emb

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        positions = torch.arange(keys.shape[-2])[None]
        cos, sin = type(self.rotary).forward.__wrapped__(self.rotary, keys, positions)  # no frequency update
        return self.apply_rotary_pos_emb(keys, keys, cos, sin)[0], values


@pytest.mark.parametrize(("prompt_length", "new_tokens"), [CROSSING, PAST], ids=["crossing", "past"])
def test_deeper_layers_follow_the_unrotated_key_reference(monkeypatch, prompt_length, new_tokens):
    """Two layers, dynamic NTK: generate equals a natively built transformers model decoding with a cache of
    un-rotated keys (queries rotated as usual), warns once that it is not the full forward, and is not."""
    model = _model("llama", "dynamic", layers=2)
    native = tiny_model(
        "llama",
        model.state_dict(),
        num_hidden_layers=2,
        rope_parameters={"rope_type": "dynamic", "factor": FACTOR, "rope_theta": 10000.0},
    ).double()
    prompt = _prompt(prompt_length)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = _generate(model, prompt, new_tokens)
    assert len([w for w in caught if issubclass(w.category, CacheStaleWarning)]) == 1

    modeling = sys.modules["transformers.models.llama.modeling_llama"]
    rotate = modeling.apply_rotary_pos_emb

    def queries_only(q, k, cos, sin, unsqueeze_dim=1):
        return rotate(q, q, cos, sin, unsqueeze_dim)[0], k

    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", queries_only)
    cache, reference = _UnrotatedKeyCache(native.model.rotary_emb, rotate), []
    with torch.no_grad():
        _reset(native)
        ids = prompt
        for _ in range(new_tokens):
            step = native(ids[:, cache.get_seq_length() :], cache=cache, use_cache=True).logits[:, -1]
            reference.append(step)
            ids = torch.cat([ids, step.argmax(-1, keepdim=True)], dim=1)
    monkeypatch.undo()
    _assert_steps_equal(out.logits, reference)
    assert torch.equal(out.sequences, ids)
    full = _full_forward_steps(model, out.sequences, prompt_length, new_tokens)
    assert max((a - b).abs().max().item() for a, b in zip(out.logits, full, strict=True)) > 10 * ATOL


def _stale_warnings(run) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return len([w for w in caught if issubclass(w.category, CacheStaleWarning)])


@pytest.mark.parametrize("hooked", [True, False], ids=["rerotated", "former-guard"])
def test_every_cache_that_leaves_the_full_forward_warns(monkeypatch, hooked):
    """Issue 68, item 1: the warning belongs to the cache that goes stale, not to the model. A second generate on the
    same two-layer dynamic model (a new cache, across the original length again) leaves the full forward as the
    first did, so it warns too, once; a generate that stays within the original length does not. Also where posenc
    recognises no attention module (the former guard: a new sequence, from position 0, is a new cache)."""
    if not hooked:
        monkeypatch.setattr("posenc.hf._cache_rerotate.attention_modules", lambda model: [])
    model = _model("llama", "dynamic", layers=2)
    prompt_length, new_tokens = CROSSING
    for seed in (1, 2):
        outs: list = []
        prompt = _prompt(prompt_length, seed)
        warned = _stale_warnings(lambda p=prompt, o=outs: o.append(_generate(model, p, new_tokens)))
        assert warned == 1, f"generate {seed}: {warned} warnings"
        full = _full_forward_steps(model, outs[0].sequences, prompt_length, new_tokens)
        assert max((a.double() - b).abs().max().item() for a, b in zip(outs[0].logits, full, strict=True)) > 10 * ATOL
    assert _stale_warnings(lambda: _generate(model, _prompt(ORIGINAL - 10), 6)) == 0


@pytest.mark.parametrize("kind", ["llama", "phi3", "gemma2"])
def test_longrope_generate_reencodes_at_the_switch(kind):
    """Two layers, LongRoPE across its switch: generate drops the cache once and re-encodes the sequence with the
    long factors, so it equals the full forward with no warning (Phi-3 natively, the others by posenc's patch)."""
    model = _model(kind, "longrope", layers=2)
    prompt_length, new_tokens = CROSSING
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheStaleWarning)
        out = _generate(model, _prompt(prompt_length), new_tokens)
    _assert_steps_equal(out.logits, _full_forward_steps(model, out.sequences, prompt_length, new_tokens))


# ---------------------------------------------------------------------------------------------------------------
# The re-rotation matters, and in bfloat16 it must not be done in place


def test_unpatched_transformers_drifts():
    """transformers' own dynamic NTK (no posenc) with its cache: past the original length, generate leaves the full
    forward by far more than the tolerance the patched model meets at the same steps."""
    patched = _model("llama", "dynamic")
    native = tiny_model(
        "llama",
        patched.state_dict(),
        num_hidden_layers=1,
        rope_parameters={"rope_type": "dynamic", "factor": FACTOR, "rope_theta": 10000.0},
    ).double()
    prompt_length, new_tokens = CROSSING
    prompt = _prompt(prompt_length)
    for model, drifts in ((native, True), (patched, False)):
        out = _generate(model, prompt, new_tokens)
        full = _full_forward_steps(model, out.sequences, prompt_length, new_tokens)
        drift = max((a - b).abs().max().item() for a, b in zip(out.logits, full, strict=True))
        assert (drift > 100 * ATOL) if drifts else (drift <= ATOL), (model.config.rope_parameters, drift)


def _pair_norms(keys: torch.Tensor, pairs: int) -> torch.Tensor:
    """The norm of each key's rotating pair (i, i + F), repeated over both channels: ``(..., 2F)``."""
    a, b = keys[..., :pairs].double(), keys[..., pairs : 2 * pairs].double()
    norm = (a * a + b * b).sqrt()
    return torch.cat([norm, norm], dim=-1)


def test_bfloat16_generates_and_its_keys_stay_within_a_few_roundings(monkeypatch):
    """A bfloat16 model (one layer, dynamic NTK, 50 steps past the original length, each with new frequencies)
    generates, and the keys its attention reads stay within a bound that does not grow with the steps.

    Bound, per element, relative to the key's rotating-pair norm rho (u = 2^-8; transformers rotates in float32 under
    ``keep_rope_float32`` and rounds once): a cached key is stored as ``bf16(T_w k)`` (pair error <= sqrt(2) u rho);
    ``T_now T_w^-1`` is a rotation times ``a_now / a_w``, so re-rotating it in float32 carries that error over
    unchanged relative to rho and the cast back adds u: ``(sqrt(2) + 1) u``. The full forward's key is
    ``bf16(T_now k')``: u, plus 2u if its k_proj row ``k'`` rounds differently in a whole-prefix GEMM than alone
    (one bfloat16 ulp; equal on this machine). Total ``(sqrt(2) + 4) u < 5.5 u`` (measured 1.9 u). A cache re-rotated
    in place would round once per step instead and lose each step's rotation below half an ulp
    (``test_in_place_rerotation_would_break_the_bfloat16_bound``)."""
    model = _model("llama", "dynamic", dtype=torch.bfloat16)
    ids = _prompt(ORIGINAL + 50)
    seen = {}
    modeling = sys.modules["transformers.models.llama.modeling_llama"]
    attend = modeling.eager_attention_forward

    def spy(module, query, key, value, *args, **kwargs):
        seen["keys"] = key
        return attend(module, query, key, value, *args, **kwargs)

    monkeypatch.setattr(modeling, "eager_attention_forward", spy)
    out = _generate(model, ids[:, :20], ORIGINAL + 30)
    assert out.sequences.shape[1] == 20 + ORIGINAL + 30 and bool(torch.isfinite(torch.stack(out.logits)).all())
    with torch.no_grad():
        _reset(model)
        cache = DynamicCache()
        model(ids[:, :20], cache=cache, use_cache=True)
        for t in range(20, ids.shape[1]):
            model(ids[:, t : t + 1], cache=cache, use_cache=True)
        cached = seen["keys"]
        _reset(model)
        model(ids, use_cache=False)
        full = seen["keys"]
    pairs = 4
    bound = 5.5 * U_BF16 * _pair_norms(full, pairs)
    error = (cached[..., : 2 * pairs].double() - full[..., : 2 * pairs].double()).abs()
    assert bool((error <= bound).all()), (error / bound).max()
    assert (error > 0).any()  # bfloat16 rounding is there: the bound is not vacuous


def test_in_place_rerotation_would_break_the_bfloat16_bound():
    """300 dynamic-NTK steps on bfloat16 keys: one re-rotation from the keys as written stays within
    ``(sqrt(2) + 1) u < 3u`` of the exact rotation (the derivation above, without the full forward's rounding),
    while re-rotating in place step by step (what the patch avoids) does not."""
    model = _model("llama", "dynamic", dtype=torch.float32)
    rotary = model.model.rotary_emb
    keys = torch.randn(1, 2, 100, 8, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(100)[None]

    def frequencies(length):
        with torch.no_grad():
            rotary(torch.zeros(1), torch.tensor([[length - 1]]))
        return rotary.inv_freq.clone(), float(rotary.attention_scaling)

    def rotate(x, inv, scale):  # transformers' tables and apply_rotary_pos_emb, in float32
        return rerotate_keys(x, positions, torch.zeros_like(inv).expand(100, -1), torch.ones(100), inv, scale)

    first, first_scale = frequencies(100)
    written = rotate(keys, first, first_scale).bfloat16()
    in_place, inv, scale = written, first, first_scale
    for length in range(101, 400):
        new, new_scale = frequencies(length)
        in_place = rerotate_keys(in_place, positions, inv.expand(100, -1), torch.full((100,), scale), new, new_scale)
        inv, scale = new, new_scale
    once = rerotate_keys(written, positions, first.expand(100, -1), torch.full((100,), first_scale), inv, scale)
    exact = rotate(keys, inv, scale)
    bound = 3 * U_BF16 * _pair_norms(exact, 4)
    assert bool(((once.double() - exact.double()).abs() <= bound).all())
    assert not bool(((in_place.double() - exact.double()).abs() <= bound).all())


# ---------------------------------------------------------------------------------------------------------------
# Refused, and left alone


def test_a_cache_filled_before_the_patch_is_refused():
    model = _model("llama", None)
    ids = _prompt(ORIGINAL + 4)
    cache = DynamicCache()
    with torch.no_grad():
        model(ids[:, :30], cache=cache, use_cache=True)
        extend_context(model, "dynamic", FACTOR)
        with pytest.raises(ValueError, match=r"layer 0 holds 30 keys this patched model did not write"):
            model(ids[:, 30:31], cache=cache, use_cache=True)


@pytest.mark.parametrize("method", ["dynamic", "longrope"])
def test_a_static_cache_runs_until_the_frequencies_change_then_is_refused(method):
    model = _model("llama", method)
    ids = _prompt(ORIGINAL + 4)
    cache = StaticCache(config=model.config, max_cache_len=64)
    with torch.no_grad():
        _reset(model)
        model(ids[:, :28], cache=cache, use_cache=True)
        for t in range(28, ORIGINAL):  # same frequencies: runs as before
            cached = model(ids[:, t : t + 1], cache=cache, use_cache=True).logits[:, -1]
            torch.testing.assert_close(cached, model(ids[:, : t + 1]).logits[:, -1], rtol=0, atol=ATOL)
        with pytest.raises(ValueError, match=r"StaticCache .*expected a DynamicCache"):
            model(ids[:, ORIGINAL : ORIGINAL + 1], cache=cache, use_cache=True)


def test_a_remapping_patch_after_dynamic_turns_the_rerotation_off():
    """Self-Extend on a dynamic-NTK model caches un-rotated keys and rotates them in its attention: the re-rotation
    hooks stay out of its way (no record, none of their warnings). The one warning is the remapping patch's own,
    where the sequence passes the original length (tests/hf/test_extend_remap.py)."""
    model = _model("llama", "dynamic", layers=2)
    extend_context(model, "self_extend", 2.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = _generate(model, _prompt(ORIGINAL - 4), 8)
    assert out.sequences.shape[1] == ORIGINAL + 4
    stale = [str(w.message) for w in caught if issubclass(w.category, CacheStaleWarning)]
    assert len(stale) == 1 and "under self_extend" in stale[0], stale
    cache = DynamicCache()
    with torch.no_grad():
        model(_prompt(ORIGINAL + 2), cache=cache, use_cache=True)
    assert not any("_posenc_written_keys" in vars(layer) for layer in cache.layers)


def test_without_an_attention_module_to_hook_the_former_guard_warns(monkeypatch):
    """Where posenc recognises no attention module (none of transformers' ``q_proj``/``query_key_value``/``qkv_proj``
    with a ``layer_idx``), nothing re-rotates: a cached forward crossing to new frequencies warns once."""
    monkeypatch.setattr("posenc.hf._cache_rerotate.attention_modules", lambda model: [])
    model = _model("llama", "dynamic")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _generate(model, _prompt(ORIGINAL - 2), 6)
    stale = [w for w in caught if issubclass(w.category, CacheStaleWarning)]
    assert len(stale) == 1 and "found no attention module" in str(stale[0].message)
