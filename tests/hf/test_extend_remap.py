"""Remapping methods on loaded transformers models (``extend_context(model, "self_extend", ...)``): every method
against its written-out reference through the whole model, each handled architecture, generation with the KV cache
== the full forward, composition with a frequency scaling, saving (DCA's config block; the others refused naming the
call), and bad input refused before the model changes."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch.testing import assert_close

import posenc.hf._remap_patch as remap_patch
from hf.tiny import ORIGINAL, tiny_model
from posenc.hf import extend_context, save_pretrained
from posenc.hf._remap_patch import REMAP_MODEL_TYPES
from posenc.remapping import METHODS, DualChunk, ReRoPE, SelfExtend
from reference import remapping as ref

KINDS = [k for k in REMAP_MODEL_TYPES]
_OVERRIDES = {"mistral": {"sliding_window": None}, "qwen2": {"use_sliding_window": False}}


def model_of(kind, dtype=torch.float32):
    torch.manual_seed(0)
    return tiny_model(kind, **_OVERRIDES.get(kind, {})).to(dtype)


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

    def run(q, k, v, *, method, encoding, q_positions, k_positions, key_mask, scale):
        assert key_mask is None and int(k_positions[0, 0]) == 0
        inv = encoding.inv_freq
        if isinstance(method, SelfExtend):
            return ref.self_extend(q, k, v, inv, window=method.window, group=method.group)
        if isinstance(method, DualChunk):
            return ref.dual_chunk(q, k, v, inv, chunk_size=method.chunk_size, local_window=method.local_window)
        if isinstance(method, ReRoPE):
            return ref.rerope(
                q, k, v, inv, window=method.window, training_length=method.log_scale_length, leak=method.leak
            )
        return ref.lm_infinite(q, k, v, inv, local_branch=method.window, global_branch=method.global_tokens)

    return run


@pytest.mark.parametrize("name", sorted(METHODS))
def test_each_method_through_the_model_equals_its_reference(name, monkeypatch):
    """Past the original context (48 tokens on a 32-token model, factor 2): the patched Llama equals the same model
    whose attention is the method's written-out reference (float64)."""
    model = model_of("llama", torch.float64)
    extend_context(model, name, 2.0)
    x = ids(48)
    fast = logits(model, x)
    monkeypatch.setattr(remap_patch, "remap_attention", _reference_attention(model._posenc_remap.method))
    assert_close(fast, logits(model, x).to(fast.dtype), atol=1e-9, rtol=0)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_generation_with_the_cache_equals_the_full_forward(name):
    """Greedy generation (KV cache of un-rotated keys, one query per step) picks the tokens the full forward
    ranks first at every step, and its step logits equal the full forward's rows."""
    model = model_of("llama", torch.float64)
    extend_context(model, name, 2.0)
    prompt = ids(40, seed=2)
    with torch.no_grad():
        out = model.generate(
            prompt, max_new_tokens=12, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True
        )
    full = logits(model, out.sequences)
    steps = torch.stack(out.logits, dim=1).double()  # (1, 12, V); generate returns them in float32
    expected = full[:, 39:-1]
    assert_close(steps, expected, atol=4 * torch.finfo(torch.float32).eps * float(expected.abs().max()), rtol=0)
    assert torch.equal(out.sequences[0, 40:], full[0, 39:-1].argmax(-1))


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


def test_meta_model_patches_without_weights():
    with torch.device("meta"):
        model = model_of("llama")
    description = extend_context(model, "dca", 2.0)
    assert description["parameters"] == {"chunk_size": 24, "local_window": 2}
    assert description["max_position_embeddings"] == {"old": ORIGINAL, "new": 2 * ORIGINAL}


def test_dca_saves_its_config_block_and_the_others_are_refused(tmp_path):
    model = model_of("qwen2")
    extend_context(model, "dca", 2.0)
    save_pretrained(model, None, tmp_path / "dca")
    config = json.loads((tmp_path / "dca" / "config.json").read_text())
    assert config["dual_chunk_attention_config"] == {
        "chunk_size": 24,
        "local_size": 2,
        "original_max_position_embeddings": ORIGINAL,
    }
    assert config["max_position_embeddings"] == 2 * ORIGINAL
    assert model.config._attn_implementation == "posenc_remap"  # the caller's model keeps running DCA
    other = model_of("llama")
    extend_context(other, "self_extend", 2.0, window=8)
    with pytest.raises(ValueError, match=r"extend_context\(model, 'self_extend', 2, window=8\)"):
        save_pretrained(other, None, tmp_path / "se")
    assert not (tmp_path / "se").exists()


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
