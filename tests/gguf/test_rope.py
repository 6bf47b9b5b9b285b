"""``posenc.gguf.rope``: a transformers RoPE config as llama.cpp's GGUF keys and back. llama.cpp's RoPE from the keys
(``tests/reference/llamacpp_rope.py``) against transformers' own rotary module of the extended model; files written
from such keys: ``tests/hf/test_gguf_export.py``.
"""

from __future__ import annotations

import pytest

pytest.importorskip("gguf")

import transformers  # noqa: E402 - after the skips

from hf.llamacpp_keys import assert_llamacpp_runs  # noqa: E402
from hf.tiny import tiny_model  # noqa: E402
from posenc.gguf import rope as gguf_rope  # noqa: E402
from posenc.hf import extend_context  # noqa: E402

# (head_dim, base, original context)
SHAPES = [(8, 10000.0, 32), (64, 100000.0, 8192), (64, 500000.0, 4096)]
METHODS = [
    ("none", {}),
    ("linear", {}),
    ("ntk", {}),
    ("yarn", {}),
    ("yarn", {"attention_factor": 1.25}),
    ("yarn", {"mscale": 0.707, "mscale_all_dim": 1.0}),
    ("llama3", {}),
    ("llama3", {"low_freq_factor": 2.0, "high_freq_factor": 8.0}),
    ("longrope", {"long_factor": "ramp", "short_factor": "near_one"}),
]


def _model(head_dim: int, base: float, original: int, method: str, factor: float, options: dict):
    model = tiny_model(
        "llama", hidden_size=head_dim, num_attention_heads=1, num_key_value_heads=1, head_dim=head_dim,
        num_hidden_layers=1, max_position_embeddings=original, rope_parameters={"rope_type": "default",
        "rope_theta": base},
    )
    half = head_dim // 2
    options = dict(options)
    if options.get("long_factor") == "ramp":  # LongRoPE-like: 1 for the fast pairs rising to ~factor
        options["long_factor"] = [1.0 + (factor - 1.0) * i / (half - 1) for i in range(half)]
        options["short_factor"] = [1.0 + 0.01 * i for i in range(half)]
    if method != "none":
        extend_context(model, method, factor, **options)
    return model


def _keys(rope: gguf_rope.GGUFRope) -> tuple[dict, dict]:
    meta = {k: v for k, (v, _) in rope.metadata().items()}
    meta["llama.rope.dimension_count"] = rope.head_dim
    return meta, {k: v.tolist() for k, v in rope.tensors().items()}


@pytest.mark.parametrize(("head_dim", "base", "original"), SHAPES)
@pytest.mark.parametrize(("method", "options"), METHODS)
@pytest.mark.parametrize("factor", [2.0, 3.5])
def test_llamacpp_runs_what_transformers_runs(head_dim, base, original, method, options, factor):
    model = _model(head_dim, base, original, method, factor, options)
    rope = gguf_rope.to_gguf(model.config)
    assert rope.context_length == model.config.max_position_embeddings
    assert_llamacpp_runs(model, *_keys(rope))


@pytest.mark.parametrize(("head_dim", "base", "original"), SHAPES)
@pytest.mark.parametrize(("method", "options"), METHODS)
def test_the_keys_read_back_as_a_config_that_runs_the_same(head_dim, base, original, method, options):
    """A file without posenc's record (converted or edited elsewhere): the config read from llama.cpp's keys alone
    computes llama.cpp's frequencies; with the record, the config comes back exactly."""
    model = _model(head_dim, base, original, method, 2.0, options)
    rope = gguf_rope.to_gguf(model.config)
    meta, tensors = _keys(rope)
    params, context, exact = gguf_rope.from_gguf(meta, tensors, arch="llama", path="f.gguf")
    assert not exact and context == rope.context_length
    config = transformers.LlamaConfig(**{**model.config.to_dict(), "rope_parameters": params,
                                         "max_position_embeddings": context})
    assert_llamacpp_runs(transformers.LlamaForCausalLM(config).eval(), meta, tensors)
    meta[gguf_rope.POSENC_KEY] = gguf_rope.record(model.config)
    assert gguf_rope.from_gguf(meta, tensors, arch="llama", path="f.gguf") == (
        model.config.rope_parameters, model.config.max_position_embeddings, True)
    meta["llama.context_length"] += 1  # the keys edited after the export: the record no longer describes them
    assert gguf_rope.from_gguf(meta, tensors, arch="llama", path="f.gguf")[2] is False


# -- per architecture: Qwen2 and Gemma 3 (files written from such keys: tests/hf/test_gguf_export_archs.py) ---------


@pytest.mark.parametrize(
    ("kv", "layers"),
    [
        ({"gemma3.attention.sliding_window": 512}, 12),  # llama.cpp's default: every 6th layer full
        ({"gemma3.attention.sliding_window": 512, "gemma3.attention.sliding_window_pattern": 3}, 7),
        ({"gemma3.attention.sliding_window": 512, "gemma3.attention.sliding_window_pattern": (True, False, True)}, 5),
        ({}, 6),  # no window: no sliding layer
    ],
)
def test_the_sliding_layers_are_the_ones_the_llamacpp_reader_reads(tmp_path, kv, layers):
    """``sliding_layers`` (what the writer checks a model's layer types against) and the runtime reader's own
    ``load_swa_pattern`` (``posenc.runtimes.llamacpp``), on the same keys."""
    import numpy as np

    from hf.tiny_gguf import write_gguf
    from posenc.runtimes import read

    meta = {"gemma3.context_length": 64, "gemma3.embedding_length": 16, "gemma3.block_count": layers,
            "gemma3.attention.head_count": 2, "gemma3.rope.freq_base": 1e6, **kv}
    path = write_gguf(tmp_path / "g.gguf", "gemma3", {"token_embd.weight": np.ones((64, 8), np.float32)}, kv=meta,
                      tokenizer=False)
    view = read(path, "llamacpp")
    assert gguf_rope.sliding_layers(meta, "gemma3", layers) == [layer.params["sliding"] for layer in view.layers]


def _gemma3(**rope):
    return transformers.Gemma3TextConfig(
        head_dim=8, hidden_size=16, num_attention_heads=2, num_hidden_layers=6, max_position_embeddings=128,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                         "full_attention": {"rope_type": "default", "rope_theta": 1e6}, **rope})


def test_gemma3_keys_are_the_full_layers_and_the_sliding_ones_are_checked():
    config = _gemma3(full_attention={"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6})
    rope = gguf_rope.to_gguf(config, arch="gemma3")
    assert (rope.freq_base, rope.scaling_type, rope.factor, rope.head_dim) == (1e6, "linear", 8.0, 8)
    theta, scale = gguf_rope.llamacpp_frequencies(rope, sliding_base=1e4)  # freq_scale 1 on the sliding layers
    assert scale == 1.0 and theta.tolist() == (1e4 ** (-_even(8) / 8)).tolist()
    with pytest.raises(ValueError, match=r"rotates the sliding_attention layers at rope.freq_base_swa \(5000\)"):
        gguf_rope.to_gguf(_gemma3(sliding_attention={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}),
                          arch="gemma3", sliding_base=5000.0)
    with pytest.raises(ValueError, match=r"at base 5000 \(the source's rope.freq_base_swa"):
        gguf_rope.to_gguf(config, arch="gemma3", sliding_base=5000.0)
    with pytest.raises(ValueError, match="runs one RoPE for every layer"):
        gguf_rope.to_gguf(config, arch="qwen2")
    flat = transformers.Qwen2Config(hidden_size=16, num_attention_heads=2, rope_parameters={
        "rope_type": "linear", "factor": 2.0, "rope_theta": 1e6})
    with pytest.raises(ValueError, match="gemma3's per-layer-type rope_parameters"):
        gguf_rope.to_gguf(flat, arch="gemma3")
    with pytest.raises(ValueError, match="arch='mistral3' is invalid"):
        gguf_rope.to_gguf(flat, arch="mistral3")


def _even(n: int):
    """0, 2, ..., n - 2 as float64 (the exponents 2i of a head of n dims)."""
    import numpy as np

    return np.arange(0, n, 2, dtype=np.float64)
