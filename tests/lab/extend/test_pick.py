"""``posenc extend MODEL --target T --pick``: the rules on made-up rows (candidates, screening, caps, the pick), then
the whole pick end to end on a tiny transformers Llama made here: plan before loading, stages, resume, save, CLI."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from lab.extend.test_study import TINY, _cli, _hf_folder
from posenc.lab.extend import pick as rules
from posenc.lab.extend.config import ExtendConfig
from posenc.lab.extend.picking import run_pick
from posenc.lab.extend.rates import Rate
from posenc.lab.extend.targets import HFTarget

pytestmark = pytest.mark.usefixtures("one_thread")
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
                                               ("2h30m", 9000), (None, None)])  # fmt: skip
def test_budgets_read_as_seconds(text, seconds):
    assert rules.parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "0m", "h", "1d", "-5", "ten"])
def test_bad_budgets_are_refused(text):
    with pytest.raises(ValueError, match=r"budget=.* is invalid"):
        rules.parse_budget(text)


def test_candidates_follow_the_model_and_the_save():
    names = lambda cs: [(c.method, c.factor) for c in cs]  # noqa: E731
    llama, left = rules.candidates(8192, 16384, model_type="llama", remapping=True)
    assert names(llama) == [("linear", 2), ("ntk", 2), ("dynamic", 2), ("yarn", 2), ("yarn", 4), ("llama3", 2),
                            ("self_extend", 2), ("self_extend", 4), ("dca", 2), ("rerope", 2), ("leaky_rerope", 2),
                            ("lm_infinite", 2), ("yarn+string", 2)]  # fmt: skip
    assert "longrope" in left and "search" in left["longrope"]
    assert "at most 16256 tokens for STRING" in left["string"] and "cannot retrieve" in left["streaming_llm"]
    near, left = rules.candidates(8192, 12288, model_type="llama", remapping=True)
    assert ("string", 1.5) in names(near) and "string" not in left and ("yarn+string", 1.5) in names(near)
    qwen, _ = rules.candidates(8192, 32768, model_type="qwen2", remapping=True)
    assert ("dca_vllm", 4) in names(qwen) and ("dca_vllm", 4) not in names(llama)
    gpt2, _ = rules.candidates(1024, 2048, model_type="gpt2", remapping=False)
    assert {c.method for c in gpt2} == set(rules.FREQUENCY_CANDIDATES)
    folder, left = rules.candidates(8192, 16384, model_type="qwen2", remapping=True,
                                    savable=lambda m: None if m in ("yarn", "dca_vllm") else "cannot")  # fmt: skip
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
            "length": length, "status": "ok"}  # fmt: skip
    out = []
    if ppl is not None:
        out.append({**base, "metric": "ppl_past", "depth": None, "ppl": ppl, "accuracy": None, "hits": None, "n": 1})
    if keys is not None:
        hits, n = keys
        out.append({**base, "metric": metric, "depth": depth if metric == "passkey" else None, "ppl": None,
                    "accuracy": hits / n, "hits": hits, "n": n})  # fmt: skip
    return out


def _u(method, factor=2.0):
    return (method, factor, 0, "plain")


def test_screening_drops_broken_perplexity_and_passkeys_beyond_noise_then_keeps_the_best():
    units = [_u("linear"), _u("ntk"), _u("yarn"), _u("dca"), _u("rerope"), _u("lm_infinite")]
    data = {"linear": (5.0, (4, 4)), "ntk": (10.5, (4, 4)), "yarn": (5.5, (3, 4)), "dca": (6.0, (0, 8)),
            "rerope": (6.0, (4, 4)), "lm_infinite": (7.0, (2, 4))}  # fmt: skip
    rows = [r for u in units for r in _rows(u, 128, ppl=data[u[0]][0]) + _rows(u, 96, keys=data[u[0]][1])]
    verdicts = {v.unit[0]: v for v in rules.survivors(rows, units, target=128, screen=96, keep=3)}
    assert "2x the best (5)" in verdicts["ntk"].why and not verdicts["ntk"].kept  # 10.5 > 2 x 5.0
    assert "beyond noise below" in verdicts["dca"].why  # 0/8 [0-32] vs 4/4 [51-100]
    # the rest ranked: passkey 4/4 (linear 5.0, rerope 6.0), 3/4 yarn, 2/4 lm_infinite (within noise of 4/4)
    assert [k for k, v in verdicts.items() if v.kept] == ["linear", "yarn", "rerope"]
    assert verdicts["lm_infinite"].why == "ranked 4 of 4 in screening; 3 go on"
    with pytest.raises(ValueError, match="screening rows for every candidate"):
        rules.survivors(rows, [*units, _u("llama3")], target=128, screen=96)


def test_caps_fit_the_budget_in_whole_rounds():
    cap = rules.caps(1000.0, fixed=100.0, per_model=10.0, models=5, cells=2, sample=2.0, floor=4)
    assert cap == 40  # (1000 - 100 - 50) / (5 x 2 x 2) = 42.5 -> whole rounds of 4
    assert 100 + 5 * (10 + 2 * cap * 2) <= 1000
    assert rules.caps(None, fixed=0, per_model=1, models=1, cells=1, sample=1, floor=4) == rules.DEFAULT_CAP
    assert rules.caps(1e9, fixed=0, per_model=1, models=1, cells=1, sample=1, floor=4) == rules.MAX_CAP
    with pytest.raises(ValueError, match=r"budget='200 s' is invalid: expected at least 230 s"):
        rules.caps(200.0, fixed=100.0, per_model=10.0, models=5, cells=1, sample=4.0, floor=4)


def _standings(spec):
    rows = []
    for method, (hits, n, ppl) in spec.items():
        unit = _u(method)
        rows += _rows(unit, 128, ppl=ppl, keys=(hits, n))
    return rules.standings(rows, [_u(m) for m in spec], target=128, model_type="llama")


def test_the_pick_is_the_best_beyond_noise_or_the_cheapest_to_serve_among_the_tied():
    name = lambda u: u[0]  # noqa: E731
    clear = rules.choose(_standings({"none": (0, 20, 90.0), "yarn": (4, 20, 5.0), "self_extend": (19, 20, 6.0)}),
                         name)  # fmt: skip
    assert clear.pick.unit[0] == "self_extend" and clear.runner_up.unit[0] == "yarn"
    assert "beyond noise above every other method (yarn)" in clear.reason
    assert clear.reason.endswith("the unpatched model finds 0/20 0% [0-16], beyond noise below it: the method "
                                 "rescues retrieval")  # fmt: skip
    close = rules.choose(_standings({"none": (3, 4, 90.0), "yarn": (4, 4, 5.0)}), name)
    assert close.reason.endswith("within noise of it: that it rescues retrieval at all is not shown at this n")
    nothing = rules.choose(_standings({"none": (0, 8, 90.0), "yarn": (0, 8, 5.0), "ntk": (0, 8, 6.0)}), name)
    assert nothing.reason.endswith("No method found a needle at the target: nothing here rescues retrieval at this "
                                   "length")  # fmt: skip
    # 18/20 and 20/20 are within noise: the frequency config (every engine reads it) beats the run-time patch.
    tied = rules.choose(_standings({"none": (0, 20, 90.0), "self_extend": (20, 20, 6.0), "yarn": (18, 20, 5.0),
                                    "dynamic": (19, 20, 5.0)}), name)  # fmt: skip
    assert tied.pick.unit[0] == "yarn" and len(tied.tied) == 3
    assert "cheapest of them to serve" in tied.reason and "self_extend" in tied.reason
    assert "(the highest point estimate, self_extend, is not beyond noise of it)" in tied.reason
    assert Rate(18, 20).beyond_noise(Rate(20, 20)) is False
    with pytest.raises(ValueError, match="needle rates at the target"):
        rules.choose(_standings({"none": (0, 4, 9.0)}), name)


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
                                                                   **settings})  # fmt: skip


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
    # each stage's plan line names only what that stage measures
    assert "Plan: 6 models (none, linear x2, yarn x2, yarn x4, self_extend x2, self_extend x4) x perplexity at " \
        "lengths 128 (original 64): 6 forwards" in text
    assert "x passkey (1 depth x 4 keys) at lengths 96 (original 64)" in text
    settings = json.loads((out / "pick.json").read_text())
    assert settings["command"] == "posenc extend --pick" and settings["target"] == 128 and settings["screen"] == 96
    assert settings["cap"] == 8
    ppl = json.loads((out / "screen-ppl" / "extend.json").read_text())
    assert ppl["measurements"] == [["ppl", 128, None]] and len(ppl["units"]) == 6  # 5 candidates + unpatched
    keys = json.loads((out / "screen-passkey" / "extend.json").read_text())
    assert keys["measurements"] == [["passkey", 96, 0.5]] and keys["trials"] == 4 and keys["stop_width"] == 0.0
    final = json.loads((out / "final" / "extend.json").read_text())
    kept = [u for u in final["units"] if u[0] != "none"]
    assert 1 <= len(kept) <= rules.KEEP
    assert final["measurements"] == [["ppl", 128, None], ["passkey", 128, 0.5]] and final["trials"] == 8
    report = (out / "pick.md").read_text()
    assert f"## The pick: {result['pick']}" in report and "## Screening" in report and "## Run it elsewhere" in report
    assert result["pick"] in text and result["reason"] in report
    # every model of the race, the unpatched one included, in the ranked table with n and an interval
    assert len(result["standings"]) == len(kept) + 1
    assert all(r["needles"] == "n/a" or "[" in r["needles"] for r in result["standings"])
    # resumed: nothing measured again, the same pick; --save writes it
    before = len(loads)
    again = run_pick(cfg, "2x", out, resume=True, progress=False, save=tmp_path / "saved")
    assert again["pick"] == result["pick"] and again["saved"] == tmp_path / "saved"
    assert len(loads) - before == 4  # each stage loads (nothing left to measure), then the save
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    method = result["unit"][0]
    if method != "self_extend":  # a frequency method: its config carries it
        assert config["rope_parameters"]["rope_type"] in ("linear", "yarn")


def test_save_limits_the_candidates_to_what_the_format_carries(llama, corpus, tmp_path):
    cfg = _cfg(llama, corpus, methods=("yarn", "self_extend", "dca"))
    result = run_pick(cfg, 128, tmp_path / "pick", progress=False, save=tmp_path / "saved", plan_only=True)
    plan = result["plan"]
    assert [(c.method, c.factor) for c in plan.candidates] == [("yarn", 2.0), ("yarn", 4.0)]
    assert "no serving format records self_extend" in plan.left_out["self_extend"]
    assert not (tmp_path / "pick").exists() and not (tmp_path / "saved").exists()


def test_plan_only_writes_nothing_and_the_budget_sets_the_cap(llama, corpus, tmp_path, capsys, monkeypatch):
    from posenc.lab.extend import plan as plan_module

    probed = []
    monkeypatch.setattr(plan_module, "probe_seconds_per_unit", lambda *a, **k: probed.append(a) or 1e-3)
    cfg = _cfg(llama, corpus, trials=None)
    result = run_pick(cfg, "2x", tmp_path / "pick", progress=False, plan_only=True)
    assert not (tmp_path / "pick").exists()
    plan = result["plan"]
    assert plan.cap == rules.DEFAULT_CAP and len(plan.candidates) == 13
    text = capsys.readouterr().out
    assert "At most" in text and "before any weight is loaded" in text and "(1 ms per token-equivalent)" in text
    dims, dtype, device = probed[0]
    assert dims.hidden == 32 and dtype == torch.float32 and device == "cpu"
    # 14 models (7 of the candidates remapping ones, at REMAP_COST each) x (a 128-token forward, 4 keys at 96) + the
    # race's 5 at most (the unpatched one and the 4 costliest candidates) x (1 + 20 keys) at 128, in token-equivalents
    cost = lambda n: n * (1 + n / dims.l0)  # noqa: E731
    remap = sum(1 for c in plan.candidates if c.method in rules.REMAP_CANDIDATES)
    assert remap == 7 and rules.REMAP_COST > 1
    units = 1 + (13 - remap) + remap * rules.REMAP_COST
    assert plan.screen_seconds == pytest.approx(units * (cost(128) + 4 * cost(96)) * 1e-3)
    assert plan.final_seconds == pytest.approx((1 + 4 * rules.REMAP_COST) * 21 * cost(128) * 1e-3)
    total = plan.screen_seconds + plan.final_seconds
    budgeted = run_pick(cfg, "2x", tmp_path / "pick", budget=f"{math.ceil(2 * total)}", plan_only=True,
                        progress=False)["plan"]  # fmt: skip
    assert budgeted.cap >= rules.DEFAULT_CAP and budgeted.cap % 4 == 0
    assert budgeted.screen_seconds + budgeted.final_seconds <= 2 * total + 1
    with pytest.raises(ValueError, match=r"budget=.* is invalid: expected at least"):
        run_pick(cfg, "2x", tmp_path / "pick", budget="1s", plan_only=True, progress=False)


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


def test_cli_pick_plan_and_one_line_errors(llama, corpus, tmp_path):
    out = tmp_path / "pick"
    code, text = _cli("extend", str(llama), "--pick", "--target", "2x", "--plan", "--corpus", str(corpus),
                      "--depths", "0.5", "--device", "cpu", "--out", str(out))  # fmt: skip
    assert code == 0 and "Pick for" in text and "At most" in text and not out.exists()
    for args, match in ((["--target", "2x"], "--target='2x' is invalid: expected a setting of --pick"),
                        (["--pick"], "--target=None is invalid"),
                        (["--pick", "--target", "3"], "target='3' is invalid"),
                        (["--pick", "--target", "2x", "--budget", "soon"], "budget='soon' is invalid")):  # fmt: skip
        code, text = _cli("extend", str(llama), *args, "--corpus", str(corpus), "--out", str(out))
        assert code == 2 and text.count("\n") == 1 and match in text and "Traceback" not in text, text
        assert not out.exists()
    assert torch.get_num_threads() == 1


def test_an_interrupted_pick_resumes_to_the_same_answer(llama, corpus, tmp_path, monkeypatch, capsys):
    """Ctrl-C (KeyboardInterrupt) in the race: every finished measurement is kept, a resumed --plan counts what is
    left (writing nothing), and --resume ends with the same table as a pick that ran straight through."""
    from posenc.lab.extend import plan as plan_module

    cfg = _cfg(llama, corpus, methods=("linear", "yarn"))
    straight = run_pick(cfg, "2x", tmp_path / "straight", progress=False)
    calls = []
    passkey = HFTarget.passkey

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 6:  # in the race, after the screening's keys
            raise KeyboardInterrupt
        return passkey(self, *args, **kwargs)

    monkeypatch.setattr(HFTarget, "passkey", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_pick(cfg, "2x", tmp_path / "cut", progress=False)
    assert (tmp_path / "cut" / "final" / "results.csv").exists() and not (tmp_path / "cut" / "pick.md").exists()
    monkeypatch.setattr(HFTarget, "passkey", passkey)
    with pytest.raises(ValueError, match="a new folder, or --resume"):
        run_pick(cfg, "2x", tmp_path / "cut", progress=False)
    before = sorted((p, p.stat().st_mtime_ns) for p in (tmp_path / "cut").rglob("*"))
    capsys.readouterr()
    monkeypatch.setattr(plan_module, "probe_seconds_per_unit", lambda *a, **k: 1.0)  # estimates in whole seconds
    planned = run_pick(cfg, "2x", tmp_path / "cut", resume=True, progress=False, plan_only=True)["plan"]
    text = capsys.readouterr().out
    assert sorted((p, p.stat().st_mtime_ns) for p in (tmp_path / "cut").rglob("*")) == before  # nothing written
    match = re.search(r"screening has perplexity for (\d+) of 4 models and (\d+) of (\d+) passkeys; the race has "
                      r"(\d+) samples and (\d+) perplexity forwards\. Left: at most (.+)$", text, re.M)  # fmt: skip
    assert match, text
    assert match[1] == "4" and match[2] == match[3] and int(match[4]) + int(match[5]) >= 1  # cut in the race
    whole = plan_module.duration_text(planned.screen_seconds + planned.final_seconds)
    assert f"At most {whole} in all" in text and match[6] != whole
    resumed = run_pick(cfg, "2x", tmp_path / "cut", resume=True, progress=False)
    assert resumed["standings"] == straight["standings"] and resumed["pick"] == straight["pick"]


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
                       **{**SETTINGS, "depths": (0.5,), "trials": 4})  # fmt: skip
    result = run_pick(cfg, "5x", tmp_path / "pick", progress=False, save=tmp_path / "x.gguf")
    assert result["unit"][0] == "yarn" and result["saved"] == tmp_path / "x.gguf"
    written = inspect_gguf(tmp_path / "x.gguf")
    assert written["context_length"] == round(original * result["unit"][1])
    assert "llama-cli -m" in (tmp_path / "pick" / "pick.md").read_text()


def test_a_resumed_pick_keeps_its_budget_and_cap_whatever_the_machine_speed_now(llama, corpus, tmp_path,
                                                                               monkeypatch):  # fmt: skip
    from posenc.lab.extend import plan as plan_module

    speed = {"s": 1e-3}
    monkeypatch.setattr(plan_module, "probe_seconds_per_unit", lambda *a, **k: speed["s"])
    cfg = _cfg(llama, corpus, methods=("yarn",), trials=None)
    first = run_pick(cfg, "2x", tmp_path / "pick", budget="60s", progress=False)
    stored = json.loads((tmp_path / "pick" / "pick.json").read_text())
    assert stored["budget"] == "60s" and stored["cap"] == first["cap"] >= 4
    speed["s"] = 10.0  # 10,000x slower today: the budget would not buy one round
    with pytest.raises(ValueError, match="budget='60 s' is invalid"):
        run_pick(cfg, "2x", tmp_path / "other", budget="60s", progress=False)
    again = run_pick(cfg, "2x", tmp_path / "pick", resume=True, progress=False)  # --budget left out: the stored one
    assert again["cap"] == first["cap"] and again["standings"] == first["standings"]
    with pytest.raises(ValueError, match=r"these differ: \['budget'\]"):
        run_pick(cfg, "2x", tmp_path / "pick", budget="2h", resume=True, progress=False)


def test_stop_width_zero_gives_every_race_cell_its_cap(llama, corpus, tmp_path):
    """--stop-width 0 (fixed counts, e.g. n = 100 for a study) is kept, never replaced by the default."""
    cfg = _cfg(llama, corpus, methods=("yarn",), trials=8, stop_width=0.0)
    run_pick(cfg, "2x", tmp_path / "pick", progress=False)
    final = json.loads((tmp_path / "pick" / "final" / "extend.json").read_text())
    assert final["stop_width"] == 0.0
    from posenc.lab.extend.study import read_results

    rows = read_results(tmp_path / "pick" / "final" / "results.csv")
    assert sorted(r["n"] for r in rows if r["metric"] == "passkey") == [8] * len(final["units"])


def test_a_scripted_race_stops_each_cell_once_decided_and_picks_the_clear_winner(llama, corpus, tmp_path, monkeypatch):
    """Passkey answers scripted by model: screening at 96 tokens drops linear (0/4 against 4/4, beyond noise); at the
    target yarn x2 finds every key, yarn x4 half, ntk and the unpatched model none. The race stops the unpatched
    model and ntk after one round (disjoint from the best), yarn x4 once its interval clears the best's, the best
    once narrow (<= 0.3), and the pick is yarn x2, beyond noise."""
    which = {}
    patched = HFTarget.patched

    def tagged(self, method, factor):
        model, described = patched(self, method, factor)
        which[id(model)] = (method, factor)
        return model, described

    def passkey(self, model, length, depth, seed, tick=None):
        method = which.get(id(model), ("none", 1.0))
        if length == 96:
            return 0.0 if method[0] in ("linear", "none") else 1.0
        return {("yarn", 2.0): 1.0, ("yarn", 4.0): 0.5}.get(method, 0.0)

    monkeypatch.setattr(HFTarget, "patched", tagged)
    monkeypatch.setattr(HFTarget, "passkey", passkey)
    cfg = _cfg(llama, corpus, methods=("linear", "ntk", "yarn"), trials=20)
    result = run_pick(cfg, "2x", tmp_path / "pick", progress=False)
    from posenc.lab.extend.study import read_results

    rows = read_results(tmp_path / "pick" / "final" / "results.csv")
    n = {(r["method"], r["factor"]): r["n"] for r in rows if r["metric"] == "passkey"}
    assert n == {("none", 1.0): 4, ("ntk", 2.0): 4, ("yarn", 2.0): 12, ("yarn", 4.0): 12}
    assert result["pick"] == "yarn x2" and "beyond noise above every other method" in result["reason"]
    assert "the method rescues retrieval" in result["reason"]
    report = (tmp_path / "pick" / "pick.md").read_text()
    assert "| linear x2 |" in report and "beyond noise below the best (4/4" in report
    assert "| **pick** | yarn x2 | 12/12 100% [76-100] |" in report


def test_a_pose_fine_tuned_yarn_joins_the_race(llama, corpus, tmp_path):
    """--finetune-steps adds YaRN at the target fine-tuned with PoSE's positions in a shorter window: it skips
    screening (a fine-tune is the expensive option) and is raced and ranked with the zero-shot survivors."""
    cfg = _cfg(llama, corpus, methods=("ntk",), trials=4, finetune_steps=2, finetune_window=48,
               finetune_positions=("pose",))  # fmt: skip
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


def test_needles_pool_passkey_depths_and_ruler_tasks_each_weighing_the_same():
    unit = _u("yarn")
    rows = (_rows(unit, 128, ppl=5.0, keys=(4, 4), depth=0.25) + _rows(unit, 128, keys=(2, 4), depth=0.75)
            + _rows(unit, 128, keys=(3.5, 8), metric="ruler:niah_single_1") + _rows(unit, 96, keys=(0, 4)))  # fmt: skip
    (standing,) = rules.standings(rows, [unit], target=128, model_type="llama")
    assert list(standing.by_metric) == ["passkey", "ruler:niah_single_1"]
    assert standing.by_metric["passkey"] == Rate(6, 8)  # the depths pooled; the 96-token row is not at the target
    assert standing.by_metric["ruler:niah_single_1"] == Rate(3.5, 8)
    assert standing.needles == Rate(9.5, 16) and standing.ppl_past == 5.0 and standing.serving == "config"


def test_cli_pick_runs_into_a_pick_folder_and_prints_the_pick(llama, corpus, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, text = _cli("extend", str(llama), "--pick", "--target", "2x", "--methods", "yarn", "--trials", "4",
                      "--depths", "0.5", "--corpus", str(corpus), "--device", "cpu")  # fmt: skip
    assert code == 0, text
    (folder,) = (tmp_path / "runs").iterdir()
    assert folder.name.startswith("pick-") and (folder / "pick.json").is_file() and (folder / "pick.md").is_file()
    assert "Pick: yarn x" in text and "| **pick** |" in text


def test_pick_md_says_once_that_dynamic_answers_come_from_cached_generation():
    from posenc.lab.extend.picking import stale_cache_note

    assert stale_cache_note([("none", 1.0, 0, "plain"), ("yarn", 2.0, 0, "plain")]) == []
    [note] = stale_cache_note([("dynamic", 2.0, 0, "plain"), ("dynamic+string", 2.0, 0, "plain")])
    assert note.startswith("dynamic x2, dynamic+string x2: answers generated with the KV cache")
    assert "CacheStaleWarning" in note
