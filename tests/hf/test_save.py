"""``posenc.hf.save_pretrained``: an extended model written as a transformers folder loads back as the same model,
with the extension in its config; GGUF-loaded models save although transformers alone refuses; the caller's model
and existing files are never touched."""

from __future__ import annotations

import copy

import pytest
import torch

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")

import transformers  # noqa: E402 - after the skips
from safetensors import safe_open  # noqa: E402

from hf.tiny import (  # noqa: E402
    ORIGINAL,
    logits,
    tiny_model,  # noqa: E402
)
from hf.tiny_gguf import write_llama  # noqa: E402
from posenc.hf import extend_context, load_causal_lm, save_pretrained  # noqa: E402


def _rounded(model, dtype):
    """A float32 copy of ``model`` whose parameters went through ``dtype`` and back (what a reload in float32 of a
    ``dtype`` save holds)."""
    out = copy.deepcopy(model)
    for p in out.parameters():
        p.data = p.data.to(dtype).float()
    return out


@pytest.fixture
def gguf_path(tmp_path):
    return write_llama(tmp_path / "src" / "tiny.gguf", tiny_model("llama", tie_word_embeddings=True))


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_round_trip_keeps_the_extension(tmp_path, gguf_path, ids, dtype):
    model, tokenizer = load_causal_lm(gguf_path, attn_implementation="eager")
    extend_context(model, "yarn", 4.0)
    params = dict(model.config.rope_parameters)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = save_pretrained(model, tokenizer, tmp_path / "out", dtype=dtype)

    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    assert reloaded.config.rope_parameters == params and params["rope_type"] == "yarn"
    assert reloaded.config.max_position_embeddings == 4 * ORIGINAL
    expected = model if dtype is None else _rounded(model, dtype)
    torch.testing.assert_close(logits(reloaded, ids), logits(expected, ids), rtol=0, atol=0)
    assert reloaded.lm_head.weight is reloaded.model.embed_tokens.weight  # still tied
    with safe_open(out / "model.safetensors", "pt") as f:
        names = list(f.keys())
        assert {f.get_slice(k).get_dtype() for k in names} == {"BF16" if dtype else "F32"}
        assert "lm_head.weight" not in names
    text = "ab a! Cab"
    assert transformers.AutoTokenizer.from_pretrained(out)(text)["input_ids"] == tokenizer(text)["input_ids"]
    # the caller's model is untouched: same dtype, same weights, still tied
    assert model.dtype == torch.float32 and model.lm_head.weight is model.model.embed_tokens.weight
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)


def test_saves_a_model_transformers_loaded_from_gguf(tmp_path, gguf_path, ids):
    """transformers keeps ``quantization_config`` and ``hf_quantizer`` on GGUF loads and then refuses to save."""
    model = transformers.AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    with pytest.raises(ValueError, match="not serializable"):
        model.save_pretrained(tmp_path / "plain")
    extend_context(model, "linear", 2.0)
    out = save_pretrained(model, None, tmp_path / "out")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert not hasattr(reloaded.config, "quantization_config")
    assert reloaded.config.rope_parameters["rope_type"] == "linear"
    torch.testing.assert_close(logits(reloaded, ids), logits(model, ids), rtol=0, atol=0)
    assert model.hf_quantizer is not None and model.config.quantization_config is not None  # the caller's, kept


def test_refuses_to_overwrite(tmp_path, gguf_path):
    model, tokenizer = load_causal_lm(gguf_path)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=f"out_dir='{busy}' is invalid: expected a new or empty folder"):
        save_pretrained(model, tokenizer, busy)
    assert [p.name for p in busy.iterdir()] == ["notes.txt"]
    with pytest.raises(ValueError, match="out_dir=.*notes.txt' is invalid"):
        save_pretrained(model, tokenizer, busy / "notes.txt")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (save_pretrained(model, tokenizer, empty) / "config.json").is_file()


def test_refuses_bad_arguments(tmp_path, gguf_path):
    model, tokenizer = load_causal_lm(gguf_path)
    with pytest.raises(ValueError, match="dtype='int8' is invalid"):
        save_pretrained(model, tokenizer, tmp_path / "a", dtype="int8")
    with pytest.raises(ValueError, match="model='Linear' is invalid"):
        save_pretrained(torch.nn.Linear(2, 2), tokenizer, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
