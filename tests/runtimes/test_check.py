"""posenc.runtimes.check: what each runtime runs against what posenc measured, and the traps it flags -- a posenc
folder transformers runs unextended (Dual Chunk Attention), YaRN without its original length, Gemma's sliding layers
at the full layers' base, a v5-only config read the transformers-4 way, a GGUF whose RoPE scaling transformers'
loader drops, a length past the extension -- with every method ``posenc export`` writes to a folder ``same`` for
transformers."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from pathlib import Path

import pytest
import torch

from hf.tiny import tiny_model
from hf.tiny_gguf import write_llama
from posenc.runtimes import RUNTIMES, Source, read
from posenc.runtimes.check import (
    U32,
    all_same,
    attention_tolerance,
    check,
    compare,
    format_rows,
    inv_freq_tolerance,
    reference,
)
from posenc.runtimes.transformers import read_transformers4


def _saved(tmp_path: Path, kind: str, *calls, name: str = "out", **overrides) -> Path:
    """A tiny ``kind`` model extended by ``calls`` (``(method, factor, options)``) and written by posenc."""
    import posenc.hf as H

    model = tiny_model(kind, **overrides)
    for method, factor, *options in calls:
        H.extend_context(model, method, factor, **(options[0] if options else {}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ServedOnlyWarning for dca_vllm: what this file checks
        return H.save_pretrained(model, None, tmp_path / name, check=False)


def _edit(folder: Path, change) -> Path:
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _row(rows, runtime="transformers"):
    return next(r for r in rows if r.runtime == runtime)


# ---------------------------------------------------------------------------------------------------------------------
# The tolerance


def test_the_tolerance_is_float32_rounding_of_the_frequencies():
    theta = torch.tensor([1.0, 1e-3, 1e-6, 0.0], dtype=torch.float64)
    tol = inv_freq_tolerance(theta)
    want = [2 * (8 + abs(math.log(t))) * U32 * t if t else 0.0 for t in theta.tolist()]
    torch.testing.assert_close(tol, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=0)
    # One float32 rounding of each frequency is within it; a base 1% off (10000 vs 10100) is 100x outside it.
    exact = 1.0 / 10000.0 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    assert ((exact.float().double() - exact).abs() <= inv_freq_tolerance(exact)).all()
    other = 1.0 / 10100.0 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    assert ((other - exact).abs() > 100 * inv_freq_tolerance(exact))[1:].all()
    assert attention_tolerance(1.2) == 4 * U32 * 1.2 and attention_tolerance(0.5) == 4 * U32


@pytest.mark.parametrize(("scale", "status"), [(0.5, "same"), (3.0, "differs")])
def test_a_frequency_off_by_a_multiple_of_the_tolerance(tmp_path, scale, status):
    folder = _saved(tmp_path, "llama", ("yarn", 2.0))
    source = Source.open(folder)
    view = read(source, "transformers")
    layer = view.layers[1]
    moved = layer.inv_freq.clone()
    moved[2] += scale * float(inv_freq_tolerance(layer.inv_freq)[2])
    shifted = dataclasses.replace(view, layers=(view.layers[0], dataclasses.replace(layer, inv_freq=moved)))
    row = compare(shifted, reference(source))
    assert row.status == status
    assert row.max_inv_freq_ratio == pytest.approx(scale, rel=1e-6)
    if status == "differs":
        assert "layer 1: max |Δ inv_freq|" in row.verdict and "3x the float32 tolerance" in row.verdict


# ---------------------------------------------------------------------------------------------------------------------
# What posenc export writes


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Tiny transformers folders with a tokenizer, as posenc export reads them: Llama, and Qwen2 for DCA."""
    from lab.extend.study.test_study import _hf_folder

    return {kind: _hf_folder(tmp_path_factory.mktemp(kind), kind) for kind in ("llama", "qwen2")}


@pytest.mark.parametrize("method", ["linear", "ntk", "dynamic", "yarn", "llama3"])
def test_every_frequency_method_export_writes_is_same_for_transformers(folders, tmp_path, method):
    from posenc.deploy import export

    written = export(str(folders["llama"]), method, 2.0, tmp_path / method, progress=False)
    row = _row(written.check)
    assert [r.runtime for r in written.check] == list(RUNTIMES)
    assert row.status == "same", row.verdict
    assert row.reference.startswith(f"posenc's record in config.json ({method} x2")
    assert row.max_inv_freq_ratio <= 1 and row.layers == 2
    assert _row(check(written.path, ["transformers"], length=128 if method != "dynamic" else 4096)).status == "same"


@pytest.mark.parametrize("method", ["linear", "ntk", "dynamic", "yarn", "llama3", "dca_vllm"])
def test_export_offers_only_the_runtimes_the_check_shows_same(folders, tmp_path, method):
    """What export prints as the ways to run the model: a runtime is offered (its command) only where the check says
    ``same``, and named with its verdict otherwise -- dynamic NTK is not offered to vLLM
    (it serves it at one base)."""
    from posenc.deploy import export

    kind = "qwen2" if method == "dca_vllm" else "llama"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        written = export(str(folders[kind]), method, 2.0, tmp_path / method, progress=False)
    status = {row.runtime: row.status for row in written.check}
    how = "\n".join(written.how)
    assert ("vllm serve" in how) == (status["vllm"] == "same"), (status, how)
    assert ("from_pretrained(" in how and "Load it with transformers" in how) == (status["transformers"] == "same")
    for runtime, name in (("vllm", "vLLM"), ("sglang", "SGLang")):
        if status[runtime] != "same" and (runtime == "vllm" or method == "dca_vllm"):
            assert f"  {name}: {status[runtime]}" in how
    if method == "dynamic":
        for runtime in ("vllm", "sglang", "llamacpp"):
            row = _row(written.check, runtime)
            assert row.status == "differs" and "one set of frequencies at every length" in row.verdict, row.verdict
    else:
        assert status["transformers"] == ("differs" if method == "dca_vllm" else "same")


def test_a_llama_folder_runs_in_llamacpp_with_the_converters_permuted_rows(folders):
    """convert_hf_to_gguf.py permutes a Llama's q/k rows: llama.cpp's neighbouring pairs on the file are transformers'
    halves on the folder, so the layouts agree; Qwen2 is converted unpermuted and rotated by halves (NEOX)."""
    for kind in ("llama", "qwen2"):
        view = read(Source.open(folders[kind]), "llamacpp")
        assert {layer.layout for layer in view.layers} == {"half"}
        assert any("permutes each head's q/k rows" in n for n in view.notes) == (kind == "llama")
        assert _row(check(folders[kind], ["llamacpp"]), "llamacpp").status == "same"


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_a_dca_folder_is_flagged_where_a_runtime_drops_the_key(tmp_path, kind):
    """llama.cpp has no Dual Chunk Attention (the converter writes no key for it); SGLang's qwen3.py does not pass
    dual_chunk_attention_config to its RoPE: both run the model without DCA. Equal frequencies are not enough."""
    folder = _saved(tmp_path, kind, ("dca_vllm", 2.0))
    rows = check(folder)
    llamacpp = _row(rows, "llamacpp")
    assert llamacpp.status == "differs" and "ignores dual_chunk_attention_config" in llamacpp.verdict
    sglang = _row(rows, "sglang")
    if kind == "qwen3":
        assert sglang.status == "differs" and "ignores dual_chunk_attention_config" in sglang.verdict
    else:
        assert sglang.status == "not verified"
    assert _row(rows, "vllm").status == "not verified"  # whether vLLM's V1 engine serves DCA's attention


def test_a_dca_folder_is_run_unextended_by_transformers(folders, tmp_path):
    from posenc.deploy import export

    written = export(str(folders["qwen2"]), "dca_vllm", 2.0, tmp_path / "dca", progress=False)
    row = _row(written.check)
    assert row.status == "differs"
    assert "ignores dual_chunk_attention_config: posenc measured dca_vllm x2, transformers runs the model without " \
           "it" in row.verdict
    assert f"posenc.hf.load_causal_lm({str(tmp_path / 'dca')!r})" in row.verdict
    assert "posenc.hf.extend_context(model, 'dca_vllm', 2, original_max_position_embeddings=64)" in row.verdict
    assert row.max_inv_freq_delta == 0  # the frequencies are the model's own: DCA is what it drops


# ---------------------------------------------------------------------------------------------------------------------
# Traps


def test_yarn_without_its_original_length_is_flagged_with_the_key_to_add(tmp_path):
    folder = _saved(tmp_path, "llama", ("yarn", 4.0))
    assert _row(check(folder, ["transformers"])).status == "same"

    def drop(config):  # a converter dropped it, from the keys of both generations
        for key in ("rope_parameters", "rope_scaling"):
            config[key].pop("original_max_position_embeddings")

    _edit(folder, drop)
    row = _row(check(folder, ["transformers"]))
    assert row.status == "differs" and row.max_inv_freq_ratio > 1e3
    assert "rope_parameters['original_max_position_embeddings'] = 32 (read: 128)" in row.verdict


def test_a_save_writes_the_transformers_4_keys_beside_rope_parameters(tmp_path):
    """``rope_scaling``, ``rope_theta`` (and ``partial_rotary_factor``) say what ``rope_parameters`` says: a stack
    pinned to transformers 4 runs the measured RoPE; plain RoPE is ``rope_scaling: null``; Gemma's per-layer-type
    parameters are left alone."""
    for calls, kind in ((("yarn", 4.0),), "yarn"), ((("linear", 2.0),), "linear"), ((), "default"):
        folder = _saved(tmp_path, "llama", *calls, name=kind)
        config = json.loads((folder / "config.json").read_text())
        params = config["rope_parameters"]
        assert config["rope_theta"] == params["rope_theta"]
        if kind == "default":
            assert config["rope_scaling"] is None
        else:
            assert config["rope_scaling"] == {k: v for k, v in params.items() if k != "rope_theta"}
        source = Source.open(folder)
        old, new = read_transformers4(source), read(source, "transformers")
        assert compare(old, reference(source, new)).status == "same"
        assert not any("transformers < 5" in note for note in new.notes)
    from posenc.hf.save import with_v4_rope_keys

    per_type = {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    assert with_v4_rope_keys(per_type) == per_type
    partial = {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}}
    assert with_v4_rope_keys(partial) == {**partial, "rope_theta": 1e4, "rope_scaling": None,
                                          "partial_rotary_factor": 0.5}


def test_a_rope_scaling_beside_rope_parameters_shadows_it_in_transformers_5(tmp_path):
    folder = _saved(tmp_path, "llama", ("yarn", 2.0))
    _edit(folder, lambda c: c.update(rope_scaling={"rope_type": "linear", "factor": 2.0}))
    row = _row(check(folder, ["transformers"]))
    assert row.status == "differs"
    assert "transformers ignores rope_parameters" in row.verdict
    assert "remove rope_scaling from config.json" in row.verdict


def test_gemma_sliding_layers_at_the_full_layers_base_are_flagged_by_layer(tmp_path):
    """A reader applying one base to every layer (the full layers' 1e6 on the sliding ones too)."""
    import posenc.hf as H

    model = tiny_model("gemma3_text", layer_types=["sliding_attention", "full_attention"] * 2, num_hidden_layers=4)
    H.extend_context(model, "linear", 2.0, layer_type="full_attention")
    folder = H.save_pretrained(model, None, tmp_path / "gemma", check=False)
    source = Source.open(folder)
    view = read(source, "transformers")
    ref = reference(source)
    assert compare(view, ref).status == "same"
    full = next(layer for layer in view.layers if layer.params.get("layer_type") == "full_attention")
    sliding = {"rope_type": "default", "rope_theta": full.params["rope_theta"], "layer_type": "sliding_attention"}
    one_base = dataclasses.replace(view, layers=tuple(
        dataclasses.replace(layer, inv_freq=full.inv_freq * 2, params=sliding)  # x2: without linear's factor
        if layer.params.get("layer_type") == "sliding_attention" else layer for layer in view.layers))
    row = compare(one_base, ref)
    assert row.status == "differs"
    assert "layers 0, 2 (sliding_attention): max |Δ inv_freq|" in row.verdict
    assert "rope_parameters['sliding_attention']['rope_theta'] = 10000.0 (read: 1000000.0)" in row.verdict


def test_a_v5_only_config_read_the_transformers_4_way_is_flagged(tmp_path):
    folder = _saved(tmp_path, "llama", ("yarn", 2.0))
    # as a tool that writes rope_parameters alone leaves it (posenc's save writes both generations' keys)
    _edit(folder, lambda c: [c.pop(key) for key in ("rope_scaling", "rope_theta")])
    source = Source.open(folder)
    row = compare(read_transformers4(source), reference(source))
    assert row.status == "differs" and "attention factor 1 where posenc measured 1.06931" in row.verdict
    assert "rope_parameters['rope_type'] = 'yarn' (read: 'default')" in row.verdict
    assert any("transformers < 5" in n for n in _row(check(folder, ["transformers"])).notes)


def test_a_posenc_gguf_is_run_unscaled_by_transformers_gguf_loader(tmp_path):
    import posenc.hf as H

    source = write_llama(tmp_path / "tiny.gguf", tiny_model("llama"), weights="f32")
    model, _ = H.load_causal_lm(source)
    H.extend_context(model, "yarn", 2.0)
    written = H.save_gguf(model, tmp_path / "yarn.gguf", source=source, check=False)
    assert written["check"] is None
    row = _row(check(tmp_path / "yarn.gguf", ["transformers"]))
    assert row.status == "differs" and row.reference == "posenc's posenc.rope record in the GGUF (yarn)"
    assert "transformers ignores llama.rope.scaling.type" in row.verdict
    assert f"load it with posenc.hf.load_causal_lm({str(tmp_path / 'yarn.gguf')!r})" in row.verdict
    plain = _row(check(source, ["transformers"]))  # an unscaled GGUF: transformers runs it as posenc's loader does
    assert plain.status == "same" and plain.rotary == "8 interleaved", plain.verdict


def test_a_length_past_the_extension_or_a_reader_that_gives_one_length(tmp_path):
    folder = _saved(tmp_path, "llama", ("yarn", 2.0))
    row = _row(check(folder, ["transformers"], length=100))
    assert row.status == "differs"
    assert "length 100 is past the 64 tokens posenc extended the model to" in row.verdict
    assert "a factor of at least 3.125 over its original 32 tokens" in row.verdict
    unextended = _row(check(_saved(tmp_path, "llama", name="plain"), ["transformers"], length=100))
    assert "length 100 is past the 32 tokens the model was trained for" in unextended.verdict  # posenc did nothing
    dynamic = _saved(tmp_path, "llama", ("dynamic", 2.0), name="dynamic")
    source = Source.open(dynamic)
    ref = reference(source)
    assert ref.context is None and compare(read(source, "transformers"), ref, length=4096).status == "same"
    view = read(source, "transformers")
    frozen = dataclasses.replace(view, layers=tuple(dataclasses.replace(x, at_length=None) for x in view.layers))
    row = compare(frozen, ref, length=4096)
    assert row.status == "not verified" and "gives them at one length only" in row.verdict
    # A runtime that runs dynamic NTK as a static table (its frequencies at the original length, at every length).
    static = dataclasses.replace(view, layers=tuple(dataclasses.replace(x, length_dependent=False, at_length=None)
                                                    for x in view.layers))
    assert compare(static, ref, length=32).status == "same"  # within the original context nothing changes
    row = compare(static, ref, length=4096)
    assert row.status == "differs" and "layers 0, 1: max |Δ inv_freq|" in row.verdict


def test_a_missing_reader_is_not_verified_and_not_same(tmp_path, monkeypatch):
    import posenc.runtimes as R

    monkeypatch.setattr(R, "_load_reader", lambda runtime: None)
    monkeypatch.setattr(R, "_READERS", {k: v for k, v in R._READERS.items() if k == "transformers"})
    rows = check(_saved(tmp_path, "llama", ("linear", 2.0)))
    assert [r.status for r in rows] == ["same", "not verified", "not verified", "not verified"]
    assert _row(rows, "vllm").verdict == "not verified: posenc has no vllm reader yet"
    assert not all_same(rows) and all_same(rows[:1])
    assert "vllm: not verified: posenc has no vllm reader yet" in format_rows(rows)


def test_a_plain_config_is_compared_with_transformers_reading_and_dca_keys_count(tmp_path):
    folder = tmp_path / "qwen"
    folder.mkdir()
    config = tiny_model("qwen2").config.to_dict()
    config["dual_chunk_attention_config"] = {"chunk_size": 24, "local_size": 4, "original_max_position_embeddings": 32}
    (folder / "config.json").write_text(json.dumps(config))
    row = _row(check(folder / "config.json", ["transformers"]))
    assert row.reference == "the config as transformers reads it (no posenc record)"
    assert row.status == "differs" and "ignores dual_chunk_attention_config" in row.verdict


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"runtimes": ["transformers", "tgi"]}, r"runtimes='tgi' is invalid: expected one of \['transformers'"),
        ({"runtimes": []}, r"runtimes=\[\] is invalid: expected one or more of"),
        ({"runtimes": ["vllm", "vllm"]}, r"expected each of .* at most once"),
        ({"length": 0}, r"length=0 is invalid: expected a positive integer"),
    ],
)
def test_bad_input_names_the_parameter(tmp_path, kwargs, match):
    folder = _saved(tmp_path, "llama", ("linear", 2.0))
    with pytest.raises(ValueError, match=match):
        check(folder, **kwargs)


def test_a_missing_path_names_it(tmp_path):
    with pytest.raises(ValueError, match=r"path='.*nowhere' is invalid: expected an existing transformers folder"):
        check(tmp_path / "nowhere")


def test_save_pretrained_prints_the_check_and_save_gguf_returns_it(tmp_path, capsys):
    import posenc.hf as H

    model = tiny_model("llama")
    H.extend_context(model, "linear", 2.0)
    H.save_pretrained(model, None, tmp_path / "f")
    out = capsys.readouterr().out
    assert "posenc check" in out and "transformers" in out and "same" in out
    source = write_llama(tmp_path / "tiny.gguf", tiny_model("llama"), weights="f32")
    model, _ = H.load_causal_lm(source)
    H.extend_context(model, "linear", 2.0)
    written = H.save_gguf(model, tmp_path / "linear.gguf", source=source)
    assert [r.runtime for r in written["check"]] == list(RUNTIMES)
    assert "posenc check" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------------------------
# vLLM as released (issue 68): YaRN's attention keys as vLLM 0.33.0 reads them


_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "num_attention_heads": 4,
          "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 512, "max_position_embeddings": 4096,
          "vocab_size": 128}


@pytest.mark.parametrize(
    "keys",
    [{"attention_factor": 1.0}, {"attention_factor": 0.8}, {"mscale": 1.0, "mscale_all_dim": 1.0},
     {"mscale": 1.0, "mscale_all_dim": 0.5}, {"attn_factor": 0.9}],
    ids=["attention_factor-1.0", "attention_factor-0.8", "mscale-1-1", "mscale-1-0.5", "attn_factor-0.9"],
)
def test_yarn_attention_keys_are_read_by_vllm_as_released(tmp_path, keys):
    """vLLM 0.33.0 reads YaRN's ``attention_factor``, ``mscale`` and ``mscale_all_dim`` as transformers does and not
    ``attn_factor`` (41c5903d, which posenc followed before, read only ``attn_factor``: five false "differs")."""
    from reference import vllm_rope_scaling as ref

    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024, "rope_theta": 500000.0,
            **keys}
    path = tmp_path / "m"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({**_LLAMA, "rope_parameters": rope}))
    row = _row(check(path, ["vllm"]), "vllm")
    assert (row.status, row.version) == ("same", "vLLM 0.33.0"), row.verdict
    layer = read(path, "vllm").layers[0]
    hf_keys = {k: v for k, v in keys.items() if k != "attn_factor"}
    want, factor = ref.yarn_release(64, 500000.0, 4.0, 1024, **hf_keys)
    torch.testing.assert_close(layer.inv_freq, want, rtol=0, atol=float(inv_freq_tolerance(want).max()))
    assert abs(layer.attention_factor - factor) <= attention_tolerance(factor)
    assert row.attention_factor_delta is not None and row.attention_factor_delta <= attention_tolerance(factor)


def test_a_kept_record_with_attention_factor_added_by_hand_differs_in_vllm(tmp_path):
    """A posenc YaRN x2 folder whose config was given ``attention_factor`` 0.8 by hand: vLLM 0.33.0 serves 0.8 where
    posenc measured 0.1 ln 2 + 1 (the reader of 41c5903d read no ``attention_factor``: a false "same")."""
    def add(config):  # in rope_parameters and the transformers-4 rope_scaling posenc writes beside it
        for key in ("rope_parameters", "rope_scaling"):
            if isinstance(config.get(key), dict):
                config[key]["attention_factor"] = 0.8

    folder = _edit(_saved(tmp_path, "llama", ("yarn", 2.0)), add)
    row = _row(check(folder, ["vllm"]), "vllm")
    assert row.status == "differs" and "attention factor 0.8 where posenc measured" in row.verdict, row.verdict
    measured = 0.1 * math.log(2.0) + 1.0
    assert row.attention_factor_delta == pytest.approx(abs(0.8 - measured), rel=1e-12)
# A GGUF whose llama.cpp keys were edited after the export: compared with what posenc measured (its record)


def _yarn_gguf(tmp_path: Path, name: str, edit: dict) -> Path:
    """A Llama GGUF as posenc.hf.save_gguf writes a YaRN x2 model (its llama.cpp keys and its posenc.rope record),
    with the keys in ``edit`` set afterwards (None: removed)."""
    import numpy as np

    from hf.tiny import ORIGINAL, tiny_config
    from hf.tiny_gguf import write_gguf
    from posenc.gguf import rope as gguf_rope

    config = tiny_config("llama", max_position_embeddings=2 * ORIGINAL)
    config.rope_parameters = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0,
                              "original_max_position_embeddings": ORIGINAL}
    d = config.hidden_size // config.num_attention_heads
    kv = {"llama.embedding_length": config.hidden_size, "llama.block_count": 2, "llama.rope.dimension_count": d,
          "llama.attention.head_count": config.num_attention_heads, gguf_rope.POSENC_KEY: gguf_rope.record(config),
          **{k: v for k, (v, _) in gguf_rope.to_gguf(config).metadata().items()}}
    for key, value in edit.items():
        kv.pop(key) if value is None else kv.__setitem__(key, value)
    weights = {"token_embd.weight": np.ones((64, config.hidden_size), np.float32)}
    return write_gguf(tmp_path / f"{name}.gguf", "llama", weights, kv=kv)


@pytest.mark.parametrize(
    ("edit", "fix"),
    [
        ({}, None),
        ({"llama.rope.scaling.original_context_length": None},
         "llama.rope.scaling.original_context_length = 32 (the file: absent)"),
        ({"llama.rope.scaling.attn_factor": 0.9}, "remove llama.rope.scaling.attn_factor (the file: 0.9)"),
        ({"llama.rope.scaling.type": "none"}, "llama.rope.scaling.type = 'yarn' (the file: 'none')"),
        ({"llama.rope.scaling.factor": 4.0}, "llama.rope.scaling.factor = 2 (the file: 4)"),
    ],
)
def test_a_gguf_edited_after_the_export_is_compared_with_what_posenc_measured(tmp_path, edit, fix):
    """llama.cpp runs the edited keys; the reference is the record, so each edit is a difference with its fix."""
    path = _yarn_gguf(tmp_path, "edited", edit)
    llamacpp, transformers = check(path, ["llamacpp", "transformers"])
    assert llamacpp.reference == transformers.reference == "posenc's posenc.rope record in the GGUF (yarn)"
    if fix is None:
        assert llamacpp.status == "same", llamacpp.verdict
        return
    assert llamacpp.status == "differs", llamacpp.verdict
    assert "the file's llama.cpp keys were edited after the export" in llamacpp.verdict
    assert f"Fix: set the file's keys to what posenc measured: {fix}" in llamacpp.verdict
    # posenc's loader reads the edited keys: its advice restores them first
    assert f"set the file's llama.cpp keys back to what posenc measured ({fix}) and load it" in transformers.verdict


# ---------------------------------------------------------------------------------------------------------------------
# dual_chunk_attention_config against what posenc measured


def test_a_dca_chunk_size_edited_by_hand_is_named_for_the_runtimes_that_read_it(tmp_path):
    """posenc measured chunk_size 24 (its record); vLLM and SGLang serve the config's 20 once it is edited."""
    folder = _saved(tmp_path, "qwen2", ("dca_vllm", 2.0))
    assert json.loads((folder / "config.json").read_text())["dual_chunk_attention_config"]["chunk_size"] == 24
    assert {_row(check(folder), r).status for r in ("vllm", "sglang")} == {"not verified"}
    _edit(folder, lambda c: c["dual_chunk_attention_config"].update(chunk_size=20))
    rows = check(folder)
    for runtime in ("vllm", "sglang"):
        row = _row(rows, runtime)
        assert row.status == "differs", row.verdict
        assert f"{runtime} runs dual_chunk_attention_config chunk_size=20 where posenc measured 24" in row.verdict
        assert "Fix: dual_chunk_attention_config['chunk_size'] = 24 (read: 20)" in row.verdict


def test_a_dca_config_without_a_record_is_given_a_call_that_runs_what_vllm_serves(tmp_path):
    """Qwen2.5-1M as shipped: a dual_chunk_attention_config and no posenc record. posenc's loader does not apply it
    (nothing claims it does); the call the check gives runs posenc's dca_vllm with the sizes vLLM reads."""
    import re

    from transformers import AutoModelForCausalLM

    import posenc
    from posenc.hf.load import apply_saved
    from posenc.remapping import VLLM_MSCALE, DualChunk

    folder = tmp_path / "qwen2-1m"
    tiny_model("qwen2").save_pretrained(folder)
    dca = {"chunk_size": 24, "local_size": 4, "original_max_position_embeddings": 32}
    _edit(folder, lambda c: c.update(dual_chunk_attention_config=dca, max_position_embeddings=64))
    row = _row(check(folder))
    assert row.status == "differs" and "which applies it" not in row.verdict, row.verdict
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert apply_saved(model) == []  # what load_causal_lm applies to a transformers folder: nothing here
    assert getattr(model, "_posenc_remap", None) is None
    call = re.search(r"call (posenc\.hf\.extend_context\(model, 'dca_vllm', [^)]*\))", row.verdict).group(1)
    eval(call, {"posenc": posenc, "model": model})  # noqa: S307 - the advice, run as a user would paste it
    served = next(layer.params for layer in read(Source.open(folder), "vllm").layers)
    assert model._posenc_remap.method == DualChunk(
        chunk_size=served["chunk_size"], local_window=served["local_size"],
        original_max_position_embeddings=served["original_max_position_embeddings"], mscale=VLLM_MSCALE)


# ---------------------------------------------------------------------------------------------------------------------
# llama.cpp's converter under transformers 4 and 5


def _yarn_folder(tmp_path: Path, name: str, rope: dict, **top) -> Path:
    """A Llama YaRN x2 of 8192 tokens (head dim 128, where the correction range moves with the original length):
    ``rope`` as config.json's rope_scaling, and ``top`` as top-level keys. No weights: check reads none."""
    config = tiny_model("llama").config.to_dict()
    config.pop("rope_parameters", None)
    config.update(architectures=["LlamaForCausalLM"], hidden_size=256, num_attention_heads=2, num_key_value_heads=2,
                  head_dim=128, max_position_embeddings=16384, rope_theta=10000.0, rope_scaling=rope, **top)
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_top_level_original_length_depends_on_the_converters_transformers(tmp_path):
    """convert_hf_to_gguf.py reads AutoConfig.from_pretrained(folder).to_dict(): under transformers 5 (installed
    here) that dict's rope_parameters already holds original_max_position_embeddings = max_position_embeddings, so
    the GGUF gets 16384; under transformers 4 the converter takes the top-level 8192, which transformers runs."""
    from transformers import AutoConfig

    folder = _yarn_folder(tmp_path, "top", {"rope_type": "yarn", "factor": 2.0}, original_max_position_embeddings=8192)
    hparams = AutoConfig.from_pretrained(folder).to_dict()
    assert hparams["rope_parameters"]["original_max_position_embeddings"] == 16384
    assert hparams["original_max_position_embeddings"] == 8192
    row = _row(check(folder), "llamacpp")
    assert row.status == "differs", row.verdict
    assert row.verdict.startswith("differs: depends on llamacpp's environment: convert_hf_to_gguf.py run under "
                                  "transformers 4")
    assert "writes llama.rope.scaling.original_context_length 8192): same" in row.verdict
    assert "transformers 5 (its AutoConfig.to_dict(); writes llama.rope.scaling.original_context_length 16384): " \
           "differs: layers 0, 1: max |Δ inv_freq|" in row.verdict
    assert "write original_max_position_embeddings = 8192 inside config.json's rope_parameters and rope_scaling" \
           in row.verdict
    # With the key inside the dict both environments write 8192: no dependence.
    inside = _yarn_folder(tmp_path, "inside", {"rope_type": "yarn", "factor": 2.0,
                                               "original_max_position_embeddings": 8192},
                          original_max_position_embeddings=8192)
    assert _row(check(inside), "llamacpp").status == "same"


def test_a_save_writes_a_top_level_original_length_inside_both_rope_dicts(tmp_path):
    """What posenc writes is read alike by the converter under transformers 4 and 5."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import posenc.hf as H
    from posenc.hf.save import with_v4_rope_keys

    config = {"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4},
              "original_max_position_embeddings": 32, "max_position_embeddings": 64}
    written = with_v4_rope_keys(config)
    assert written["rope_parameters"]["original_max_position_embeddings"] == 32
    assert written["rope_scaling"]["original_max_position_embeddings"] == 32
    source = json.loads((_yarn_folder(tmp_path, "src", {"rope_type": "yarn", "factor": 2.0},
                                      original_max_position_embeddings=8192) / "config.json").read_text())
    source.update(num_hidden_layers=1, intermediate_size=8, vocab_size=8)
    folder = H.save_pretrained(LlamaForCausalLM(LlamaConfig.from_dict(source)), None, tmp_path / "saved", check=False)
    saved = json.loads((folder / "config.json").read_text())
    assert saved["rope_parameters"]["original_max_position_embeddings"] == 8192
    assert saved["rope_scaling"]["original_max_position_embeddings"] == 8192
    assert _row(check(folder), "llamacpp").status == "same"
