"""RULER through lm-evaluation-harness in ``posenc extend``: task checks, documents spread over lengths, the
truncation guard, lm-eval's results into ``results.csv``, a tiny random Llama end to end, and the ``lm_eval``
command line on a ``--save`` folder giving the in-process answers. Lengths are tiny (512, 1024 tokens of a 320-token
byte-level BPE) so lm-eval builds its documents in seconds."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import json
import shlex
import subprocess
import sys

import pytest
import torch

from posenc.cli import main
from posenc.lab.extend.needles import ruler
from posenc.lab.extend.settings.config import ExtendConfig
from posenc.lab.extend.stats.rates import Rate, rates
from posenc.lab.extend.study.run import read_results, run_extend

LENGTHS = (512, 1024)
TASK = "niah_single_1"


def _cli(*args: str) -> tuple[int, str]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        code = main(list(args))
    return code, buf.getvalue()


# ---------------------------------------------------------------------------------------------------------------------
# Checks that need no lm-eval


@pytest.mark.parametrize(
    ("tasks", "match"),
    [
        (["niah_single_2"], "builds its data offline, one of .*niah_single_1.*niah_single_2 downloads Paul Graham"),
        (["ruler_qa_squad"], "ruler_qa_squad downloads SQuAD"),
        (["ruler"], "the whole suite"),
        (["niah_single_9"], "a RULER task of lm-eval 0.4.13, one of"),
        (["ruler_vt", "ruler_vt"], "each task once"),
        ([], "non-empty list"),
    ],
)
def test_only_offline_tasks_are_taken_and_the_error_names_them(tasks, match):
    with pytest.raises(ValueError, match=match):
        ruler.check_tasks(tasks)


def test_ruler_settings_need_task_ruler_and_at_most_what_lm_eval_generates():
    with pytest.raises(ValueError, match="ruler_tasks.*pass --task ruler"):
        ExtendConfig(model="smollm2", ruler_tasks=("niah_single_1",))
    with pytest.raises(ValueError, match="ruler_samples"):
        ExtendConfig(model="smollm2", ruler_samples=3)
    with pytest.raises(ValueError, match="ruler_samples=501 is invalid: expected at most 500"):
        ExtendConfig(model="smollm2", task="ruler", ruler_samples=501)
    with pytest.raises(ValueError, match="ruler_samples=0"):
        ExtendConfig(model="smollm2", task="ruler", ruler_samples=0)
    cfg = ExtendConfig(model="smollm2", task="ruler", ruler_tasks=["ruler_vt"], ruler_samples=4)
    assert cfg.ruler_tasks == ("ruler_vt",) and ExtendConfig.from_dict(cfg.to_dict()) == cfg


def test_cli_refuses_a_network_task_in_one_line_before_anything(tmp_path):
    code, text = _cli("extend", "smollm2", "--task", "ruler", "--ruler-tasks", "niah_single_3", "--out",
                      str(tmp_path / "out"))
    assert code == 2 and len(text.strip().splitlines()) == 1 and "Traceback" not in text
    assert "niah_single_1" in text and "downloads" in text
    assert not (tmp_path / "out").exists()


def test_missing_lm_eval_prints_the_pip_command_before_any_model_work(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # `import lm_eval` raises ImportError
    cfg = ExtendConfig(model=str(tmp_path / "nowhere"), task="ruler", device="cpu")
    with pytest.raises(ValueError, match=r'lm_eval is missing\): pip install "lm-eval\[ruler\]==0.4.13"'):
        run_extend(cfg, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("saved", [True, False])
def test_report_names_the_folder_save_wrote_in_its_lm_eval_commands(saved, corpus, tmp_path, monkeypatch):
    """With ``--save DIR`` the report's ``lm_eval`` commands load that folder (they said ``pretrained=DIR``, a
    placeholder, even then); without one they keep the placeholder. lm-eval itself is stubbed out: the documents
    and scores are made up, the commands are what is checked."""
    from lab.extend.study.test_study import _hf_folder, _needs_extend_context
    from posenc.lab.extend.targets.hf import HFTarget

    _needs_extend_context()
    folder = _hf_folder(tmp_path / "llama")
    lengths = (64, 128)
    suite = ruler.Suite(
        tasks={TASK: None}, samples={TASK: {n: [n, n + 1] for n in lengths}},
        prompt_tokens={TASK: {n: n - 10 for n in lengths}}, lengths=lengths,
    )

    def build_ruler(self, lengths):
        self.suite = suite
        return suite

    monkeypatch.setattr(ruler, "require", lambda: None)
    monkeypatch.setattr(HFTarget, "build_ruler", build_ruler)
    monkeypatch.setattr(HFTarget, "ruler", lambda self, model, task, length, tick=None: ruler.Score(1.0, 2, ("a",)))
    cfg = ExtendConfig(
        model=str(folder), task="ruler", ruler_tasks=(TASK,), ruler_samples=2, methods=("yarn",), factors=(2.0,),
        lengths=lengths, depths=(0.5,), trials=1, eval_tokens=256, corpus=str(corpus), device="cpu",
    )
    target = tmp_path / "saved model"  # a space: the command quotes it
    run_extend(cfg, tmp_path / "out", progress=False, save=target if saved else None)
    report = (tmp_path / "out" / "report.md").read_text()
    commands = [line for line in report.splitlines() if line.startswith("lm_eval ")]
    assert commands == [ruler.lm_eval_command(target if saved else "DIR", suite, TASK)]
    model_args = shlex.split(commands[0])[shlex.split(commands[0]).index("--model_args") + 1]
    assert model_args.startswith(f"pretrained={target}," if saved else "pretrained=DIR,")
    if saved:
        assert (target / "config.json").is_file() and "DIR" not in report
        assert f"saved to `{target}` (`yarn x2`" in report


def test_documents_are_taken_from_every_length_not_only_the_first():
    stacked = [512] * 4 + [1024] * 3  # lm-eval's order: every document of one length, then the next
    assert ruler.select(stacked, LENGTHS, 2, TASK) == {512: [0, 1], 1024: [4, 5]}
    assert ruler.select(stacked, LENGTHS, 3, TASK) == {512: [0, 1, 2], 1024: [4, 5, 6]}
    with pytest.raises(ValueError, match="ruler_samples=4 is invalid: expected at most 3: lm-eval generated 3 "):
        ruler.select(stacked, LENGTHS, 4, TASK)


def _logged(doc_id: int, length: int, score: float, answer: str) -> dict:
    return {"doc_id": doc_id, str(length): score, "4096": -1, "filtered_resps": [answer]}


def test_lm_eval_results_parse_into_hits_and_intervals():
    results = {"samples": {"ruler_vt": [_logged(7, 512, 0.6, "A B C"), _logged(3, 512, 1.0, "x")]}}
    score = ruler.parse(results, "ruler_vt", 512, [3, 7])
    assert (score.hits, score.n, score.answers) == (1.6, 2, ("x", "A B C"))
    with pytest.raises(ValueError, match="lm-eval's samples"):
        ruler.parse(results, "ruler_vt", 512, [3, 7, 9])
    with pytest.raises(ValueError, match="a score in \\[0, 1\\]"):
        ruler.parse(results, "ruler_vt", 1024, [3, 7])  # the samples carry no score at 1024 (-1 / missing)
    rate = Rate(1.6, 2)
    assert rate.text() == "1.6/2 80% [" + f"{100 * rate.interval[0]:.0f}-{100 * rate.interval[1]:.0f}]"
    assert Rate(3, 4).text() == "3/4 75% [30-95]"
    assert Rate(0, 6).beyond_noise(Rate(6, 6)) and not Rate(1, 2).beyond_noise(Rate(2, 2))


def test_passkey_rates_pool_depths_and_read_files_without_the_new_columns():
    row = {"metric": "passkey", "method": "none", "factor": 1.0, "finetune_steps": 0, "length": 512, "status": "ok"}
    rows = [
        {**row, "depth": 0.25, "accuracy": 2 / 3, "n": 3, "hits": None},  # an older file: hits from accuracy * n
        {**row, "depth": 0.75, "accuracy": 1.0, "n": 3, "hits": 3.0},
        {**row, "length": 1024, "depth": 0.25, "accuracy": None, "n": 0, "hits": None, "status": "n/a"},
    ]
    assert rates(rows, "passkey") == {("none", 1.0, 0, "plain"): {512: Rate(5.0, 6), 1024: None}}


# ---------------------------------------------------------------------------------------------------------------------
# lm-eval on a tiny random Llama


@pytest.fixture(scope="module")
def lm_eval_installed():
    pytest.importorskip("lm_eval", reason=f"needs lm-evaluation-harness: {ruler.PIP}")
    ruler.require()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, lm_eval_installed):
    """A tiny random Llama (64-token context) whose large initial weights make its answers depend on the prompt."""
    transformers = pytest.importorskip("transformers")
    from lab.extend.needles.test_passkey import byte_bpe_tokenizer

    folder = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = byte_bpe_tokenizer(folder)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=1, initializer_range=0.5,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    model = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    return folder, model, tokenizer


@pytest.fixture(scope="module")
def suite(tiny):
    return ruler.build([TASK], tiny[2], LENGTHS, 2)


def test_documents_are_lm_evals_own_at_each_length(suite):
    task = suite.tasks[TASK]
    docs = task.test_docs()
    assert suite.samples[TASK] == {512: [0, 1], 1024: [500, 501]}  # 500 per length, stacked
    for length, indices in suite.samples[TASK].items():
        for i in indices:
            assert docs[i]["max_length"] == length and docs[i]["outputs"][0] in docs[i]["input"]
        # lm-eval fits prompt + 128 generated tokens in the length (in steps of 5 filler lines at these lengths)
        assert length / 2 < suite.prompt_tokens[TASK][length] < length
    assert task.config.generation_kwargs["max_gen_toks"] == ruler.GEN_TOKENS[TASK]


def test_a_prompt_longer_than_max_length_is_an_error_not_a_truncation(suite, tiny):
    _, model, tokenizer = tiny
    short = dataclasses.replace(suite, prompt_tokens={TASK: {n: t - 10 for n, t in suite.prompt_tokens[TASK].items()}})
    with pytest.raises(ValueError, match="room for the whole prompt: it has .* lm-eval would cut its first 10 tokens"):
        ruler.evaluate(short, model, tokenizer, TASK, 512, device="cpu")
    score = ruler.evaluate(suite, model, tokenizer, TASK, 512, device="cpu")  # exactly long enough: fine
    assert score.n == 2


def test_lengths_too_short_for_a_task_fail_before_any_document_is_built(tiny):
    with pytest.raises(ValueError, match="lengths=512 is invalid: expected lengths of at least .* for RULER ruler_vt"):
        ruler.build(["ruler_vt"], tiny[2], [512], 1)  # lm-eval's own loop would spin forever here
    with pytest.raises(ValueError, match="lengths at which lm-eval can build RULER niah_single_1: Could not generate"):
        ruler.build([TASK], tiny[2], [150], 1)


def test_study_with_ruler_and_the_lm_eval_cli_on_the_saved_model_agree(tiny, suite, tmp_path):
    from posenc.hf import extend_context

    folder, model, tokenizer = tiny
    corpus = tmp_path / "corpus.py"
    corpus.write_text("".join(f"def f{i}_{j}(x):\n    return x * {j} + {i}\n\n" for j in range(120) for i in range(10)))
    cfg = ExtendConfig(
        model=str(folder), task="ruler", ruler_tasks=(TASK,), ruler_samples=2, methods=("linear",), factors=(2.0,),
        lengths=LENGTHS, depths=(0.5,), trials=1, corpus=str(corpus), device="cpu",
    )
    rows = run_extend(cfg, tmp_path / "out", progress=False, save=tmp_path / "saved")
    scored = [r for r in rows if r["metric"] == f"ruler:{TASK}"]
    assert sorted((r["method"], r["length"]) for r in scored) == [("linear", 512), ("linear", 1024),
                                                                    ("none", 512), ("none", 1024)]
    for r in scored:
        assert r["n"] == 2 and r["status"] == "ok" and r["accuracy"] == r["hits"] / 2
        assert r["ci_low"] <= r["accuracy"] <= r["ci_high"] and r["ci_high"] - r["ci_low"] > 0.5  # n = 2: wide
    passkey = [r for r in rows if r["metric"] == "passkey"]
    assert passkey and all(r["hits"] in (0.0, 1.0) and r["ci_low"] is not None for r in passkey)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## RULER (lm-evaluation-harness)" in report and (tmp_path / "out" / "rates.png").is_file()
    command = ruler.lm_eval_command(tmp_path / "saved", suite, TASK)
    assert command in report  # the folder --save wrote, not a placeholder

    # The patched model in memory, as the study evaluates it ...
    patched = copy.deepcopy(model)
    extend_context(patched, "linear", 2.0, original_max_position_embeddings=64)
    inside = {n: ruler.evaluate(suite, patched, tokenizer, TASK, n, device="cpu") for n in LENGTHS}
    assert len({a for s in inside.values() for a in s.answers}) > 1  # answers differ: comparing them means something
    # ... and the folder --save wrote, through the lm_eval command line the report prints.
    argv = [sys.executable, "-m", "lm_eval", *shlex.split(command)[1:]]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (logged,) = (tmp_path / "lm_eval_results").rglob(f"samples_{TASK}_*.jsonl")
    outside = {s["doc_id"]: s for s in map(json.loads, logged.read_text().splitlines())}
    for n in LENGTHS:
        for i, answer in zip(suite.samples[TASK][n], inside[n].answers, strict=True):
            assert outside[i]["filtered_resps"][0] == answer
            assert outside[i]["doc"]["max_length"] == n
        hits = sum(outside[i][str(n)] for i in suite.samples[TASK][n])
        row = next(r for r in scored if r["method"] == "linear" and r["length"] == n)
        assert hits == inside[n].hits == row["hits"]


def test_resume_keeps_ruler_rows_and_refuses_changed_tasks(tiny, tmp_path):
    folder = tiny[0]
    corpus = tmp_path / "corpus.py"
    corpus.write_text("".join(f"def g{i}_{j}(x):\n    return x - {j} * {i}\n\n" for j in range(120) for i in range(10)))
    settings = dict(
        model=str(folder), task="ruler", ruler_samples=1, methods=("linear",), factors=(2.0,), lengths=(512,),
        depths=(0.5,), trials=1, corpus=str(corpus), device="cpu",
    )
    run_extend(ExtendConfig(**settings), tmp_path / "out", progress=False)
    before = read_results(tmp_path / "out" / "results.csv")
    assert [r["metric"] for r in before].count(f"ruler:{TASK}") == 2
    code, text = _cli(
        "extend", str(folder), "--task", "ruler", "--ruler-tasks", "ruler_fwe", "--ruler-samples", "1", "--methods",
        "linear", "--factors", "2", "--lengths", "512", "--depths", "0.5", "--trials", "1", "--corpus", str(corpus),
        "--device", "cpu", "--out", str(tmp_path / "out"), "--resume",
    )
    assert code == 2 and "ruler_tasks" in text and len(text.strip().splitlines()) == 1
    code, text = _cli("extend", str(folder), "--task", "ruler", "--out", str(tmp_path / "out"))
    assert code == 2 and "--resume" in text
    assert read_results(tmp_path / "out" / "results.csv") == before


def test_resuming_a_task_lm_study_with_task_ruler_adds_ruler_and_keeps_its_rows(tiny, tmp_path, monkeypatch):
    folder = tiny[0]
    corpus = tmp_path / "corpus.py"
    corpus.write_text("".join(f"def h{i}_{j}(x):\n    return x + {j} - {i}\n\n" for j in range(120) for i in range(10)))
    settings = dict(
        model=str(folder), methods=("linear",), factors=(2.0,), lengths=(512,), depths=(0.5,), trials=1,
        corpus=str(corpus), device="cpu",
    )
    out = tmp_path / "out"
    lm = run_extend(ExtendConfig(**settings), out, progress=False)
    assert not any(r["metric"].startswith("ruler:") for r in lm)
    measured = []
    evaluate = ruler.evaluate
    monkeypatch.setattr(ruler, "evaluate", lambda *a, **k: measured.append(a[3]) or evaluate(*a, **k))
    changed = ExtendConfig(**{**settings, "trials": 2, "task": "ruler", "ruler_samples": 1})
    with pytest.raises(ValueError, match=r"these differ: \['ruler_samples', 'ruler_tasks', 'task', 'trials'\]"):
        run_extend(changed, out, resume=True, progress=False)  # another setting changed too: refused
    with pytest.raises(ValueError, match="--resume"):
        run_extend(ExtendConfig(**{**settings, "task": "ruler", "ruler_samples": 1}), out, progress=False)
    rows = run_extend(ExtendConfig(**{**settings, "task": "ruler", "ruler_samples": 1}), out, resume=True,
                      progress=False)
    assert measured == [TASK, TASK]  # RULER alone, for none and linear x2; nothing else measured again
    key = lambda r: (r["metric"], r["method"], r["length"], r["depth"])  # noqa: E731
    kept = {key(r): r for r in rows}
    assert all(kept[key(r)] == r for r in lm)
    assert sorted(r["method"] for r in rows if r["metric"] == f"ruler:{TASK}") == ["linear", "none"]
    saved = json.loads((out / "extend.json").read_text())
    assert saved["task"] == "ruler" and saved["ruler_tasks"] == [TASK] and saved["ruler_samples"] == 1


def _rate_row(metric, method, factor, length, hits, n, depth=None):
    return {"metric": metric, "method": method, "factor": factor, "finetune_steps": 0, "original_len": 8192,
            "length": length, "depth": depth, "loss": None, "ppl": None, "accuracy": hits / n, "hits": float(hits),
            "n": n, "status": "ok"}


def test_findings_call_a_difference_real_only_beyond_noise():
    from posenc.lab.extend.study.report import findings_for, format_table

    rows = []
    for method, factor, found in (("none", 1.0, (6, 0, 4, 0)), ("yarn", 2.0, (6, 3, 4, 3)),
                                  ("dynamic", 2.0, (6, 6, 4, 4))):
        rows += [_rate_row("passkey", method, factor, 4096, found[0], 6, 0.5),
                 _rate_row("passkey", method, factor, 12288, found[1], 6, 0.5),
                 _rate_row(f"ruler:{TASK}", method, factor, 4096, found[2], 4),
                 _rate_row(f"ruler:{TASK}", method, factor, 12288, found[3], 4)]
    text = "\n".join(findings_for(rows, 8192, kind="hf"))
    assert "best dynamic x2 with 6/6 100% [61-100] (above the unpatched model beyond noise)" in text
    assert "yarn x2 3/6 50% [19-81] (within noise of the unpatched model)" in text
    assert f"RULER {TASK} at 12288 tokens (past the original 8192 tokens): none 0/4 0% [0-49]" in text
    assert "dynamic x2 4/4 100% [51-100] (above the unpatched model beyond noise)" in text
    assert f"RULER {TASK}: dynamic x2 (within noise of yarn x2); passkey: dynamic x2 (within noise of yarn x2)" in text
    assert "they agree on dynamic x2" in text
    table = format_table(rows, f"ruler:{TASK}")
    assert "| yarn x2 | 4/4 100% [51-100] | 3/4 75% [30-95] |" in table
