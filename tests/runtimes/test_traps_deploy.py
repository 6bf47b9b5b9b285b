"""Traps from the field's bugs, on what ``posenc export`` writes (a GGUF through ``posenc.hf.save_gguf``, a folder
through ``posenc.hf.save_pretrained``): ``posenc check`` must flag each against what posenc measured.

- llama.cpp #14367: Gemma 3's local (sliding) layers given the global layers' frequency scale (or base);
- llama.cpp #13322: a converter dropped the RoPE scaling keys, so the file reads as not extended;
- vLLM #29111 (fixing the regression of #28542): Gemma 3's sliding layers must run the default RoPE at
  ``rope_local_base_freq`` (10000) with no scaling; the regression gave them the config's scaling.

The tiny models and files: ``tests/hf/tiny.py``, ``tests/hf/tiny_gguf.py``; the readers follow the runtime releases
named in their modules (llama.cpp 0c1e57098, vLLM 0.33.0).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")  # transformers' GGUF loader needs it

import posenc.hf as H  # noqa: E402 - after the skips
from hf.tiny import tiny_model  # noqa: E402
from hf.tiny_gguf import edited_copy, tiny_gemma3, write_gemma3, write_llama  # noqa: E402
from posenc.gguf.header import read_gguf_header  # noqa: E402
from posenc.runtimes import Source, read  # noqa: E402
from posenc.runtimes import llamacpp as llamacpp_reader  # noqa: E402
from posenc.runtimes.check import check, compare, reference  # noqa: E402
from posenc.runtimes.vllm import vllm_get_rope  # noqa: E402

FULL, SLIDING = "full_attention", "sliding_attention"
SLIDING_LAYERS = "layers 0, 1, 2, 3, 4 (sliding_attention)"  # the tiny Gemma 3: full at layer 5 only
HEAD = 8  # the tiny models' head_dim


def _plain(base: float) -> torch.Tensor:
    return 1.0 / base ** (torch.arange(0, HEAD, 2, dtype=torch.float64) / HEAD)


@pytest.fixture(scope="module")
def gemma_gguf(tmp_path_factory):
    """A tiny Gemma 3 GGUF extended linear x4 on its full_attention layers, as posenc export writes it."""
    folder = tmp_path_factory.mktemp("gemma")
    source = write_gemma3(folder / "source.gguf", tiny_gemma3())
    model, _ = H.load_causal_lm(source)
    H.extend_context(model, "linear", 4.0, layer_type=FULL)
    return H.save_gguf(model, folder / "linear.gguf", source=source, check=False)["path"]


@pytest.fixture(scope="module")
def qwen_gguf(tmp_path_factory):
    """A tiny Qwen2 GGUF extended by YaRN x4."""
    folder = tmp_path_factory.mktemp("qwen")
    source = write_llama(folder / "source.gguf", tiny_model("qwen2"), weights="f32", arch="qwen2")
    model, _ = H.load_causal_lm(source)
    H.extend_context(model, "yarn", 4.0)
    return H.save_gguf(model, folder / "yarn.gguf", source=source, check=False)["path"]


def _gemma_folder(tmp_path, *types: str):
    model = tiny_gemma3()
    for layer_type in types:
        H.extend_context(model, "linear", 4.0, layer_type=layer_type)
    return H.save_pretrained(model, None, tmp_path / "gemma", check=False)


def _rows(path, **kwargs):
    return {row.runtime: row for row in check(path, **kwargs)}


# -- llama.cpp #14367: the sliding layers given the global scale or base ------------------------------------------


def test_14367_a_reading_that_scales_the_sliding_layers_is_flagged(gemma_gguf, monkeypatch):
    """The exported file read as llama.cpp read it when #14367 was filed (the sliding layers' freq_scale the file's
    1 / factor, as get_rope_freq_scale gives every other sliding-window architecture): flagged on the sliding layers
    alone. At the followed commit (freq_scale 1 there) the same file reads as measured."""
    assert _rows(gemma_gguf)["llamacpp"].status == "same"
    rules = llamacpp_reader._ARCHS["gemma3"]
    monkeypatch.setitem(llamacpp_reader._ARCHS, "gemma3", dataclasses.replace(rules, scale_swa="train"))
    view = read(gemma_gguf, "llamacpp")
    assert [layer.params["freq_scale"] for layer in view.layers] == [0.25] * 6  # every layer scaled
    row = _rows(gemma_gguf)["llamacpp"]
    assert row.status == "differs"
    assert f"{SLIDING_LAYERS}: max |Δ inv_freq|" in row.verdict and "layer 5" not in row.verdict


def test_14367_a_file_whose_sliding_layers_take_the_global_base_is_flagged_with_the_key(gemma_gguf, tmp_path):
    """A converter writing the full layers' theta as rope.freq_base_swa: llama.cpp rotates the sliding layers at
    1e6; the check names the sliding layers and the key that says the record again."""
    edited = edited_copy(gemma_gguf, tmp_path / "swa.gguf", put={"gemma3.rope.freq_base_swa": (1e6, "FLOAT32")})
    view = read(edited, "llamacpp")
    torch.testing.assert_close(view.layers[0].inv_freq, _plain(1e6), rtol=1e-6, atol=0)
    row = _rows(edited)["llamacpp"]
    assert row.status == "differs" and f"{SLIDING_LAYERS}: max |Δ inv_freq|" in row.verdict
    assert "gemma3.rope.freq_base_swa = 10000 (the file: 1000000)" in row.verdict


def test_14367_a_folder_extended_on_its_sliding_layers_too_differs_in_llamacpp(tmp_path):
    """Extended on every layer type (--layer-type all): transformers and vLLM run both scalings from the folder, but
    convert_hf_to_gguf.py writes the full layers' only and llama.cpp runs the sliding ones unscaled."""
    rows = _rows(_gemma_folder(tmp_path, FULL, SLIDING))
    assert rows["transformers"].status == "same" and rows["vllm"].status == "same"
    assert rows["llamacpp"].status == "differs"
    assert f"{SLIDING_LAYERS}: max |Δ inv_freq|" in rows["llamacpp"].verdict
    assert "rope_parameters.sliding_attention.rope_type='linear'" in rows["llamacpp"].verdict


# -- llama.cpp #13322: RoPE keys dropped by a converter ----------------------------------------------------------


@pytest.mark.parametrize("which", ["gemma", "qwen"])
def test_13322_a_gguf_whose_scaling_keys_were_dropped_reads_as_not_extended(gemma_gguf, qwen_gguf, tmp_path, which):
    """posenc's record survives a converter that drops rope.scaling.*: llama.cpp then runs the plain RoPE, the check
    flags it against the record and names the keys to write back."""
    path = gemma_gguf if which == "gemma" else qwen_gguf
    arch = read_gguf_header(path).architecture
    scaling = tuple(k for k in read_gguf_header(path).metadata if k.startswith(f"{arch}.rope.scaling."))
    assert scaling
    dropped = edited_copy(path, tmp_path / "dropped.gguf", drop=scaling)
    view = read(dropped, "llamacpp")
    assert {layer.params["factor"] for layer in view.layers} == {1.0}  # not extended
    rows = _rows(dropped)
    assert rows["llamacpp"].status == "differs", rows["llamacpp"].verdict
    kind = "linear" if which == "gemma" else "yarn"
    assert f"{arch}.rope.scaling.type = '{kind}' (the file: absent)" in rows["llamacpp"].verdict
    assert "edited after the export" in rows["llamacpp"].verdict


def test_13322_without_keys_or_record_the_file_is_not_extended_and_a_longer_length_is_flagged(qwen_gguf, tmp_path):
    """A converter that dropped the scaling keys and posenc's record, and wrote the original context back: every
    runtime reads the plain model (nothing claims an extension) and a length past the original is flagged."""
    meta = read_gguf_header(qwen_gguf).metadata
    drop = (*[k for k in meta if k.startswith("qwen2.rope.scaling.")], "posenc.rope")
    plain = edited_copy(qwen_gguf, tmp_path / "plain.gguf", drop=drop,
                        put={"qwen2.context_length": (32, "UINT32")})
    ref = reference(Source.open(plain))
    assert {layer.method for layer in ref.layers} == {"default"}
    assert _rows(plain)["llamacpp"].status == "same"
    row = _rows(plain, length=128)["llamacpp"]
    assert row.status == "differs" and "llamacpp allows at most 32 tokens, not length 128" in row.verdict


def test_13322_a_folder_whose_scaling_was_dropped_is_flagged_against_its_record(tmp_path):
    """A Gemma 3 folder whose config.json lost the full layers' scaling (posenc's record kept): every runtime that
    reads the config runs the plain RoPE on layer 5 and is flagged, naming the key."""
    folder = _gemma_folder(tmp_path, FULL)
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config["rope_parameters"][FULL] = {"rope_type": "default", "rope_theta": 1e6}
    config.pop("rope_scaling", None)
    path.write_text(json.dumps(config))
    rows = _rows(folder)
    for runtime in ("transformers", "vllm", "llamacpp"):
        assert rows[runtime].status == "differs", (runtime, rows[runtime].verdict)
        assert "layer 5 (full_attention)" in rows[runtime].verdict
    assert "rope_parameters['full_attention']['factor'] = 4.0 (read: absent)" in rows["transformers"].verdict


# -- vLLM #29111: Gemma 3's sliding layers, default RoPE at rope_local_base_freq, unscaled --------------------------


def test_29111_vllm_runs_the_sliding_layers_plain_at_the_local_base(tmp_path):
    """A folder extended on full_attention (posenc export's default): vLLM 0.33's gemma3.py builds the sliding layers
    from rope_parameters['sliding_attention'], the default RoPE at 10000, and only layer 5 scaled."""
    folder = _gemma_folder(tmp_path, FULL)
    view = read(folder, "vllm")
    for layer in view.layers[:5]:
        assert layer.method == "default"
        torch.testing.assert_close(layer.inv_freq, _plain(1e4), rtol=1e-12, atol=0)
    torch.testing.assert_close(view.layers[5].inv_freq, _plain(1e6) / 4, rtol=1e-12, atol=0)
    assert _rows(folder)["vllm"].status == "same"


def test_29111_the_regressions_reading_is_flagged_on_the_sliding_layers(tmp_path):
    """#28542's regression: the sliding layers built from the full layers' (scaled) parameters at the local base.
    Compared with what posenc measured, the sliding layers alone are flagged, with the key vLLM misread."""
    folder = _gemma_folder(tmp_path, FULL)
    source = Source.open(folder)
    view = read(source, "vllm")
    full_params = json.loads((folder / "config.json").read_text())["rope_parameters"][FULL]
    regressed = vllm_get_rope(HEAD, 128, {**full_params, "rope_theta": 1e4}).layer
    regressed = dataclasses.replace(regressed, params={**regressed.params, "layer_type": SLIDING})
    bad = dataclasses.replace(view, layers=(*[regressed] * 5, view.layers[5]))
    row = compare(bad, reference(source))
    assert row.status == "differs"
    assert f"{SLIDING_LAYERS}: max |Δ inv_freq|" in row.verdict and "layer 5" not in row.verdict
    assert "rope_parameters['sliding_attention']['rope_type'] = 'default' (read: 'linear')" in row.verdict
