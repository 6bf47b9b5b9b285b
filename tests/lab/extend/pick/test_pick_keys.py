"""The deciding pick (every new ``--pick``): the perplexity screen, the cost inside the context and the race on
documents of keys, end to end on a tiny transformers Llama, with each model's answers scripted per document and key
(``HFTarget.keys`` replaced) so that the truth is known: shown better, shown within delta (the cheapest picked), no
candidate retrieving, a deadline and an interrupt resumed to the same answer, ``--keep-short``. The statistics are
simulated in ``tests/lab/extend/stats/test_paired.py``; the documents themselves in ``needles/test_keys.py``."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import random
from types import SimpleNamespace

import pytest

from lab.extend.pick.tagged import tag_patched
from lab.extend.study.test_study import TINY, _cli, _hf_folder
from posenc.lab.common import evaluate as ev
from posenc.lab.extend.pick import evidence, inside
from posenc.lab.extend.pick.run import run_pick as _run_pick
from posenc.lab.extend.settings.config import ExtendConfig
from posenc.lab.extend.targets.hf import HFTarget

pytestmark = pytest.mark.usefixtures("one_thread")
SETTINGS = {k: v for k, v in TINY.items() if k not in ("trials", "eval_tokens")}
TARGET = 128  # "2x" of the tiny Llama's 64
#: The scripted races read documents of 8 keys (the default is one); a test that runs real documents says its own.
run_pick = functools.partial(_run_pick, keys=8)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return _hf_folder(tmp_path_factory.mktemp("llama"))


def _cfg(llama, corpus, **settings):
    return ExtendConfig(model=str(llama), corpus=str(corpus), **{**SETTINGS, "trials": 16, **settings})


def _scripted(monkeypatch, at_target, *, inside_ppl=None, calls=None, asked=None):
    """``at_target[(method, factor)] = (mean, spread)``: each key's answer probability at T is uniform in ``mean +-
    spread`` (clipped to [0, 1]), drawn from the document's seed and the key, so every run sees the same answers.
    Inside L every model finds every key; ``inside_ppl[(method, factor)]``: its perplexity there (default: the
    unpatched model's, 10). ``asked`` gets each ``(method, keys, how)`` a document was scored with."""
    which = tag_patched(monkeypatch)

    def keys(self, model, length, k, seed, tick=None, how="document"):
        method = which.get(model, ("none", 1.0))
        if calls is not None:
            calls.append((method, length))
        if asked is not None:
            asked.add((method[0], k, how))
        mean, spread = at_target.get(method, (0.0, 0.0)) if length == TARGET else (1.0, 0.0)
        draw = random.Random(seed * 31 + sum(map(ord, method[0])))
        probs = [min(1.0, max(0.0, mean + spread * (2 * draw.random() - 1))) for _ in range(k)]
        return SimpleNamespace(found=[p > 0.5 for p in probs], logprob=[math.log(max(p, 1e-300)) for p in probs],
                               tokens=[2] * k, depths=[(i + 0.5) / k for i in range(k)], seconds=0.0)

    perplexity = HFTarget.perplexity

    def scripted_ppl(self, model, length, tick=None, max_tokens=None):
        if length >= TARGET:
            return perplexity(self, model, length, tick, max_tokens)
        method = which.get(model, ("none", 1.0))
        ppl = (inside_ppl or {}).get(method, 10.0)
        return ev.Score(loss=math.log(ppl), tokens=64), None

    from posenc.lab.extend.pick import keys_run

    monkeypatch.setattr(keys_run, "check", lambda *args: None)  # documents scripted: K keys need not fit in 64 tokens
    monkeypatch.setattr(HFTarget, "keys", keys, raising=False)
    monkeypatch.setattr(HFTarget, "perplexity", scripted_ppl)


def test_a_clear_winner_is_shown_better_with_its_cost_inside_the_context(llama, corpus, tmp_path, monkeypatch,
                                                                       capsys):
    _scripted(monkeypatch, {("ntk", 2.0): (0.97, 0.03), ("rerope", 2.0): (0.3, 0.2)},
              inside_ppl={("ntk", 2.0): 10.5})
    out = tmp_path / "pick"
    result = run_pick(_cfg(llama, corpus, methods=("ntk", "rerope")), "2x", out, progress=True)
    printed = capsys.readouterr().out
    assert result["pick"] == "ntk x2" and result["verdict"] == "better", result["reason"]
    assert "shown better than every other model raced" in result["reason"]
    assert "shown above the unpatched model" in result["reason"]
    settings = json.loads((out / "pick.json").read_text())
    assert settings["design"] == "keys" and settings["keys"] == 8 and settings["documents"] == 16
    rows = inside.read(out / inside.INSIDE_FILE)
    assert {r["length"] for r in rows} == {16, 64} and len(rows) == 6  # L/4 and L, unpatched + 2 candidates
    needles = evidence.read(out / evidence.NEEDLES_FILE)
    assert {r["length"] for r in needles} == {64, TARGET}
    report = (out / "pick.md").read_text()
    assert "## The pick: ntk x2 (shown better)" in report and "## Inside the original context" in report
    assert "perplexity +5.0% at L/4" in report  # 10.5 against the unpatched model's 10: beyond the 2% margin
    assert "The score and the retrieval rate" in report and "ntk x2: keys found 100%" in report
    assert "document 1," in printed and "Inside the context (64 tokens)" in printed
    # --plan --resume says where the folder stands and writes nothing
    before = sorted((p, p.stat().st_mtime_ns) for p in out.rglob("*"))
    run_pick(_cfg(llama, corpus, methods=("ntk", "rerope")), "2x", out, resume=True, progress=False, plan_only=True)
    left = capsys.readouterr().out
    assert "perplexity at the target for 3 of 3 models; the cost inside the context for 3; documents at the " \
        "target: none 8, ntk x2 8, rerope x2 8" in left, left
    assert sorted((p, p.stat().st_mtime_ns) for p in out.rglob("*")) == before
    # resumed: nothing measured again, the same answer
    calls = []
    _scripted(monkeypatch, {("ntk", 2.0): (0.97, 0.03), ("rerope", 2.0): (0.3, 0.2)},
              inside_ppl={("ntk", 2.0): 10.5}, calls=calls)
    again = run_pick(_cfg(llama, corpus, methods=("ntk", "rerope")), "2x", out, resume=True, progress=False)
    assert calls == [] and again["pick"] == result["pick"] and again["reason"] == result["reason"]


def test_a_tie_picks_the_cheapest_to_serve_once_shown_within_delta(llama, corpus, tmp_path, monkeypatch):
    """ReRoPE (a run-time patch) and NTK (a config every engine reads) answer alike: NTK is picked, shown within
    0.05 of every model raced, not merely not shown different."""
    _scripted(monkeypatch, {("ntk", 2.0): (0.985, 0.015), ("rerope", 2.0): (0.985, 0.015)})
    result = run_pick(_cfg(llama, corpus, methods=("ntk", "rerope"), trials=32), "2x", tmp_path / "pick",
                      progress=False)
    assert result["pick"] == "ntk x2" and result["verdict"] == "within", result["reason"]
    assert "shown within 0.05 of every model raced and is the cheapest" in result["reason"]


def test_when_nothing_retrieves_the_verdict_says_so(llama, corpus, tmp_path, monkeypatch):
    _scripted(monkeypatch, {("ntk", 2.0): (0.01, 0.01), ("rerope", 2.0): (0.0, 0.0)})
    result = run_pick(_cfg(llama, corpus, methods=("ntk", "rerope"), trials=32), "2x", tmp_path / "pick",
                      progress=False)
    assert result["pick"] is None and result["verdict"] == "none", result["reason"]
    assert "no candidate retrieves at the target" in (tmp_path / "pick" / "pick.md").read_text()
    runs = [json.loads(line) for line in (tmp_path / "pick" / "runs.jsonl").read_text().splitlines()]
    assert [r["ended"] for r in runs] == ["no candidate retrieves"]


def test_keep_short_leaves_out_a_candidate_that_costs_short_prompts(llama, corpus, tmp_path, monkeypatch):
    """NTK answers best at T but is 5% worse inside L: with --keep-short it is not raced, and ReRoPE is picked."""
    _scripted(monkeypatch, {("ntk", 2.0): (0.99, 0.01), ("rerope", 2.0): (0.8, 0.1)},
              inside_ppl={("ntk", 2.0): 10.5})
    result = run_pick(_cfg(llama, corpus, methods=("ntk", "rerope")), "2x", tmp_path / "pick", progress=False,
                      keep_short=True)
    assert result["pick"] == "rerope x2", result["reason"]
    report = (tmp_path / "pick" / "pick.md").read_text()
    assert "was not raced (--keep-short)" in report and "| ntk x2 |" not in report.split("## At the target")[1]


@pytest.mark.parametrize("how", ["deadline", "interrupt"])
def test_a_race_cut_resumes_to_the_same_answer(llama, corpus, tmp_path, monkeypatch, how):
    table = {("ntk", 2.0): (0.97, 0.03), ("rerope", 2.0): (0.6, 0.3)}
    _scripted(monkeypatch, table)
    cfg = _cfg(llama, corpus, methods=("ntk", "rerope"))
    straight = run_pick(cfg, "2x", tmp_path / "straight", progress=False)
    calls = []
    _scripted(monkeypatch, table, calls=calls)
    keys = HFTarget.keys

    def cut(self, model, length, k, seed, tick=None, how_=None, **kwargs):
        if sum(1 for _, n in calls if n == TARGET) == 3:
            if how == "interrupt":
                raise KeyboardInterrupt
            cut.deadline[0] = True
        return keys(self, model, length, k, seed, tick, **kwargs)

    cut.deadline = [False]
    monkeypatch.setattr(HFTarget, "keys", cut)
    if how == "interrupt":
        with pytest.raises(KeyboardInterrupt):
            run_pick(cfg, "2x", tmp_path / "cut", progress=False)
    else:
        from posenc.lab.extend.pick import racing

        monkeypatch.setattr(racing.Deadline, "passed", lambda self: cut.deadline[0])
        first = run_pick(cfg, "2x", tmp_path / "cut", progress=False, budget=3600)
        assert first["ended"] in ("deadline", "decided")
        monkeypatch.setattr(racing.Deadline, "passed", lambda self: False)
    text = (tmp_path / "cut" / "pick.md").read_text()
    assert "# Which method" in text or "not finished" in text
    monkeypatch.setattr(HFTarget, "keys", keys)
    resumed = run_pick(cfg, "2x", tmp_path / "cut", resume=True, progress=False)
    assert resumed["pick"] == straight["pick"] and resumed["reason"] == straight["reason"]


def test_a_blind_race_asks_each_model_the_way_its_attention_allows(llama, corpus, tmp_path, monkeypatch):
    """Blind (the default for several keys): the unpatched model and NTK in the split, DCA in the one forward, and
    LM-Infinite on one-key documents, paired with the others' by document; pick.json says so, and the race decides
    on the mixed key counts."""
    asked: set = set()
    table = {("ntk", 2.0): (0.97, 0.03), ("lm_infinite", 2.0): (0.3, 0.2), ("dca", 2.0): (0.5, 0.3)}
    _scripted(monkeypatch, table, asked=asked)
    out = tmp_path / "pick"
    result = run_pick(_cfg(llama, corpus, methods=("ntk", "lm_infinite", "dca")), "2x", out, progress=False)
    assert asked == {("none", 8, "split"), ("ntk", 8, "split"), ("dca", 8, "branches"), ("lm_infinite", 1, "document")}
    settings = json.loads((out / "pick.json").read_text())
    assert settings["ask"] == "blind" and settings["keys"] == 8
    needles = evidence.read(out / evidence.NEEDLES_FILE)
    per_document = {(r["method"], r["length"], r["document"]) for r in needles}
    for method in ("none", "ntk", "dca", "lm_infinite"):
        rows = [r for r in needles if r["method"] == method]
        docs = {(r["length"], r["document"]) for r in rows}
        assert len(rows) == len(docs) * (1 if method == "lm_infinite" else 8), method
        assert {(method, *d) for d in docs} <= per_document
    assert result["pick"] == "ntk x2" and result["verdict"] == "better", result["reason"]
    report = (out / "pick.md").read_text()
    assert "asked blind" in report and "Keys within a document (3 models of 8 keys" in report, report
    assert "independent keys (intra-document correlation about" in report


def test_a_folder_asked_in_the_document_resumes_as_it_began(llama, corpus, tmp_path, monkeypatch):
    """A folder made before ``ask`` (its pick.json has none): resumed with no --keys or --ask it goes on asking in the
    document with its own key count; asked to go on blind it is refused before anything is measured."""
    table = {("ntk", 2.0): (0.97, 0.03), ("rerope", 2.0): (0.6, 0.3)}
    _scripted(monkeypatch, table)
    out = tmp_path / "pick"
    cfg = _cfg(llama, corpus, methods=("ntk", "rerope"))
    first = _run_pick(cfg, "2x", out, progress=False, keys=4, ask="document")
    stored = json.loads((out / "pick.json").read_text())
    assert "ask" not in stored and stored["keys"] == 4
    calls: list = []
    _scripted(monkeypatch, table, calls=calls)
    again = _run_pick(cfg, "2x", out, progress=False, resume=True)
    assert calls == [] and again["reason"] == first["reason"]
    with pytest.raises(ValueError, match="ask"):
        _run_pick(cfg, "2x", out, progress=False, resume=True, ask="blind")
    assert calls == []


def test_a_new_pick_asks_sixteen_keys_blind_and_one_key_in_the_document(llama, corpus, tmp_path, monkeypatch):
    asked: set = set()
    _scripted(monkeypatch, {("ntk", 2.0): (0.97, 0.03)}, asked=asked)
    cfg = _cfg(llama, corpus, methods=("ntk",), trials=8)
    _run_pick(cfg, "2x", tmp_path / "new", progress=False)
    stored = json.loads((tmp_path / "new" / "pick.json").read_text())
    assert (stored["keys"], stored["ask"]) == (16, "blind") and asked == {("none", 16, "split"), ("ntk", 16, "split")}
    asked.clear()
    _run_pick(cfg, "2x", tmp_path / "one", progress=False, keys=1)
    assert "ask" not in json.loads((tmp_path / "one" / "pick.json").read_text())
    assert asked == {("none", 1, "document"), ("ntk", 1, "document")}


@pytest.mark.parametrize(("settings", "extra", "match"), [
    ({}, {"keys": 0}, "keys=0 is invalid"),
    ({}, {"delta": 1.5}, "delta=1.5 is invalid"),
    ({"trials": 1}, {}, "trials=1 is invalid"),
    ({"task": "ruler"}, {}, "task='ruler' is invalid"),
    ({}, {"keys": 41}, "keys=41 is invalid: expected at most 40 keys"),
    ({}, {"keys": 2}, "keys=2 is invalid: expected fewer keys per document"),  # 64 tokens hold none
    ({}, {"ask": "apart"}, r"ask='apart' is invalid: expected one of \['blind', 'document'\]"),
])
def test_bad_deciding_settings_fail_before_anything_is_written(llama, corpus, tmp_path, settings, extra, match,
                                                              monkeypatch):
    import posenc.lab.extend.needles.ruler as ruler

    monkeypatch.setattr(ruler, "require", lambda: None)
    with pytest.raises(ValueError, match=match):
        run_pick(_cfg(llama, corpus, **settings), "2x", tmp_path / "pick", progress=False, **extra)
    assert not (tmp_path / "pick").exists()


def test_cli_pick_flags_are_pick_settings(llama, llama128, corpus, tmp_path):
    out = tmp_path / "study"
    for args, match in ((["--keys", "4"], "--keys=4 is invalid: expected a setting of --pick"),
                        (["--keep-short"], "--keep-short=True is invalid"),
                        (["--ask", "blind"], "--ask='blind' is invalid: expected a setting of --pick"),
                        (["--pick", "--target", "2x", "--task", "ruler"], "--task='ruler' is invalid: expected lm"),
                        (["--pick", "--target", "2x", "--delta", "1"], "--delta=1.0 is invalid: expected a margin")):
        code, text = _cli("extend", str(llama), *args, "--corpus", str(corpus), "--out", str(out))
        assert code == 2 and text.count("\n") == 1 and match in text, text
    code, text = _cli("extend", str(llama128), "--pick", "--target", "2x", "--plan", "--keys", "1", "--corpus",
                      str(corpus), "--device", "cpu", "--out", str(tmp_path / "pick"))
    assert code == 0 and "documents of 1 key" in text and not (tmp_path / "pick").exists(), text


@pytest.fixture(scope="module")
def llama128(llama, tmp_path_factory):
    """The tiny Llama said to be trained for 128 tokens: a document of one key and its question fits inside L."""
    import shutil

    folder = tmp_path_factory.mktemp("llama128") / "model"
    shutil.copytree(llama, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 128}))
    return folder


def test_a_real_pick_on_documents_of_keys_runs_end_to_end(llama128, corpus, tmp_path):
    """No answer scripted: the tiny Llama's own documents at 128 and 256 tokens (one key each), its verdict whatever
    it is, every document kept with its scores, and a resume that measures nothing more."""
    out = tmp_path / "pick"
    cfg = _cfg(llama128, corpus, methods=("ntk",), trials=8)
    result = run_pick(cfg, "2x", out, progress=False, keys=1)
    assert result["verdict"] in ("better", "within", "none", "open"), result
    needles = evidence.read(out / evidence.NEEDLES_FILE)
    assert {(r["length"], r["method"]) for r in needles} == {(128, "none"), (128, "ntk"), (256, "none"), (256, "ntk")}
    assert all(r["logprob"] <= 0 and r["tokens"] >= 1 and r["found"] in (0, 1) for r in needles)
    assert len([r for r in needles if r["length"] == 256]) == 16  # the first look: 8 documents each
    again = run_pick(cfg, "2x", out, progress=False, keys=1, resume=True)
    assert again["reason"] == result["reason"] and evidence.read(out / evidence.NEEDLES_FILE) == needles


def test_cli_pick_runs_into_a_pick_folder_and_prints_the_pick(llama128, corpus, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, text = _cli("extend", str(llama128), "--pick", "--target", "2x", "--methods", "yarn", "--trials", "8",
                      "--keys", "1", "--corpus", str(corpus), "--device", "cpu")
    assert code == 0, text
    (folder,) = (tmp_path / "runs").iterdir()
    assert folder.name.startswith("pick-") and (folder / "pick.json").is_file() and (folder / "pick.md").is_file()
    assert "Pick: " in text and "About" in text and "(at most" in text


def test_a_pose_fine_tuned_yarn_is_measured_inside_and_raced(llama, corpus, tmp_path, monkeypatch):
    """--finetune-steps adds YaRN at the target fine-tuned with PoSE's positions: it skips the perplexity screen,
    is fine-tuned once (its run folder reused), and gets the cost inside L and the race like every candidate."""
    _scripted(monkeypatch, {("ntk", 2.0): (0.9, 0.05), ("yarn", 2.0): (0.95, 0.05)})
    cfg = _cfg(llama, corpus, methods=("ntk",), trials=8, finetune_steps=2, finetune_window=48,
               finetune_positions=("pose",))
    out = tmp_path / "pick"
    result = run_pick(cfg, "2x", out, progress=False)
    tuned = ("yarn", 2.0, 2, "pose")
    inner = {(r["method"], r["factor"], r["finetune_steps"], r["finetune_positions"]) for r in
             inside.read(out / inside.INSIDE_FILE)}
    assert tuned in inner
    raced = {evidence.unit_of(r) for r in evidence.read(out / evidence.NEEDLES_FILE) if r["length"] == TARGET}
    assert tuned in raced and ("ntk", 2.0, 0, "plain") in raced
    assert "yarn x2 +ft2 pose" in (out / "pick.md").read_text() and result["verdict"], result
    assert (out / "final" / "runs").is_dir()


def test_a_pick_resumed_where_auto_means_another_dtype_goes_on_in_its_own(llama, corpus, tmp_path, monkeypatch):
    """``--dtype auto`` resolves per machine (bfloat16 on a CPU with units for it): a pick begun in float32 and
    resumed on such a machine goes on in float32, so its stored needles stay comparable, and pick.json keeps what
    was asked."""
    import torch

    from posenc.hf import dtypes

    table = {("ntk", 2.0): (0.97, 0.03), ("rerope", 2.0): (0.6, 0.3)}
    _scripted(monkeypatch, table)
    cfg = _cfg(llama, corpus, methods=("ntk", "rerope"), dtype=None)
    out = tmp_path / "pick"
    first = run_pick(cfg, "2x", out, progress=False)
    stage = json.loads((out / "screen-ppl" / "extend.json").read_text())
    assert stage["dtype"] == "float32"
    monkeypatch.setattr(dtypes, "auto_dtype", lambda device, checkpoint=None: torch.bfloat16)
    resumed = run_pick(cfg, "2x", out, resume=True, progress=False)
    assert resumed["pick"] == first["pick"] and resumed["reason"] == first["reason"]
    assert json.loads((out / "screen-ppl" / "extend.json").read_text())["dtype"] == "float32"
    assert json.loads((out / "pick.json").read_text())["dtype"] is None
    named = run_pick(dataclasses.replace(cfg, dtype="float32"), "2x", out, resume=True, progress=False)
    assert named["pick"] == first["pick"]  # the dtype it ran in, named, is the same pick
    with pytest.raises(ValueError, match="dtype"):
        run_pick(dataclasses.replace(cfg, dtype="bfloat16"), "2x", out, resume=True, progress=False)


def test_a_real_gemma3_pick_runs_a_remapping_method_on_its_global_layers(corpus, tmp_path):
    """A tiny Gemma 3 (one sliding layer, window 16; one global) said to be trained for 128 tokens: Self-Extend on
    the global layer and YaRN on it race the unpatched model at 256 tokens with real documents, end to end."""
    folder = _hf_folder(tmp_path / "gemma3", kind="gemma3")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 128}))
    out = tmp_path / "pick"
    result = run_pick(_cfg(folder, corpus, methods=("yarn", "self_extend"), trials=8), "2x", out, progress=False,
                      keys=1)
    assert result["verdict"] in ("better", "within", "none", "open"), result
    needles = evidence.read(out / evidence.NEEDLES_FILE)
    assert {r["method"] for r in needles if r["length"] == 256} == {"none", "yarn", "self_extend"}
    assert all(r["logprob"] <= 0 and r["found"] in (0, 1) for r in needles)


def test_a_real_blind_pick_runs_every_scorer(llama128, corpus, tmp_path):
    """No answer scripted, asked blind: the split (NTK, the unpatched model), the one forward with the T x T mask
    (DCA) and a one-key document (LM-Infinite) on the tiny Llama's own documents; a resume measures nothing more."""
    out = tmp_path / "pick"
    cfg = _cfg(llama128, corpus, methods=("ntk", "dca", "lm_infinite"), trials=8)
    result = _run_pick(cfg, "2x", out, progress=False, keys=1, ask="blind")
    assert result["verdict"] in ("better", "within", "none", "open"), result
    needles = evidence.read(out / evidence.NEEDLES_FILE)
    assert {r["method"] for r in needles if r["length"] == 256} == {"none", "ntk", "dca", "lm_infinite"}
    assert all(r["logprob"] <= 0 and r["tokens"] >= 1 and r["found"] in (0, 1) for r in needles)
    again = _run_pick(cfg, "2x", out, progress=False, resume=True)
    assert again["reason"] == result["reason"] and evidence.read(out / evidence.NEEDLES_FILE) == needles
