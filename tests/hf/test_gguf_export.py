"""``posenc.hf.save_gguf``: an extended Llama written as a GGUF that llama.cpp runs as measured, and read back whole
by posenc's loader (the RoPE keys alone: ``tests/gguf/test_rope.py``).

References: llama.cpp's RoPE from a file's keys, written out from its source (``tests/reference/llamacpp_rope.py``),
against transformers' own rotary module of the extended model; posenc's loader and transformers' GGUF loader on the
written files. (llama.cpp itself, when installed: ``test_gguf_llamacpp.py``.)
"""

from __future__ import annotations

import os
import re

import pytest
import torch

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")  # transformers' GGUF loader needs it

import transformers  # noqa: E402 - after the skips

from hf.llamacpp_keys import assert_llamacpp_runs  # noqa: E402
from hf.tiny import ORIGINAL, logits, tiny_model  # noqa: E402
from hf.tiny_gguf import write_llama  # noqa: E402
from posenc.gguf import llama as gguf_llama  # noqa: E402
from posenc.gguf import rope as gguf_rope  # noqa: E402
from posenc.gguf import write as gguf_write  # noqa: E402
from posenc.gguf.header import read_gguf_header  # noqa: E402
from posenc.hf import extend_context, load_causal_lm, save_gguf  # noqa: E402

EXPRESSIBLE = [("none", {}), ("linear", {}), ("ntk", {}), ("yarn", {}), ("yarn", {"attention_factor": 1.3}),
               ("llama3", {}), ("longrope", {"long_factor": [1.0, 1.5, 2.0, 4.0]})]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """``{weights: (gguf path, the model it was written from)}``: F32, and SmolLM2's Q4_1 / Q8_0 mix."""
    folder = tmp_path_factory.mktemp("sources")
    model = tiny_model("llama")
    return {w: write_llama(folder / f"{w}.gguf", model, weights=w) for w in ("f32", "quantized")}


def _extended(path, method, options, factor=4.0):
    model, tokenizer = load_causal_lm(path)
    if method != "none":
        extend_context(model, method, factor, **options)
    return model, tokenizer


def _file_keys(path) -> tuple[dict, dict]:
    header = read_gguf_header(path)
    return dict(header.metadata), {k: list(v) for k, v in gguf_llama.rope_tensors(header).items()}


def _ids(n: int = 3 * ORIGINAL) -> torch.Tensor:
    return torch.randint(0, 64, (2, n), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(("method", "options"), EXPRESSIBLE)
@pytest.mark.parametrize("weights", ["f32", "quantized"])
def test_an_extended_model_round_trips_bit_equal(sources, tmp_path, method, options, weights):
    model, tokenizer = _extended(sources[weights], method, options)
    out = tmp_path / "sub" / "extended.gguf"
    written = save_gguf(model, out, source=sources[weights])
    assert written["weights"] == "copied" and written["path"] == out and out.stat().st_size == written["bytes"]
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # as a plain open() makes it, not a private temp file

    # llama.cpp's view of the written file: the model's frequencies
    meta, tensors = _file_keys(out)
    assert meta["llama.context_length"] == model.config.max_position_embeddings
    assert_llamacpp_runs(model, meta, tensors)

    # the weights are the source's, byte for byte; only RoPE tensors are added
    src, dst = read_gguf_header(sources[weights]), read_gguf_header(out)
    with open(src.path, "rb") as a, open(dst.path, "rb") as b:
        for t in src.tensors:
            (u,) = [d for d in dst.tensors if d.name == t.name]
            a.seek(t.offset), b.seek(u.offset)
            assert (u.ggml_type, u.shape) == (t.ggml_type, t.shape) and a.read(t.n_bytes) == b.read(u.n_bytes)
    assert {d.name for d in dst.tensors} - {t.name for t in src.tensors} == set(rope_tensor_names(method))
    keys = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "general.name")  # the tokenizer carried over
    src_meta, dst_meta = (read_gguf_header(p, arrays=keys).metadata for p in (src.path, out))
    assert all(src_meta[k] == dst_meta[k] for k in keys)

    # posenc's loader: the same config and bit-equal logits past the original context
    back, back_tokenizer = load_causal_lm(out)
    assert back.config.rope_parameters == model.config.rope_parameters
    assert back.config.max_position_embeddings == model.config.max_position_embeddings
    ids = _ids()
    torch.testing.assert_close(logits(back, ids), logits(model, ids), rtol=0, atol=0)
    assert back_tokenizer("ab a! Cab")["input_ids"] == tokenizer("ab a! Cab")["input_ids"]


def rope_tensor_names(method: str) -> list[str]:
    return {"llama3": [gguf_rope.FREQS], "longrope": [gguf_rope.LONG, gguf_rope.SHORT]}.get(method, [])


def test_transformers_gguf_loader_drops_the_scaling(sources, tmp_path):
    """What the README says: transformers reads the exported file's weights and tokenizer but not its RoPE scaling
    (it reads rope.scaling.* for gpt-oss only); re-applying the method gives posenc's model exactly."""
    model, _ = _extended(sources["f32"], "yarn", {})
    out = save_gguf(model, tmp_path / "yarn.gguf", source=sources["f32"])["path"]
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out.parent, gguf_file=out.name).eval()
    assert theirs.config.rope_parameters.get("rope_type", "default") == "default"
    assert theirs.config.max_position_embeddings == model.config.max_position_embeddings  # context_length is read
    for key, value in model.state_dict().items():
        torch.testing.assert_close(theirs.state_dict()[key], value, rtol=0, atol=0, msg=key)
    extend_context(theirs, "yarn", 4.0, original_max_position_embeddings=ORIGINAL,
                   max_position_embeddings=model.config.max_position_embeddings)
    theirs.config._attn_implementation = model.config._attn_implementation
    ids = _ids()
    torch.testing.assert_close(logits(theirs, ids), logits(model, ids), rtol=0, atol=0)


def _fine_tuned(path):
    model, _ = _extended(path, "yarn", {})
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=gen))
    return model


@pytest.mark.parametrize(
    ("tensor_type", "rounded"),
    [
        ("F32", lambda w, q: w),
        ("F16", lambda w, q: w.half().float()),
        ("BF16", lambda w, q: w.bfloat16().float()),
        ("source", None),  # each tensor back in its source type (Q4_1 / Q8_0 / F32)
        ("Q8_0", None),
    ],
)
def test_fine_tuned_weights_are_written_from_the_model(sources, tmp_path, tensor_type, rounded):
    model = _fine_tuned(sources["quantized"])
    written = save_gguf(model, tmp_path / "tuned.gguf", source=sources["quantized"], tensor_type=tensor_type)
    assert written["weights"] == "written"
    back, _ = load_causal_lm(written["path"])
    assert back.config.rope_parameters == model.config.rope_parameters
    header = read_gguf_header(written["path"])
    types = {t.name: gguf.GGMLQuantizationType(t.ggml_type) for t in header.tensors}
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, model.config.num_hidden_layers)
    source_types = {t.name: t.ggml_type for t in read_gguf_header(sources["quantized"]).tensors}
    for key, w in model.state_dict().items():
        name = gguf_write.tensor_name(key, names)
        if name == "output.weight" and name not in types:
            continue  # tied
        qtype = types[name]
        if w.ndim == 1:
            assert qtype == gguf.GGMLQuantizationType.F32
        elif tensor_type == "source":
            assert qtype == source_types[name]
        else:
            assert qtype.name == tensor_type
        if rounded is not None or w.ndim == 1:
            expected = w if w.ndim == 1 else rounded(w, qtype)
        else:  # the file holds gguf's quantization of the model's weight: reading it back dequantizes exactly that
            heads = _heads(model.config, name)
            rows = gguf_llama.permute(w, heads) if heads else w
            restored = torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(rows.numpy(), qtype), qtype))
            expected = gguf_llama._unpermute(restored, heads) if heads else restored
        torch.testing.assert_close(back.state_dict()[key], expected, rtol=0, atol=0, msg=key)


def _heads(config, name: str) -> int | None:
    if ".attn_q." in name:
        return config.num_attention_heads
    if ".attn_k." in name:
        return config.num_key_value_heads
    return None


# -- refused, before anything is written ----------------------------------------------------------------------------


def _refused(tmp_path, call, message: str) -> None:
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(ValueError, match=message):
        call()
    assert sorted(tmp_path.rglob("*")) == before  # no partial file, nothing else


@pytest.mark.parametrize(
    ("method", "options", "message"),
    [
        ("dynamic", {}, "dynamic NTK changes its frequencies with the sequence length"),
        ("yarn", {"beta_fast": 16.0}, r"--yarn-beta-fast, --yarn-beta-slow"),
        ("yarn", {"truncate": False}, "truncate=False"),
        ("self_extend", {}, r"llama-cli --grp-attn-n \d+ --grp-attn-w \d+"),
        ("dca", {}, "llama.cpp has no dca.*dual_chunk_attention_config"),
        ("rerope", {}, r"llama.cpp has no rerope.*extend_context\(model, 'rerope', 4\)"),
        ("lm_infinite", {}, "llama.cpp has no lm_infinite"),
    ],
)
def test_methods_llamacpp_cannot_run_are_refused_naming_the_alternative(sources, tmp_path, method, options, message):
    model, _ = _extended(sources["f32"], method, options)
    _refused(tmp_path, lambda: save_gguf(model, tmp_path / "x.gguf", source=sources["f32"]), message)


def test_bad_paths_sources_and_types(sources, tmp_path):
    model, _ = _extended(sources["f32"], "yarn", {})
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(b"mine")
    _refused(tmp_path, lambda: save_gguf(model, mine, source=sources["f32"]), "posenc never overwrites files")
    assert mine.read_bytes() == b"mine"
    _refused(tmp_path, lambda: save_gguf(model, tmp_path / "x.bin", source=sources["f32"]), "ending in .gguf")
    folder_like = f"{tmp_path / 'x' / 'sub.gguf'}/"  # Path() would drop the slash and write the file x/sub.gguf
    _refused(tmp_path, lambda: save_gguf(model, folder_like, source=sources["f32"]),
             rf"^path='{re.escape(folder_like)}' is invalid: expected a file path \(it ends with '/', which names a "
             r"folder\)$")
    _refused(tmp_path, lambda: save_gguf(model, tmp_path / "x.gguf", source=sources["f32"], tensor_type="Q4_K"),
             "tensor_type='Q4_K' is invalid")
    folder = tmp_path / "hf"
    tiny_model("llama").save_pretrained(folder)
    _refused(tmp_path, lambda: save_gguf(model, tmp_path / "x.gguf", source=folder), "convert_hf_to_gguf.py")
    qwen = write_llama(tmp_path / "q" / "qwen.gguf", tiny_model("qwen2"), weights="f32", arch="qwen2")
    _refused(tmp_path, lambda: save_gguf(model, tmp_path / "x.gguf", source=qwen),
             "model='llama' is invalid: expected a model of the source's architecture 'qwen2'")
    qwen3 = write_llama(tmp_path / "q3" / "qwen3.gguf", tiny_model("qwen3"), weights="f32", arch="qwen3")
    _refused(tmp_path, lambda: save_gguf(model, tmp_path / "x.gguf", source=qwen3), "this one is 'qwen3'")
    other = write_llama(tmp_path / "o" / "other.gguf", tiny_model("llama", intermediate_size=96), weights="f32")
    _refused(tmp_path, lambda: save_gguf(model, tmp_path / "x.gguf", source=other),
             "intermediate_size: model 64, file 96")


def test_a_type_gguf_cannot_write_is_refused(sources, tmp_path, monkeypatch):
    """A fine-tuned model whose source tensor is a K-quant (gguf quantizes none of them): refused, nothing left."""

    def quantize(data, qtype):
        raise NotImplementedError(qtype)

    model = _fine_tuned(sources["quantized"])
    monkeypatch.setattr(gguf.quants, "quantize", quantize)
    _refused(tmp_path, lambda: save_gguf(model, tmp_path / "x.gguf", source=sources["quantized"]),
             "a type the gguf package writes")


@pytest.mark.parametrize("stop", [KeyboardInterrupt, OSError])
def test_an_interrupted_write_leaves_nothing(sources, tmp_path, monkeypatch, stop):
    model, _ = _extended(sources["f32"], "yarn", {})
    calls = []

    def write_tensor_data(self, tensor, tensor_endianess=None):
        calls.append(1)
        if len(calls) == 3:
            raise stop("stopped")
        return original(self, tensor, tensor_endianess)

    original = gguf.GGUFWriter.write_tensor_data
    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", write_tensor_data)
    with pytest.raises(stop):
        save_gguf(model, tmp_path / "x.gguf", source=sources["f32"])
    assert list(tmp_path.iterdir()) == []
