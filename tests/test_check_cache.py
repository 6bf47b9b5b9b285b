"""``posenc check``'s kept rows (``posenc._check_cache``): the same check of the same files with the same code prints
the rows of the first without reading the model (and, in a fresh process, without importing torch or transformers);
any change to what a row is computed from -- the model's files, the arguments, the code installed -- reads again.

The session runs with the cache off (``tests/conftest.py``); each test here turns it on in its own folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import posenc
from hf.tiny import tiny_model
from posenc import _check_cache
from posenc._check_rows import Row
from posenc.cli import main
from posenc.runtimes import RUNTIMES

SRC = Path(posenc.__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny Llama extended by linear x2 and saved with its posenc record (every runtime runs it as measured)."""
    import posenc.hf as H

    model = tiny_model("llama")
    H.extend_context(model, "linear", 2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return H.save_pretrained(model, None, tmp_path_factory.mktemp("llama") / "out", check=False)


@pytest.fixture
def folder(saved, tmp_path):
    """A copy of ``saved`` this test may edit."""
    out = tmp_path / "model"
    out.mkdir()
    for file in Path(saved).iterdir():
        (out / file.name).write_bytes(file.read_bytes())
    return out


@pytest.fixture
def cache(tmp_path, monkeypatch):
    where = tmp_path / "cache"
    monkeypatch.setenv("POSENC_CHECK_CACHE", str(where))
    return where


@pytest.fixture
def readings(monkeypatch):
    """How many times the model is read (``posenc.runtimes.check.check`` called by the command)."""
    import posenc.runtimes.check as C

    calls = []
    real = C.check

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(C, "check", counting)
    return calls


def _run(capsys, *args):
    code = main(["check", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_rows_read_back_equal_the_rows_computed(folder):
    from posenc.runtimes.check import check

    rows = check(folder)
    assert len(rows) == len(RUNTIMES)
    back = [Row.from_dict(json.loads(json.dumps(row.to_dict()))) for row in rows]
    assert back == rows  # every field, floats included (JSON keeps a float's repr)


def test_a_row_with_a_missing_or_unknown_field_is_refused():
    row = Row("vllm", "same", "same", 2, 0.0, 0.0, 0.0, "8 half", 64, "ref", "code", ("a note",), "vLLM 0.33.0")
    data = row.to_dict()
    assert Row.from_dict(data) == row
    with pytest.raises(TypeError, match="fields"):
        Row.from_dict({k: v for k, v in data.items() if k != "verdict"})
    with pytest.raises(TypeError, match="fields"):
        Row.from_dict({**data, "extra": 1})
    with pytest.raises(ValueError, match="text"):
        Row.from_dict({**data, "status": 3})


def test_the_same_check_again_prints_the_same_rows_without_reading(folder, cache, readings, capsys):
    first = _run(capsys, folder)
    assert first[0] == 0 and first[2] == "" and len(readings) == 1
    assert len(list(cache.glob("*.json"))) == 1
    second = _run(capsys, folder)
    assert second[:2] == first[:2] and len(readings) == 1  # same exit status, same table, no reading
    assert second[2].startswith("posenc check: rows computed ") and str(cache) in second[2]
    code, out, _ = _run(capsys, folder, "--json")  # printed otherwise, the same rows
    assert code == first[0] and len(readings) == 1
    assert [r["status"] for r in json.loads(out)] == ["same"] * len(RUNTIMES)


def test_no_cache_reads_again_and_an_empty_variable_keeps_nothing(folder, cache, readings, capsys, monkeypatch):
    _run(capsys, folder)
    _run(capsys, folder, "--no-cache")
    assert len(readings) == 2
    assert len(list(cache.glob("*.json"))) == 1
    monkeypatch.setenv("POSENC_CHECK_CACHE", "")
    assert _check_cache.folder() is None
    _run(capsys, folder)
    _run(capsys, folder)
    assert len(readings) == 4


def test_an_edited_config_is_read_again_and_its_new_verdict_printed(folder, cache, readings, capsys):
    code, out, _ = _run(capsys, folder, "--runtimes", "transformers", "--json")
    assert code == 0 and json.loads(out)[0]["status"] == "same"
    config = json.loads((folder / "config.json").read_text())
    for key in ("rope_parameters", "rope_scaling"):  # no longer what posenc's record says it measured
        if key in config:
            config[key]["factor"] = 3.0
    (folder / "config.json").write_text(json.dumps(config))
    code, out, err = _run(capsys, folder, "--runtimes", "transformers", "--json")
    assert len(readings) == 2 and err == ""
    assert code == 1 and json.loads(out)[0]["status"] == "differs"


def test_the_key_changes_with_everything_a_row_is_computed_from(folder, tmp_path, monkeypatch):
    base = _check_cache.key(folder, RUNTIMES, None)
    assert base is not None and base == _check_cache.key(folder, list(RUNTIMES), None)
    assert _check_cache.key(folder, RUNTIMES[:2], None) != base
    assert _check_cache.key(folder, RUNTIMES, 64) != base
    os.utime(folder / "config.json", ns=(1, 1))  # the same content: the same key
    assert _check_cache.key(folder, RUNTIMES, None) == base
    (folder / "tokenizer_config.json").write_text('{"model_max_length": 32}')  # vLLM's context reads it
    with_tokenizer = _check_cache.key(folder, RUNTIMES, None)
    assert with_tokenizer != base
    (folder / "tokenizer_config.json").write_text('{"model_max_length": 33}')  # same size, other content
    assert _check_cache.key(folder, RUNTIMES, None) not in (base, with_tokenizer)
    (folder / "tokenizer_config.json").unlink()
    assert _check_cache.key(folder, RUNTIMES, None) == base
    (folder / "config.json").rename(tmp_path / "config.json")  # the same file elsewhere: another path, another key
    assert _check_cache.key(tmp_path / "config.json", RUNTIMES, None) not in (None, base)
    (tmp_path / "config.json").rename(folder / "config.json")
    real = _check_cache._distributions
    monkeypatch.setattr(_check_cache, "_distributions", lambda: [*real(), ["vllm", "0.34.0"]])
    assert _check_cache.key(folder, RUNTIMES, None) != base
    monkeypatch.setattr(_check_cache, "_distributions", real)
    real_files = _check_cache._package_files
    for edited in ("posenc", "transformers"):
        monkeypatch.setattr(_check_cache, "_package_files",
                            lambda name, e=edited: [*real_files(name), "edited"] if name == e else real_files(name))
        assert _check_cache.key(folder, RUNTIMES, None) != base


def test_a_posenc_or_transformers_file_edited_in_place_changes_the_key(tmp_path, monkeypatch):
    package = tmp_path / "site" / "fakepkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("X = 1\n")
    (package / "sub").mkdir()
    (package / "sub" / "rope.py").write_text("Y = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    first = _check_cache._package_files("fakepkg")
    assert [f[0] for f in first[2]] == ["__init__.py", os.path.join("sub", "rope.py")]
    st = (package / "sub" / "rope.py").stat()
    (package / "sub" / "rope.py").write_text("Y = 3\n")  # the same size
    os.utime(package / "sub" / "rope.py", ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert _check_cache._package_files("fakepkg") != first
    assert _check_cache._package_files("no_such_package_here") == ["no_such_package_here", None]


def test_a_gguf_key_reads_its_head_its_stat_and_a_config_beside_it(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(1000))
    base = _check_cache.key(gguf, RUNTIMES, None)
    assert base is not None
    st = gguf.stat()
    with gguf.open("r+b") as f:  # the header edited in place, size and modification time kept
        f.seek(10)
        f.write(b"\x01")
    os.utime(gguf, ns=(st.st_atime_ns, st.st_mtime_ns))
    edited = _check_cache.key(gguf, RUNTIMES, None)
    assert edited != base
    (tmp_path / "config.json").write_text("{}")  # SGLang reads a config.json beside a GGUF instead of its header
    assert _check_cache.key(gguf, RUNTIMES, None) not in (base, edited)


def test_names_missing_paths_and_other_files_are_not_kept(tmp_path):
    assert _check_cache.key("smollm2", RUNTIMES, None) is None or Path("smollm2").exists()
    assert _check_cache.key(tmp_path / "nothing", RUNTIMES, None) is None
    (tmp_path / "weights.bin").write_bytes(b"x")
    assert _check_cache.key(tmp_path / "weights.bin", RUNTIMES, None) is None
    assert _check_cache.load(None) is None
    _check_cache.store(None, [])  # nothing to keep


def test_an_entry_that_cannot_be_read_back_is_read_again_and_replaced(folder, cache, readings, capsys):
    first = _run(capsys, folder)
    (entry,) = cache.glob("*.json")
    for broken in ("{not json", json.dumps({"schema": _check_cache.SCHEMA, "key": "another", "rows": []}),
                   json.dumps({"schema": -1}), json.dumps({"schema": _check_cache.SCHEMA})):
        entry.write_text(broken)
        assert _run(capsys, folder)[:2] == first[:2]
        assert json.loads(entry.read_text())["schema"] == _check_cache.SCHEMA  # replaced by the new reading
    assert len(readings) == 5


def test_a_cache_that_cannot_be_written_costs_only_the_time(folder, tmp_path, monkeypatch, readings, capsys):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv("POSENC_CHECK_CACHE", str(blocker / "check"))  # a folder under a file: cannot be created
    first = _run(capsys, folder)
    assert first[0] == 0 and first[2] == "" and _run(capsys, folder)[:2] == first[:2] and len(readings) == 2


def test_old_entries_are_removed_past_keep(cache, monkeypatch):
    monkeypatch.setattr(_check_cache, "KEEP", 4)
    row = Row("vllm", "same", "same", 2, 0.0, 0.0, 0.0, "8 half", 64, "ref", "code", (), "vLLM 0.33.0")
    for i in range(9):
        _check_cache.store(f"{i:064x}", [row])
        os.utime(cache / f"{i:064x}.json", ns=(i + 1, i + 1))  # in the order written
    left = sorted(p.stem for p in cache.glob("*.json"))
    assert 1 <= len(left) <= 4 and f"{8:064x}" in left  # the newest stays
    assert _check_cache.load(f"{8:064x}") is not None


def test_an_export_keeps_its_check_for_posenc_check(folder, cache, readings, capsys):
    from posenc.deploy import verify

    rows = verify.check_written(folder)  # what export runs on what it wrote
    code, out, err = _run(capsys, folder, "--json")
    assert len(readings) == 1 and code == 0  # only export's own reading (not through the command)
    assert [Row.from_dict(r) for r in json.loads(out)] == list(rows) and err.startswith("posenc check: rows computed")


def test_a_kept_check_in_a_fresh_process_imports_neither_torch_nor_transformers(folder, cache):
    env = {**os.environ, "POSENC_CHECK_CACHE": str(cache),
           "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}

    def run():
        done = subprocess.run([sys.executable, "-X", "importtime", "-m", "posenc", "check", str(folder), "--json"],
                              cwd=folder, env=env, capture_output=True, text=True, timeout=300)
        modules = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
        return done.returncode, done.stdout, modules

    code, out, modules = run()
    assert code == 0 and {"torch", "transformers"} <= modules
    again, out_again, modules_again = run()
    assert (again, out_again) == (code, out)
    assert not {m for m in modules_again if m.split(".")[0] in ("torch", "transformers", "numpy")}
