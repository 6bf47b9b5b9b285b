"""``posenc vision`` end to end on tiny image folders: files, resume, findings, the CLI and its errors."""

import csv

import pytest

from cli_runs import one_and_two_processes
from posenc.cli import main
from posenc.lab.vision import (
    COORDINATE_ENCODINGS,
    DEFAULT_ENCODINGS,
    VisionConfig,
    findings_for,
    read_results,
    run_vision,
    upsert_results,
)

TINY = {"train_res": 8, "patch_size": 4, "steps": 4, "batch_size": 8, "dim": 16, "n_layers": 1, "n_heads": 2}


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    """Three classes of 12x12 grey images: a bright bar at the top, middle or bottom."""
    import torch
    from PIL import Image

    root = tmp_path_factory.mktemp("bars")
    g = torch.Generator().manual_seed(0)
    for c, name in enumerate(("top", "middle", "bottom")):
        (root / name).mkdir()
        for i in range(10):
            pixels = (torch.rand(12, 12, generator=g) * 60).to(torch.uint8)
            pixels[4 * c : 4 * c + 4] += 150
            Image.fromarray(pixels.numpy(), mode="L").save(root / name / f"{i}.png")
    return root


def test_every_encoding_end_to_end(pictures, tmp_path):
    cfg = VisionConfig(data=str(pictures), **TINY)
    assert cfg.resolutions == (8, 12, 16)  # 0.75x = 6 px rounds to whole patches: 8 px, the training size
    rows = run_vision(cfg, tmp_path, progress=False)
    lines = {(e, "none") for e in DEFAULT_ENCODINGS} | {(e, "interpolate") for e in COORDINATE_ENCODINGS}
    assert {(r["encoding"], r["scaling"], r["eval_res"]) for r in rows} == {
        (e, s, n) for e, s in lines if e in DEFAULT_ENCODINGS for n in (8, 12, 16)
    }
    with open(tmp_path / "results.csv", newline="") as f:
        header = next(csv.reader(f))
    assert header[:5] == ["encoding", "scaling", "train_res", "eval_res", "accuracy"]
    for r in rows:
        assert 0.0 <= r["accuracy"] <= 1.0 and r["images"] == 6 and r["patches"] == (r["eval_res"] // 4) ** 2
    assert (tmp_path / "resolution.png").stat().st_size > 10_000
    report = (tmp_path / "report.md").read_text()
    assert "Paper check at 2x the training resolution (16 px)" in report
    assert "image folders in" in report and "| rope_mixed |" in report
    for e in DEFAULT_ENCODINGS:
        assert (tmp_path / "runs" / e / "done.json").is_file()


def test_resume_keeps_finished_work_and_checks_settings(pictures, tmp_path):
    cfg = VisionConfig(data=str(pictures), encodings=("rope_axial", "learned"), eval_res=(8, 16), **TINY)
    first = run_vision(cfg, tmp_path, progress=False)
    done = (tmp_path / "runs" / "rope_axial" / "done.json").stat().st_mtime_ns
    again = run_vision(cfg, tmp_path, resume=True, progress=False)
    assert again == first
    assert (tmp_path / "runs" / "rope_axial" / "done.json").stat().st_mtime_ns == done  # not retrained
    with pytest.raises(ValueError, match="--resume"):
        run_vision(cfg, tmp_path, progress=False)
    with pytest.raises(ValueError, match="these differ: \\['steps'\\]"):
        run_vision(VisionConfig(**{**cfg.to_dict(), "steps": 5}), tmp_path, resume=True, progress=False)


def test_same_seed_same_numbers(pictures, tmp_path):
    cfg = VisionConfig(data=str(pictures), encodings=("rope_mixed",), eval_res=(8, 12), **TINY)
    a = run_vision(cfg, tmp_path / "a", progress=False)
    b = run_vision(cfg, tmp_path / "b", progress=False)
    assert [r["accuracy"] for r in a] == [r["accuracy"] for r in b]
    assert [r["loss"] for r in a] == [r["loss"] for r in b]


def rows_at_2x(mixed, axial, ape):
    rows = []
    for e, acc in (("learned", ape), ("rope_axial", axial), ("rope_mixed", mixed)):
        rows += [
            {"encoding": e, "train_res": 16, "eval_res": 16, "accuracy": 0.8},
            {"encoding": e, "train_res": 16, "eval_res": 32, "accuracy": acc},
        ]
    return rows


def test_findings_state_the_paper_ordering():
    cfg = VisionConfig(encodings=("learned", "rope_axial", "rope_mixed"), eval_res=(16, 32))
    held = findings_for(rows_at_2x(0.75, 0.70, 0.60), cfg)
    assert "rope_mixed 75.0%, rope_axial 70.0%, learned 60.0%: the ordering HELD" in held[0]
    assert "(rope_mixed - rope_axial = +5.0 points, rope_axial - learned = +10.0 points)" in held[0]
    broken = findings_for(rows_at_2x(0.65, 0.70, 0.60), cfg)
    assert "did NOT hold" in broken[0] and "-5.0 points" in broken[0]
    assert any(line.startswith("- learned: 80.0% at 16 px (train); 60.0% at 32 px (-20.0)") for line in held)
    missing = findings_for(rows_at_2x(0.7, 0.7, 0.6)[:4], cfg)
    assert "not in this run" in missing[0]


def test_results_upsert_is_keyed(tmp_path):
    path = tmp_path / "results.csv"
    upsert_results(path, [{"encoding": "nope", "train_res": 8, "eval_res": 8, "accuracy": 0.5, "status": "ok"}])
    rows = upsert_results(path, [{"encoding": "nope", "train_res": 8, "eval_res": 8, "accuracy": 0.75}])
    assert len(rows) == 1 and rows[0]["accuracy"] == 0.75
    path.write_text("encoding,train_res\nnope,8\n")
    with pytest.raises(ValueError, match="missing"):
        read_results(path)


@pytest.mark.parametrize(
    "overrides, name",
    [
        ({"encodings": ("rope",)}, "encodings"),
        ({"encodings": ()}, "encodings"),
        ({"encodings": ("nope", "nope")}, "encodings"),
        ({"train_res": 10}, "train_res"),
        ({"eval_res": (8, 10)}, "eval_res"),
        ({"eval_res": (0,)}, "eval_res"),
        ({"dim": 12}, "dim"),
        ({"crop_scale": 0.0}, "crop_scale"),
        ({"pool": "max"}, "pool"),
        ({"steps": 0}, "steps"),
    ],
)
def test_bad_settings(overrides, name):
    with pytest.raises(ValueError, match=name):
        VisionConfig(**{**TINY, **overrides})


def test_cli_runs_and_reports_bad_data(pictures, tmp_path, capsys):
    argv = ["vision", "--data", str(pictures), "--encodings", "nope,alibi_2d", "--train-res", "8", "--patch-size", "4"]
    argv += ["--eval-res", "8,16", "--steps", "3", "--batch-size", "6", "--dim", "16", "--layers", "1", "--heads", "2"]
    assert main([*argv, "--out", str(tmp_path / "ok"), "--quiet"]) == 0
    rows = read_results(tmp_path / "ok" / "results.csv")
    assert [(r["encoding"], r["scaling"]) for r in rows] == [("nope", "none")] * 2 + [("alibi_2d", "none")] * 2 + [
        ("alibi_2d", "interpolate")
    ] * 2
    assert main(["vision", "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "x"), "--quiet"]) == 2
    assert "--data=" in capsys.readouterr().out
    assert main(["vision", "--encodings", "rope", "--out", str(tmp_path / "y"), "--quiet"]) == 2
    assert "encodings='rope' is invalid" in capsys.readouterr().out


def test_torchrun_two_processes_match_one(pictures, tmp_path):
    """``torchrun --nproc_per_node=2 -m posenc vision`` gives the numbers of one process with the same global batch."""
    args = ["vision", "--data", str(pictures), "--encodings", "rope_mixed", "--train-res", "8", "--patch-size", "4",
            "--eval-res", "8,16", "--steps", "4", "--batch-size", "8", "--dim", "16", "--layers", "1", "--heads", "2",
            "--quiet"]  # fmt: skip
    one_and_two_processes(args, tmp_path / "one", tmp_path / "two")
    a, b = (read_results(tmp_path / d / "results.csv") for d in ("one", "two"))
    assert [(r["encoding"], r["eval_res"]) for r in a] == [(r["encoding"], r["eval_res"]) for r in b]
    for x, y in zip(a, b, strict=True):
        assert abs(x["loss"] - y["loss"]) < 1e-4, (x, y)
