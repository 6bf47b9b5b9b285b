"""``posenc.hf.save_pretrained``: an extended model written as a transformers folder loads back as the same model,
with the extension in its config; GGUF-loaded models save although transformers alone refuses; the caller's model
and existing files are never touched."""

from __future__ import annotations

import copy
import json
import os
import re
import warnings
from pathlib import Path

import pytest
import torch

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")

import transformers  # noqa: E402 - after the skips
from safetensors import safe_open  # noqa: E402

import posenc.hf  # noqa: E402
from hf.tiny import ORIGINAL, logits, tiny_model  # noqa: E402
from hf.tiny_gguf import write_llama  # noqa: E402
from posenc.hf import (  # noqa: E402
    CacheStaleWarning,
    ServedOnlyWarning,
    extend_context,
    load_causal_lm,
    save_gguf,
    save_pretrained,
)


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


def test_refuses_a_folder_under_a_file(tmp_path, gguf_path):
    model, tokenizer = load_causal_lm(gguf_path)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"out_dir=.*notes.txt/a/b' is invalid: expected a path under folders \("):
        save_pretrained(model, tokenizer, tmp_path / "notes.txt" / "a" / "b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "src"]


def test_an_interrupted_save_leaves_nothing(tmp_path, gguf_path, monkeypatch):
    """The folder appears whole or not at all: a save interrupted half-way leaves neither the half-written files
    nor the folders it created above ``out_dir``."""
    model, tokenizer = load_causal_lm(gguf_path)

    def interrupted(self, folder, *args, **kwargs):
        (Path(folder) / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", interrupted)
    (tmp_path / "mine").mkdir()
    with pytest.raises(KeyboardInterrupt):
        save_pretrained(model, tokenizer, tmp_path / "mine" / "new" / "out")
    assert [str(p.relative_to(tmp_path)) for p in (tmp_path / "mine").rglob("*")] == []


def test_saved_files_follow_the_umask(tmp_path, gguf_path):
    """transformers writes model.safetensors as 0600 where its other files get 0666 less the umask."""
    model, tokenizer = load_causal_lm(gguf_path)
    old = os.umask(0o022)
    try:
        out = save_pretrained(model, tokenizer, tmp_path / "out")
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes
    assert out.stat().st_mode & 0o777 == 0o755


def test_refuses_bad_arguments(tmp_path, gguf_path):
    model, tokenizer = load_causal_lm(gguf_path)
    with pytest.raises(ValueError, match="dtype='int8' is invalid"):
        save_pretrained(model, tokenizer, tmp_path / "a", dtype="int8")
    with pytest.raises(ValueError, match="model='Linear' is invalid"):
        save_pretrained(torch.nn.Linear(2, 2), tokenizer, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# ---------------------------------------------------------------------------------------------------------------------
# Every piece of advice about re-applying an extension, followed literally, rebuilds the measured model (issue 46.2)

_OVERRIDES = {"qwen2": {"use_sliding_window": False}, "qwen3": {"use_sliding_window": False}}
_CALL = re.compile(r"posenc\.hf\.(?:extend_context|load_causal_lm)\((?:[^()\[\]]|\[[^\]]*\])*\)")


def _loaded(kind, dtype=torch.float32):
    """The model "as loaded": the same weights every time."""
    torch.manual_seed(0)
    model = tiny_model(kind, **_OVERRIDES.get(kind, {})).to(dtype)
    return model


def _extended(kind, steps, dtype=torch.float32):
    model = _loaded(kind, dtype)
    for method, factor, kwargs in steps:
        extend_context(model, method, factor, **kwargs)
    return model


def _calls(text, after):
    """The Python calls an advice text names after ``after``, in order."""
    tail = text[text.index(after) + len(after) :]
    return _CALL.findall(tail)


def _follow(calls, model=None):
    """Run the advice's calls as written, on ``model`` (bound to the name ``model`` the advice uses)."""
    scope = {"posenc": posenc, "model": model}
    for call in calls:
        if call.startswith("posenc.hf.load_causal_lm("):
            scope["model"], _ = eval(call, scope)
        else:
            exec(call, scope)
    return scope["model"]


def _ids(n=3 * ORIGINAL):
    return torch.randint(0, 64, (1, n), generator=torch.Generator().manual_seed(3))  # (B, S), past the context


@pytest.fixture(scope="module")
def bpe_tokenizer():
    from lab.extend.needles.test_passkey import byte_bpe_tokenizer

    return byte_bpe_tokenizer()


REFUSED = {  # model type, the calls made after loading it
    "yarn x2 then string": ("llama", [("yarn", 2.0, {}), ("string", 1.0, {})]),
    "self_extend with options": ("llama", [("self_extend", 2.0, {"window": 8, "group": 3})]),
    "dca over an explicit original": ("llama", [("dca", 2.5, {"original_max_position_embeddings": 24})]),
    "linear then dca_vllm on qwen2": ("qwen2", [("linear", 2.0, {}), ("dca_vllm", 2.0, {})]),
    "alibi slopes (mpt)": ("mpt", [("linear", 2.0, {})]),
    "alibi slopes twice (bloom)": ("bloom", [("linear", 2.0, {}), ("linear", 1.5, {})]),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_every_refused_save_names_the_calls_that_rebuild_the_model(case, tmp_path):
    """yarn x2 then string: the refusal named only the STRING call (following it gave logits 0.185 off on
    SmolLM2); every refusal now names every call made since loading, and following it -- save the model as loaded,
    load that, make the calls -- gives the measured logits exactly (the same weights, the same computation)."""
    kind, steps = REFUSED[case]
    measured = _extended(kind, steps)
    x = _ids(2 * ORIGINAL - 4)  # past the original length, within each model's (MPT's bias table: 2x)
    expected = logits(measured, x)
    texts = []
    with pytest.raises(ValueError) as refused:
        save_pretrained(measured, None, tmp_path / "posenc")
    texts.append(str(refused.value))
    assert not (tmp_path / "posenc").exists()
    if getattr(measured, "_posenc_remap", None) is not None or kind in ("mpt", "bloom"):
        inner = measured.transformer if kind in ("mpt", "bloom") else measured.model
        for save in (measured.save_pretrained, inner.save_pretrained):  # issue 68, item 4: ALiBi's too
            with pytest.raises(ValueError) as refused:
                save(tmp_path / "plain")
            texts.append(str(refused.value))
        assert not (tmp_path / "plain").exists()
    if kind == "llama":
        source = write_llama(tmp_path / "source.gguf", _loaded("llama"))
        with pytest.raises(ValueError) as refused:
            save_gguf(measured, tmp_path / "m.gguf", source=source)
        if steps[-1][0] == "self_extend":  # llama.cpp runs its own: its flags, with the parameters posenc ran
            assert "llama-cli --grp-attn-n 3 --grp-attn-w 8" in str(refused.value)
        else:
            texts.append(str(refused.value))
    as_loaded = save_pretrained(_loaded(kind), None, tmp_path / "as-loaded")
    for text in texts:
        calls = _calls(text, "Save the model as loaded")
        assert len(calls) == len(steps), text
        model = transformers.AutoModelForCausalLM.from_pretrained(as_loaded, attn_implementation="eager").eval()
        torch.testing.assert_close(logits(_follow(calls, model), x), expected, rtol=0, atol=0)


def test_the_advice_names_only_the_calls_made_since_the_model_was_loaded(tmp_path, bpe_tokenizer):
    """A model loaded from a YaRN folder posenc saved, then STRING: its refusal names STRING alone, and saving the
    model as loaded (the YaRN model) then following it rebuilds the measured model."""
    yarn = save_pretrained(_extended("llama", [("yarn", 2.0, {})]), bpe_tokenizer, tmp_path / "yarn")
    measured, _ = load_causal_lm(yarn, attn_implementation="eager")
    extend_context(measured, "string", 1.0)
    x = _ids()
    with pytest.raises(ValueError) as refused:
        save_pretrained(measured, None, tmp_path / "again")
    calls = _calls(str(refused.value), "Save the model as loaded")
    assert calls == ["posenc.hf.extend_context(model, 'string', 1)"]
    as_loaded, _ = load_causal_lm(yarn, attn_implementation="eager")
    again = save_pretrained(as_loaded, None, tmp_path / "as-loaded")
    model = transformers.AutoModelForCausalLM.from_pretrained(again, attn_implementation="eager").eval()
    torch.testing.assert_close(logits(_follow(calls, model), x), logits(measured, x), rtol=0, atol=0)


SERVED = {  # saved with a ServedOnlyWarning: vLLM and SGLang run dual_chunk_attention_config
    "dca_vllm on qwen2": ("qwen2", [("dca_vllm", 2.0, {})]),
    "ntk then dca_vllm on qwen3": ("qwen3", [("ntk", 2.0, {}), ("dca_vllm", 2.0, {"local_window": 6})]),
}


@pytest.mark.parametrize("case", list(SERVED))
def test_a_dca_vllm_folder_rebuilds_by_each_way_its_warning_names(case, tmp_path, bpe_tokenizer):
    """The warning said to re-apply with extend_context(model, 'dca_vllm', 2), which on the reloaded folder (its
    max_position_embeddings already the extended length) built chunk 96 / local 16 / L 128 instead of 48 / 8 / 64
    (logits 0.39 off). Now: posenc.hf.load_causal_lm(folder) re-applies what config.json records, and the call the
    warning names for a plain transformers load gives the original length; both give the measured logits."""
    kind, steps = SERVED[case]
    measured = _extended(kind, steps)
    x = _ids()
    expected = logits(measured, x)
    with pytest.warns(ServedOnlyWarning) as warned:
        out = save_pretrained(measured, bpe_tokenizer, tmp_path / "dca")
    text = str(warned[0].message)
    load, reapply = _calls(text, "transformers ignores")
    assert load == f"posenc.hf.load_causal_lm({str(out)!r})"
    torch.testing.assert_close(logits(_follow([load]), x), expected, rtol=0, atol=0)
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert model.config.max_position_embeddings == measured.config.max_position_embeddings
    torch.testing.assert_close(logits(_follow([reapply], model), x), expected, rtol=0, atol=0)
    # what the old advice did on the reloaded folder: DCA over the extended length, another model
    old = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    extend_context(old, "dca_vllm", 2.0)
    assert old._posenc_remap.method != measured._posenc_remap.method


FREQUENCY = {
    "linear": {},
    "ntk": {},
    "dynamic": {},
    "yarn": {"beta_fast": 16.0},
    "llama3": {},
    "longrope": {"long_factor": [1.0 + i / 4 for i in range(4)]},
}


def _own_save(model, tokenizer, out):
    """The model's own ``save_pretrained`` (transformers'), its tokenizer beside it."""
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.mark.parametrize("save", ["posenc", "own"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("method", list(FREQUENCY))
def test_a_frequency_folder_loads_back_as_the_measured_model(method, dtype, save, tmp_path, bpe_tokenizer):
    """transformers loads a frequency method's folder extended (its config), and posenc.hf.load_causal_lm gives
    the model extend_context made, run-time parts included: RoPE in float32 in a bfloat16 model (transformers
    rounds its tables to bfloat16: the plain load differs there) and, for dynamic, cached keys re-rotated. The same
    from the model's own ``save_pretrained`` (issue 68, item 4): extend_context keeps the record in the config, so
    every save of the config (``save_pretrained``, ``push_to_hub``, a Trainer checkpoint) writes it."""
    measured = _extended("llama", [(method, 2.0, FREQUENCY[method])], dtype)
    x = _ids()
    expected = logits(measured, x)
    out = (save_pretrained if save == "posenc" else _own_save)(measured, bpe_tokenizer, tmp_path / method)
    record = json.loads((out / "config.json").read_text())["posenc"]["extensions"]
    assert [(e["method"], e["factor"], e["in_config"]) for e in record] == [(method, 2.0, True)]
    model, _ = load_causal_lm(out, dtype=dtype, attn_implementation="eager")
    torch.testing.assert_close(logits(model, x), expected, rtol=0, atol=0)
    if dtype == torch.float32:
        plain = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
        torch.testing.assert_close(logits(plain, x), expected, rtol=0, atol=0)
    if method == "dynamic":  # decoding past the original length: the cache re-rotated as in the measured model
        prompt = x[:, : 2 * ORIGINAL]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CacheStaleWarning)
            ours = measured.generate(prompt, max_new_tokens=8, do_sample=False, output_logits=True,
                                     return_dict_in_generate=True, pad_token_id=0)
            theirs = model.generate(prompt, max_new_tokens=8, do_sample=False, output_logits=True,
                                    return_dict_in_generate=True, pad_token_id=0)
        torch.testing.assert_close(torch.stack(theirs.logits), torch.stack(ours.logits), rtol=0, atol=0)


def test_a_saved_record_follows_the_model_through_a_second_save(tmp_path, bpe_tokenizer):
    """A YaRN folder loaded, extended again and saved records both calls; a folder saved from a model without an
    extension records none, even when it was loaded from one that had (plain transformers drops nothing)."""
    first = save_pretrained(_extended("llama", [("yarn", 2.0, {})]), bpe_tokenizer, tmp_path / "first")
    model, tokenizer = load_causal_lm(first)
    extend_context(model, "yarn", 2.0)
    second = save_pretrained(model, tokenizer, tmp_path / "second")
    record = json.loads((second / "config.json").read_text())["posenc"]["extensions"]
    assert [(e["method"], e["factor"]) for e in record] == [("yarn", 2.0), ("yarn", 2.0)]
    assert json.loads((second / "config.json").read_text())["rope_parameters"]["factor"] == 4.0
    plain = save_pretrained(_loaded("llama"), bpe_tokenizer, tmp_path / "plain")
    assert "posenc" not in json.loads((plain / "config.json").read_text())
