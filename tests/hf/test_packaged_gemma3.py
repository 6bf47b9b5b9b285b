"""Gemma 3 270M as posenc loads it by name -- ``load_causal_lm("gemma3-270m")``, through transformers' own GGUF
loader -- against an independent float64 forward of the same file (``tests/reference/gemma3.py``: the authors'
formulas, google/gemma_pytorch; tensors read with the ``gguf`` package, not with transformers).

- every weight of the loaded model is the file's (norms: the file's ``1 + w``, less 1), nothing else is held;
- the full logits ``(1, 640, 262144)`` of 640 tokens of Python source -- past the 512-token window of the sliding
  layers, so the window is in play: without it the reference moves by hundreds of tolerances past position 512
  and not at all before -- equal the reference's within float32 rounding (``packaged_check``: the tolerance);
- the config transformers fills in: 5 sliding : 1 full layer types, RoPE base 10 000 / 1 000 000 by layer type,
  window 512, QK-norm, ``query_pre_attn_scalar`` 256, no soft-capping, tied head, ``sqrt(640)`` embedding scale;
- the tokenizer: BOS first, Gemma's turn tokens single tokens; the file carries no chat template, and neither does
  the tokenizer.

The model is loaded once for the module and the forwards run once; the tests assert on what they measured. The
module took 90 s on 2 shared cores (3 min when the machine was busy), half of it transformers' load (the 262k-token
vocabulary), and peaks at 3.7 GB (transformers' load).
"""

from __future__ import annotations

import dataclasses
import gc
import math

import pytest
import torch

from hf.packaged_check import assert_weights_equal, loaded_logits, skip_unless_available, source_text, spread
from posenc.hf import packaged

NAME = packaged.GEMMA3_270M
skip_unless_available(NAME)
pytest.importorskip("gguf", reason="reading GGUF files needs the gguf package")

from posenc.hf import load_causal_lm  # noqa: E402 - after the skips
from reference import gemma3 as ref  # noqa: E402
from reference.gguf_tensors import GGUFTensors  # noqa: E402

TOKENS = 640  # > WINDOW: 128 positions whose sliding layers see only part of the past
WINDOW = 512
LOCAL_BASE, GLOBAL_BASE = 10_000.0, 1_000_000.0


@pytest.fixture(autouse=True)
def one_thread():
    """Overrides tests/hf/conftest.py's: these forwards are large enough for every thread the worker has."""
    yield


@pytest.fixture(scope="module")
def tensors():
    return GGUFTensors(packaged.model_file(NAME))


@pytest.fixture(scope="module")
def loaded():
    model, tokenizer = load_causal_lm(NAME)
    yield model, tokenizer
    del model, tokenizer
    gc.collect()


@pytest.fixture(scope="module")
def ids(loaded):
    """640 tokens of Python source, BOS first: ``(1, 640)``."""
    ids = loaded[1](source_text(), return_tensors="pt")["input_ids"][:, :TOKENS]
    assert ids.shape == (1, TOKENS)
    return ids


@pytest.fixture(scope="module")
def measured(loaded, tensors, ids):
    """The loaded model's logits against the reference's: ``(Spread, window)``, ``window`` the per-position max
    ``(S,)`` of what dropping the window moves the reference's float32 logits (the first 8192 of the vocabulary)."""
    config = ref.Gemma3Config.from_gguf(tensors)
    no_window = dataclasses.replace(config, window=None)
    runs = [(config, torch.float64), (config, torch.float32), (no_window, torch.float32)]
    h64, h32, h_all = ref.hidden_states(tensors, ids, runs)
    logits = loaded_logits(loaded[0], ids)
    result = spread(logits, ref.logits(tensors, [h64, h32]))
    del logits
    _, (with_window, without) = next(ref.logits(tensors, [h32, h_all]))
    window = (without - with_window).abs().amax(-1)[0]
    print(
        f"\n{NAME}: {result.summary()}; past the window {float(result.loaded[WINDOW:].max()):.3g}; dropping the "
        f"window moves {float(window[:WINDOW].max()):.3g} before {WINDOW}, {float(window[WINDOW:].max()):.3g} after"
    )
    return result, window


def test_weights_are_the_files(loaded, tensors):
    names = {"token_embd.weight": ("model.embed_tokens.weight", 0.0), "output_norm.weight": ("model.norm.weight", 1.0)}
    per_layer = {
        "attn_q": ("self_attn.q_proj", 0.0), "attn_k": ("self_attn.k_proj", 0.0), "attn_v": ("self_attn.v_proj", 0.0),
        "attn_output": ("self_attn.o_proj", 0.0), "attn_q_norm": ("self_attn.q_norm", 1.0),
        "attn_k_norm": ("self_attn.k_norm", 1.0), "attn_norm": ("input_layernorm", 1.0),
        "post_attention_norm": ("post_attention_layernorm", 1.0), "ffn_norm": ("pre_feedforward_layernorm", 1.0),
        "post_ffw_norm": ("post_feedforward_layernorm", 1.0), "ffn_gate": ("mlp.gate_proj", 0.0),
        "ffn_up": ("mlp.up_proj", 0.0), "ffn_down": ("mlp.down_proj", 0.0),
    }  # fmt: skip
    for layer in range(loaded[0].config.num_hidden_layers):
        for gguf_name, (param, offset) in per_layer.items():
            names[f"blk.{layer}.{gguf_name}.weight"] = (f"model.layers.{layer}.{param}.weight", offset)
    assert_weights_equal(loaded[0], tensors, names)


def test_logits_equal_the_reference(measured):
    result, _ = measured
    assert float(result.loaded.max()) <= result.bound, result.summary()


def test_the_window_is_in_play(measured):
    """Without the window the reference is the same before position 512 (the same float32 operations: no key is 512
    back yet) and far from it after -- the comparison above would catch a model ignoring the window."""
    result, window = measured
    assert float(window[:WINDOW].max()) == 0.0
    assert float(window[WINDOW:].max()) > 100 * result.bound, (float(window[WINDOW:].max()), result.bound)


def test_config_as_transformers_fills_it(loaded, tensors):
    model = loaded[0]
    config = model.config
    assert config.model_type == "gemma3_text"
    layers = config.num_hidden_layers
    assert layers == 18
    expected = ["full_attention" if i % 6 == 5 else "sliding_attention" for i in range(layers)]
    assert config.layer_types == expected
    reference = ref.Gemma3Config.from_gguf(tensors)
    assert [reference.is_global(i) for i in range(layers)] == [t == "full_attention" for t in expected]
    assert config.rope_parameters == {
        "sliding_attention": {"rope_type": "default", "rope_theta": LOCAL_BASE},
        "full_attention": {"rope_type": "default", "rope_theta": GLOBAL_BASE},
    }
    assert (reference.local_base, reference.global_base) == (LOCAL_BASE, GLOBAL_BASE)
    assert config.sliding_window == reference.window == WINDOW
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 1, 256)
    assert config.query_pre_attn_scalar == 256 == config.head_dim
    assert config.final_logit_softcapping is None and config.attn_logit_softcapping is None
    assert config.hidden_activation == "gelu_pytorch_tanh"
    for i, layer in enumerate(model.model.layers):
        attention = layer.self_attn
        assert attention.sliding_window == (None if i % 6 == 5 else WINDOW)
        assert attention.scaling == 256**-0.5
        assert attention.q_norm.weight.shape == attention.k_norm.weight.shape == (256,)
    assert config.tie_word_embeddings and "output.weight" not in tensors
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.model.embed_tokens.scalar_embed_scale == math.sqrt(640)


def test_tokenizer(loaded, tensors, ids):
    tokenizer = loaded[1]
    assert tensors.value("tokenizer.ggml.add_bos_token") is True
    assert ids[0, 0] == tokenizer.bos_token_id == tensors.value("tokenizer.ggml.bos_token_id") == 2
    tokens = tensors.value("tokenizer.ggml.tokens")
    for turn in ("<start_of_turn>", "<end_of_turn>"):
        assert tokenizer(turn, add_special_tokens=False)["input_ids"] == [tokens.index(turn)]
    # The packaged file (the base model) has no tokenizer.chat_template, so the tokenizer has none either: a chat
    # template must come from elsewhere (Google's tokenizer_config.json has one).
    assert tensors.value("tokenizer.chat_template") is None
    assert tokenizer.chat_template is None
