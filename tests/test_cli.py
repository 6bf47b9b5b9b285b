"""``posenc`` on the command line: output folders it may write into, numbers and devices checked before any work,
one-line errors with exit status 2, interruption (exit 130 and the command that continues), --quiet, --help, tables
in a pipe, file modes.

Runs ``posenc.cli.main(argv)`` in this process (with capsys), and a subprocess for SIGTERM.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from posenc import _argtypes as A
from posenc.cli import build_parser, main
from posenc.cli.runs import resume_command
from posenc.lab.extend.settings.options import parse_length, parse_lengths

#: A lab run of a second or two: one encoding, one layer, few steps and tokens.
TINY_LAB = ["lab", "--encodings", "nope", "--train-len", "16", "--eval-lens", "16", "--steps", "3",
            "--batch-size", "4", "--dim", "32", "--layers", "1", "--heads", "2", "--eval-tokens", "256"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "code.py"
    path.write_text("".join(f"def f{i}(x):\n    return x * {i}\n\n" for i in range(2000)))
    return path


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> Path:
    """Two classes of 8x8 grey images, class-named folders."""
    from PIL import Image

    root = tmp_path_factory.mktemp("pictures")
    g = torch.Generator().manual_seed(0)
    for c, name in enumerate(("dark", "light")):
        (root / name).mkdir()
        for i in range(6):
            pixels = (torch.rand(8, 8, generator=g) * 100 + 100 * c).to(torch.uint8)
            Image.fromarray(pixels.numpy(), mode="L").save(root / name / f"{i}.png")
    return root


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _refused(capsys, argv, command: str, *needles: str) -> str:
    """``posenc *argv`` exits 2 with one stderr line ``posenc <command>: ...`` holding ``needles``, no traceback."""
    code, out, err = _run(capsys, *argv)
    assert code == 2, (out, err)
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith(f"posenc {command}: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


def _snapshot(folder: Path) -> dict:
    return {p.relative_to(folder): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


# ---------------------------------------------------------------------------------------------------------------------
# Output folders


def _user_folder(tmp_path: Path) -> Path:
    user = tmp_path / "mine"
    user.mkdir()
    (user / "report.md").write_text("my report")
    (user / "notes.txt").write_text("my notes")
    (user / "results.csv").write_text("not,posenc\n1,2\n")
    return user


TINY_VISION = ["vision", "--train-res", "8", "--eval-res", "8", "--steps", "2", "--batch-size", "4", "--dim", "16",
               "--layers", "1", "--heads", "2"]
TINY_EXTEND = ["extend", "new", "--task", "passkey", "--train-len", "16", "--train-steps", "2", "--lengths", "16,32",
               "--trials", "1", "--depths", "0.5", "--device", "cpu"]


def _commands(corpus: Path, pictures: Path) -> dict[str, list[str]]:
    return {
        "lab": [*TINY_LAB, "--corpus", corpus],
        "vision": [*TINY_VISION, "--data", pictures],
        "extend": TINY_EXTEND,
        "figures": ["figures"],
        "bench": ["bench", "--no-rotary", "--no-attention", "--device", "cpu"],
    }


@pytest.mark.parametrize("command", ["lab", "vision", "extend", "figures", "bench"])
def test_a_user_folder_is_refused_and_left_byte_identical(command, corpus, pictures, tmp_path, capsys):
    user = _user_folder(tmp_path)
    before = _snapshot(user)
    for resume in ([], ["--resume"]) if command in ("lab", "vision", "extend") else ([],):
        _refused(capsys, [*_commands(corpus, pictures)[command], "--out", user, *resume], command,
                 f"--out='{user}' is invalid: expected a new or empty folder, or a `posenc {command}` output folder",
                 "other files: notes.txt, report.md, results.csv")
    assert _snapshot(user) == before


def test_figures_out_a_file_is_a_message(capsys):
    _refused(capsys, ["figures", "--out", "/bin/ls"], "figures", "--out='/bin/ls' is invalid", "this is a file")


def test_a_lab_folder_is_not_a_vision_folder(corpus, pictures, tmp_path, capsys):
    out = tmp_path / "run"
    assert _run(capsys, *TINY_LAB, "--corpus", corpus, "--out", out, "--quiet")[0] == 0
    before = _snapshot(out)
    _refused(capsys, [*_commands(corpus, pictures)["vision"], "--out", out, "--resume"], "vision",
             "it holds a `posenc lab` (study.json) run")
    assert _snapshot(out) == before


def test_empty_folder_accepted_own_run_needs_resume(corpus, tmp_path, capsys):
    out = tmp_path / "empty"
    out.mkdir()
    code, said, _ = _run(capsys, *TINY_LAB, "--corpus", corpus, "--out", out, "--quiet")
    assert code == 0
    assert json.loads((out / "study.json").read_text())["command"] == "posenc lab"
    _refused(capsys, [*TINY_LAB, "--corpus", corpus, "--out", out], "lab", "--resume to continue the study")
    assert _run(capsys, *TINY_LAB, "--corpus", corpus, "--out", out, "--resume", "--quiet")[0] == 0
    _refused(capsys, [*TINY_LAB, "--corpus", corpus, "--seed", "1", "--out", out, "--resume"], "lab",
             "these differ: ['seed']")


def test_figures_and_bench_rerun_into_their_own_folder(tmp_path, capsys, monkeypatch):
    from posenc.lab import figures

    monkeypatch.setattr(figures, "draw_figures", lambda out: [Path(out, "a.png").write_bytes(b"png") and Path(out)])
    for _ in range(2):  # the second run finds its own figures.json
        assert _run(capsys, "figures", "--out", tmp_path / "figs")[0] == 0
        assert (
            _run(capsys, "bench", "--no-rotary", "--no-attention", "--out", tmp_path / "b", "--device", "cpu")[0] == 0
        )
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == ["a.png", "figures.json"]
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["bench.json", "bench.md"]
    assert json.loads((tmp_path / "b" / "bench.json").read_text()) == {"command": "posenc bench", "device": "cpu"}


# ---------------------------------------------------------------------------------------------------------------------
# A failed run leaves nothing that blocks a rerun


def test_failed_vision_data_then_a_rerun_works(pictures, tmp_path, capsys):
    empty, out = tmp_path / "nothing", tmp_path / "v1"
    empty.mkdir()
    _refused(capsys, [*_commands(tmp_path, pictures)["vision"][:1], "--data", empty, "--out", out, "--quiet"],
             "vision", "--data=")
    assert not out.exists()
    code, said, err = _run(capsys, *_commands(tmp_path, pictures)["vision"], "--out", out, "--quiet")
    assert code == 0, err
    assert said == f"results in {out}: report.md, resolution.png, results.csv, runs, vision.json\n"


def test_failed_lab_device_then_a_rerun_works(corpus, tmp_path, capsys, no_cuda):
    out = tmp_path / "l1"
    _refused(capsys, [*TINY_LAB, "--corpus", corpus, "--device", "cuda", "--out", out], "lab", "--device='cuda'")
    assert not out.exists()
    assert _run(capsys, *TINY_LAB, "--corpus", corpus, "--out", out, "--quiet")[0] == 0


def test_a_run_failing_after_claiming_its_folder_leaves_no_trace(corpus, tmp_path, capsys, monkeypatch):
    from posenc.lab.length import study

    def failing(*args, **kwargs):
        raise ValueError("train failed before any work")

    monkeypatch.setattr(study, "train", failing)
    out = tmp_path / "new"
    _refused(capsys, [*TINY_LAB, "--corpus", corpus, "--out", out], "lab", "train failed before any work")
    assert not out.exists()  # created by this invocation, no work in it: removed
    empty = tmp_path / "empty"
    empty.mkdir()
    _refused(capsys, [*TINY_LAB, "--corpus", corpus, "--out", empty], "lab", "train failed")
    assert sorted(p.name for p in empty.iterdir()) == ["study.json"]  # the user's folder stays; only settings in it
    monkeypatch.undo()
    code = _run(capsys, *TINY_LAB, "--corpus", corpus, "--steps", "2", "--out", empty, "--quiet")[0]
    assert code == 0  # other settings: the folder held no work


def test_an_unexpected_error_keeps_its_traceback_and_leaves_no_folder(corpus, tmp_path, monkeypatch):
    from posenc.lab.length import study

    monkeypatch.setattr(study, "train", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        main([*TINY_LAB, "--corpus", str(corpus), "--out", str(tmp_path / "x")])
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------------------------------------------------------------
# Numbers: zero, negatives, NaN and infinities refused the same way by every subcommand

BAD_VALUES = {
    A.positive_int: ["0", "-3", "2.5", "x"],
    A.nonnegative_int: ["-1"],
    A.even_head_dim: ["0", "2", "7"],
    A.context_length: ["1", "0"],
    A.positive_float: ["0", "-1", "nan", "inf"],
    A.at_least_one: ["0.5", "nan"],
    A.above_one: ["1", "-inf"],
    A.fraction: ["0", "1.5", "nan"],
    A.unit_interval: ["-0.5", "1.5", "nan"],
    A.positive_ints: ["0", "16,-2", "16,", ",", "16,,32", "16,nan"],
    A.factors: ["2,0.5", "2,0", "0.99", "inf", ""],
    A.unit_intervals: ["0.5,2", "nan"],
    parse_length: ["0", "-3", "2.5", "0x", "x2", "2xx", "-1x", "nan", "0.1k", "16kx"],  # tokens, 16k or a multiple (2x)
    parse_lengths: ["0", "16,-2", "16,", ",", "16,,32", "16,nan", "2x,0x", "2xx"],
}


def _numeric_options() -> list[tuple[str, str, str]]:
    cases = []
    for command, parser in build_parser().commands.items():
        for action in parser._actions:
            assert action.type not in (int, float), f"posenc {command} {action.option_strings}: use posenc._argtypes"
            if action.type in BAD_VALUES:
                cases += [(command, action.option_strings[0], v) for v in BAD_VALUES[action.type]]
            else:
                assert action.type in (None, A.names), (command, action.option_strings, action.type)
    return cases


NUMERIC = _numeric_options()


def test_every_subcommand_has_its_numbers_checked():
    options = {(c, o) for c, o, _ in NUMERIC}
    assert {c for c, _ in options} == {"lab", "vision", "extend", "export", "check", "bench", "demo"}
    assert len(options) == 13 + 12 + 16 + 2 + 1 + 4 + 4  # lab, vision, extend, export, check, bench, demo
    for command, option in [("lab", "--steps"), ("lab", "--lr"), ("vision", "--crop-scale"), ("extend", "--depths"),
                            ("bench", "--min-run-time"), ("demo", "--head-dim"), ("demo", "--base")]:
        assert (command, option) in options


@pytest.fixture
def no_work(monkeypatch):
    """A value wrongly accepted fails at once instead of running a default-sized study."""
    from posenc.cli import demo
    from posenc.lab import bench
    from posenc.lab.extend.study import run as extend
    from posenc.lab.length import study
    from posenc.lab.vision import study as vision

    def work(*args, **kwargs):
        raise AssertionError("a bad value was accepted")

    for module, name in [(study, "run_study"), (vision, "run_vision"), (extend, "run_extend"),
                         (bench, "settle_allocator"), (demo, "run")]:
        monkeypatch.setattr(module, name, work)


@pytest.mark.parametrize(("command", "option", "value"), NUMERIC)
def test_a_bad_number_is_refused_before_anything_is_written(command, option, value, tmp_path, capsys, no_work):
    out = tmp_path / "out"
    argv = [command, *(["new"] if command == "extend" else []), f"{option}={value}"]
    argv += [] if command == "demo" else ["--out", str(out)]
    err = _refused(capsys, argv, command, f"argument {option}: ", f"(see posenc {command} --help)")
    if value not in ("", ","):
        assert repr(value) in err
    assert not out.exists()


# Name lists (--encodings, --methods, --dtypes, ...): one shared parser; an empty list or item refused like a number's

NAME_OPTIONS = [(c, a.option_strings[0]) for c, p in build_parser().commands.items() for a in p._actions
                if a.type is A.names]


def test_every_name_list_option_uses_the_shared_parser():
    assert set(NAME_OPTIONS) == {("lab", "--encodings"), ("vision", "--encodings"), ("extend", "--methods"),
                                 ("extend", "--ruler-tasks"), ("extend", "--finetune-positions"),
                                 ("check", "--runtimes"), ("bench", "--dtypes"), ("bench", "--layouts"),
                                 ("bench", "--attention-encodings")}


@pytest.mark.parametrize("value", [",", " , ", "", "  ", "x,,y", "x,"])
@pytest.mark.parametrize(("command", "option"), NAME_OPTIONS)
def test_an_empty_name_list_is_refused_before_anything_is_written(command, option, value, tmp_path, capsys, no_work):
    out = tmp_path / "out"
    argv = [command, *(["new"] if command == "extend" else []), f"{option}={value}", "--out", str(out)]
    _refused(capsys, argv, command, f"argument {option}: {value!r} is invalid: expected ", "comma-separated names")
    assert not out.exists()


@pytest.mark.parametrize("argv", [["--dtypes", ","], ["--attention-encodings", " , "], ["--layouts", ", ,"]])
def test_bench_with_an_empty_name_list_times_nothing_and_writes_nothing(argv, tmp_path, capsys, monkeypatch):
    """Once exit 0 with nothing timed and an empty bench.md."""
    out = tmp_path / "bench"
    monkeypatch.chdir(tmp_path)
    _refused(capsys, ["bench", *argv, "--out", out], "bench", f"argument {argv[0]}: {argv[1]!r} is invalid")
    assert list(tmp_path.iterdir()) == []


def test_name_lists_split_at_commas_and_spaces():
    assert A.names("alibi") == ("alibi",)
    assert A.names(" alibi, t5  alibi_2d ,rope ") == ("alibi", "t5", "alibi_2d", "rope")


def test_zero_is_never_replaced_by_a_default(corpus, tmp_path, capsys):
    for option in ("--steps", "--train-len", "--batch-size", "--heads"):
        _refused(capsys, [*TINY_LAB, option, "0", "--out", tmp_path / "o"], "lab", f"argument {option}: '0'")
    code, _, _ = _run(capsys, *TINY_LAB, "--corpus", corpus, "--finetune-steps", "0", "--seed", "0", "--out",
                      tmp_path / "zero", "--quiet")
    settings = json.loads((tmp_path / "zero" / "study.json").read_text())
    assert code == 0 and (settings["finetune_steps"], settings["seed"]) == (0, 0)


# ---------------------------------------------------------------------------------------------------------------------
# Devices and other errors: one line, exit 2


@pytest.mark.parametrize("device", ["banana", "cuda", "cuda:1", "meta"])
@pytest.mark.parametrize("command", ["lab", "vision", "extend", "bench"])
def test_a_bad_device_is_a_message(command, device, corpus, pictures, tmp_path, capsys, no_cuda):
    out = tmp_path / "out"
    argv = [*_commands(corpus, pictures)[command], "--device", device, "--out", out]
    _refused(capsys, argv, command, f"--device='{device}' is invalid: expected one of ")
    assert not out.exists()


def test_a_real_cuda_device_is_refused_only_without_one(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    _refused(capsys, ["bench", "--device", "cuda", "--no-rotary", "--no-attention"], "bench", "no CUDA device")


def test_a_bad_setting_is_one_line_on_stderr_and_nothing_on_stdout(tmp_path, capsys):
    code, out, err = _run(capsys, "lab", "--dim", "30", "--out", tmp_path / "o")
    assert (code, out) == (2, "")
    assert err.startswith("posenc lab: dim=30 is invalid: expected a multiple of 2 * n_heads")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        ([], "posenc: the following arguments are required: COMMAND (see posenc --help)"),
        (["train"], "posenc: argument COMMAND: invalid choice: 'train'"),
        (["lab", "--bogus"], "posenc lab: unrecognized arguments: --bogus (see posenc lab --help)"),
        (["lab", "--task", "sort"], "posenc lab: argument --task: invalid choice: 'sort'"),
        (["lab", "--step", "5"], "posenc lab: unrecognized arguments: --step 5"),  # never abbreviated
        (["extend"], "posenc extend: the following arguments are required: model (see posenc extend --help)"),
        (["demo", "--factor"], "posenc demo: argument --factor: expected one argument (see posenc demo --help)"),
    ],
)
def test_usage_errors_are_one_line(argv, line, capsys):
    code, out, err = _run(capsys, *argv)
    assert (code, out) == (2, "")
    assert err.startswith(line) and err.count("\n") == 1, err


def test_help_shows_a_text_and_the_default_of_every_option(capsys):
    for command, parser in build_parser().commands.items():
        code, out, _ = _run(capsys, command, "--help")
        assert code == 0 and out.startswith(f"usage: posenc {command}")
        for action in parser._actions:
            assert action.help, (command, action.option_strings)
    helps = {c: p.format_help() for c, p in build_parser().commands.items()}
    wanted = [("lab", "peak AdamW learning rate (default: 0.003)"), ("lab", "(default: cpu)"),
              ("lab", "seed of the weights and batches (default: 0)"), ("figures", "(default: figures)"),
              ("bench", "(default: 1024,2048,4096,8192,16384)"), ("lab", "layers (default: 2)")]
    for command, text in wanted:
        assert text in " ".join(helps[command].split()), (command, text)


def test_demo_runs_at_the_edges_of_its_options(capsys):
    code, out, _ = _run(capsys, "demo", "--head-dim", "4", "--factor", "1", "--trained-length", "2", "--base", "1.5")
    assert code == 0 and "RoPE for head_dim=4, base=1.5, trained on 2 tokens, extended 1x to 2" in out


# ---------------------------------------------------------------------------------------------------------------------
# Interruption


def test_resume_command_replaces_out_and_adds_resume_once():
    argv = ["lab", "--out", "old", "--resume", "--corpus", "my file.txt", "--out=older", "--steps", "5"]
    assert resume_command(argv, "runs/new dir") == (
        "posenc lab --corpus 'my file.txt' --steps 5 --out 'runs/new dir' --resume"
    )
    extend = resume_command(["extend", "new", "--task", "passkey"], "o")
    assert extend == "posenc extend new --task passkey --out o --resume"


def test_resume_command_drops_save_once_the_model_was_saved(tmp_path):
    """The model is written before the measurements: a resume with the same --save would be refused (the file
    exists), so the command leaves it out once it exists, and keeps it while it does not."""
    saved = tmp_path / "m.gguf"
    argv = ["extend", "smollm2", "--save", str(saved), "--save-type", "F16", "--factors", "2"]
    keep = f"posenc extend smollm2 --save {saved} --save-type F16 --factors 2 --out o --resume"
    assert resume_command(argv, "o") == keep
    saved.write_bytes(b"GGUF")
    assert resume_command(argv, "o") == "posenc extend smollm2 --factors 2 --out o --resume"
    assert resume_command(["extend", "smollm2", f"--save={saved}", "--save-type=F16"], "o") == (
        "posenc extend smollm2 --out o --resume"
    )
    folder = tmp_path / "folder"
    folder.mkdir()
    argv = ["extend", "smollm2", "--save", str(folder)]
    assert resume_command(argv, "o") == f"posenc extend smollm2 --save {folder} --out o --resume"  # empty: kept
    (folder / "config.json").write_text("{}")
    assert resume_command(argv, "o") == "posenc extend smollm2 --out o --resume"


def test_an_interruption_names_the_folder_and_the_command_that_continues(tmp_path, capsys, monkeypatch):
    from posenc.lab.length import study

    def interrupted(cfg, out, **kwargs):
        Path(out).mkdir(parents=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(study, "run_study", interrupted)
    monkeypatch.chdir(tmp_path)
    handler = signal.getsignal(signal.SIGTERM)
    code, out, err = _run(capsys, "lab", "--steps", "7")
    assert (code, out) == (130, "")
    [folder] = Path("runs").iterdir()
    assert folder.name.startswith("lab-")
    assert err == (f"posenc lab: interrupted; finished work is kept in {folder}. Continue with:\n"
                   f"  posenc lab --steps 7 --out {folder} --resume\n")
    assert signal.getsignal(signal.SIGTERM) is handler  # restored

    monkeypatch.setattr(study, "run_study", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    code, _, err = _run(capsys, "lab", "--out", "later")
    assert (code, err) == (130, "posenc lab: interrupted before anything was written\n")


def test_sigterm_exits_130_and_the_printed_command_finishes_the_study(corpus, tmp_path):
    out = tmp_path / "run"
    argv = ["lab", "--encodings", "rope", "--train-len", "16", "--eval-lens", "16", "--steps", "1000",
            "--batch-size", "4", "--dim", "32", "--layers", "1", "--heads", "2", "--eval-tokens", "256",
            "--corpus", str(corpus), "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "posenc", *argv, "--out", str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "runs" / "rope" / "checkpoint.safetensors").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    said, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    command = shlex.join(["posenc", *argv, "--out", str(out), "--resume"])
    assert err.splitlines()[-2:] == [
        f"posenc lab: interrupted; finished work is kept in {out}. Continue with:",
        f"  {command}",
    ]
    assert not (out / "results.csv").exists()
    again = subprocess.run([sys.executable, "-m", "posenc", *shlex.split(command)[1:]], env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "runs" / "rope" / "done.json").read_text())["steps"] == 1000
    assert again.stdout.startswith(f"results in {out}: ")


# ---------------------------------------------------------------------------------------------------------------------
# Output: --quiet, tables in a pipe, file modes


def test_quiet_says_where_the_results_are_and_files_get_the_umask_mode(corpus, tmp_path, capsys):
    old = os.umask(0o022)
    try:
        code, said, err = _run(capsys, *TINY_LAB, "--corpus", corpus, "--out", tmp_path / "q", "--quiet")
    finally:
        os.umask(old)
    assert (code, err) == (0, "")
    assert said == f"results in {tmp_path / 'q'}: extrapolation.png, report.md, results.csv, runs, study.json\n"
    modes = {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in (tmp_path / "q").rglob("*")
             if p.is_file()}
    assert "q/runs/nope/checkpoint.safetensors" in modes and "q/study.json" in modes
    assert set(modes.values()) == {"0o644"}, modes


def test_tables_are_not_cut_at_80_columns_in_a_pipe(corpus, tmp_path, capsys):
    lengths = "16,32,48,64,80,96,112,128"
    code, said, _ = _run(capsys, *TINY_LAB, "--corpus", corpus, "--eval-lens", lengths, "--out", tmp_path / "w")
    assert code == 0
    rows = [line for line in said.splitlines() if line.startswith("│")]
    assert len(rows) == 1 and rows[0].startswith("│ nope") and rows[0].count("│") == 11, said  # one line per row
    assert max(len(line) for line in said.splitlines()) > 80


def test_ctrl_c_while_the_command_starts_is_one_line(monkeypatch, capsys):
    """The console script's entry (``posenc_entry``, outside the package) imports ``posenc.cli`` -- torch: seconds --
    inside a ``try``: a Ctrl-C there is one line on stderr and exit status 130, no traceback."""
    import importlib.abc

    import posenc_entry

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    class Interrupted(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201
            if name == "posenc.cli":
                raise KeyboardInterrupt
            return None

    monkeypatch.delitem(sys.modules, "posenc.cli", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Interrupted(), *sys.meta_path])
    assert posenc_entry.main() == 130
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "posenc: interrupted while starting; nothing was done\n"
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["posenc"] == "posenc_entry:main"


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(tmp_path):
    """``posenc check DIR --json | head``: once the reader is gone, the command ends with exit status 141 (SIGPIPE's,
    as a Unix tool) and nothing on stderr -- no BrokenPipeError traceback, none at interpreter exit either."""
    import subprocess

    code = (
        "import sys, posenc.cli, posenc_entry\n"
        "def run():\n"
        "    print('x' * 1000, flush=True)\n"
        "    raise BrokenPipeError(32, 'Broken pipe')\n"
        "posenc.cli.main = run\n"
        "sys.exit(posenc_entry.main())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 141 and done.stderr == "", done.stderr
