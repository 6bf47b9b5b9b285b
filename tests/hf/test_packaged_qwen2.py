"""Qwen2.5-Coder-0.5B-Instruct as posenc loads it by name -- ``load_causal_lm("qwen2.5-coder-0.5b")``, through
transformers' own GGUF loader -- against an independent float64 forward of the same file (``tests/reference/qwen2.py``:
the Qwen team's formulas; tensors read with the ``gguf`` package, q/k rows as stored: Qwen2 files are not permuted).

- every weight of the loaded model is the file's, bit for bit, and nothing else is held (the file has its own
  ``output.weight``: the head is not the embedding);
- the full logits ``(1, 320, 151936)`` of 320 tokens of Python source equal the reference's within float32
  rounding (``packaged_check``: the tolerance);
- the config transformers fills in: 24 full-attention layers, no sliding window, RoPE base 1 000 000, 14 heads over
  2 KV heads of 64, q/k/v biases, an untied head;
- the tokenizer: the file's ChatML chat template, ``<|im_start|>`` a single token.

The model is loaded once for the module and the forwards run once; the tests assert on what they measured. The
module took 2 min on 2 shared cores (almost 4 when the machine was busy) and peaks at 4.7 GB (transformers' load
alone: 4.0).
"""

from __future__ import annotations

import gc

import pytest
import torch

from hf.packaged_check import assert_weights_equal, loaded_logits, skip_unless_available, source_text, spread
from posenc.hf import packaged

NAME = packaged.QWEN25_CODER_05B
skip_unless_available(NAME)
pytest.importorskip("gguf", reason="reading GGUF files needs the gguf package")

from posenc.hf import load_causal_lm  # noqa: E402 - after the skips
from reference import qwen2 as ref  # noqa: E402
from reference.gguf_tensors import GGUFTensors  # noqa: E402

TOKENS = 320
BASE = 1_000_000.0


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
    """320 tokens of Python source: ``(1, 320)``."""
    ids = loaded[1](source_text(), return_tensors="pt")["input_ids"][:, :TOKENS]
    assert ids.shape == (1, TOKENS)
    return ids


@pytest.fixture(scope="module")
def measured(loaded, tensors, ids):
    """The loaded model's logits against the reference's (a ``Spread``)."""
    h64, h32 = ref.hidden_states(tensors, ids, dtypes=(torch.float64, torch.float32))
    logits = loaded_logits(loaded[0], ids)
    result = spread(logits, ref.logits(tensors, [h64, h32]))
    print(f"\n{NAME}: {result.summary()}")
    return result


def test_weights_are_the_files(loaded, tensors):
    names = {
        "token_embd.weight": "model.embed_tokens.weight",
        "output.weight": "lm_head.weight",
        "output_norm.weight": "model.norm.weight",
    }
    per_layer = {
        "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
        "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
        "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
        "attn_output.weight": "self_attn.o_proj.weight", "attn_norm.weight": "input_layernorm.weight",
        "ffn_norm.weight": "post_attention_layernorm.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
        "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
    }  # fmt: skip
    for layer in range(loaded[0].config.num_hidden_layers):
        for gguf_name, param in per_layer.items():
            names[f"blk.{layer}.{gguf_name}"] = f"model.layers.{layer}.{param}"
    assert_weights_equal(loaded[0], tensors, {k: (v, 0.0) for k, v in names.items()})


def test_logits_equal_the_reference(measured):
    assert float(measured.loaded.max()) <= measured.bound, measured.summary()


def test_config_as_transformers_fills_it(loaded, tensors):
    model = loaded[0]
    config = model.config
    assert config.model_type == "qwen2"
    assert config.num_hidden_layers == 24
    assert config.layer_types == ["full_attention"] * 24
    assert not config.use_sliding_window and config.sliding_window is None
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": BASE}
    reference = ref.Qwen2Config.from_gguf(tensors)
    assert (reference.heads, reference.kv_heads, reference.head_dim, reference.base) == (14, 2, 64, BASE)
    assert (config.num_attention_heads, config.num_key_value_heads) == (14, 2)
    assert config.hidden_act == "silu"
    for layer in model.model.layers:
        attention = layer.self_attn
        assert attention.head_dim == 64 and attention.scaling == 64**-0.5
        assert attention.sliding_window is None
        for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
            assert projection.bias is not None
        assert attention.o_proj.bias is None
    assert not config.tie_word_embeddings and "output.weight" in tensors
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()


def test_tokenizer(loaded, tensors):
    tokenizer = loaded[1]
    template = tensors.value("tokenizer.chat_template")
    assert "<|im_start|>" in template
    assert tokenizer.chat_template == template
    tokens = tensors.value("tokenizer.ggml.tokens")
    for special in ("<|im_start|>", "<|im_end|>"):
        assert tokenizer(special, add_special_tokens=False)["input_ids"] == [tokens.index(special)]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
