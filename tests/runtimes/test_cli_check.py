"""``posenc check PATH``: a table (or ``--json``) naming each runtime's release, exit 1 where a runtime ``differs`` or
``cannot run this`` (``--strict``: also where one is ``not verified``), else 0; 2 for bad input with one line on
stderr and no traceback."""

from __future__ import annotations

import json
import warnings

import pytest

from hf.tiny import tiny_model
from posenc.cli import main


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A linear x2 folder (transformers runs it as measured) and a dca_vllm one (transformers drops DCA)."""
    import posenc.hf as H

    out = {}
    for kind, method in (("llama", "linear"), ("qwen2", "dca_vllm")):
        model = tiny_model(kind)
        H.extend_context(model, method, 2.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out[method] = H.save_pretrained(model, None, tmp_path_factory.mktemp(kind) / "out", check=False)
    return out


def _run(capsys, *args):
    code = main(["check", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_same_exits_0_with_a_table(folders, capsys):
    code, out, err = _run(capsys, folders["linear"], "--runtimes", "transformers")
    assert (code, err) == (0, "")
    assert "transformers" in out and "same" in out and "max |Δ inv_freq|" in out
    assert "posenc's record in config.json (linear x2)" in out


def test_a_difference_exits_1_and_json_holds_the_rows(folders, capsys):
    code, out, err = _run(capsys, folders["dca_vllm"], "--runtimes", "transformers", "--json")
    assert (code, err) == (1, "")
    rows = json.loads(out)
    assert [r["runtime"] for r in rows] == ["transformers"] and rows[0]["status"] == "differs"
    assert "ignores dual_chunk_attention_config" in rows[0]["verdict"]
    assert set(rows[0]) >= {"max_inv_freq_delta", "attention_factor_delta", "rotary", "context", "follows", "notes"}


def test_a_length_past_the_extension_exits_1(folders, capsys):
    code, out, _ = _run(capsys, folders["linear"], "--runtimes", "transformers", "--length", "65", "--json")
    assert code == 1 and "length 65 is past the 64 tokens" in json.loads(out)[0]["verdict"]
    code, out, _ = _run(capsys, folders["linear"], "--runtimes", "transformers", "--length", "64", "--json")
    assert code == 0


def test_every_runtime_by_default_and_a_missing_reader_is_not_same(folders, capsys, monkeypatch):
    import posenc.runtimes as R

    monkeypatch.setattr(R, "_load_reader", lambda runtime: None)
    monkeypatch.setattr(R, "_READERS", {k: v for k, v in R._READERS.items() if k == "transformers"})
    code, out, _ = _run(capsys, folders["linear"], "--json")
    rows = json.loads(out)
    assert code == 0 and [r["runtime"] for r in rows] == ["transformers", "vllm", "sglang", "llamacpp"]
    assert [r["status"] for r in rows] == ["same", "not verified", "not verified", "not verified"]
    code, _, _ = _run(capsys, folders["linear"], "--json", "--strict")
    assert code == 1


def test_the_readmes_yarn_export_exits_0_with_every_release_named(tmp_path, capsys):
    """The README's own example (a Llama extended by YaRN x2 and written by posenc): every runtime ``same``, exit 0
    with and without ``--strict`` (SGLang's Llama path read from SGLang 0.5.23's llama.py; before, its row was "not
    verified" for every Llama config and the export of the README's example exited 1); each row, text and JSON,
    names the release read."""
    import posenc.hf as H

    model = tiny_model("llama")
    H.extend_context(model, "yarn", 2.0)
    path = H.save_pretrained(model, None, tmp_path / "yarn2", check=False)
    code, out, _ = _run(capsys, path, "--json")
    rows = json.loads(out)
    assert code == 0 and [r["status"] for r in rows] == ["same"] * 4, [r["verdict"] for r in rows]
    versions = [r["version"] for r in rows]
    assert versions[1:] == ["vLLM 0.33.0", "SGLang 0.5.23", "llama.cpp 0c1e57098 (llama-cpp-python 0.3.36)"]
    assert versions[0].startswith("transformers 5.") and versions[0].endswith("(installed)")
    assert _run(capsys, path, "--strict", "--json")[0] == 0
    code, out, _ = _run(capsys, path)
    assert code == 0 and "release read" in out and all(v in out for v in versions)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--runtimes", "transformers,tgi"], "posenc check: runtimes='tgi' is invalid: expected one of"),
        (["--length", "0"], "posenc check: argument --length: '0' is invalid"),
        (["--length", "2k"], "posenc check: argument --length: '2k' is invalid"),
        (["--frobnicate"], "posenc check: unrecognized arguments: --frobnicate"),
    ],
)
def test_bad_input_exits_2_in_one_line(folders, capsys, args, message):
    code, out, err = _run(capsys, folders["linear"], *args)
    assert code == 2 and out == ""
    assert err.startswith(message) and err.count("\n") == 1 and "Traceback" not in err


def test_a_missing_or_unreadable_path_exits_2(tmp_path, capsys):
    code, _, err = _run(capsys, tmp_path / "nowhere")
    assert code == 2 and err.startswith("posenc check: path=") and err.count("\n") == 1
    (tmp_path / "bad.json").write_text("{not json")
    code, _, err = _run(capsys, tmp_path / "bad.json")
    assert code == 2 and "a readable JSON config" in err and err.count("\n") == 1
    (tmp_path / "notes.txt").write_text("hello")
    code, _, err = _run(capsys, tmp_path / "notes.txt")
    assert code == 2 and err.count("\n") == 1


def _config(tmp_path, name, change):
    """A tiny Llama YaRN x2 config.json (no posenc record) changed by ``change``."""
    config = tiny_model("llama").config.to_dict()
    config["rope_parameters"] = {"rope_type": "yarn", "factor": 2.0, "rope_theta": 10000.0,
                                 "original_max_position_embeddings": 32}
    change(config)
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _gguf(tmp_path, name, edit):
    """A tiny Llama GGUF's metadata with ``edit`` applied (None: the key removed)."""
    import numpy as np

    from hf.tiny_gguf import llama_kv, write_gguf

    model = tiny_model("llama")
    kv = llama_kv(model.config)
    for key, value in edit.items():
        kv.pop(key) if value is None else kv.__setitem__(key, value)
    return write_gguf(tmp_path / f"{name}.gguf", "llama", {"token_embd.weight": np.ones((64, 8), np.float32)}, kv=kv)


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        ("no-layers", lambda c: c.pop("num_hidden_layers"),
         r"config.json has no num_hidden_layers \(.*\): expected the number of decoder layers, a positive integer"),
        ("string-factor", lambda c: c["rope_parameters"].update(factor="abc"),
         r"rope_parameters\['factor'\]='abc' in .*config.json is invalid: expected a finite number > 0"),
        ("string-base", lambda c: c["rope_parameters"].update(rope_theta="abc"),
         r"rope_parameters\['rope_theta'\]='abc' in .*config.json is invalid: expected a finite number > 0"),
        ("negative-factor", lambda c: c["rope_parameters"].update(factor=-2.0),
         r"rope_parameters\['factor'\]=-2.0 in .*config.json is invalid: expected a finite number > 0"),
        ("zero-original", lambda c: c["rope_parameters"].update(original_max_position_embeddings=0),
         r"rope_parameters\['original_max_position_embeddings'\]=0 in .*config.json is invalid: expected a positive "
         r"integer"),
        ("bad-dca", lambda c: c.update(dual_chunk_attention_config={"chunk_size": "48", "local_size": 4}),
         r"dual_chunk_attention_config\['chunk_size'\]='48' in .*config.json is invalid"),
    ],
)
def test_a_bad_config_key_exits_2_naming_file_key_and_value(tmp_path, capsys, name, change, message):
    from posenc.runtimes.check import check

    folder = _config(tmp_path, name, change)
    with pytest.raises(ValueError, match=message):
        check(folder)
    code, out, err = _run(capsys, folder)
    assert code == 2 and out == "" and "Traceback" not in err and err.count("\n") == 1, err
    assert str(folder / "config.json") in err


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"llama.context_length": None}, r"\.gguf has no llama.context_length: expected a positive integer"),
        ({"llama.block_count": None}, r"\.gguf has no llama.block_count"),
        ({"llama.rope.freq_base": "10000"}, r"llama.rope.freq_base='10000' in .*\.gguf is invalid: expected a finite "
                                            r"number > 0, stored as float32 \(the file stores a string"),
        ({"llama.rope.freq_base": -1.0}, r"llama.rope.freq_base=-1.0 in .*\.gguf is invalid"),
        ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 2.0,
          "llama.rope.scaling.original_context_length": 0},
         r"llama.rope.scaling.original_context_length=0 in .*\.gguf is invalid: expected a positive integer"),
    ],
)
def test_a_bad_gguf_key_exits_2_naming_file_key_and_value(tmp_path, capsys, edit, message):
    from posenc.runtimes.check import check

    path = _gguf(tmp_path, "bad", edit)
    with pytest.raises(ValueError, match=message):
        check(path)
    code, out, err = _run(capsys, path)
    assert code == 2 and out == "" and "Traceback" not in err and err.count("\n") == 1, err
    assert str(path) in err


def test_a_llama_gguf_checked_for_llamacpp_alone_never_imports_transformers(tmp_path):
    """Each reader imports what it needs, when it needs it: llama.cpp's reading of a Llama GGUF and its reference
    (the file's own keys) need no transformers, so ``--runtimes llamacpp`` starts without importing it (about 2 s
    less); the default, with transformers' row, imports it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import posenc

    path = _gguf(tmp_path, "plain", {})
    src = str(Path(posenc.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}

    def run(*args):
        done = subprocess.run([sys.executable, "-X", "importtime", "-m", "posenc", "check", str(path), "--json", *args],
                              capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
        imported = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines()
                    if line.startswith("import time:")}
        return done.returncode, json.loads(done.stdout), imported

    code, rows, imported = run("--runtimes", "llamacpp")
    assert code == 0 and [(r["runtime"], r["status"]) for r in rows] == [("llamacpp", "same")], rows
    assert "transformers" not in imported and "torch" in imported
    code, rows, imported = run()  # exit 1: vLLM 0.33 has no GGUF loader
    assert [(r["runtime"], r["status"]) for r in rows] == [("transformers", "same"), ("vllm", "cannot run this"),
                                                           ("sglang", "differs"), ("llamacpp", "same")], rows
    assert code == 1 and "transformers" in imported
