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
