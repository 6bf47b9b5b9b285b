"""Extension per layer type on the real Gemma 3 270M (``posenc.hf.load_causal_lm("gemma3-270m")``: the released
weights as Q4_K_M GGUF, dequantised to float32; 18 layers, 5 sliding (window 512, RoPE base 1e4) then 1 global
(base 1e6), repeated; trained context 32768).

- Google's own extension: the released Gemma 3 4B, 12B and 27B scale the global layers only, linear x8 --
  transformers' ``models/gemma3/convert_gemma3_weights.py`` (``_VARIANTS``, huggingface/transformers@0d7e95d9) gives
  them ``rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0}, "sliding_attention":
  {"rope_type": "default"}}``, their hub configs ``"rope_scaling": {"factor": 8.0, "rope_type": "linear"}`` beside
  ``rope_local_base_freq`` 1e4 (270M and 1B: none). ``extend_context(model, "linear", 8, layer_type=
  "full_attention")`` equals (full logits, exactly) the model transformers builds from that config with the same
  weights.
- Every other frequency method on the global layers: the rotary module's cos/sin of both layer types equal those of
  the module transformers builds from the method's own config (the model reads RoPE from nothing else), the sliding
  layers' equal the model as loaded.
- Remapping methods on the global layers: a global layer's attention (float64 copy) equals the method's written-out
  reference at base 1e6, and in one real forward every sliding layer gets the model's own cos/sin and 512-token
  window mask and returns exactly what the unpatched layer returns.
- The reach warning follows the layers actually extended (a sliding layer, whose window fits its context, reaches
  any length).

The twins transformers builds share the loaded weights (a meta-device model given them with ``assign=True``), so the
module stays near 3 GiB; the model loads once (``posenc.gguf.native``: 7-10 s on a 2-core Xeon).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from posenc.hf import ReachExceededWarning, extend_context, packaged

pytestmark = pytest.mark.skipif(
    not packaged.available(packaged.GEMMA3_270M),
    reason="Gemma 3 270M is not at hand (posenc.hf.packaged.available('gemma3-270m'): POSENC_CACHE / POSENC_WHEELS)",
)

FULL, SLIDING = "full_attention", "sliding_attention"
ORIGINAL = 32768  # Gemma 3 270M's max_position_embeddings
S = 640  # tokens per input: past the 512-token window, so the sliding layers' mask is not plain causal
AS_LOADED = {SLIDING: {"rope_type": "default", "rope_theta": 1e4}, FULL: {"rope_type": "default", "rope_theta": 1e6}}


@pytest.fixture(autouse=True)
def one_thread():
    """Overrides tests/hf's one-thread fixture: these matrices are large enough for both cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(min(2, threads))
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def gemma():
    from posenc.hf import load_causal_lm

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load_causal_lm(packaged.GEMMA3_270M, tokenizer=False)[0]  # no tokenizer needed here
    assert model.config.rope_parameters == AS_LOADED and model.config.sliding_window == 512  # what this file assumes
    assert model.config.max_position_embeddings == ORIGINAL and model.dtype == torch.float32
    return model


def twin(model, **config):
    """The model transformers builds from ``model``'s config with ``config`` set, holding ``model``'s weights
    (shared, not copied): built on the meta device, given the weights with ``assign=True``; its rotary module built
    from the new config as ``Gemma3TextModel.__init__`` builds it, its other non-persistent buffers (the embedding
    scale) taken from ``model``."""
    new = copy.deepcopy(model.config)
    for key, value in config.items():
        setattr(new, key, value)
    with torch.device("meta"):
        out = type(model)(new)
    out.load_state_dict(model.state_dict(), assign=True, strict=True)
    out.model.rotary_emb = type(model.model.rotary_emb)(new)
    buffers = dict(model.named_buffers())
    for name, buffer in list(out.named_buffers()):
        if buffer.is_meta:
            owner, _, leaf = name.rpartition(".")
            setattr(out.get_submodule(owner), leaf, buffers[name].clone())
    assert not any(t.is_meta for t in (*out.parameters(), *out.buffers()))
    return out.eval()


def tokens(n=S, seed=0):
    return torch.randint(3, 262_000, (1, n), generator=torch.Generator().manual_seed(seed))


def rotary(model, positions, layer_type):
    """``(cos, sin)`` the model's rotary module gives ``layer_type`` at ``positions``, as its forward asks for them."""
    with torch.no_grad():
        return model.model.rotary_emb(torch.zeros(1, positions.shape[-1], 1), positions, layer_type)


# ---------------------------------------------------------------------------------------------------------------------
# Frequency methods on the global layers


def test_google_s_linear_x8_on_the_global_layers_is_transformers_own_model(gemma):
    """Positions 40000..40639: past the 32768 trained, inside the 262144 linear x8 reaches. Full logits, exactly:
    the same weights, the same code, the same cos/sin (measured max |difference| 0)."""
    model = copy.deepcopy(gemma)
    report = extend_context(model, "linear", 8.0, layer_type=FULL)
    linear = {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    native = twin(gemma, rope_parameters={**AS_LOADED, FULL: linear}, max_position_embeddings=8 * ORIGINAL)
    assert model.config.rope_parameters == native.config.rope_parameters == {**AS_LOADED, FULL: linear}
    assert model.config.max_position_embeddings == 8 * ORIGINAL
    assert report["layer_contexts"] == {FULL: 8 * ORIGINAL, SLIDING: ORIGINAL}
    positions = torch.arange(40_000, 40_000 + S)[None]
    with torch.no_grad():
        got = model(input_ids=tokens(), position_ids=positions, use_cache=False).logits
        expected = native(input_ids=tokens(), position_ids=positions, use_cache=False).logits
    assert got.shape == (1, S, 262_144) and torch.equal(got, expected)
    del got, expected
    for layer_type, moved in ((SLIDING, False), (FULL, True)):  # only the global layers' rotation changed
        cos, sin = rotary(model, positions, layer_type)
        cos0, sin0 = rotary(gemma, positions, layer_type)
        assert (torch.equal(cos, cos0) and torch.equal(sin, sin0)) is not moved


LONG_FACTOR = [1.0 + 0.05 * i for i in range(128)]  # head_dim 256: 128 frequencies
#: posenc's method and options -> transformers' own ``rope_parameters`` for the global layers (base 1e6, 32768 -> x8);
#: static NTK, which transformers lacks, is default RoPE at base ``1e6 * 8 ** (256 / 254)``.
NATIVE = {
    "linear": ({}, {"rope_type": "linear", "factor": 8.0}),
    "ntk": ({}, {"rope_type": "default", "rope_theta": 1e6 * 8 ** (256 / 254)}),
    "dynamic": ({}, {"rope_type": "dynamic", "factor": 8.0}),
    "yarn": ({}, {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": ORIGINAL}),
    "llama3": ({}, {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": ORIGINAL,
                    "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
    "longrope": ({"long_factor": LONG_FACTOR}, {"rope_type": "longrope", "factor": 8.0,
                                                "original_max_position_embeddings": ORIGINAL,
                                                "long_factor": LONG_FACTOR, "short_factor": [1.0] * 128}),
}


@pytest.mark.parametrize("method", sorted(NATIVE))
def test_each_frequency_method_on_the_global_layers_is_transformers_own(method, gemma):
    """At positions 40000..40639 (past 32768: dynamic NTK rescales there, LongRoPE takes its long factors): the
    patched model's cos/sin of both layer types equal, exactly, those of the rotary module transformers builds from
    the method's own config -- what every attention layer reads of the positions (the weights and the code are the
    same), so the forward is transformers' model of that config. The sliding layers' equal the model as loaded, the
    global layers' differ from it."""
    options, params = NATIVE[method]
    model = twin(gemma)
    extend_context(model, method, 8.0, layer_type=FULL, **options)
    context = ORIGINAL if method == "dynamic" else 8 * ORIGINAL  # dynamic keeps its threshold there
    native = twin(gemma, rope_parameters={**AS_LOADED, FULL: {"rope_theta": 1e6, **params}},
                  max_position_embeddings=context)
    assert model.config.max_position_embeddings == context
    assert model.config.rope_parameters[SLIDING] == AS_LOADED[SLIDING]
    positions = torch.arange(40_000, 40_000 + S)[None]
    for layer_type in (SLIDING, FULL):
        got, expected, loaded = (rotary(m, positions, layer_type) for m in (model, native, gemma))
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True)), layer_type
        assert all(torch.equal(a, b) for a, b in zip(got, loaded, strict=True)) is (layer_type == SLIDING)


# ---------------------------------------------------------------------------------------------------------------------
# Remapping methods on the global layers


#: Each method's factor and options, set so that it changes something within 640 tokens (its paper's rule over 32768
#: tokens would put every pair of a short input in its neighbour window): (factor, options).
REMAP = {
    "self_extend": (2.0, dict(window=128, group=4)),
    "dca": (2.0, dict(chunk_size=256, local_window=32)),
    "dca_vllm": (2.0, dict(chunk_size=256, local_window=32)),
    "rerope": (2.0, dict(window=128)),
    "leaky_rerope": (2.0, dict(window=128)),
    "lm_infinite": (2.0, dict(window=256, global_tokens=10)),
    "string": (1.0, dict(shifted_offset=256, local_window=32)),  # at the training length, where its paper runs it
    "streaming_llm": (2.0, dict(window=256, sinks=4)),
}
ROWS = 16  # the last 16 query rows (624..639) against the reference: every branch of every method above occurs there


def _attend_rows(q, k, v, pair, inv_freq, *, layout="half", attention_factor=1.0, scale=None):
    """``reference.remapping._attend`` with the rotations of each query row batched: the same pairs (the reference's
    own ``pair(i, j)``, its written-out if/else), positions and softmax, float64; a query row costs two rotations of
    640 vectors instead of 1280 calls."""
    from reference.rope_float64 import rotate_float64

    b_, h_, s_, d_ = q.shape
    hkv, t_ = k.shape[1], k.shape[2]
    scale = d_**-0.5 if scale is None else scale
    out = torch.zeros(b_, h_, s_, v.shape[-1], dtype=torch.float64)
    for a in range(s_):
        i = t_ - s_ + a
        chosen = [(j, c) for j in range(i + 1) if (c := pair(i, j)) is not None]
        keys = torch.tensor([j for j, _ in chosen])
        qp, kp, factor = (torch.tensor([c[n] for _, c in chosen], dtype=torch.float64) for n in range(3))
        for b in range(b_):
            for h in range(h_):
                g = h // (h_ // hkv)
                rope = dict(layout=layout, attention_factor=attention_factor)
                qr = rotate_float64(q[b, h, a].expand(len(keys), -1), qp, inv_freq, **rope)
                kr = rotate_float64(k[b, g, keys], kp, inv_freq, **rope)
                w = torch.softmax((qr * kr).sum(-1) * scale * factor, dim=0)
                out[b, h, a] = w @ v[b, g, keys].double()
    return out


def _reference(name, method, q, k, v, scale):
    """The method's reference (tests/reference/remapping.py) for the last ``ROWS`` queries at base 1e6, written out
    here (not posenc's encoding), ``(1, H, ROWS, D)`` float64."""
    from reference import remapping as ref

    # The float32 table a RoPE module holds (posenc's: the float64 formula rounded once; transformers' own float32
    # computation differs by up to an ulp), then float64: a float64 table would move angles at position 639 by up to
    # 639 * 2**-24 = 4e-5 rad, 1e-7 of the output, which is what a float32 table is, not what the method does.
    inv_freq = (1.0 / (1e6 ** (torch.arange(0, 256, 2, dtype=torch.float64) / 256))).float().double()
    q = q[:, :, -ROWS:]
    if name == "plain":
        return ref.plain(q, k, v, inv_freq, scale=scale)
    if name == "self_extend":
        return ref.self_extend(q, k, v, inv_freq, window=method.window, group=method.group, scale=scale)
    if name == "dca":
        return ref.dual_chunk(q, k, v, inv_freq, chunk_size=method.chunk_size, local_window=method.local_window,
                              pretraining_length=method.original_max_position_embeddings, scale=scale)
    if name == "dca_vllm":
        return ref.dual_chunk_vllm(q, k, v, inv_freq, chunk_size=method.chunk_size, local_size=method.local_window,
                                   original_max_position_embeddings=method.original_max_position_embeddings,
                                   scale=scale)
    if name in ("rerope", "leaky_rerope"):
        return ref.rerope(q, k, v, inv_freq, window=method.window, training_length=method.log_scale_length,
                          leak=method.leak, scale=scale)
    if name == "string":
        return ref.string(q, k, v, inv_freq, diag_size=method.shifted_offset, local_window=method.local_window,
                          attention_factor_string=method.mscale, scale=scale)
    if name == "streaming_llm":
        return ref.streaming_llm(q, k, v, inv_freq, start_size=method.sinks, recent_size=method.window, scale=scale)
    return ref.lm_infinite(q, k, v, inv_freq, local_branch=method.window, global_branch=method.global_tokens,
                           scale=scale)


def _layer_input(model):
    """A real hidden input for one attention module: the tokens' scaled embeddings, normalised as a layer does."""
    with torch.no_grad():
        return model.model.layers[0].input_layernorm(model.model.embed_tokens(tokens(seed=1)))  # (1, S, 640)


def _masks(model, hidden):
    """The (full, sliding) masks the model's forward builds for a plain causal input (transformers' own builders)."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    kwargs = dict(config=model.config, inputs_embeds=hidden, attention_mask=None, cache=None,
                  position_ids=torch.arange(hidden.shape[1])[None])
    return create_causal_mask(**kwargs), create_sliding_window_causal_mask(**kwargs)


@pytest.mark.parametrize("name", sorted(REMAP))
def test_each_remapping_method_on_the_global_layers_is_its_reference(name, gemma, monkeypatch):
    """640 real-token positions 0..639. A global layer (5) of the patched model, copied to float64, equals the
    method's float64 reference on its own queries, keys and values (q/k-normed, un-rotated, rotated by the reference
    at base 1e6, scale 256 ** -0.5): float64 against float64, so 1e-12 of the output's magnitude bounds the
    difference (measured <= 1.6e-15 relative); the method moves the output by >= 1e-2 of it against plain RoPE. A
    sliding layer (0) equals the unpatched model's layer, exactly, with each model's own cos/sin and window mask."""
    import reference.remapping

    factor, options = REMAP[name]
    model = twin(gemma)
    description = extend_context(model, name, factor, layer_type=FULL, **options)
    assert description["layers"] == [5, 11, 17] and description["layer_type"] == FULL
    assert model.config.rope_parameters == AS_LOADED  # the frequencies stay; only the global layers' positions move
    hidden = _layer_input(gemma)
    positions = torch.arange(S)[None]
    (full_mask, sliding_mask), (_, loaded_mask) = _masks(model, hidden), _masks(gemma, hidden)
    with torch.no_grad():
        got = model.model.layers[0].self_attn(hidden_states=hidden, attention_mask=sliding_mask,
                                              position_embeddings=rotary(model, positions, SLIDING))[0]
        expected = gemma.model.layers[0].self_attn(hidden_states=hidden, attention_mask=loaded_mask,
                                                   position_embeddings=rotary(gemma, positions, SLIDING))[0]
    assert torch.equal(got, expected)

    attention = copy.deepcopy(model.model.layers[5].self_attn).double()
    x = hidden.double()
    cos, sin = rotary(model, positions, FULL)
    assert torch.equal(cos, torch.ones_like(cos)) and torch.equal(sin, torch.zeros_like(sin))  # rotated in attention
    with torch.no_grad():
        got = attention(hidden_states=x, attention_mask=full_mask, position_embeddings=(cos.double(), sin.double()))[0]
        shape = (1, S, -1, 256)
        q = attention.q_norm(attention.q_proj(x).view(shape).transpose(1, 2))  # (1, 4, S, 256)
        k = attention.k_norm(attention.k_proj(x).view(shape).transpose(1, 2))  # (1, 1, S, 256)
        v = attention.v_proj(x).view(shape).transpose(1, 2)
        monkeypatch.setattr(reference.remapping, "_attend", _attend_rows)
        rows = {which: _reference(which, model._posenc_remap.method, q, k, v, attention.scaling)
                for which in (name, "plain")}
        out = {which: attention.o_proj(r.transpose(1, 2).reshape(1, ROWS, -1)) for which, r in rows.items()}
    size = float(out[name].abs().max())
    # float64 through two projections, a 256-wide product per logit and a softmax over 640 keys: a few thousand
    # roundings of 1.1e-16, far below 1e-12 (measured 1.2e-15 .. 1.6e-15); the method moves it by 0.08 .. 0.40.
    assert float((got[:, -ROWS:] - out[name]).abs().max()) <= 1e-12 * size
    assert float((out[name] - out["plain"]).abs().max()) >= 1e-2 * size


def test_in_a_real_forward_the_sliding_layers_are_the_model_as_loaded(gemma):
    """Self-Extend (window 128, group 4) on the global layers, one forward of 640 tokens. Each of the 15 sliding
    layers gets the unpatched model's own cos/sin (base 1e4) and window-512 mask, exactly, and its attention returns
    exactly what the unpatched layer returns for the hidden states it got; the 3 global layers get the identity
    rotation (their attention rotates: the test above) and the full causal mask."""
    model = copy.deepcopy(gemma)
    extend_context(model, "self_extend", 2.0, layer_type=FULL, window=128, group=4)
    calls, handles = {}, []
    for layer in model.model.layers:
        def hook(module, args, kwargs, output):  # noqa: ANN001, ANN202
            calls[module.layer_idx] = (kwargs, output[0])
        handles.append(layer.self_attn.register_forward_hook(hook, with_kwargs=True))
    with torch.no_grad():
        model.model(input_ids=tokens(seed=2), use_cache=False)
    for handle in handles:
        handle.remove()
    hidden = _layer_input(gemma)
    positions = torch.arange(S)[None]
    full_mask, sliding_mask = _masks(gemma, hidden)
    loaded = {SLIDING: (rotary(gemma, positions, SLIDING), sliding_mask), FULL: (None, full_mask)}
    assert sliding_mask is not None and not bool(sliding_mask[0, 0, -1, 0])  # the last token cannot see the first
    for i, layer_type in enumerate(gemma.config.layer_types):
        kwargs, out = calls[i]
        (cos, sin), mask = kwargs["position_embeddings"], kwargs["attention_mask"]
        own, expected_mask = loaded[layer_type]
        assert (mask is None and expected_mask is None) or torch.equal(mask, expected_mask), i
        if layer_type == FULL:
            assert torch.equal(cos, torch.ones_like(cos)) and torch.equal(sin, torch.zeros_like(sin))
            continue
        assert torch.equal(cos, own[0]) and torch.equal(sin, own[1]), i
        with torch.no_grad():
            expected = gemma.model.layers[i].self_attn(**{**kwargs, "position_embeddings": own})[0]
        assert torch.equal(out, expected), i


# ---------------------------------------------------------------------------------------------------------------------
# How far the extended model reaches


def _warned(model, position):
    """ReachExceededWarning messages of a one-token forward at ``position`` (a sequence of ``position + 1``)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            model(input_ids=tokens(1), position_ids=torch.tensor([[position]]), use_cache=False)
    return [str(w.message) for w in caught if issubclass(w.category, ReachExceededWarning)]


def test_the_reach_follows_the_layers_extended(gemma):
    """Linear x8 on the global layers reaches 262144 (the sliding layers' window of 512 fits their 32768: no limit);
    then x2 on the sliding layers too changes nothing; x2 on the sliding layers alone leaves the model at the global
    layers' 32768; dynamic NTK has no limit; Self-Extend x2 on the global layers (its rule over 32768: window 8192,
    group 3) reaches 3 * (32768 - 8192 + 8192 // 3) = 81918. The model as loaded never warns."""
    assert _warned(gemma, 10**6) == []

    google = twin(gemma)
    extend_context(google, "linear", 8.0, layer_type=FULL)
    extend_context(google, "linear", 2.0, layer_type=SLIDING)
    assert google.config.max_position_embeddings == 8 * ORIGINAL
    assert _warned(google, 8 * ORIGINAL - 1) == []
    (message,) = _warned(google, 8 * ORIGINAL)
    assert f"a sequence of {8 * ORIGINAL + 1} tokens" in message and f", {8 * ORIGINAL} tokens:" in message

    sliding = twin(gemma)
    report = extend_context(sliding, "linear", 2.0, layer_type=SLIDING)
    assert sliding.config.max_position_embeddings == ORIGINAL
    assert "the model reaches as far as its full_attention layers: 32768 tokens" in report["description"]
    assert _warned(sliding, ORIGINAL - 1) == []
    assert len(_warned(sliding, ORIGINAL)) == 1

    dynamic = twin(gemma)
    extend_context(dynamic, "dynamic", 8.0, layer_type=FULL)
    assert _warned(dynamic, 10**6) == []

    remapped = twin(gemma)
    extend_context(remapped, "self_extend", 2.0, layer_type=FULL)
    reach = int(remapped._posenc_remap.method.reach(ORIGINAL))
    assert reach == 3 * (ORIGINAL - 8192 + 8192 // 3) and remapped.config.max_position_embeddings == 2 * ORIGINAL
    assert _warned(remapped, reach - 1) == []
    (message,) = _warned(remapped, reach)
    assert f", {reach} tokens:" in message and "on the full_attention layers" in message
