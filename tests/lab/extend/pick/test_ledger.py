"""``runs.jsonl`` (``posenc.lab.extend.pick.ledger``): one line per measuring run of a pick, however it ends, so a pick
resumed over sittings has a measured total beside its plan."""

from __future__ import annotations

import json

import pytest

from posenc.lab.extend.pick import ledger


def test_each_run_appends_its_line_and_an_error_is_named_and_reraised(tmp_path):
    with ledger.timed(tmp_path, plan_seconds=3725.04, plan_about_seconds=2500.0) as entry:
        assert entry["ended"] == "picked"  # the default: a block that ends normally picked
    with pytest.raises(KeyboardInterrupt), ledger.timed(tmp_path, plan_seconds=None):
        raise KeyboardInterrupt
    with pytest.raises(ValueError, match="bad"), ledger.timed(tmp_path, plan_seconds=None) as entry:
        entry["ended"] = "deadline"
        raise ValueError("bad")
    rows = ledger.read(tmp_path)
    assert [r["ended"] for r in rows] == ["picked", "interrupted", "failed: ValueError"]
    assert rows[0]["plan_seconds"] == 3725.0 and rows[1]["plan_seconds"] is None
    assert rows[0]["plan_about_seconds"] == 2500.0 and rows[1]["plan_about_seconds"] is None
    assert all(r["seconds"] >= 0 and r["started"].endswith("+00:00") for r in rows)


def test_a_half_written_line_is_skipped_and_the_total_counts_every_run(tmp_path):
    lines = [
        {"seconds": 3600.0, "plan_seconds": 7200.0, "load_start": 0.3, "load_end": 1.1, "ended": "deadline"},
        {"seconds": 1800.0, "plan_seconds": None, "load_start": None, "load_end": 0.9, "ended": "interrupted"},
    ]
    (tmp_path / "runs.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + '\n{"seconds": 12')
    rows = ledger.read(tmp_path)
    assert len(rows) == 2
    text = ledger.total_text(rows, 600.0)
    assert text.startswith("Took 0:10:00 this run; 1:40:00 in all, over 3 runs (runs.jsonl; the first run's plan: "
                           "at most 2:00:00; 1-minute load averages 0.3-1.1 in earlier runs")
    assert ledger.total_text([], 61.0) == "Took 0:01:01 this run."
    assert ledger.read(tmp_path / "missing") == []


def test_the_first_plan_is_said_as_it_was_logged(tmp_path):
    old = {"seconds": 60.0, "plan_seconds": 7200.0}  # a line from before the expectation was logged
    new = {"seconds": 60.0, "plan_seconds": 7200.0, "plan_about_seconds": 4500.0}
    untimed = {"seconds": 60.0, "plan_seconds": None, "plan_about_seconds": None}
    assert "the first run's plan: about 1:15:00, at most 2:00:00)" in ledger.total_text([untimed, new, old], 0.0)
    assert "the first run's plan: at most 2:00:00)" in ledger.total_text([old, new], 0.0)
    assert "plan" not in ledger.total_text([untimed], 0.0)
