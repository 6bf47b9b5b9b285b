"""Atomic writes give files the mode a plain ``open()`` would: ``0o666`` less the umask, or the replaced file's mode.

(``tempfile.mkstemp`` would make checkpoints and configs private, 0600, unlike every other output.)
"""

import os
import stat

import pytest
import torch

from posenc.lab.common.checkpoint import save_checkpoint
from posenc.lab.common.files import atomic_open, create_temp, write_json_atomic, write_text_atomic


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_new_files_get_0666_less_the_umask(tmp_path, umask_027):
    write_json_atomic(tmp_path / "config.json", {"a": 1})
    write_text_atomic(tmp_path / "report.md", "text")
    with atomic_open(tmp_path / "plot.png", "wb") as f:
        f.write(b"png")
    model = torch.nn.Linear(2, 2)
    save_checkpoint(tmp_path / "checkpoint.safetensors", model=model, step=1)
    modes = {p.name: oct(_mode(p)) for p in tmp_path.iterdir()}
    assert modes == dict.fromkeys(["config.json", "report.md", "plot.png", "checkpoint.safetensors"], "0o640")


def test_a_replaced_file_keeps_its_mode(tmp_path, umask_027):
    path = tmp_path / "results.csv"
    path.write_text("old")
    os.chmod(path, 0o604)
    write_text_atomic(path, "new")
    assert (path.read_text(), _mode(path)) == ("new", 0o604)
    model = torch.nn.Linear(2, 2)
    ckpt = tmp_path / "checkpoint.safetensors"
    ckpt.write_bytes(b"")
    os.chmod(ckpt, 0o664)
    save_checkpoint(ckpt, model=model, step=1)  # safetensors recreates the file it writes
    assert _mode(ckpt) == 0o664


def test_temporary_names_never_collide(tmp_path):
    made = [create_temp(tmp_path / "x.json") for _ in range(50)]
    for fd, _ in made:
        os.close(fd)
    names = {name for _, name in made}
    assert len(names) == 50 and all(os.path.basename(n).startswith(".x.json.") for n in names)
