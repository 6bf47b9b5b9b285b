"""``posenc lab`` end to end on tiny settings: every encoding trains and evaluates past L, resume, DDP, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import posenc
from cli_runs import one_and_two_processes
from posenc.cli import main
from posenc.lab.common import evaluate as ev
from posenc.lab.common.corpus import load_corpus
from posenc.lab.common.scaling import ROPE_SCALINGS
from posenc.lab.common.train import load_model
from posenc.lab.length.config import DEFAULT_ENCODINGS, StudyConfig
from posenc.lab.length.report import read_results
from posenc.lab.length.study import run_study

TINY = {"train_len": 16, "eval_lens": (16, 32), "steps": 12, "batch_size": 8, "dim": 32, "n_layers": 1,
        "n_heads": 2, "eval_tokens": 256, "corpus_bytes": 60_000}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    for i in range(12):  # several files: a split by file
        text = "".join(f"def f{i}_{j}(x):\n    return x * {j} + {i}\n\n" for j in range(150))
        (folder / f"m{i:02d}.py").write_text(text)
    return folder


def _cli(*args: str) -> tuple[int, str]:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):  # errors go to stderr
        code = main(list(args))
    return code, buf.getvalue()


def test_every_default_encoding_trains_and_runs_past_its_length(corpus, tmp_path):
    cfg = StudyConfig(**TINY, corpus=str(corpus))
    rows = run_study(cfg, tmp_path / "out", progress=False)
    for name in DEFAULT_ENCODINGS:
        done = json.loads((tmp_path / "out" / "runs" / name / "done.json").read_text())
        first = json.loads((tmp_path / "out" / "runs" / name / "metrics.jsonl").read_text().splitlines()[0])
        assert done["final_loss"] < first["loss"] < 6.0, name  # the loss falls from ~ln(256)
        at_2l = {r["scaling"]: r for r in rows if r["encoding"] == name and r["eval_len"] == 32}
        if name == "learned":
            assert at_2l["none"]["status"] == "n/a" and at_2l["none"]["ppl"] is None
            assert at_2l["interpolate"]["status"] == "ok"
        else:
            assert at_2l["none"]["status"] == "ok" and 1.0 < at_2l["none"]["ppl"] < 256.0, name
    assert {r["scaling"] for r in rows if r["encoding"] == "rope"} == {"none", "linear", "ntk", "dynamic", "yarn"}
    out = tmp_path / "out"
    assert (out / "extrapolation.png").stat().st_size > 10_000
    report = (out / "report.md").read_text()
    assert "Literature check" not in report or "ALiBi" in report
    assert "| alibi" in report and "extrapolation.png" in report


def test_resume_finishes_an_interrupted_study_without_redoing_work(corpus, tmp_path):
    cfg = StudyConfig(**{**TINY, "steps": 10}, encodings=("nope", "alibi"), corpus=str(corpus))
    straight = run_study(cfg, tmp_path / "a", progress=False)
    # Interrupt b during alibi's training: nope is finished and evaluated; alibi has a checkpoint but no done.json.
    out = tmp_path / "b"
    run_study(cfg, out, progress=False)
    (out / "runs" / "alibi" / "done.json").unlink()
    rows = [r for r in read_results(out / "results.csv") if r["encoding"] == "nope"]
    from posenc.lab.length.report import write_csv_atomic

    write_csv_atomic(rows, out / "results.csv")
    nope_done = (out / "runs" / "nope" / "done.json").stat().st_mtime_ns
    with pytest.raises(ValueError, match=r"--out=.*--resume"):
        run_study(cfg, out, progress=False)
    with pytest.raises(ValueError, match=r"--resume=.*differ: \['steps'\]"):
        run_study(StudyConfig(**{**TINY, "steps": 11}, encodings=("nope", "alibi"), corpus=str(corpus)), out,
                  resume=True, progress=False)
    resumed = run_study(cfg, out, resume=True, progress=False)
    assert (out / "runs" / "nope" / "done.json").stat().st_mtime_ns == nope_done  # not retrained
    key = lambda r: (r["encoding"], r["scaling"], r["eval_len"])  # noqa: E731
    assert sorted(map(key, resumed)) == sorted(map(key, straight))
    for a, b in zip(sorted(straight, key=key), sorted(resumed, key=key), strict=True):
        assert a["loss"] == b["loss"], key(a)  # same numbers: the same run, resumed


def test_same_seed_same_numbers(corpus, tmp_path):
    cfg = StudyConfig(**{**TINY, "steps": 6}, encodings=("rope",), corpus=str(corpus), extensions=False)
    a = run_study(cfg, tmp_path / "a", progress=False)
    b = run_study(cfg, tmp_path / "b", progress=False)
    assert [r["loss"] for r in a] == [r["loss"] for r in b]


def test_copy_task_reports_accuracy(tmp_path):
    code, text = _cli("lab", "--task", "copy", "--encodings", "nope,alibi", "--train-len", "8", "--eval-lens", "8,16",
                      "--steps", "5", "--batch-size", "8", "--dim", "32", "--layers", "1", "--heads", "2",
                      "--out", str(tmp_path / "copy"), "--quiet")
    assert code == 0, text
    rows = read_results(tmp_path / "copy" / "results.csv")
    assert {r["eval_len"] for r in rows} == {8, 16}
    assert all(r["accuracy"] is not None and 0.0 <= r["accuracy"] <= 1.0 for r in rows)


def test_task_defaults_fill_the_flags_not_given(tmp_path):
    from posenc.lab.length.config import TASK_DEFAULTS

    code, text = _cli("lab", "--task", "recall", "--encodings", "nope", "--steps", "2", "--eval-lens", "16",
                      "--dim", "32", "--layers", "1", "--out", str(tmp_path / "r"), "--quiet")
    assert code == 0, text
    study = json.loads((tmp_path / "r" / "study.json").read_text())
    want = TASK_DEFAULTS["recall"]
    assert (study["train_len"], study["batch_size"], study["n_heads"]) == (
        want["train_len"], want["batch_size"], want["n_heads"])
    code, text = _cli("lab", "--task", "recall", "--encodings", "nope", "--steps", "2", "--eval-lens", "16",
                      "--batch-size", "4", "--heads", "2", "--dim", "32", "--layers", "1",
                      "--out", str(tmp_path / "r2"), "--quiet")
    assert code == 0, text
    study = json.loads((tmp_path / "r2" / "study.json").read_text())
    assert (study["batch_size"], study["n_heads"], study["steps"]) == (4, 2, 2)
    assert "batch_size" not in TASK_DEFAULTS["lm"] and "n_heads" not in TASK_DEFAULTS["lm"]  # lm: StudyConfig's


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--encodings", "rope,alibii"], r"encodings='alibii' is invalid: expected names from"),
        (["--encodings", "rope_axial"], r"grid encodings belong to `posenc vision`"),
        (["--eval-lens", "16,0"], r"argument --eval-lens: '16,0' is invalid"),
        (["--train-len", "-4"], r"argument --train-len: '-4' is invalid"),
        (["--dim", "30"], r"dim=30 is invalid"),
        (["--stride", "100"], r"stride=100 is invalid"),
        (["--corpus", "/nonexistent/text"], r"path=.*nonexistent"),
    ],
)
def test_bad_input_is_a_clear_error(args, match, tmp_path):
    code, text = _cli("lab", *args, "--steps", "2", "--out", str(tmp_path / "o"), "--quiet")
    assert code == 2
    assert __import__("re").search(match, text), text


def test_empty_corpus_and_corrupt_checkpoint(corpus, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, text = _cli("lab", "--corpus", str(empty), "--out", str(tmp_path / "o1"), "--quiet")
    assert code == 2 and "--corpus" in text
    base = ["lab", "--corpus", str(corpus), "--encodings", "nope", "--train-len", "16", "--eval-lens", "16",
            "--steps", "4", "--batch-size", "4", "--dim", "32", "--layers", "1", "--heads", "2", "--quiet"]
    out = tmp_path / "o2"
    assert _cli(*base, "--out", str(out))[0] == 0
    (out / "runs" / "nope" / "done.json").unlink()
    (out / "runs" / "nope" / "checkpoint.safetensors").write_bytes(b"not a checkpoint")
    code, text = _cli(*base, "--out", str(out), "--resume")
    assert code == 2 and "checkpoint.safetensors" in text and "delete" in text


def test_figures_command(tmp_path):
    code, text = _cli("figures", "--out", str(tmp_path))
    assert code == 0
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == ["alibi.png", "rope_decay.png", "rope_scalings.png", "sinusoidal.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in tmp_path.glob("*.png"))


def test_torchrun_two_processes_match_one(corpus, tmp_path):
    """``torchrun --nproc_per_node=2 -m posenc lab`` gives the numbers of one process with the same global batch."""
    args = ["lab", "--corpus", str(corpus), "--encodings", "rope", "--train-len", "16", "--eval-lens", "16,32",
            "--steps", "6", "--batch-size", "8", "--dim", "32", "--layers", "1", "--heads", "2",
            "--eval-tokens", "256", "--quiet"]
    one_and_two_processes(args, tmp_path / "one", tmp_path / "two")
    a, b = (read_results(tmp_path / d / "results.csv") for d in ("one", "two"))
    assert len(a) == len(b) == 10
    for x, y in zip(a, b, strict=True):
        assert (x["encoding"], x["scaling"], x["eval_len"]) == (y["encoding"], y["scaling"], y["eval_len"])
        assert abs(x["loss"] - y["loss"]) < 1e-4


def test_an_interrupted_study_keeps_each_finished_row_and_says_what_it_skips(corpus, tmp_path, monkeypatch, capsys):
    import dataclasses
    import os
    import signal

    from posenc.lab.length import study

    cfg = StudyConfig(**{**TINY, "steps": 4, "eval_lens": (16, 32, 64)}, encodings=("nope", "alibi"),
                      corpus=str(corpus), extensions=False)
    out = tmp_path / "out"
    real, calls = study._evaluate, []

    def evaluate(model, cfg, corpus, encoding, extension, length):
        calls.append((encoding, length))
        if len(calls) == 5:  # alibi's second length: Ctrl-C while it is measured
            raise KeyboardInterrupt
        return real(model, cfg, corpus, encoding, extension, length)

    monkeypatch.setattr(study, "_evaluate", evaluate)
    with pytest.raises(KeyboardInterrupt):
        run_study(cfg, out, progress=False)
    kept = read_results(out / "results.csv")
    assert [(r["encoding"], r["eval_len"]) for r in kept] == [("nope", 16), ("nope", 32), ("nope", 64), ("alibi", 16)]

    calls.clear()
    monkeypatch.setattr(study, "_evaluate", lambda *a: calls.append((a[3], a[5])) or real(*a))
    rows = run_study(cfg, out, resume=True, progress=True)
    assert calls == [("alibi", 32), ("alibi", 64)]  # only the rows the interruption lost
    assert rows[:4] == kept and len(rows) == 6
    said = capsys.readouterr().out
    for line in ("nope: already trained (4 steps), skipped", "nope: 3 of 3 evaluations done, skipped",
                 "alibi: already trained (4 steps), skipped",
                 "alibi: 1 of 3 evaluations done, skipped; measuring the other 2"):
        assert line in said, said

    # a signal during training stops the study there; --resume continues that encoding from its checkpoint
    real_batches = study.batch_fn_for

    def signalling(cfg, corpus):
        def batch_fn(step, rank, world):
            if step == 1:
                os.kill(os.getpid(), signal.SIGINT)
            return real_batches(cfg, corpus)(step, rank, world)

        return batch_fn

    monkeypatch.setattr(study, "batch_fn_for", signalling)
    again = dataclasses.replace(cfg, encodings=("rope",))
    with pytest.raises(KeyboardInterrupt):
        run_study(again, tmp_path / "rope", progress=False)
    assert not (tmp_path / "rope" / "results.csv").exists()
    monkeypatch.setattr(study, "batch_fn_for", real_batches)
    run_study(again, tmp_path / "rope", resume=True, progress=True)
    assert "resuming rope from step 2 of 4" in capsys.readouterr().out
    assert len(read_results(tmp_path / "rope" / "results.csv")) == 3


def test_a_per_layer_hybrid_trains_evaluates_past_l_and_reloads(corpus, tmp_path):
    cfg = StudyConfig(**{**TINY, "n_layers": 2, "eval_lens": (16, 64)}, encodings=("rope/nope_temperature:2",),
                      corpus=str(corpus))
    rows = run_study(cfg, tmp_path / "out", progress=False)
    measured = {(r["encoding"], r["scaling"]) for r in rows if r["eval_len"] == 64 and r["status"] == "ok"}
    # the spec is the CSV label; the RoPE scalings act on its RoPE layers
    assert measured == {("rope/nope_temperature:2", s) for s in ("none", *ROPE_SCALINGS)}
    runs = tmp_path / "out" / "runs"
    assert [p.name for p in runs.iterdir()] == ["rope-nope_temperature-every2"]
    model = load_model(runs / "rope-nope_temperature-every2")  # config.json -> ModelConfig -> GPT + checkpoint
    assert model.config.encoding == "rope/nope_temperature:2"
    assert [type(e) for e in model.layer_encodings()] == [posenc.RotaryEmbedding, posenc.NoPETemperature]
    assert model.nth_encoding.config.floor_scale == 16  # the training length: the temperature moves at 16..64
    val = load_corpus(str(corpus), max_bytes=cfg.corpus_bytes).val
    again = ev.perplexity(model, val, length=64, max_tokens=cfg.eval_tokens)
    none_64 = next(r for r in rows if r["scaling"] == "none" and r["eval_len"] == 64)
    assert again.loss == pytest.approx(none_64["loss"], rel=1e-6)


def test_hybrid_specs_are_checked_before_anything_runs():
    from posenc.lab.length.study import _model_config, run_name

    for spec, match in [
        ("rope/nope:3", r"encodings='rope/nope:3' is invalid: expected an interval N from 2 to n_layers=2"),
        ("sinusoidal/nope:2", r"encodings='sinusoidal/nope:2' is invalid: .*'sinusoidal' adds positions"),
        ("rope/rope_axial:2", r"encodings='rope/rope_axial:2' is invalid: .*grid encodings belong"),
        ("rope/nope", r"encodings='rope/nope' is invalid: expected BASE/OTHER:N"),
        ("rope/nopee:2", r"encodings='rope/nopee:2' is invalid: expected names from"),
    ]:
        with pytest.raises(ValueError, match=match):
            StudyConfig(**{**TINY, "n_layers": 2}, encodings=("rope", spec))
    assert run_name("rope") == "rope" and run_name("rope/nope:4") == "rope-nope-every4"
    cfg = StudyConfig(**{**TINY, "n_layers": 4}, encodings=("rope/t5:2", "nope_temperature", "alibi/nope:4"))
    assert _model_config(cfg, "rope/t5:2").encoding_config == {"t5": {"bidirectional": False}}
    assert _model_config(cfg, "nope_temperature").encoding_config == {"floor_scale": 16}
    assert _model_config(cfg, "alibi/nope:4").encoding_config == {}


def test_cli_refuses_a_bad_hybrid_in_one_line(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["lab", "--encodings", "rope/nope:0", "--steps", "2", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "posenc lab: encodings='rope/nope:0' is invalid: expected an interval N from 2 to n_layers=2 in "
        "BASE/OTHER:N (N=1 leaves no rope layer, N > n_layers no nope layer)"
    ]
    assert not out.exists()


def test_all_expands_to_every_sequence_encoding_and_is_stored_expanded():
    import posenc
    from posenc.lab.length.config import StudyConfig, sequence_encodings

    names = sequence_encodings()
    grid = {"rope_axial", "rope_mixed", "alibi_2d", "sinusoidal_2d", "learned_2d", "mrope", "xdrope", "rope_3d"}
    assert set(names) == set(posenc.available()) - grid
    cfg = StudyConfig(encodings=("rope", "all", "rope/nope:2"))
    assert cfg.encodings == ("rope", *(n for n in names if n != "rope"), "rope/nope:2")
    assert "all" not in cfg.to_dict()["encodings"]


def test_later_papers_claims_are_checked_against_the_measured_table():
    from posenc.lab.length.config import StudyConfig
    from posenc.lab.length.report import findings_for

    def r(encoding, eval_len, ppl):
        return {"encoding": encoding, "scaling": "none", "finetune_steps": 0, "train_len": 64, "eval_len": eval_len,
                "stride": 0, "loss": None, "ppl": ppl, "accuracy": None, "tokens": 1, "status": "ok"}

    at8 = {"alibi": 8.7, "kerple": 7.4, "fire": 9.0, "t5": 11.5, "rope": 21.8, "rope/nope:2": 23.4, "sandwich": 9.5}
    rows = [r(e, n, 7.0 if n == 64 else v) for e, v in at8.items() for n in (64, 512)]
    cfg = StudyConfig(encodings=tuple(at8), extensions=False, n_layers=2)
    text = "\n".join(findings_for(rows, cfg))
    assert "KERPLE extrapolates better than ALiBi. Here kerple 7.40 vs alibi 8.70: this run agrees." in text
    assert "Here fire 9.00 vs t5 11.50, alibi 8.70, kerple 7.40: this run does NOT agree." in text
    assert "Here sandwich 9.50 vs alibi 8.70: this run agrees." in text  # parity claim: within 10%
    assert "Here rope/nope:2 23.40 vs rope 21.80: this run does NOT agree." in text
    assert "p_rope" not in text and "CoPE" not in text  # claims whose encodings did not run are left out


def test_encodings_at_once_give_the_numbers_of_one_after_another(corpus, tmp_path):
    """``jobs=2``: two worker processes, one thread each; the same rows as in this process with one thread, and a
    resume of a parallel study that lost an encoding's rows redoes only those."""
    import torch

    cfg = StudyConfig(**{**TINY, "steps": 6}, encodings=("rope", "alibi", "t5"), corpus=str(corpus))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = run_study(cfg, tmp_path / "one", progress=False)
    finally:
        torch.set_num_threads(threads)
    torch.set_num_threads(2)  # two jobs: one thread each
    try:
        out = tmp_path / "two"
        two = run_study(cfg, out, progress=True, jobs=2)
        assert (out / "runs" / "alibi" / "done.json").is_file() and (out / "report.md").is_file()
        from posenc.lab.length.report import write_csv_atomic

        write_csv_atomic([r for r in two if r["encoding"] != "t5"], out / "results.csv")
        resumed = run_study(cfg, out, resume=True, progress=False, jobs=2)
    finally:
        torch.set_num_threads(threads)
    key = lambda r: (r["encoding"], r["scaling"], r["eval_len"])  # noqa: E731
    assert sorted(one, key=key) == sorted(two, key=key) == sorted(resumed, key=key)


@pytest.mark.parametrize("jobs", [0, -1, 1.5, True])
def test_jobs_must_be_a_positive_count(jobs, corpus, tmp_path):
    with pytest.raises(ValueError, match=rf"jobs={jobs!r} is invalid: expected a positive number"):
        run_study(StudyConfig(**TINY, corpus=str(corpus)), tmp_path / "out", progress=False, jobs=jobs)
    assert not (tmp_path / "out").exists()


def test_ssmax_over_rope_and_nope_trains_evaluates_past_l_and_reloads_its_s(corpus, tmp_path):
    """``posenc lab --encodings rope_ssmax,ssmax_bias`` (RoPE + SSMax, NoPE + SSMax with a bias): s (and b) are learned
    per layer and head, saved and reloaded."""
    code, out = _cli("lab", "--encodings", "rope_ssmax,ssmax_bias", "--train-len", "16", "--eval-lens", "16,32",
                     "--steps", "12", "--batch-size", "8", "--dim", "32", "--layers", "2", "--heads", "2",
                     "--eval-tokens", "256", "--corpus", str(corpus), "--quiet",
                     "--out", str(tmp_path / "out"))
    assert code == 0, out
    rows = read_results(tmp_path / "out" / "results.csv")
    assert {(r["encoding"], r["scaling"], r["eval_len"]) for r in rows if r["status"] == "ok"} == {
        (e, "none", n) for e in ("rope_ssmax", "ssmax_bias") for n in (16, 32)
    }
    for name in ("rope_ssmax", "ssmax_bias"):
        model = load_model(tmp_path / "out" / "runs" / name)
        first, second = model.layer_encodings()
        assert first is not second and model.encoding is None  # one SSMax per layer, none shared
        for enc in (first, second):
            assert isinstance(enc, posenc.SSMax) and (enc.rope is not None) == (name == "rope_ssmax")
            assert not torch.allclose(enc.s, torch.full_like(enc.s, 0.43))  # trained, reloaded
            assert (enc.b is not None) == (name == "ssmax_bias")
            assert enc.b is None or not torch.allclose(enc.b, torch.zeros_like(enc.b))
        assert not torch.equal(first.s, second.s)  # each layer learned its own
    cfg = StudyConfig(encodings=("all",))
    assert {"rope_ssmax", "ssmax", "rope_ssmax_bias", "ssmax_bias"} <= set(cfg.encodings)


# A spec suffix, the spec without it and with it, the run folder, the layers' value after reloading, bad specs.
SUFFIXES = {
    # ``SPEC@C`` (Llama 4's iRoPE): the RoPE layers attend within chunks of C tokens, the NoPE layers globally
    "chunk": (("rope/nope_temperature:2", "rope/nope_temperature:2@8"), "rope-nope_temperature-every2-chunk8",
              lambda b: b.attn.chunk_size, [8, None],
              [("nope@8", "non-NoPE layers"), ("rope@0", "SPEC@C"), ("rope/nope:2@", "SPEC@C")]),
    # ``SPEC~W`` (RNoPE-SWA; Mistral's windows with ``rope~8``): the RoPE layers see the 8 most recent tokens
    "window": (("rope/nope:2", "rope/nope:2~8"), "rope-nope-every2-window8", lambda b: b.attn.window, [8, None],
               [("nope~8", "non-NoPE layers"), ("rope~0", "SPEC~W"), ("rope/nope:2~", "SPEC~W")]),
    # ``SPEC+sinks`` (GPT-OSS): every layer learns a sink logit per head, from 0
    "sinks": (("nope", "nope+sinks"), "nope-sinks", lambda b: bool(b.attn.sinks.abs().max() > 0), [True, True],
              [("rope+sink", r"SPEC\+sinks"), ("rope+sinks~4", r"SPEC\+sinks")]),
}


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_spec_suffix_trains_evaluates_and_reloads(corpus, tmp_path, suffix):
    """A suffixed spec trains beside the plain one in one study, in its own run folder and CSV label, and its
    reloaded model carries the option in every layer it names; malformed or meaningless suffixes are refused."""
    from posenc.lab.length.study import run_name

    specs, folder, value, want, bad = SUFFIXES[suffix]
    cfg = StudyConfig(**{**TINY, "n_layers": 2, "eval_lens": (16, 32)}, encodings=specs, corpus=str(corpus),
                      extensions=False)
    assert run_name(specs[1]) == folder
    rows = run_study(cfg, tmp_path / "out", progress=False)
    ok = {(r["encoding"], r["eval_len"]): r["ppl"] for r in rows if r["status"] == "ok"}
    assert set(ok) == {(s, n) for s in specs for n in (16, 32)} and ok[(specs[0], 16)] != ok[(specs[1], 16)]
    assert [value(b) for b in load_model(tmp_path / "out" / "runs" / folder).blocks] == want
    for spec, match in bad:
        with pytest.raises(ValueError, match=match):
            StudyConfig(**{**TINY, "n_layers": 2}, encodings=(spec,))


def test_suffixes_name_their_model_config_and_run_folder():
    from posenc.lab.length.study import _model_config, run_name

    cfg = StudyConfig(**{**TINY, "n_layers": 2}, encodings=("rope",))
    local = _model_config(cfg, "rope/nope_temperature:2@16~8+sinks")
    assert (local.encoding, local.attention_chunk_size, local.sliding_window, local.sinks) == (
        "rope/nope_temperature:2", 16, 8, True)
    plain = _model_config(cfg, "rope/nope:2")
    assert (plain.attention_chunk_size, plain.sliding_window, plain.sinks) == (None, None, False)
    assert run_name("rope@8") == "rope-chunk8" and run_name("rope@16~8") == "rope-chunk16-window8"
    assert run_name("rope/nope:2@16~8+sinks") == "rope-nope-every2-chunk16-window8-sinks"


# Issue 46: a spec's numbers are ASCII digits without a leading zero, bounded by the longest length the study runs;
# one line on stderr, exit 2, nothing written. ``ssmax~W`` trains an SSMax whose n is the keys its window leaves.
BAD_SPEC_NUMBERS = {
    "rope~²": r"encodings='rope~²' is invalid: expected SPEC~W .*, W a positive whole number written in the digits "
    r"0-9 without a leading zero",
    "rope@³": r"encodings='rope@³' is invalid: expected SPEC@C .*, C a positive whole number written in the digits",
    "rope@016": r"encodings='rope@016' is invalid: expected SPEC@C .* without a leading zero",
    "rope/nope:02": r"encodings='rope/nope:02' is invalid: expected BASE/OTHER:N .*, N written in the digits 0-9",
    "rope~99999999999999999999": r"encodings='rope~99999999999999999999' is invalid: expected a window ~W from 1 "
    r"to 32, the longest length this study runs \(--eval-lens, default 16 x --train-len\): a larger one masks nothing",
    "rope/nope:2@33": r"encodings='rope/nope:2@33' is invalid: expected a chunk size @C from 1 to 32",
}


@pytest.mark.parametrize("spec", list(BAD_SPEC_NUMBERS))
def test_spec_numbers_are_refused_in_one_line_before_anything_is_written(spec, tmp_path, capsys):
    out = tmp_path / "o"
    args = ["lab", "--encodings", f"ssmax~8,{spec}", "--train-len", "16", "--eval-lens", "16,32", "--steps", "2",
            "--layers", "2", "--out", str(out)]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("posenc lab: ")
    assert __import__("re").match(BAD_SPEC_NUMBERS[spec], lines[0].removeprefix("posenc lab: ")), lines[0]
    assert not out.exists()
    assert StudyConfig(**{**TINY, "n_layers": 2}, encodings=("rope~32", "rope/nope:2@32")).encodings  # the bound itself


def test_a_resumed_study_refuses_a_run_trained_with_the_old_ssmax_n_before_writing(corpus, tmp_path):
    """A study whose ``ssmax~4`` run was saved before issue 46 (its ``config.json`` has no ``key_count``: that SSMax
    used n = p + 1 under the window) is refused on ``--resume``, naming the run, and nothing in the folder changes;
    the same study run now resumes (and its SSMax layers count the window's keys: test_gpt_key_count.py)."""
    out = tmp_path / "out"
    args = ["lab", "--encodings", "rope,ssmax~4", "--train-len", "16", "--eval-lens", "16", "--steps", "2",
            "--batch-size", "4", "--dim", "32", "--layers", "1", "--heads", "2", "--eval-tokens", "256",
            "--corpus", str(corpus), "--quiet", "--out", str(out)]
    code, text = _cli(*args)
    assert code == 0, text
    code, text = _cli(*args, "--resume")
    assert code == 0, text
    config = out / "runs" / "ssmax-window4" / "config.json"
    saved = json.loads(config.read_text())
    assert saved["model"]["key_count"] == "mask"
    del saved["model"]["key_count"]
    config.write_text(json.dumps(saved))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    code, text = _cli(*args, "--resume")
    assert code == 2
    assert text.splitlines() == [
        f"posenc lab: {config}['key_count']=None is invalid: expected 'mask': this model (encoding='ssmax', "
        "sliding_window=4) was saved by a posenc that gave the SSMax of layers [0] an n read from the query's "
        "position (p + 1) whatever the window or chunks masked (issue 46); posenc now counts the keys each query "
        "sees and cannot rebuild the model it trained as: retrain it with a fresh --out (the rows of 'ssmax~4' in "
        f"{out / 'results.csv'} come from it too)"
    ]
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
