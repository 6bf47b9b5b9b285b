"""posenc.lab.length.report and .plot: the results CSV, the tables, the report and the extrapolation plot; the
shared pieces they use (posenc.lab.common.report, posenc.lab.common.plots)."""

import io
import math
import os

import pytest

from posenc.lab.common import report
from posenc.lab.common.files import atomic_open
from posenc.lab.length.plot import MAX_LINES, plot_extrapolation
from posenc.lab.length.report import (
    RESULT_COLUMNS,
    format_table,
    print_table,
    read_results,
    upsert_results,
    write_csv_atomic,
    write_report,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def row(encoding, scaling, eval_len, ppl, *, finetune_steps=0, train_len=64, stride=0, status="ok", accuracy=None):
    """A result row as ``posenc lab`` writes it; ``ppl=None`` with ``status="n/a"`` for lengths it cannot run."""
    return {
        "encoding": encoding,
        "scaling": scaling,
        "finetune_steps": finetune_steps,
        "train_len": train_len,
        "eval_len": eval_len,
        "stride": stride,
        "loss": None if ppl is None else math.log(ppl),
        "ppl": ppl,
        "accuracy": accuracy,
        "tokens": 0 if status == "n/a" else 4096,
        "status": status,
    }


@pytest.fixture
def rows():
    return [
        row("rope", "none", 64, 3.0),
        row("rope", "none", 128, 9.5),
        row("rope", "yarn", 64, 3.0),
        row("rope", "yarn", 128, 3.4),
        row("learned", "none", 64, 2.9),
        row("learned", "none", 128, None, status="n/a"),
        row("alibi", "none", 64, 3.1),
        row("alibi", "none", 128, 3.2),
    ]


# --- CSV ----------------------------------------------------------------------------------------------------------


def test_csv_round_trip_keeps_values_and_types(tmp_path, rows):
    rows[0]["ppl"] = 1 / 3  # not a short decimal: must come back bit for bit
    path = write_csv_atomic(rows, tmp_path / "results.csv")
    back = read_results(path)
    assert back == rows
    first = back[0]
    types = [str, str, int, int, int, int, float, float, type(None), int, str]
    assert [type(first[c]) for c in RESULT_COLUMNS] == types
    assert first["ppl"] == 1 / 3
    assert path.read_text().splitlines()[0] == ",".join(RESULT_COLUMNS)


def test_na_rows_are_written_empty_and_read_as_none(tmp_path, rows):
    path = write_csv_atomic(rows, tmp_path / "results.csv")
    line = path.read_text().splitlines()[6]
    assert line == "learned,none,0,64,128,0,,,,0,n/a"
    na = read_results(path)[5]
    assert na["status"] == "n/a" and na["loss"] is None and na["ppl"] is None and na["accuracy"] is None


def test_extra_columns_kept_after_the_standard_ones(tmp_path, rows):
    rows[0]["seed"] = 3
    rows[1]["corpus"] = "stdlib"
    path = write_csv_atomic(rows, tmp_path / "results.csv")
    assert path.read_text().splitlines()[0] == ",".join([*RESULT_COLUMNS, "seed", "corpus"])
    back = read_results(path)
    assert back[0]["seed"] == 3 and back[0]["corpus"] is None and back[1]["corpus"] == "stdlib"


def test_nan_and_tensor_values(tmp_path):
    torch = pytest.importorskip("torch")
    rows = [row("rope", "none", 64, 3.0, accuracy=float("nan"))]
    rows[0]["eval_len"] = torch.tensor(64)
    rows[0]["loss"] = torch.tensor(0.5, dtype=torch.float64)
    back = read_results(write_csv_atomic(rows, tmp_path / "r.csv"))[0]
    assert back["accuracy"] is None and back["eval_len"] == 64 and back["loss"] == 0.5


def test_hand_made_csv_with_the_minimal_columns(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text("encoding,scaling,train_len,eval_len,loss,ppl\nrope,none,64,64,1.0,2.7\nlearned,none,64,128,,\n")
    back = read_results(path)
    assert [r["status"] for r in back] == ["ok", "n/a"]
    assert back[0]["stride"] is None and back[0]["ppl"] == 2.7 and set(RESULT_COLUMNS) <= set(back[0])


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("encoding,scaling,train_len\nrope,none,64\n", "missing \\['eval_len'\\]"),
        ("encoding,scaling,train_len,eval_len\nrope,none,64,long\n", "results.csv line 2 eval_len='long'"),
        ("encoding,scaling,train_len,eval_len,status\nrope,none,64,64,broken\n", "status='broken'"),
        ("encoding,scaling,train_len,eval_len\nrope,none,64,64,extra\n", "line 2"),
    ],
)
def test_damaged_csv_errors_say_where(tmp_path, text, match):
    path = tmp_path / "results.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        read_results(path)


def test_read_missing_file_says_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="run `posenc lab` first"):
        read_results(tmp_path / "nothing.csv")


@pytest.mark.parametrize(
    ("column", "value", "match"),
    [("eval_len", 64.0, "eval_len=64.0 is invalid: expected an integer"), ("ppl", "3.0", "expected a number"),
     ("status", "failed", "status='failed'"), ("train_len", True, "not a bool")],
)
def test_write_rejects_bad_values(tmp_path, column, value, match):
    bad = row("rope", "none", 64, 3.0)
    bad[column] = value
    with pytest.raises(ValueError, match=match):
        write_csv_atomic([bad], tmp_path / "r.csv")
    assert not list(tmp_path.iterdir())  # nothing written, no temp file left


def test_upsert_replaces_same_key_in_place_and_appends_new(tmp_path, rows):
    path = tmp_path / "results.csv"
    upsert_results(path, rows[:4])  # creates the file
    got = upsert_results(path, [row("rope", "none", 128, 7.0), row("alibi", "none", 64, 3.1)])
    assert len(got) == 5
    assert got[1]["ppl"] == 7.0 and got[1]["eval_len"] == 128  # replaced where it was
    assert got[4]["encoding"] == "alibi"
    assert read_results(path) == got
    # Same key except the stride, the fine-tuning or the length: a different measurement.
    others = [row("rope", "none", 128, 5.0, stride=32), row("rope", "none", 128, 4.0, finetune_steps=50)]
    got = upsert_results(path, others)
    assert len(got) == 7 and got[1]["ppl"] == 7.0


def test_upsert_treats_empty_and_zero_stride_and_finetune_as_one_key(tmp_path):
    path = tmp_path / "results.csv"
    upsert_results(path, [row("rope", "none", 64, 3.0)])
    again = row("rope", "none", 64, 2.5)
    again["stride"] = None
    again["finetune_steps"] = None
    got = upsert_results(path, [again])
    assert len(got) == 1 and got[0]["ppl"] == 2.5


def test_upsert_last_duplicate_wins(tmp_path):
    got = upsert_results(tmp_path / "r.csv", [row("rope", "none", 64, 3.0), row("rope", "none", 64, 4.0)])
    assert [r["ppl"] for r in got] == [4.0]


def test_atomic_write_leaves_the_old_file_on_failure(tmp_path, rows):
    path = write_csv_atomic(rows, tmp_path / "results.csv")
    before = path.read_bytes()
    with pytest.raises(RuntimeError), atomic_open(path) as f:
        f.write("half a file")
        raise RuntimeError("interrupted")
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv"]  # the temp file is gone
    assert os.stat(path).st_mode & 0o777 == 0o644


# --- tables -------------------------------------------------------------------------------------------------------


def test_format_table_exact(rows):
    assert format_table(rows, "ppl") == (
        "| encoding | scaling | 64 (train) | 128 (2x) |\n"
        "|:---------|:--------|-----------:|---------:|\n"
        "| rope     | none    |       3.00 |     9.50 |\n"
        "| rope     | yarn    |       3.00 |     3.40 |\n"
        "| learned  | none    |   **2.90** |      n/a |\n"
        "| alibi    | none    |       3.10 | **3.20** |\n"
    )


def test_format_table_orders_as_trained_first_and_shows_varying_columns(rows):
    rows = [
        row("rope", "yarn", 64, 3.0, finetune_steps=20),
        row("rope", "none", 64, 3.0),
        row("rope", "none", 256, 9.0),  # 128 not measured
        row("rope", "none", 64, 3.0, train_len=32),
    ]
    lines = format_table(rows, "ppl").splitlines()
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in lines]
    assert cells[0] == ["encoding", "scaling", "finetune steps", "train len", "64", "256"]  # two train lengths
    assert cells[2:] == [
        ["rope", "none", "0", "32", "**3.00**", "-"],  # train lengths ascending
        ["rope", "none", "0", "64", "**3.00**", "9.00"],
        ["rope", "yarn", "20", "64", "**3.00**", "-"],
    ]


def test_format_table_accuracy_best_is_highest():
    rows = [row("rope", "none", 32, None, accuracy=1.0, train_len=32), row("rope", "none", 64, None, accuracy=0.25,
            train_len=32), row("alibi", "none", 32, None, accuracy=0.5, train_len=32)]
    table = format_table(rows, "accuracy")
    assert "| rope     | none    | **100.0%** |   25.0% |" in table
    assert "| alibi    | none    |      50.0% |       - |" in table


def test_format_table_rejects_unknown_metric(rows):
    with pytest.raises(ValueError, match="metric='bpb' is invalid"):
        format_table(rows, "bpb")


def test_print_table_prints_every_cell(rows):
    from rich.console import Console

    console = Console(file=io.StringIO(), width=120, color_system=None)
    print_table(rows, "ppl", console=console)
    text = console.file.getvalue()
    for cell in ("encoding", "128 (2x)", "learned", "yarn", "n/a", "9.50", "3.40", "lower is better"):
        assert cell in text


# --- report and plot ------------------------------------------------------------------------------------------------


def test_environment_is_json_able():
    import json

    env = report.environment()
    assert json.loads(json.dumps(env)) == env
    for key in ("python", "torch", "posenc", "git_sha", "device", "threads"):
        assert key in env
    assert env["threads"] >= 1 and env["device"].startswith(("cpu", "cuda"))


def test_write_report_has_table_figure_config_environment_findings(tmp_path, rows):
    csv_path = write_csv_atomic(rows, tmp_path / "results.csv")
    plot_extrapolation(csv_path, tmp_path / "extrapolation.png")
    env = {"python": "3.x", "torch": "2.x", "git_sha": None}
    path = write_report(tmp_path, results_csv=csv_path, config={"train_len": 64, "encodings": ["rope"]},
                        environment=env, seconds=125.0, findings=["- rope: 3.00 -> 9.50", "alibi: flat"])
    assert path == tmp_path / "report.md"
    text = path.read_text()
    assert format_table(rows, "ppl") in text
    assert "![validation perplexity per byte by evaluation length](extrapolation.png)" in text
    assert "[results.csv](results.csv)" in text
    assert "- rope: 3.00 -> 9.50\n- alibi: flat\n" in text
    assert '"train_len": 64' in text and "| torch | 2.x |" in text and "| git_sha |  |" in text
    assert "2 min 5 s" in text
    assert "trained at 64 tokens and evaluated at 64, 128 tokens" in text


def test_write_report_without_figure_says_so_and_infers_accuracy(tmp_path):
    rows = [row("rope", "none", 32, None, accuracy=0.5, train_len=32)]
    csv_path = write_csv_atomic(rows, tmp_path / "results.csv")
    text = write_report(tmp_path, results_csv=csv_path, config={"task": "copy"}, environment={}, seconds=1.0,
                        findings=[]).read_text()
    assert "Exact-match accuracy (higher is better)" in text and "50.0%" in text
    assert "No figure at `extrapolation.png`" in text and "No findings" in text


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@pytest.mark.parametrize("metric", ["ppl", "loss"])
def test_plot_extrapolation_writes_a_png(tmp_path, rows, metric):
    csv_path = write_csv_atomic(rows, tmp_path / "results.csv")
    out = plot_extrapolation(csv_path, tmp_path / "plots" / "extrapolation.png", metric=metric, corpus="stdlib")
    width, height = _png_size(out)
    assert width > 800 and height > 400
    assert sorted(p.name for p in out.parent.iterdir()) == ["extrapolation.png"]


def test_plot_reads_only_the_csv_and_draws_lines_and_labels(tmp_path, rows, monkeypatch):
    """The drawn figure: one line per (encoding, scaling) with n/a points left out, the training length marked."""
    from posenc.lab.common import plots

    rows.append(row("rope", "yarn", 128, 3.0, finetune_steps=10))
    rows.append(row("nope", "none", 64, 3.3))
    rows.append(row("nope", "none", 128, 5000.0))  # far above 100x the best: off the top
    csv_path = write_csv_atomic(rows, tmp_path / "results.csv")
    saved = {}
    monkeypatch.setattr(plots, "save_png", lambda fig, path, dpi: saved.setdefault("fig", fig) and path)
    plot_extrapolation(csv_path, tmp_path / "x.png", corpus="stdlib")
    ax = saved["fig"].axes[0]
    lines = {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}
    assert list(lines) == [
        "rope", "rope + yarn", "rope + yarn, fine-tuned 10 steps", "learned (n/a from 128)", "alibi",
        "nope (off the top from 128)",
    ]
    assert list(lines["learned (n/a from 128)"].get_xdata()) == [64]
    assert lines["rope"].get_linestyle() == "-" and lines["rope + yarn"].get_linestyle() == "--"
    assert lines["rope + yarn, fine-tuned 10 steps"].get_linestyle() == "-."
    assert ax.get_yscale() == "log" and ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["64", "128"]
    assert ax.get_ylim()[1] < 5000.0
    vertical = [line for line in ax.get_lines() if list(line.get_xdata()) == [64, 64]]
    assert vertical and vertical[0].get_linestyle() == ":"
    assert "train length" in [t.get_text() for t in ax.texts]
    assert "stdlib" in ax.get_title()
    assert [text.get_text() for text in ax.get_legend().get_texts()] == list(lines)


def test_plot_accuracy_is_linear_and_all_na_still_draws(tmp_path):
    rows = [row("rope", "none", 32, None, accuracy=0.9, train_len=32), row("rope", "none", 64, None, accuracy=0.1,
            train_len=32)]
    out = plot_extrapolation(write_csv_atomic(rows, tmp_path / "a.csv"), tmp_path / "a.png", metric="accuracy")
    assert _png_size(out)[0] > 0
    na = [row("learned", "none", 128, None, status="n/a")]
    out = plot_extrapolation(write_csv_atomic(na, tmp_path / "b.csv"), tmp_path / "b.png")
    assert _png_size(out)[0] > 0


def test_plot_rejects_unknown_metric(tmp_path, rows):
    with pytest.raises(ValueError, match="metric='bleu' is invalid"):
        plot_extrapolation(write_csv_atomic(rows, tmp_path / "r.csv"), tmp_path / "p.png", metric="bleu")


# --- figures people can read values off, findings markdown, noise -------------------------------------------------


def _figure_of(monkeypatch, csv_path, **kwargs):
    from posenc.lab.common import plots

    saved = {}
    monkeypatch.setattr(plots, "save_png", lambda fig, path, dpi: saved.setdefault("fig", fig) and path)
    plot_extrapolation(csv_path, "unused.png", **kwargs)
    saved["fig"].canvas.draw()
    return saved["fig"].axes[0]


def test_every_line_has_its_own_colour_marker_and_style_and_twins_stay_visible(tmp_path, monkeypatch):
    """The lab's 13-line figure: no two lines look alike; NTK and dynamic NTK (equal by construction) both show."""
    from posenc.lab.common.plots import PALETTE

    lines = [("nope", "none"), ("sinusoidal", "none"), ("learned", "none"), ("learned", "interpolate"),
             ("rope", "none"), ("rope", "linear"), ("rope", "ntk"), ("rope", "dynamic"), ("rope", "yarn"),
             ("xpos", "none"), ("alibi", "none"), ("alibi", "interpolate"), ("t5", "none")]
    rows = []
    for i, (encoding, scaling) in enumerate(lines):
        twin = 6 if scaling == "dynamic" else i  # dynamic: exactly NTK's numbers
        rows += [row(encoding, scaling, n, 5.0 + twin + n / 64) for n in (64, 128, 256)]
    ax = _figure_of(monkeypatch, write_csv_atomic(rows, tmp_path / "r.csv"))
    drawn = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
    assert len(drawn) == 13
    looks = [(line.get_color(), line.get_marker(), str(line.get_linestyle())) for line in drawn]
    assert len(set(looks)) == 13  # no two share (colour, marker, line style)
    assert len({c for c, _, _ in looks}) == 13 and len({m for _, m, _ in looks}) == 13  # not even colour or marker
    assert [c for c, _, _ in looks] == list(PALETTE[:13])
    dynamic = drawn[7]
    assert dynamic.get_label() == "rope + dynamic (= rope + ntk)" and list(dynamic.get_ydata()) == list(
        drawn[6].get_ydata()
    )
    assert dynamic.get_linestyle() == ":" and dynamic.get_markerfacecolor() == "none"
    assert dynamic.get_markersize() > drawn[6].get_markersize()  # a ring around ntk's filled marker


def test_palette_is_colour_blind_aware():
    """No red-green pair among the first colours: Okabe-Ito's, then distinct others; none repeated."""
    from posenc.lab.common.plots import MARKERS, PALETTE

    assert PALETTE[:6] == ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00")
    assert len(set(PALETTE)) == len(PALETTE) and len(set(MARKERS)) == len(MARKERS)


@pytest.mark.parametrize(
    ("low", "high", "ticks"),
    [
        (11.5, 15.0, [12.0, 13.0, 14.0, 15.0]),  # the 1-2-5 sets hold only 15 here
        (6.2, 40.0, [7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0]),
        (6.9, 1000.0, [10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0]),
        (3.05, 3.2, [3.05, 3.1, 3.15, 3.2]),
        (0.5, 0.9, [0.5, 0.6, 0.7, 0.8, 0.9]),
    ],
)
def test_log_ticks_label_several_round_values(low, high, ticks):
    from posenc.lab.common.plots import log_ticks

    assert log_ticks(low, high) == ticks


def test_a_narrow_log_axis_still_has_several_labels(tmp_path, monkeypatch):
    rows = [row("rope", "none", 64, 11.6), row("rope", "none", 128, 13.0), row("rope", "none", 256, 14.9)]
    ax = _figure_of(monkeypatch, write_csv_atomic(rows, tmp_path / "r.csv"))
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    low, high = ax.get_ylim()
    assert ax.get_yscale() == "log" and labels == ["11", "12", "13", "14", "15", "16", "17"]
    assert all(low <= float(t) <= high for t in labels)
    assert ax.get_ylabel() == "validation perplexity per byte (log scale; lower is better)"
    assert "bytes" in ax.get_xlabel()


def test_findings_markdown_has_no_empty_bullet():
    findings = ["Literature check at 8x (512 tokens):", "- ALiBi: 0.99x.", "- sinusoidal: 3.72x.", "", "- nope: 1.22x",
                "rope: 3.14x", "", ""]
    assert report.findings_markdown(findings) == [
        "Literature check at 8x (512 tokens):", "", "- ALiBi: 0.99x.", "- sinusoidal: 3.72x.", "", "- nope: 1.22x",
        "- rope: 3.14x",
    ]
    # A lead-in after bullets gets a blank line first: otherwise it would continue the last bullet.
    assert report.findings_markdown(["- a", "Then:", "- b"]) == ["- a", "", "Then:", "", "- b"]


def test_report_findings_render_as_a_heading_then_paragraph_and_bullets(tmp_path, rows):
    csv_path = write_csv_atomic(rows, tmp_path / "results.csv")
    findings = ["Literature check at 8x the training length (512 tokens):", "- ALiBi: 0.99x.", "", "- rope: 3.14x"]
    text = write_report(tmp_path, results_csv=csv_path, config={}, environment={}, seconds=1.0,
                        findings=findings).read_text()
    assert (
        "## Findings\n\nLiterature check at 8x the training length (512 tokens):\n\n- ALiBi: 0.99x.\n\n- rope: 3.14x\n"
        in text
    )
    assert all(line.strip() not in ("-", "- -", "*") for line in text.splitlines())


def test_committed_lab_report_has_no_empty_bullet():
    from pathlib import Path

    text = (Path(__file__).parents[3] / "experiments" / "length-extrapolation" / "report.md").read_text()
    findings = text.split("## Findings\n\n", 1)[1].split("\n## ", 1)[0]
    assert findings.startswith("Literature check at 8x the training length (512 tokens):\n\n- ALiBi: ")
    assert all(line.strip() != "-" for line in findings.splitlines())


@pytest.mark.parametrize(
    ("successes", "n", "expected"),
    # Newcombe (1998), Statistics in Medicine 17:857, Table I, method 3 (Wilson score, no continuity correction).
    [(81, 263, (0.2553, 0.3662)), (15, 148, (0.0624, 0.1605)), (0, 20, (0.0, 0.1611)), (1, 29, (0.0061, 0.1718)),
     (29, 29, (0.8830, 1.0))],
)
def test_wilson_interval_matches_published_values(successes, n, expected):
    low, high = report.wilson_interval(successes / n, n)
    assert (round(low, 4), round(high, 4)) == expected


@pytest.mark.parametrize(("accuracy", "n", "name"), [(0.5, 0, "n=0"), (1.5, 10, "accuracy=1.5"), (0.5, 2.0, "n=2.0")])
def test_wilson_interval_rejects_bad_input(accuracy, n, name):
    with pytest.raises(ValueError, match=name):
        report.wilson_interval(accuracy, n)


def test_more_lines_than_distinct_colours_split_into_two_panels(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from posenc.lab.common import plots

    encodings = [f"enc{i}" for i in range(MAX_LINES)]
    rows = [row(e, "none", n, 5.0 + i + n / 64) for i, e in enumerate(encodings) for n in (64, 128)]
    rows += [row("enc0", s, n, k + n / 64) for s, k in (("linear", 6.0), ("yarn", 6.5)) for n in (64, 128)]
    upsert_results(tmp_path / "results.csv", rows)
    captured = []
    real_save = plots.save_png
    plots.save_png = lambda fig, out, dpi=150: captured.append(fig) or real_save(fig, out, dpi=dpi)
    try:
        plot_extrapolation(tmp_path / "results.csv", tmp_path / "x.png")
    finally:
        plots.save_png = real_save
    top, bottom = captured[0].axes
    assert [line.get_label() for line in top.get_lines() if not line.get_label().startswith("_")] == encodings
    labels = [line.get_label() for line in bottom.get_lines() if not line.get_label().startswith("_")]
    assert labels == ["enc0", "enc0 + linear", "enc0 + yarn"]
    for ax in (top, bottom):
        styles = [(ln.get_color(), ln.get_marker()) for ln in ax.get_lines() if not ln.get_label().startswith("_")]
        assert len(set(styles)) == len(styles)
    plt.close("all")
    upsert_results(tmp_path / "one.csv", rows[: 2 * (MAX_LINES - 1)])
    captured.clear()
    plots.save_png = lambda fig, out, dpi=150: captured.append(fig) or real_save(fig, out, dpi=dpi)
    try:
        plot_extrapolation(tmp_path / "one.csv", tmp_path / "y.png")
    finally:
        plots.save_png = real_save
    assert len(captured[0].axes) == 1
