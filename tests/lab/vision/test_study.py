"""``posenc vision`` end to end on tiny image folders: files, resume, findings, the CLI and its errors."""

import csv

import pytest

from cli_runs import one_and_two_processes
from posenc.cli import main
from posenc.lab.vision.config import DEFAULT_ENCODINGS, VisionConfig
from posenc.lab.vision.report import findings_for
from posenc.lab.vision.study import COORDINATE_ENCODINGS, read_results, run_vision, upsert_results

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


def rows_at_2x(mixed, axial, ape, images=None):
    rows = []
    for e, acc in (("learned", ape), ("rope_axial", axial), ("rope_mixed", mixed)):
        rows += [
            {"encoding": e, "train_res": 16, "eval_res": 16, "accuracy": 0.8, "images": images},
            {"encoding": e, "train_res": 16, "eval_res": 32, "accuracy": acc, "images": images},
        ]
    return rows


def test_a_small_gap_on_few_images_is_within_noise():
    """360 test images (scikit-learn's digits): a 2.8-point gap is inside the 95% intervals, not a broken ordering."""
    cfg = VisionConfig(encodings=("learned", "rope_axial", "rope_mixed"), eval_res=(16, 32))
    [check, blank, *rest] = findings_for(rows_at_2x(0.500, 0.528, 0.400, images=360), cfg)
    assert check == (
        "Paper check at 2x the training resolution (32 px): RoPE-ViT reports RoPE-Mixed >= RoPE-Axial > learned APE. "
        "Here rope_mixed 50.0% [44.9, 55.1], rope_axial 52.8% [47.6, 57.9], learned 40.0% [35.1, 45.1] (95% Wilson "
        "intervals over 360 test images): the ordering could not be told apart from noise (rope_mixed - rope_axial = "
        "-2.8 points, within noise (the 95% intervals overlap); rope_axial - learned = +12.8 points, outside the noise "
        "(the 95% intervals do not overlap))."
    )
    assert blank == "" and "did NOT hold" not in check
    # Outside the noise, a reversed gap breaks the ordering; a small gap alongside it is still called noise.
    [broken, *_] = findings_for(rows_at_2x(0.500, 0.528, 0.700, images=360), cfg)
    assert "the ordering did NOT hold (rope_mixed - rope_axial = -2.8 points, within noise" in broken
    assert "rope_axial - learned = -17.2 points, outside the noise" in broken
    [clear, *_] = findings_for(rows_at_2x(0.75, 0.60, 0.40, images=10_000), cfg)
    assert "the ordering HELD" in clear
    assert "Each accuracy below with its 95% Wilson interval over 360 test images:" in rest
    assert (
        "- learned: 80.0% [75.6, 83.8] at 16 px (train); 40.0% [35.1, 45.1] at 32 px (-40.0). Paper (ViT-S, ImageNet, "
        "224 -> 384 px): 80.4 -> 79.4." in rest
    )


def test_interval_and_compare():
    from posenc.lab.common.report import wilson_interval
    from posenc.lab.vision.report import compare, interval

    assert interval({"accuracy": 0.5, "images": 360}) == wilson_interval(0.5, 360)
    assert interval({"accuracy": 0.5, "images": None}) is None and interval({"accuracy": None, "images": 9}) is None
    a, b = {"accuracy": 0.52, "images": 360}, {"accuracy": 0.50, "images": 360}
    assert compare(a, b, strict=True) == "noise" and compare(b, a, strict=True) == "noise"
    a["images"] = b["images"] = 1_000_000
    assert compare(a, b, strict=True) == "held" and compare(b, a, strict=True) == "broken"
    assert compare({"accuracy": 0.5}, {"accuracy": 0.5}, strict=False) == "held"  # no counts: the raw numbers
    assert compare({"accuracy": 0.5}, {"accuracy": 0.5}, strict=True) == "broken"


def test_findings_state_the_paper_ordering():
    cfg = VisionConfig(encodings=("learned", "rope_axial", "rope_mixed"), eval_res=(16, 32))
    held = findings_for(rows_at_2x(0.75, 0.70, 0.60), cfg)
    assert (
        "rope_mixed 75.0%, rope_axial 70.0%, learned 60.0% (no image counts in the results: no noise estimate): "
        "the ordering HELD" in held[0]
    )
    assert "(rope_mixed - rope_axial = +5.0 points; rope_axial - learned = +10.0 points)" in held[0]
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
    assert "--data=" in capsys.readouterr().err
    assert main(["vision", "--encodings", "rope", "--out", str(tmp_path / "y"), "--quiet"]) == 2
    assert "encodings='rope' is invalid" in capsys.readouterr().err


def test_torchrun_two_processes_match_one(pictures, tmp_path):
    """``torchrun --nproc_per_node=2 -m posenc vision`` gives the numbers of one process with the same global batch."""
    args = ["vision", "--data", str(pictures), "--encodings", "rope_mixed", "--train-res", "8", "--patch-size", "4",
            "--eval-res", "8,16", "--steps", "4", "--batch-size", "8", "--dim", "16", "--layers", "1", "--heads", "2",
            "--quiet"]
    one_and_two_processes(args, tmp_path / "one", tmp_path / "two")
    a, b = (read_results(tmp_path / d / "results.csv") for d in ("one", "two"))
    assert [(r["encoding"], r["eval_res"]) for r in a] == [(r["encoding"], r["eval_res"]) for r in b]
    for x, y in zip(a, b, strict=True):
        assert abs(x["loss"] - y["loss"]) < 1e-4, (x, y)


def test_an_interrupted_evaluation_keeps_each_finished_row(pictures, tmp_path, monkeypatch, capsys):
    from posenc.lab.vision import study as vision

    cfg = VisionConfig(data=str(pictures), encodings=("rope_axial",), eval_res=(8, 12, 16), **TINY)
    real, calls = vision.accuracy, []

    def accuracy(model, images, labels, **kw):
        calls.append((images.shape[-1], kw["coordinate_scale"]))
        if len(calls) == 2:  # Ctrl-C while the second resolution is measured
            raise KeyboardInterrupt
        return real(model, images, labels, **kw)

    monkeypatch.setattr(vision, "accuracy", accuracy)
    with pytest.raises(KeyboardInterrupt):
        run_vision(cfg, tmp_path, progress=False)
    kept = read_results(tmp_path / "results.csv")
    assert [(r["scaling"], r["eval_res"]) for r in kept] == [("none", 8)]

    calls.clear()
    monkeypatch.setattr(vision, "accuracy", lambda *a, **kw: calls.append((a[1].shape[-1], kw["coordinate_scale"]))
                        or real(*a, **kw))
    rows = run_vision(cfg, tmp_path, resume=True, progress=True)
    assert calls == [(12, 1.0), (16, 1.0), (8, 1.0), (12, 8 / 12), (16, 0.5)]  # all but the kept row
    assert rows[0] == kept[0] and len(rows) == 6
    said = capsys.readouterr().out
    assert "rope_axial: already trained (4 steps), skipped" in said
    assert "rope_axial: 1 of 6 evaluations done, skipped; measuring the other 5" in said
