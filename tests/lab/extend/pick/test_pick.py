"""``posenc extend MODEL --target T --pick`` as folders made before the deciding race run it (``design="rounds"``:
screening by passkeys at a shorter length, then binary needles at T in rounds; a resumed old folder takes this path):
the rules on made-up rows (candidates, screening's verdicts, durations), then the whole pick end to end on a tiny
transformers Llama made here: plan, stages, resume, deadline, save, CLI. The statistics themselves are simulated in
``test_race_simulation.py``; the deciding race (every new pick) is ``test_pick_keys.py``."""

from __future__ import annotations

import dataclasses
import functools
import json
import re

import pytest
import torch

from lab.extend.pick.tagged import tag_patched
from lab.extend.study.test_study import TINY, _cli, _hf_folder
from markdown_table import markdown_table
from posenc.lab.extend.pick import rules
from posenc.lab.extend.pick.run import run_pick as _run_pick
from posenc.lab.extend.settings.config import ExtendConfig
from posenc.lab.extend.stats.rates import Rate
from posenc.lab.extend.targets.hf import HFTarget

pytestmark = pytest.mark.usefixtures("one_thread")
run_pick = functools.partial(_run_pick, design="rounds")
SETTINGS = {k: v for k, v in TINY.items() if k not in ("trials", "eval_tokens")}


# ---------------------------------------------------------------------------------------------------------------------
# The rules


@pytest.mark.parametrize(
    ("text", "length"), [("128", 128), (128, 128), ("2x", 128), ("1.5x", 96), (" 4X ", 256), ("12k", 12288)]
)
def test_targets_are_tokens_or_multiples_of_the_context(text, length):
    assert rules.parse_target(text, 64) == length


@pytest.mark.parametrize("text", ["64", "1x", "0.5x", "x2", "-3", "0.01k", "", "2xx", "k", "\u0661\u0666"])
def test_bad_targets_are_refused_naming_the_setting(text):
    with pytest.raises(ValueError, match=r"target=.* is invalid"):
        rules.parse_target(text, 64)


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("45s", 45), ("90m", 5400), ("1.5h", 5400),
                                               ("2h30m", 9000), ("1h30", 5400), ("2m30", 150), ("1h 30m", 5400),
                                               (None, None)])
def test_budgets_read_as_seconds(text, seconds):
    assert rules.parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "0m", "h", "1d", "-5", "ten", "30m1h", "1h1h", "1x"])
def test_bad_budgets_are_refused(text):
    with pytest.raises(ValueError, match=r"budget=.* is invalid"):
        rules.parse_budget(text)


def test_candidates_follow_the_model_and_the_save():
    names = lambda cs: [(c.method, c.factor) for c in cs]  # noqa: E731
    llama, left = rules.candidates(8192, 16384, model_type="llama", remapping=True)
    assert names(llama) == [("linear", 2), ("ntk", 2), ("dynamic", 2), ("yarn", 2), ("yarn", 4), ("llama3", 2),
                            ("self_extend", 2), ("self_extend", 4), ("dca", 2), ("rerope", 2), ("leaky_rerope", 2),
                            ("lm_infinite", 2), ("yarn+string", 2)]
    assert "longrope" in left and "search" in left["longrope"]
    assert "at most 16256 tokens for STRING" in left["string"] and "cannot retrieve" in left["streaming_llm"]
    near, left = rules.candidates(8192, 12288, model_type="llama", remapping=True)
    assert ("string", 1.5) in names(near) and "string" not in left and ("yarn+string", 1.5) in names(near)
    qwen, _ = rules.candidates(8192, 32768, model_type="qwen2", remapping=True)
    assert ("dca_vllm", 4) in names(qwen) and ("dca_vllm", 4) not in names(llama)
    gpt2, left = rules.candidates(1024, 2048, model_type="gpt2", remapping=False)
    assert {c.method for c in gpt2} == set(rules.FREQUENCY_CANDIDATES)
    assert "not gpt2" in left["remapping methods"] and "gemma3_text" in left["remapping methods"]
    folder, left = rules.candidates(8192, 16384, model_type="qwen2", remapping=True,
                                    savable=lambda m: None if m in ("yarn", "dca_vllm") else "cannot")
    assert names(folder) == [("yarn", 2), ("yarn", 4), ("dca_vllm", 2)] and left["rerope"] == "cannot"
    chosen, _ = rules.candidates(8192, 16384, model_type="llama", remapping=True, methods=("yarn", "dca"))
    assert names(chosen) == [("yarn", 2), ("yarn", 4), ("dca", 2)]
    for methods, match in ((("yarn", "nope"), "candidates --pick can measure"), (("longrope",), "search"),
                           (("streaming_llm",), "streaming_llm is not one"), (("string",), "at least one candidate")):
        with pytest.raises(ValueError, match=match):
            rules.candidates(8192, 16384, model_type="llama", remapping=True, methods=methods)


def _rows(unit, length, *, ppl=None, keys=None, metric="passkey", depth=0.5):
    method, factor = unit[:2]
    base = {"method": method, "factor": factor, "finetune_steps": 0, "finetune_positions": "plain",
            "length": length, "status": "ok"}
    out = []
    if ppl is not None:
        out.append({**base, "metric": "ppl_past", "depth": None, "ppl": ppl, "accuracy": None, "hits": None, "n": 1})
    if keys is not None:
        hits, n = keys
        out.append({**base, "metric": metric, "depth": depth if metric == "passkey" else None, "ppl": None,
                    "accuracy": hits / n, "hits": hits, "n": n})
    return out


def _u(method, factor=2.0):
    return (method, factor, 0, "plain")


def test_screening_verdicts_name_the_perplexity_and_the_credible_set():
    units = [_u("none", 1.0), _u("linear"), _u("ntk"), _u("yarn"), _u("dca")]
    rows = [r for u in units for r in _rows(u, 128, ppl={"ntk": 12.0}.get(u[0], 5.0)) + _rows(u, 96, keys=(3, 4))]
    broken = rules.broken(rows, units[1:], target=128)
    assert list(broken) == [_u("ntk")] and "2x the best (5)" in broken[_u("ntk")]
    verdicts = {v.unit[0]: v for v in rules.screened(rows, units, target=128, screen=96, broken_units=broken,
                                                      kept=[_u("yarn"), _u("linear")], p_best={_u("yarn"): 0.6},
                                                      keep=4)}
    assert verdicts["ntk"].why == broken[_u("ntk")] and not verdicts["ntk"].kept
    assert verdicts["yarn"].kept and verdicts["yarn"].p_best == 0.6 and "credible set" in verdicts["yarn"].why
    assert not verdicts["dca"].kept
    assert verdicts["dca"].why == "out: outside the 98% credible set of the best after 4 keys"
    assert verdicts["yarn"].passkey.anytime and verdicts["yarn"].passkey.text().startswith("3/4 75% [")


def test_pooled_anytime_rates_average_each_needle_over_the_cells():
    """Two cells of 8 needles, 6 and 3.5 found: pooled 9.5/16 shown, and its anytime interval is the one of 8
    averaged needles (each in [0, 1]) -- the interval the race uses (``race.pooled_interval``)."""
    from posenc.lab.extend.stats.confidence import rate_interval
    from posenc.lab.extend.stats.rates import pool

    pooled = pool([Rate(6, 8, anytime=True), Rate(3.5, 8, anytime=True)])
    assert (pooled.hits, pooled.n, pooled.cells) == (9.5, 16, 2)
    assert pooled.interval == tuple(float(x) for x in rate_interval(9.5 / 2, 8))
    assert pool([Rate(6, 8), Rate(2, 4)]) == Rate(6.25, 10)  # fixed-n rates of unequal n: Kish's count, as before


def test_serving_tiers():
    assert rules.serving("yarn", "llama") == "config" and rules.serving("ntk", "gemma") == "config"
    assert rules.serving("dynamic", "llama") == "dynamic"
    assert rules.serving("dca_vllm", "qwen2") == "dca_vllm" and rules.serving("dca_vllm", "llama") == "patch"
    assert rules.serving("self_extend", "qwen3") == "patch"


# ---------------------------------------------------------------------------------------------------------------------
# End to end on a tiny Llama


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return _hf_folder(tmp_path_factory.mktemp("llama"))


def _cfg(llama, corpus, **settings):
    return ExtendConfig(model=str(llama), corpus=str(corpus), **{**SETTINGS, "depths": (0.5,), "trials": 8,
                                                                   **settings})


def test_pick_end_to_end_then_resume_and_save(llama, corpus, tmp_path, monkeypatch, capsys):
    loads = []
    load = HFTarget.load
    monkeypatch.setattr(HFTarget, "load", lambda self: (loads.append(1), load(self))[1])
    cfg = _cfg(llama, corpus, methods=("linear", "yarn", "self_extend"))
    out = tmp_path / "pick"
    result = run_pick(cfg, "2x", out, progress=True)
    text = capsys.readouterr().out
    plan_at = text.index("Pick for LlamaForCausalLM")
    assert plan_at < text.index("Screening:")  # the plan first, then the stages
    assert "5 candidates (linear x2, yarn x2, yarn x4, self_extend x2, self_extend x4)" in text
    assert "Left out" not in text  # --methods chose them
    assert "from timed forwards of the model on this machine" in text
    # each stage's plan line names only what that stage measures
    assert "Plan: 6 models (none, linear x2, yarn x2, yarn x4, self_extend x2, self_extend x4) x perplexity at " \
        "lengths 128 (original 64): 6 forwards" in text
    assert "x passkey (1 depth x up to 12 keys) at lengths 96 (original 64)" in text
    settings = json.loads((out / "pick.json").read_text())
    assert settings["command"] == "posenc extend --pick" and settings["target"] == 128 and settings["screen"] == 96
    assert settings["cap"] == 8 and "budget" not in settings
    ppl = json.loads((out / "screen-ppl" / "extend.json").read_text())
    assert ppl["measurements"] == [["ppl", 128, None]] and len(ppl["units"]) == 6  # 5 candidates + unpatched
    keys = json.loads((out / "screen-passkey" / "extend.json").read_text())
    assert keys["measurements"] == [["passkey", 96, 0.5]] and keys["trials"] == 12 and keys["stop_width"] == 0.3
    final = json.loads((out / "final" / "extend.json").read_text())
    kept = [u for u in final["units"] if u[0] != "none"]
    assert 1 <= len(kept) <= 5
    assert final["measurements"] == [["ppl", 128, None], ["passkey", 128, 0.5]] and final["trials"] == 8
    report = (out / "pick.md").read_text()
    assert f"## The pick: {result['pick']}" in report and "## Screening" in report and "## Run it elsewhere" in report
    assert "The rule: a model stops being sampled once another one is better beyond noise" in report
    assert result["pick"] in text and result["reason"] in report
    # every model of the race, the unpatched one included, in the ranked table with n and an interval
    assert len(result["standings"]) == len(kept) + 1
    assert all("[" in r["needles"] and "per cell" in r["needles"] for r in result["standings"])
    # resumed: nothing measured again, the same pick; --save writes it
    before = len(loads)
    again = run_pick(cfg, "2x", out, resume=True, progress=False, save=tmp_path / "saved")
    assert again["pick"] == result["pick"] and again["saved"] == tmp_path / "saved"
    assert again["standings"] == result["standings"]
    assert len(loads) - before == 4  # each stage loads (nothing left to measure), then the save
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    method = result["unit"][0]
    if method != "self_extend":  # a frequency method: its config carries it
        assert config["rope_parameters"]["rope_type"] in ("linear", "yarn")


def _scripted(monkeypatch, found, screen_found=None):
    """Passkey answers scripted by model: ``found[(method, factor)](index)`` is key ``index``'s score at the target,
    ``screen_found`` at the screening length (default: the same)."""
    which = tag_patched(monkeypatch)

    def passkey(self, model, length, depth, seed, tick=None, outcomes=None):
        method = which.get(model, ("none", 1.0))
        table = found if length == 128 or screen_found is None else screen_found
        start = passkey.start.get((method, length), 0)
        scores = [float(table.get(method, lambda i: 0.0)(start + i)) for i in range(self.cfg.trials)]
        passkey.start[(method, length)] = start + self.cfg.trials
        if outcomes is not None:
            outcomes.extend(scores)
        return sum(scores) / len(scores)

    passkey.start = {}
    monkeypatch.setattr(HFTarget, "passkey", passkey)


def test_a_scripted_race_stops_the_clearly_worse_and_picks_the_clear_winner(llama, corpus, tmp_path, monkeypatch):
    """At 96 tokens linear finds nothing: out of the credible set. At the target yarn x2 finds every key, yarn x4 every
    other one, ntk and the unpatched model none: on the same needles, ntk and the unpatched model are shown worse
    and stop; the pick is yarn x2, shown better than every other method, and it rescues retrieval."""
    _scripted(monkeypatch, {("yarn", 2.0): lambda i: 1, ("yarn", 4.0): lambda i: i % 2},
              screen_found={("yarn", 2.0): lambda i: 1, ("yarn", 4.0): lambda i: 1, ("ntk", 2.0): lambda i: 1})
    cfg = _cfg(llama, corpus, methods=("linear", "ntk", "yarn"), trials=40)
    result = run_pick(cfg, "2x", tmp_path / "pick", progress=False)
    from posenc.lab.extend.study.run import read_results

    rows = read_results(tmp_path / "pick" / "final" / "results.csv")
    n = {(r["method"], r["factor"]): r["n"] for r in rows if r["metric"] == "passkey"}
    assert ("linear", 2.0) not in n  # screened out
    assert n[("ntk", 2.0)] < 40 and n[("none", 1.0)] < 40  # shown worse, stopped early
    assert result["pick"] == "yarn x2" and result["shown"] and result["ended"] == "decided"
    assert "better beyond noise than every other method raced" in result["reason"]
    assert "the method rescues retrieval" in result["reason"]
    report = (tmp_path / "pick" / "pick.md").read_text()
    assert "| linear x2 |" in report and "outside the 98% credible set" in report
    assert "| **pick** | yarn x2 |" in report


def test_a_cheaper_config_is_not_picked_on_a_tie_it_has_not_shown(llama, corpus, tmp_path, monkeypatch):
    """Self-Extend (a run-time patch) finds 9 keys of 10 and YaRN (a config every engine reads) 7 of 10, on the same
    needles: the old rule called that a tie and picked YaRN. Now the pick is Self-Extend's best estimate, not shown
    better, and the report says what YaRN would cost in rate, with its interval."""
    _scripted(monkeypatch, {("self_extend", 2.0): lambda i: i % 10 != 0, ("yarn", 2.0): lambda i: i % 10 < 7},
              screen_found={("self_extend", 2.0): lambda i: 1, ("yarn", 2.0): lambda i: 1})
    cfg = _cfg(llama, corpus, methods=("yarn", "self_extend"), trials=20)
    result = run_pick(cfg, "2x", tmp_path / "pick", progress=False)
    assert result["pick"] == "self_extend x2" and not result["shown"] and result["ended"] == "cap"
    assert "has the best estimate" in result["reason"] and "not shown better than" in result["reason"]
    assert re.search(r"yarn x2 \(a RoPE config every engine reads\) would cost \+0\.\d\d in rate \[[-+]0\.\d\d to "
                     r"\+\d\.\d\d\]", result["reason"]), result["reason"]
    report = (tmp_path / "pick" / "pick.md").read_text()
    assert "(best with probability" in report and "not shown better)" in report


@pytest.mark.parametrize("before", [1, 6])
def test_the_budget_is_a_deadline_and_a_resume_continues(llama, corpus, tmp_path, monkeypatch, capsys, before):
    """--budget stops sampling when it passes (here: after ``before`` looks; the deadline is looked at before each
    model's first measurements and before each round) and the pick is made from what was measured, reported as ended
    by the deadline; a resume with another budget (not a stored setting) continues and reaches the same answer as a
    pick that ran straight through. After one look the perplexity screen stops after its first model: nothing is
    picked from a partial screen."""
    from posenc.lab.extend.pick import racing
    from posenc.lab.extend.study.run import read_results

    cfg = _cfg(llama, corpus, methods=("yarn",), trials=12)
    straight = run_pick(cfg, "2x", tmp_path / "straight", progress=False)
    looks, passed = [], racing.Deadline.passed
    monkeypatch.setattr(racing.Deadline, "passed", lambda self: looks.append(1) is None and len(looks) > before)
    cut = run_pick(cfg, "2x", tmp_path / "cut", budget="1h30", progress=False)
    if before == 1:
        ppl = read_results(tmp_path / "cut" / "screen-ppl" / "results.csv")
        assert {r["method"] for r in ppl} == {"none"} and cut["stage"] == "screening"
    if cut["pick"] is None:  # the deadline came in screening
        assert cut["ended"] == "deadline" and "not finished" in (tmp_path / "cut" / "pick.md").read_text()
    else:
        assert cut["ended"] in ("deadline", "decided", "cap")
    monkeypatch.setattr(racing.Deadline, "passed", passed)
    first = json.loads((tmp_path / "cut" / "runs.jsonl").read_text())
    assert first["ended"] == ("deadline" if cut["pick"] is None else f"picked: {cut['ended']}")
    resumed = run_pick(cfg, "2x", tmp_path / "cut", budget="5h", resume=True, progress=False)
    assert resumed["standings"] == straight["standings"] and resumed["pick"] == straight["pick"]
    capsys.readouterr()
    run_pick(cfg, "2x", tmp_path / "cut", resume=True, progress=False, plan_only=True)
    assert re.search(r"Resumed from .*: finished \(pick.md\)\. Left: at most 0:00:00", capsys.readouterr().out)


def test_an_interrupted_pick_resumes_to_the_same_answer(llama, corpus, tmp_path, monkeypatch, capsys):
    """Ctrl-C (KeyboardInterrupt) in the race: every finished measurement is kept, a resumed --plan counts what is
    left (writing nothing), and --resume ends with the same table as a pick that ran straight through."""
    cfg = _cfg(llama, corpus, methods=("linear", "yarn"))
    straight = run_pick(cfg, "2x", tmp_path / "straight", progress=False)
    calls = []
    passkey = HFTarget.passkey

    def interrupted(self, model, length, *args, **kwargs):
        calls.append(length)
        if calls.count(128) == 3:  # in the race, after screening
            raise KeyboardInterrupt
        return passkey(self, model, length, *args, **kwargs)

    monkeypatch.setattr(HFTarget, "passkey", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_pick(cfg, "2x", tmp_path / "cut", progress=False)
    final = tmp_path / "cut" / "final"
    assert (final / "results.csv").exists()
    # the reports say what was measured and that the run was interrupted: none is older than its results
    assert "The run was interrupted (Ctrl-C or SIGTERM) during the race's first round" in (
        tmp_path / "cut" / "pick.md").read_text()
    assert (final / "report.md").stat().st_mtime_ns >= (final / "results.csv").stat().st_mtime_ns
    monkeypatch.setattr(HFTarget, "passkey", passkey)
    with pytest.raises(ValueError, match="a new folder, or --resume"):
        run_pick(cfg, "2x", tmp_path / "cut", progress=False)
    before = sorted((p, p.stat().st_mtime_ns) for p in (tmp_path / "cut").rglob("*"))
    capsys.readouterr()
    run_pick(cfg, "2x", tmp_path / "cut", resume=True, progress=False, plan_only=True)
    text = capsys.readouterr().out
    assert sorted((p, p.stat().st_mtime_ns) for p in (tmp_path / "cut").rglob("*")) == before  # nothing written
    assert re.search(r"Resumed from .*: the race: none \d+, .* needles per cell\. Left: at most \d+:\d\d:\d\d$", text,
                     re.M), text
    resumed = run_pick(cfg, "2x", tmp_path / "cut", resume=True, progress=False)
    assert resumed["standings"] == straight["standings"] and resumed["pick"] == straight["pick"]
    # runs.jsonl: one line per measuring run, however it ended (the refused one and --plan wrote none); pick.md sums
    runs = [json.loads(line) for line in (tmp_path / "cut" / "runs.jsonl").read_text().splitlines()]
    assert [r["ended"] for r in runs] == ["interrupted", f"picked: {resumed['ended']}"]
    assert all(r["seconds"] > 0 for r in runs)
    assert runs[0]["plan_seconds"] is None  # progress=False: no calibrated plan was made, none is claimed
    total = runs[0]["seconds"] + runs[1]["seconds"]
    took = re.search(r"Took (\d+:\d\d:\d\d) this run; (\d+:\d\d:\d\d) in all, over 2 runs \(runs.jsonl",
                     (tmp_path / "cut" / "pick.md").read_text())
    assert took, (tmp_path / "cut" / "pick.md").read_text()
    h, m, sec = map(int, took.group(2).split(":"))
    assert abs(h * 3600 + m * 60 + sec - total) <= 1.5  # whole seconds, from the same two measured runs
    straight_runs = (tmp_path / "straight" / "runs.jsonl").read_text().splitlines()
    assert [json.loads(line)["ended"] for line in straight_runs] == [f"picked: {straight['ended']}"]


@pytest.mark.parametrize("how", ["interrupt", "deadline"])
def test_a_round_cut_midway_is_reported_with_every_needle_measured(llama, corpus, tmp_path, monkeypatch, how):
    """The race's second round cut after its first model's needles (Ctrl-C, or the deadline between two models):
    pick.md's table counts every needle measured -- each model's n is its results.csv n, the cut round's model ahead
    of the others (the anytime-valid intervals hold at any n) --, the stage's report is rewritten, and pick.md says
    how the run ended."""
    from posenc.lab.extend.pick import racing
    from posenc.lab.extend.study.run import read_results

    _scripted(monkeypatch, {("yarn", 2.0): lambda i: 1, ("yarn", 4.0): lambda i: i % 2},
              screen_found={("yarn", 2.0): lambda i: 1, ("yarn", 4.0): lambda i: 1})
    cfg = _cfg(llama, corpus, methods=("yarn",), trials=40)
    out = tmp_path / "pick"
    final = out / "final" / "results.csv"

    def second_round_begun() -> bool:  # a model of the race has more than its first round
        return final.is_file() and any(r["n"] > 4 for r in read_results(final) if r["metric"] == "passkey")

    if how == "deadline":
        monkeypatch.setattr(racing.Deadline, "passed", lambda self: second_round_begun())
        result = run_pick(cfg, "2x", out, budget="1h", progress=False)
        assert result["ended"] == "deadline"
    else:
        scripted = HFTarget.passkey

        def interrupted(self, model, length, *args, **kwargs):
            if length == 128 and second_round_begun():
                raise KeyboardInterrupt
            return scripted(self, model, length, *args, **kwargs)

        monkeypatch.setattr(HFTarget, "passkey", interrupted)
        with pytest.raises(KeyboardInterrupt):
            run_pick(cfg, "2x", out, progress=False)
    n = {f"{r['method']} x{r['factor']:g}".replace("none x1", "none"): r["n"] for r in read_results(final)
         if r["metric"] == "passkey"}
    assert sorted(n.values()) == [4, 4, 8], n  # the cut round measured one model
    text = (out / "pick.md").read_text()
    table = {m.group(1): int(m.group(2)) for m in re.finditer(r"^\| [^|]+ \| ([^|]+) \| [^|]+\(n = (\d+) per cell\)",
                                                             text, re.M)}
    assert table == n, text
    ended = "the deadline came" if how == "deadline" else "the run was interrupted"
    assert f"({ended})" in text and "The race is not over" in text and "with `--resume` continues it" in text
    report = out / "final" / "report.md"
    assert report.stat().st_mtime_ns >= final.stat().st_mtime_ns
    cut = next(m for m, k in n.items() if k == 8)
    assert re.search(rf"^\| {re.escape(cut)} \| \d/8 ", report.read_text(), re.M), report.read_text()


def test_an_interrupt_between_a_models_cells_keeps_every_needle_in_its_cell_columns(llama, corpus, tmp_path,
                                                                                   monkeypatch):
    """Two passkey depths, Ctrl-C after the second round's first cell: that model's first cell has 8 needles, its
    second 4. pick.md's cell columns show each cell's own needles (as results.csv and the stage's report do), the
    pooled rate counts the needles every cell has, and a note names the needles measured past it."""
    from posenc.lab.extend.study.run import read_results

    _scripted(monkeypatch, {("yarn", 2.0): lambda i: 1, ("yarn", 4.0): lambda i: i % 2},
              screen_found={("yarn", 2.0): lambda i: 1, ("yarn", 4.0): lambda i: 1})
    cfg = _cfg(llama, corpus, methods=("yarn",), trials=40, depths=(0.25, 0.75))
    out = tmp_path / "pick"
    final = out / "final" / "results.csv"
    scripted = HFTarget.passkey

    def interrupted(self, model, length, *args, **kwargs):
        ahead = final.is_file() and any(r["n"] > 4 for r in read_results(final) if r["metric"] == "passkey")
        if length == 128 and ahead:
            raise KeyboardInterrupt
        return scripted(self, model, length, *args, **kwargs)

    monkeypatch.setattr(HFTarget, "passkey", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_pick(cfg, "2x", out, progress=False)
    rows = [r for r in read_results(final) if r["metric"] == "passkey"]
    cells = {(f"{r['method']} x{r['factor']:g}".replace("none x1", "none"), f"passkey @{r['depth']:g}"): r["n"]
             for r in rows}
    cut = [key for key, n in cells.items() if n == 8]
    assert len(cut) == 1 and sorted(cells.values()).count(4) == len(cells) - 1, cells  # one cell of one model ahead
    text = (out / "pick.md").read_text()
    columns, body = markdown_table(text, "|  | model |")
    table = {row[1]: dict(zip(columns, row, strict=True)) for row in body}
    for (model, cell), n in cells.items():
        assert re.match(rf"[\d.]+/{n} ", table[model][cell]), (model, cell, table[model])
    model = cut[0][0]
    assert "(n = 4 per cell)" in table[model]["needles at T (pooled)"]
    assert f"{model}: 4 needles of {cut[0][1]} measured past its pooled n = 4" in text, text


def test_an_interrupt_stays_an_interrupt_when_its_reports_cannot_be_written(llama, corpus, tmp_path, monkeypatch,
                                                                           capsys):
    """Rewriting the reports after Ctrl-C fails (a full disk, say): the interrupt still ends the run, and stderr says
    which reports were not rewritten."""
    from posenc.lab.extend.pick import run as pick_run

    def full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(pick_run, "_rewrite_stage_reports", full)
    monkeypatch.setattr(HFTarget, "passkey", lambda self, *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        run_pick(_cfg(llama, corpus, methods=("yarn",)), "2x", tmp_path / "pick", progress=False)
    err = capsys.readouterr().err
    assert f"the reports in {tmp_path / 'pick'} were not rewritten after the interrupt (OSError: No space" in err


def test_the_plan_writes_nothing_and_estimates_from_the_models_own_speed(llama, corpus, tmp_path, capsys,
                                                                         monkeypatch):
    """--plan times the model itself (two forwards, HFTarget.calibrate), writes nothing, and never refuses a budget:
    a budget is a deadline, not a price."""
    calibrated = []
    calibrate = HFTarget.calibrate
    monkeypatch.setattr(HFTarget, "calibrate", lambda self, lengths, report=None: calibrated.append(lengths) or
                        calibrate(self, lengths, report))
    cfg = _cfg(llama, corpus, trials=None)
    result = run_pick(cfg, "2x", tmp_path / "pick", progress=False, plan_only=True, budget="1s")
    assert not (tmp_path / "pick").exists() and calibrated == [[128]]
    plan = result["plan"]
    assert plan.cap == rules.DEFAULT_CAP and len(plan.candidates) == 13 and plan.calibrated
    text = capsys.readouterr().out
    assert re.search(r"About \d+:\d\d:\d\d in all \(at most \d+:\d\d:\d\d\), from timed forwards of the model "
                     "on this machine", text)
    assert "the pick and its strongest challenger to the cap, the others a round or two" in text
    assert "sampling stops at the deadline, 0:00:01 from the start (--budget)" in text
    assert plan.screen_seconds > 0 and plan.final_seconds > 0 and plan.seconds_per_unit > 0
    assert 0 < plan.race_seconds < plan.final_seconds and plan.about_seconds < plan.most_seconds


def test_the_plan_prints_the_candidates_before_the_first_timed_forward_then_a_line_per_forward(
        llama, corpus, tmp_path, capsys, monkeypatch):
    """--pick --plan loads the model and times its forwards (minutes each on a loaded CPU; a newcomer once waited 8-16
    minutes on a blank screen): the candidates and the left-out list come first, then a line as each forward ends,
    then the stages and the estimate."""
    from posenc.lab.extend.targets import hf as targets_module

    printed = []  # what was on stdout as each timed forward began
    forward = HFTarget._timed_forward

    def timed(self, n, *, warm_up, model=None):
        printed.append(capsys.readouterr().out)
        return forward(self, n, warm_up=warm_up, model=model)

    monkeypatch.setattr(HFTarget, "_timed_forward", timed)
    monkeypatch.setattr(targets_module.cost, "calibration_lengths", lambda longest: (64, 128))
    cfg = _cfg(llama, corpus, trials=None, methods=("yarn", "self_extend"))
    run_pick(cfg, "2x", tmp_path / "pick", progress=False, plan_only=True, save=tmp_path / "saved")
    rest = capsys.readouterr().out
    assert len(printed) == 2
    first = printed[0].splitlines()
    assert first[0].startswith("Pick for ") and "candidates (yarn x2" in first[0], first
    assert first[1].startswith("Left out: self_extend: no serving format records self_extend"), first
    assert re.fullmatch(r"Loading .+ \([\d,]+ MiB of weights\) to time its forwards on this machine for the estimate",
                        first[2]) and len(first) == 3, first
    assert re.fullmatch(r"  timed forward 1 of 2: 64 tokens in [\d.e+-]+ s\n", printed[1]), printed[1]
    lines = rest.splitlines()
    assert re.fullmatch(r"  timed forward 2 of 2: 128 tokens in [\d.e+-]+ s", lines[0]), lines
    assert lines[1].startswith("1. Screening") and lines[-1].startswith("About "), lines


def test_the_plan_expects_the_race_on_a_tie_and_every_model_to_the_cap_without_stopping(llama, corpus):
    """The race's expectation: LUCB on a tie (``racing.tied_race``: the unpatched reference 12 needles per cell until
    shown below, the pick and its strongest challenger the cap of 20; with two candidates, fewer than ``KEEP``, both are
    raced), each raced candidate at the candidates' mean cost, one perplexity forward each; with ``--stop-width 0``
    every model to the cap (the "at most"). The cost model is scripted (a forward costs its length), so the numbers
    are known."""
    import types

    from posenc.lab.extend.pick import plan as picking

    cfg = _cfg(llama, corpus, trials=20, task="ruler")
    costs = types.SimpleNamespace(forward_cost=lambda length: float(length))
    decided = picking.PickPlan(
        target=100, screen=50, candidates=[rules.Candidate("yarn", 2.0, ""), rules.Candidate("self_extend", 2.0, "")],
        left_out={}, depths=(0.5,), tuned=[], cap=20, seconds_per_unit=0.01, screen_seconds=0.0, final_seconds=0.0,
        finetune_seconds=0.0, budget=None, remap_cost=3.0,
    )
    got = picking.estimate(decided, costs, cfg)
    cells, mean = 2, (1.0 + 3.0) / 2  # passkey and RULER; the candidates' mean weight
    race_forwards = (1 + cells * 12) + mean * (1 + cells * 20) * 2
    assert got.race_seconds == pytest.approx(race_forwards * 100 * 0.01, rel=1e-12)
    most = (1 + 3.0 + 1.0) * (1 + cells * 20) * 100 * 0.01  # the two candidates' weights; KEEP is 4
    assert got.final_seconds == pytest.approx(most, rel=1e-12)
    fixed = picking.estimate(decided, costs, dataclasses.replace(cfg, stop_width=0.0))
    assert not dataclasses.replace(cfg, stop_width=0.0).adaptive and fixed.race_seconds == fixed.final_seconds


def test_the_plan_measures_a_remapping_forward_against_the_plain_one(llama, corpus, tmp_path, capsys, monkeypatch):
    """A remapping candidate's cost comes from one forward timed on this machine at the longest length calibrate
    timed (8192 tokens for a long target), against the plain one there, not extrapolated: the ratio levels off as
    attention dominates both (Self-Extend x4 on the idle Xeon: 1.96x at 8192, 2.01x at 20,480), while extrapolating
    it through fits of single timed forwards gave 2.0x-8.35x on different calibrations. The clock is scripted here,
    so the ratio is known: no timing is asserted."""
    import types

    from posenc.lab.extend.pick import plan as picking
    from posenc.lab.extend.targets import hf as targets_module

    timed = []

    def forward(self, n, *, warm_up, model=None):
        timed.append((n, warm_up, model is None))
        return (0.05 + 1e-3 * n + 1e-8 * n * n) * (1.0 if model is None else 2.5)

    monkeypatch.setattr(HFTarget, "_timed_forward", forward)
    monkeypatch.setattr(targets_module.cost, "calibration_lengths", lambda longest: (1024, 4096, 8192))
    cfg = _cfg(llama, corpus, trials=None, methods=("yarn", "self_extend"))
    plan = run_pick(cfg, "2x", tmp_path / "pick", progress=False, plan_only=True)["plan"]
    # the plain forwards, then one remapped forward (with its warm-up) at the longest length
    assert timed == [(1024, True, True), (4096, False, True), (8192, False, True), (8192, True, False)]
    assert plan.remap_cost == pytest.approx(2.5, rel=1e-12)
    plain = 0.05 + 1e-3 * 8192 + 1e-8 * 8192**2
    took = f"a 8192-token forward took {2.5 * plain:.3g} s against {plain:.3g} s plain, on this machine"
    assert plan.remap_measured == f"self_extend x2: {took}"
    text = capsys.readouterr().out
    assert f"a remapping candidate at 2.5x a frequency one per forward (self_extend x2: {took})" in text
    # the estimate weighs each remapping candidate by it: more than the constant 1.5 gives, on the same cost model
    costs = types.SimpleNamespace(forward_cost=lambda length: float(length), cfg=cfg)
    measured = picking.estimate(plan, costs, cfg)
    constant = picking.estimate(dataclasses.replace(plan, remap_cost=rules.REMAP_COST), costs, cfg)
    assert measured.screen_seconds > constant.screen_seconds and measured.final_seconds > constant.final_seconds
    monkeypatch.setattr(targets_module.cost, "calibration_lengths", lambda longest: (128,))  # one length: unmeasured
    assert run_pick(cfg, "2x", tmp_path / "pick", progress=False, plan_only=True)["plan"].remap_measured == ""


def test_the_plan_of_a_model_too_big_to_load_quickly_keeps_the_probes_estimate(llama, corpus, tmp_path,
                                                                               monkeypatch):
    """--plan loads a model to time it only up to LOAD_FOR_PLAN_BYTES of weights (parameters x bytes per element);
    above, nothing is loaded and the plan says the probe's estimate. (The guard once read an attribute no target has,
    so it never fired.)"""
    from posenc.lab.extend.pick import plan as pick_plan

    def refuse(self):
        raise AssertionError("--plan loaded the weights of a model above the limit")

    cfg = _cfg(llama, corpus, trials=None)
    monkeypatch.setattr(HFTarget, "load", refuse)
    monkeypatch.setattr(pick_plan, "LOAD_FOR_PLAN_BYTES", 0)
    plan = run_pick(cfg, "2x", tmp_path / "pick", progress=False, plan_only=True)["plan"]
    assert not plan.calibrated and not (tmp_path / "pick").exists()
    monkeypatch.undo()
    calls = []
    monkeypatch.setattr(HFTarget, "load", lambda self, load=HFTarget.load: (calls.append(1), load(self))[1])
    assert run_pick(cfg, "2x", tmp_path / "pick", progress=False, plan_only=True)["plan"].calibrated and calls


def test_save_limits_the_candidates_to_what_the_format_carries(llama, corpus, tmp_path):
    cfg = _cfg(llama, corpus, methods=("yarn", "self_extend", "dca"))
    result = run_pick(cfg, 128, tmp_path / "pick", progress=False, save=tmp_path / "saved", plan_only=True)
    plan = result["plan"]
    assert [(c.method, c.factor) for c in plan.candidates] == [("yarn", 2.0), ("yarn", 4.0)]
    assert "no serving format records self_extend" in plan.left_out["self_extend"]
    assert not (tmp_path / "pick").exists() and not (tmp_path / "saved").exists()


@pytest.mark.parametrize(
    ("settings", "target", "match"),
    [
        ({"lengths": (128,)}, "2x", "lengths=.*left out with --pick"),
        ({}, "64", "target='64' is invalid: expected a length beyond the original context of 64"),
        ({"methods": ("nope",)}, "2x", "methods=.* is invalid"),
        # the race's fine-tune is checked before screening runs: PoSE needs a window shorter than the target
        ({"finetune_steps": 2, "finetune_positions": ("pose",), "finetune_window": 128}, "2x", "finetune_window"),
    ],
)
def test_bad_pick_settings_fail_before_anything_is_written(llama, corpus, tmp_path, settings, target, match):
    with pytest.raises(ValueError, match=match):
        run_pick(_cfg(llama, corpus, **settings), target, tmp_path / "pick", progress=False)
    assert not (tmp_path / "pick").exists()


def test_cli_pick_one_line_errors(llama, corpus, tmp_path):
    out = tmp_path / "pick"  # the plan of a new (deciding) pick through the command line: test_pick_keys.py
    for args, match in ((["--target", "2x"], "--target='2x' is invalid: expected a setting of --pick"),
                        (["--pick"], "--target=None is invalid"),
                        (["--pick", "--target", "3"], "target='3' is invalid"),
                        (["--pick", "--target", "2x", "--budget", "soon"], "budget='soon' is invalid")):
        code, text = _cli("extend", str(llama), *args, "--corpus", str(corpus), "--out", str(out))
        assert code == 2 and text.count("\n") == 1 and match in text and "Traceback" not in text, text
        assert not out.exists()
    assert torch.get_num_threads() == 1


def test_a_gguf_pick_competes_only_with_what_llamacpp_runs_and_writes_the_file(corpus, tmp_path):
    from hf.tiny import tiny_model
    from hf.tiny_gguf import write_llama
    from posenc.hf import inspect_gguf

    gguf = write_llama(tmp_path / "tiny.gguf", tiny_model("llama"))
    original = inspect_gguf(gguf)["context_length"]
    cfg = ExtendConfig(model=str(gguf), corpus=str(corpus), **{**SETTINGS, "depths": (0.5,), "trials": 4})
    planned = run_pick(cfg, "5x", tmp_path / "plan", progress=False, save=tmp_path / "x.gguf", plan_only=True)
    assert {c.method for c in planned["plan"].candidates} == {"linear", "ntk", "yarn", "llama3"}
    assert "llama.cpp runs no GGUF key" in planned["plan"].left_out["dynamic"]
    assert "llama.cpp runs no GGUF key" in planned["plan"].left_out["self_extend"]
    cfg = ExtendConfig(model=str(gguf), corpus=str(corpus), methods=("yarn", "dynamic"),
                       **{**SETTINGS, "depths": (0.5,), "trials": 4})
    result = run_pick(cfg, "5x", tmp_path / "pick", progress=False, save=tmp_path / "x.gguf")
    assert result["unit"][0] == "yarn" and result["saved"] == tmp_path / "x.gguf"
    written = inspect_gguf(tmp_path / "x.gguf")
    assert written["context_length"] == round(original * result["unit"][1])
    assert "llama-cli -m" in (tmp_path / "pick" / "pick.md").read_text()


def test_stop_width_zero_gives_every_race_cell_its_cap(llama, corpus, tmp_path):
    """--stop-width 0 (a fixed design, e.g. n = 100 for a study) is kept, never replaced by the default: every raced
    model gets the cap, none stops early."""
    cfg = _cfg(llama, corpus, methods=("yarn",), trials=8, stop_width=0.0)
    run_pick(cfg, "2x", tmp_path / "pick", progress=False)
    assert json.loads((tmp_path / "pick" / "pick.json").read_text())["stop_width"] == 0.0
    final = json.loads((tmp_path / "pick" / "final" / "extend.json").read_text())
    from posenc.lab.extend.study.run import read_results

    rows = read_results(tmp_path / "pick" / "final" / "results.csv")
    assert sorted(r["n"] for r in rows if r["metric"] == "passkey") == [8] * len(final["units"])


def test_a_deadline_in_the_races_first_pass_picks_nothing_and_resumes(llama, corpus, tmp_path, monkeypatch):
    """With --stop-width 0 too: a deadline that passes once the race's first model is measured leaves the others
    unmeasured, so nothing is picked from a partial race ("not finished"); --resume measures the rest."""
    from posenc.lab.extend.pick import racing
    from posenc.lab.extend.study.run import read_results

    cfg = _cfg(llama, corpus, methods=("yarn",), trials=8, stop_width=0.0)
    final = tmp_path / "pick" / "final" / "results.csv"
    passed = racing.Deadline.passed
    monkeypatch.setattr(racing.Deadline, "passed", lambda self: final.is_file())
    cut = run_pick(cfg, "2x", tmp_path / "pick", budget="1h", progress=False)
    assert cut["pick"] is None and cut["stage"] == "the race's first round"
    assert "not finished" in (tmp_path / "pick" / "pick.md").read_text()
    assert len({r["method"] for r in read_results(final)}) == 1
    monkeypatch.setattr(racing.Deadline, "passed", passed)
    resumed = run_pick(cfg, "2x", tmp_path / "pick", resume=True, progress=False)
    rows = read_results(final)
    assert resumed["pick"] is not None and {r["n"] for r in rows if r["metric"] == "passkey"} == {8}


def test_a_pose_fine_tuned_yarn_joins_the_race(llama, corpus, tmp_path):
    """--finetune-steps adds YaRN at the target fine-tuned with PoSE's positions in a shorter window: it skips
    screening (a fine-tune is the expensive option) and is raced and ranked with the zero-shot survivors."""
    cfg = _cfg(llama, corpus, methods=("ntk",), trials=4, finetune_steps=2, finetune_window=48,
               finetune_positions=("pose",))
    result = run_pick(cfg, "2x", tmp_path / "pick", progress=False)
    final = json.loads((tmp_path / "pick" / "final" / "extend.json").read_text())
    assert ["yarn", 2.0, 2, "pose"] in final["units"] and final["finetune_window"] == 48
    ppl = json.loads((tmp_path / "pick" / "screen-ppl" / "extend.json").read_text())
    assert ppl["finetune_steps"] == 0 and ["yarn", 2.0, 2, "pose"] not in ppl["units"]
    assert "yarn x2 +ft2 pose" in [r["model"] for r in result["standings"]]
    assert (tmp_path / "pick" / "final" / "runs").is_dir()


def test_a_ruler_pick_without_lm_eval_fails_first_with_the_pip_command(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # `import lm_eval` raises ImportError
    cfg = ExtendConfig(model=str(tmp_path / "nowhere"), task="ruler", device="cpu")
    with pytest.raises(ValueError, match=r'pip install "lm-eval\[ruler\]==0.4.13"'):
        run_pick(cfg, "2x", tmp_path / "pick", progress=False)
    assert not (tmp_path / "pick").exists()


def test_pick_md_says_once_that_length_dependent_answers_come_from_cached_generation():
    """Dynamic NTK and DCA (its logit factor) both follow the length, so both are named; other methods are not."""
    from posenc.lab.extend.pick.report import stale_cache_note

    names = ("none x1", "yarn x2", "self_extend x4", "dynamic x2", "dynamic+string x2", "dynamic x4", "dca x4")
    unit = {name: (name.split()[0], float(name.split("x")[-1]), 0, "plain") for name in names}
    assert stale_cache_note([unit["none x1"], unit["yarn x2"], unit["self_extend x4"]]) == []
    [note] = stale_cache_note([unit["dynamic x2"], unit["dynamic+string x2"], unit["yarn x2"]])
    assert note.startswith("dynamic x2, dynamic+string x2: answers generated with the KV cache while dynamic NTK's")
    assert "CacheStaleWarning" in note and "DCA" not in note and " follows each step's length" in note
    [note] = stale_cache_note([unit["dca x4"]])
    assert note.startswith("dca x4: answers generated with the KV cache while DCA's logit factor follows each step's")
    [note] = stale_cache_note([unit["dynamic x4"], unit["dca x4"]])
    assert note.startswith("dynamic x4, dca x4: ")
    assert "YaRN section 3.3) and DCA's logit factor follow each step's length" in note


def test_a_pick_by_best_estimate_says_which_method_has_the_higher_p_best_and_why():
    """The 32k race after its eighth sitting: YaRN+STRING 8/8 + 7/8 (n = 8 per cell) is the best pooled estimate,
    dynamic 20/20 + 17/20 (n = 20) has the higher P(best): the reason names dynamic's P(best) and the cause (the
    pick's fewer needles, pulled further toward 50% by the uniform priors); with P(best) agreeing, nothing is added."""
    from types import SimpleNamespace

    import numpy as np

    from posenc.lab.extend.pick import rules

    def standing(unit, estimate, n, p_best, serving):
        return rules.Standing(unit=unit, estimate=estimate, interval=(0.4, 1.0), n=n, by_metric={}, ppl_past=None,
                              serving=serving, active=True, beaten_by=None, p_best=p_best, loss=0.08)

    units = [("none", 1.0, 0, "plain"), ("dynamic", 4.0, 0, "plain"), ("yarn+string", 4.0, 0, "plain")]
    name = lambda u: f"{u[0]} x{u[1]:g}"  # noqa: E731
    verdict = SimpleNamespace(pick=np.array([2]), shown=np.array([False]), low=np.full((1, 3, 3), -0.7),
                              high=np.full((1, 3, 3), 0.7))
    for p_dynamic, p_string, said in ((0.45, 0.34, True), (0.3, 0.7, False)):
        standings = [standing(units[2], 15 / 16, 8, p_string, "patch"), standing(units[1], 37 / 40, 20, p_dynamic,
                     "dynamic"), standing(units[0], 0.0, 12, 0.0, "unpatched")]
        outcome = rules.decide(standings, verdict, units, name, ended="interrupted")
        assert outcome.pick.unit == units[2] and not outcome.shown
        note = ("dynamic x4 has the higher P(best), 0.45 (with 8 needles per cell against 20, the uniform priors "
                "behind P(best) pull yarn+string x4's posterior further toward 50%); the pick is the best estimate")
        assert (note in outcome.reason) is said, outcome.reason
        assert ("has the higher P(best)" in outcome.reason) is said


def test_targets_past_the_text_and_saves_under_a_file_are_refused_before_anything(llama, corpus, tmp_path):
    """From the audit: --target 131072 past the held-out text blamed --lengths (a flag --pick refuses), --target
    1000001x became 512 million tokens silently, and --save under a file failed after the measuring -- each now one
    error naming the setting, before anything is written; a multiple keeps its digits in messages (not 1e+06x)."""
    cfg = _cfg(llama, corpus)
    for target in ("131072", "1000001x"):
        with pytest.raises(ValueError, match=rf"^target='{target}' is invalid: expected a length the held-out text "
                                             r"can fill: .* held-out tokens, so at most \d+"):
            run_pick(cfg, target, tmp_path / "pick", progress=False)
        assert not (tmp_path / "pick").exists()
    (tmp_path / "file").write_text("mine")
    with pytest.raises(ValueError, match=r"save=.*file/x.* is invalid: expected a path under folders"):
        run_pick(cfg, "2x", tmp_path / "pick", progress=False, save=tmp_path / "file" / "x")
    assert not (tmp_path / "pick").exists() and (tmp_path / "file").read_text() == "mine"
    with pytest.raises(ValueError, match=r"lengths='1000001x0' is invalid"):
        ExtendConfig(model="m", lengths=("1000001x0",))
    assert ExtendConfig(model="m", lengths=("1000001x",)).lengths == ("1000001x",)


def test_a_gemma3_pick_races_remapping_methods_on_its_global_layers(corpus, tmp_path):
    """Gemma 3 takes remapping methods on its full_attention layers (the sliding ones keep their window): the pick
    offers them beside the frequency methods, each checked on a weight-free copy of the model."""
    gemma = _hf_folder(tmp_path / "gemma3", kind="gemma3")
    cfg = ExtendConfig(model=str(gemma), corpus=str(corpus), **{**SETTINGS, "trials": 4})
    plan = run_pick(cfg, "2x", tmp_path / "pick", progress=False, plan_only=True)["plan"]
    methods = {c.method for c in plan.candidates}
    assert set(rules.FREQUENCY_CANDIDATES) <= methods
    assert {"self_extend", "dca", "rerope", "leaky_rerope", "lm_infinite"} <= methods
    assert "remapping methods" not in plan.left_out
