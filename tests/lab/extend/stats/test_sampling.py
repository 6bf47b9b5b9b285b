"""Sample until the answer is clear (``posenc.lab.extend.stats.sampling``): the stopping rule on made-up rows, then
studies of a tiny lab model whose passkey answers are scripted, so which cell stops where is known in advance."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from lab.extend.study.test_study import ORIGINAL, TINY, _cli, _lab_run
from posenc.lab.common.train import load_model
from posenc.lab.extend.needles import passkey as pk
from posenc.lab.extend.settings.config import ExtendConfig
from posenc.lab.extend.stats import sampling
from posenc.lab.extend.stats.rates import Rate
from posenc.lab.extend.study.run import _passkey_seed, read_results, run_extend
from posenc.lab.extend.targets.lab import LabTarget

pytestmark = pytest.mark.usefixtures("one_thread")
LONG = 128  # the passkey prompt needs 101 bytes: measured at 128, n/a at 32


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory, corpus) -> Path:
    return _lab_run(tmp_path_factory.mktemp("rope"), "rope", corpus, steps=5)


def _cfg(rope_run, corpus, **settings) -> ExtendConfig:
    base = {**TINY, "depths": (0.0, 0.5, 1.0), "trials": 16}
    return ExtendConfig(model=str(rope_run), methods=("linear",), factors=(2.0,), lengths=(ORIGINAL, LONG),
                        corpus=str(corpus), **{**base, **settings})


def _scripted(monkeypatch) -> list:
    """Passkey answers by depth: at 0 every model finds every key; at 0.5 each model finds the even keys (the same
    keys for every model: a tie that no number of keys decides); at 1 only the unpatched model finds them. Returns
    the calls: (unpatched, length, depth, seed, keys)."""
    calls = []

    def passkey(self, model, length, depth, seed, tick=None):
        trials = self.cfg.trials  # one call per round, all its keys
        calls.append((model is self.model, length, depth, seed, trials))
        if depth == 0.0:
            return 1.0
        if depth == 0.5:
            keys = torch.randint(pk.KEY_LOW, pk.KEY_HIGH, (trials,), generator=torch.Generator().manual_seed(seed))
            return float((keys % 2 == 0).sum()) / trials
        return 1.0 if model is self.model else 0.0

    monkeypatch.setattr(LabTarget, "passkey", passkey)
    return calls


def _n(rows) -> dict:
    return {(r["method"], r["depth"]): (r["n"], r["hits"]) for r in rows if r["metric"] == "passkey" and r["n"]}


def _row(method: str, depth: float, hits: float, n: int) -> dict:
    low, high = Rate(hits, n).interval
    return {"metric": "passkey", "method": method, "factor": 2.0, "finetune_steps": 0, "finetune_positions": "plain",
            "length": 128, "depth": depth, "hits": hits, "n": n, "accuracy": hits / n, "ci_low": low,
            "ci_high": high, "status": "ok"}


def test_the_rule_on_rows():
    cfg = ExtendConfig(model="m", trials=20)
    best, apart, close, capped = (_row("none", 0.5, 4, 4), _row("yarn", 0.5, 0, 4), _row("ntk", 0.5, 3, 4),
                                  _row("linear", 0.5, 1, 20))
    pending = sampling.pending([best, apart, close, capped], cfg)
    # 4/4 [51-100] is the best, still wide; 0/4 [0-49] is disjoint from it; 3/4 overlaps; a cell at its cap is done.
    assert pending == [best, close]
    assert sampling.pending([_row("none", 0.5, 12, 12), close], cfg) == [close]  # 12/12 [76-100]: narrow enough
    other_depth = {**apart, "depth": 1.0}  # compared only with its own length and depth: there it is the best
    assert sampling.pending([best, other_depth], cfg) == [best, other_depth]
    assert sampling.pending([best, close], ExtendConfig(**{**cfg.to_dict(), "stop_width": 0})) == []
    assert sampling.round_seed(7, 0) != sampling.round_seed(7, 4) and sampling.round_seed(2**62, 12) < 2**63
    with pytest.raises(ValueError, match="start=3 is invalid: expected a multiple of the round of 4"):
        sampling.round_seed(7, 3)


def test_a_cap_off_the_round_ends_with_a_shorter_round(rope_run, corpus, tmp_path, monkeypatch):
    calls = _scripted(monkeypatch)
    rows = run_extend(_cfg(rope_run, corpus, trials=6, depths=(0.5,)), tmp_path / "out", progress=False)
    assert {method: n for (method, _), (n, _) in _n(rows).items()} == {"none": 6, "linear": 6}
    assert [k for u, *_, k in calls if u] == [4, 2]  # the last round: the first 2 keys of its generator


@pytest.mark.parametrize("width", [-0.1, 1.0, 1.5, math.nan, math.inf, "0.3", True])
def test_bad_stop_widths_are_refused_naming_the_setting(width):
    with pytest.raises(ValueError, match=r"stop_width=.* is invalid"):
        ExtendConfig(model="m", stop_width=width)


def test_cli_refuses_a_bad_stop_width_in_one_line(rope_run, tmp_path):
    code, text = _cli("extend", str(rope_run), "--stop-width", "1", "--out", str(tmp_path / "bad"))
    assert code == 2 and text.count("\n") == 1 and "stop_width=1.0 is invalid" in text and "Traceback" not in text
    code, text = _cli("extend", str(rope_run), "--stop-width", "-1", "--out", str(tmp_path / "bad"))  # argparse
    assert code == 2 and "--stop-width" in text and "Traceback" not in text
    assert not (tmp_path / "bad").exists()


def test_cells_stop_once_decided_and_undecided_ones_reach_their_cap(rope_run, corpus, tmp_path, monkeypatch, capsys):
    calls = _scripted(monkeypatch)
    cfg = _cfg(rope_run, corpus)
    rows = run_extend(cfg, tmp_path / "out", progress=True)
    assert "passkey (3 depths x up to 16 keys)" in capsys.readouterr().out
    assert _n(rows) == {
        # all found: the anytime-valid interval of 12/12 is 67-100 (wider than 0.3), of 16/16 73-100: the best
        # stops at the cap of 16, and the tie with it too (never disjoint from the best)
        ("none", 0.0): (16, 16.0), ("linear", 0.0): (16, 16.0),
        # a coin flip for both, tied: undecided, so each goes to the cap of 16
        ("none", 0.5): (16, _n(rows)[("none", 0.5)][1]), ("linear", 0.5): (16, _n(rows)[("none", 0.5)][1]),
        # 0/4 (0-66) overlaps 4/4 (34-100) after one round; 0/8 (0-44) is disjoint from 8/8 (56-100) after two
        ("none", 1.0): (16, 16.0), ("linear", 1.0): (8, 0.0),
    }
    assert 0 < _n(rows)[("none", 0.5)][1] < 16
    for unpatched in (True, False):  # each cell's keys: its rounds in order, each once, 4 keys each
        for depth in cfg.depths:
            rounds = [(s, k) for u, n, d, s, k in calls if (u, n, d) == (unpatched, LONG, depth)]
            cell = _passkey_seed(cfg, LONG, depth)
            assert rounds == [(sampling.round_seed(cell, 4 * r), 4) for r in range(len(rounds))]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Keys: up to 16 keys per cell, in rounds of 4" in report and "at most 0.3 wide" in report
    assert "| none | n/a | 16/16/16 |" in report and "| linear x2 | n/a | 16/16/8 |" in report
    settings = json.loads((tmp_path / "out" / "extend.json").read_text())
    assert settings["stop_width"] == 0.3


@pytest.mark.parametrize("stop_at", [3, 7, 11])
def test_a_resumed_study_continues_each_cell_to_the_same_counts(
    rope_run, corpus, tmp_path, monkeypatch, capsys, stop_at
):
    """Ctrl-C in the first rounds (6 calls: one per cell), in the second, in a later one: the resumed study ends with
    the counts and hits of one never stopped."""
    calls = _scripted(monkeypatch)
    cfg = _cfg(rope_run, corpus)
    whole = _n(run_extend(cfg, tmp_path / "whole", progress=False))
    scripted = LabTarget.passkey

    def interrupted(self, *args, **kwargs):
        if len(calls) == stop_at:
            raise KeyboardInterrupt
        return scripted(self, *args, **kwargs)

    calls.clear()
    monkeypatch.setattr(LabTarget, "passkey", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_extend(cfg, tmp_path / "out", progress=False)
    part = _n(read_results(tmp_path / "out" / "results.csv"))
    assert part != whole and all(part[c][0] <= whole[c][0] for c in part)
    assert sum(n for n, _ in part.values()) == stop_at * 4  # every finished round kept, the cut one not
    monkeypatch.setattr(LabTarget, "passkey", scripted)
    capsys.readouterr()
    assert _n(run_extend(cfg, tmp_path / "out", resume=True, progress=True)) == whole
    assert (
        "Plan: 2 models (none, linear x2) x perplexity and passkey (3 depths x up to 16 keys)"
        in capsys.readouterr().out
    )
    calls.clear()
    assert _n(run_extend(cfg, tmp_path / "out", resume=True, progress=False)) == whole and not calls


def test_stop_width_zero_is_the_fixed_count_of_before(rope_run, corpus, tmp_path):
    cfg = _cfg(rope_run, corpus, trials=3, depths=(0.5,), stop_width=0)
    rows = run_extend(cfg, tmp_path / "out", progress=False)
    model = load_model(rope_run)
    seed = cfg.seed * 1_000_003 + LONG * 101 + 500  # the cell's seed before rounds existed, all keys from it
    expected = pk.lab_accuracy(model, length=LONG, depth=0.5, trials=3, seed=seed)
    [none] = [r for r in rows if r["metric"] == "passkey" and r["method"] == "none" and r["length"] == LONG]
    assert none["n"] == 3 and none["accuracy"] == expected
    assert all(r["n"] == 3 for r in rows if r["metric"] == "passkey" and r["status"] == "ok")
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Keys: 3 keys per cell (a fixed count)" in report and "Keys tried per cell" not in report


def test_a_study_made_before_rounds_resumes_with_its_fixed_counts(rope_run, corpus, tmp_path, monkeypatch):
    out = tmp_path / "out"
    fixed = _cfg(rope_run, corpus, trials=6, depths=(0.5,), stop_width=None)
    run_extend(fixed, out, progress=False)
    settings = json.loads((out / "extend.json").read_text())
    del settings["stop_width"]  # as written before the setting existed
    (out / "extend.json").write_text(json.dumps(settings))
    before = (out / "results.csv").read_text()
    calls = _scripted(monkeypatch)
    rows = run_extend(_cfg(rope_run, corpus, trials=6, depths=(0.5,)), out, resume=True, progress=False)
    assert not calls and (out / "results.csv").read_text() == before
    assert all(r["n"] == 6 for r in rows if r["metric"] == "passkey" and r["status"] == "ok")
    with pytest.raises(ValueError, match="stop_width"):  # a different rule is a different study
        run_extend(_cfg(rope_run, corpus, trials=6, depths=(0.5,), stop_width=0.2), out, resume=True, progress=False)


def test_pooled_depths_with_different_counts_weigh_each_depth_the_same():
    from posenc.lab.extend.stats.rates import pool

    assert pool([Rate(3, 4), Rate(1, 4)]) == Rate(4, 8)  # equal counts: summed, as before rounds
    mixed = pool([Rate(12, 12), Rate(0, 4)])  # summed it would read 12/16 = 75%
    assert mixed.value == pytest.approx(0.5) and mixed.n == 12  # Kish: 2^2 / (1/12 + 1/4) = 12
    assert pool([None, Rate(1, 2)]) == Rate(1, 2) and pool([None]) is None


def test_ruler_rounds_take_the_next_documents(corpus, tmp_path, monkeypatch):
    """RULER cells in rounds: each round evaluates the next documents of lm-eval's order at that length (lm-eval is
    stubbed out: the unpatched model answers every document, the patched one none)."""
    from lab.extend.study.test_study import _hf_folder, _needs_extend_context
    from posenc.lab.extend.needles import ruler
    from posenc.lab.extend.targets.hf import HFTarget

    _needs_extend_context()
    task, lengths = "niah_single_1", (64, 128)
    suite = ruler.Suite(tasks={task: None}, samples={task: {n: list(range(n, n + 12)) for n in lengths}},
                        prompt_tokens={task: {n: n - 10 for n in lengths}}, lengths=lengths)
    seen = []

    def build_ruler(self, lengths):
        self.suite = suite
        return suite

    def evaluate(self, model, task, length, tick=None):
        documents = self.suite.samples[task][length]
        seen.append((model is self.model, length, tuple(documents)))
        return ruler.Score(float(len(documents)) if model is self.model else 0.0, len(documents), ())

    monkeypatch.setattr(ruler, "require", lambda: None)
    monkeypatch.setattr(HFTarget, "build_ruler", build_ruler)
    monkeypatch.setattr(HFTarget, "ruler", evaluate)
    cfg = ExtendConfig(model=str(_hf_folder(tmp_path / "llama")), task="ruler", ruler_tasks=(task,), ruler_samples=12,
                       methods=("yarn",), factors=(2.0,), lengths=lengths, depths=(0.5,), trials=1, eval_tokens=256,
                       corpus=str(corpus), device="cpu")
    saved = tmp_path / "yarn"
    rows = run_extend(cfg, tmp_path / "out", progress=False, save=saved)
    got = {(r["method"], r["length"]): (r["n"], r["hits"]) for r in rows if r["metric"] == "ruler:" + task}
    # anytime-valid intervals: 0/4 (0-66) overlaps 4/4 (34-100); 0/8 (0-44) is disjoint from 8/8 (56-100): the
    # patched cells stop after two rounds; the best goes to the cap (12/12 is 67-100: wider than 0.3)
    assert got == {("none", 64): (12, 12.0), ("none", 128): (12, 12.0), ("yarn", 64): (8, 0.0), ("yarn", 128): (8, 0.0)}
    for n in lengths:
        rounds = [tuple(range(n + start, n + start + 4)) for start in (0, 4, 8)]
        assert [d for u, m, d in seen if (u, m) == (True, n)] == rounds
        assert [d for u, m, d in seen if (u, m) == (False, n)] == rounds[:2]
    assert suite.samples[task] == {n: list(range(n, n + 12)) for n in lengths}  # each round swapped in a copy
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Documents: up to 12 documents per cell, in rounds of 4" in report
    # the lm_eval command for the saved model lists the documents its cells took: the first 8 of each length
    took = dataclasses.replace(suite, samples={task: {n: list(range(n, n + 8)) for n in lengths}})
    assert ruler.lm_eval_command(saved, took, task) in report
