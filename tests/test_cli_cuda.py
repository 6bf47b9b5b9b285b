"""``posenc lab|vision|extend --device cuda`` end to end on a GPU: each trains or patches, evaluates, writes its
folder with finite numbers and records the CUDA device. Tiny settings (seconds); marked ``gpu``, skipped in CI."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from posenc.cli import main
from test_cli import TINY_LAB, TINY_VISION, corpus, pictures  # noqa: F401 (fixtures)

pytestmark = pytest.mark.gpu


def _run(capsys, *argv) -> str:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def _numbers(path: Path, column: str) -> list[float]:
    with path.open() as f:
        return [float(row[column]) for row in csv.DictReader(f) if row.get(column) not in (None, "")]


def _device_recorded(folder: Path) -> None:
    text = "".join(p.read_text() for p in folder.glob("*.json")) + (folder / "report.md").read_text()
    assert "cuda" in text.lower(), f"no CUDA device recorded in {folder}"


def test_lab_on_cuda_trains_every_kind_of_encoding(corpus, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "lab"
    args = [a for a in TINY_LAB]
    args[args.index("nope")] = "rope,alibi,t5,sinusoidal"
    _run(capsys, *args, "--eval-lens", "16,32", "--corpus", corpus, "--device", "cuda", "--out", out, "--quiet")
    values = _numbers(out / "results.csv", "ppl")
    assert values and all(math.isfinite(v) and v > 1 for v in values)
    _device_recorded(out)
    extended = tmp_path / "extend"
    run = next(p for p in (out / "runs").iterdir() if "rope" in p.name)
    _run(capsys, "extend", run, "--methods", "linear,yarn,dynamic", "--factors", "2", "--lengths", "16,32",
         "--trials", "1", "--depths", "0.5", "--device", "cuda", "--out", extended, "--quiet")
    assert (extended / "results.csv").exists()
    _device_recorded(extended)


def test_vision_on_cuda(pictures, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "vision"
    _run(capsys, *TINY_VISION, "--data", pictures, "--device", "cuda", "--out", out, "--quiet")
    assert (out / "results.csv").exists()
    _device_recorded(out)


def test_extend_new_passkey_model_on_cuda(tmp_path, capsys):
    out = tmp_path / "new"
    _run(capsys, "extend", "new", "--task", "passkey", "--train-len", "128", "--train-steps", "2",
         "--lengths", "128,256", "--trials", "1", "--depths", "0.5", "--device", "cuda", "--out", out,
         "--quiet")
    assert json.loads(next(out.glob("*.json")).read_text())
    _device_recorded(out)
