"""The newcomer's path (issue 39, points 3 and 4): ``posenc extend --plan`` (the plan and its estimate, no weight
read, nothing written), lengths as multiples of the model's context (``--lengths 0.5x,2x``), ``posenc export`` (one
patched model written, nothing else), and ``--no-baseline`` (a study without the unpatched model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf.tiny import tiny_model  # noqa: E402 - after the skip
from hf.tiny_gguf import write_llama  # noqa: E402
from lab.extend.needles.test_passkey import byte_bpe_tokenizer  # noqa: E402
from lab.extend.study.test_study import TINY, _hf_folder, _lab_run  # noqa: E402
from lab.extend.study.test_study import _cli as _cli_of_strings  # noqa: E402
from posenc.gguf.header import read_gguf_header  # noqa: E402
from posenc.lab.extend.settings.config import ExtendConfig, resolve_lengths  # noqa: E402
from posenc.lab.extend.study.run import read_results, run_extend  # noqa: E402
from posenc.lab.extend.targets.hf import HFTarget  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
STUDY = ["--methods", "yarn", "--factors", "2", "--depths", "0.5", "--trials", "1", "--device", "cpu"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    """A tiny random transformers Llama, original context 64."""
    return _hf_folder(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def llama_gguf(tmp_path_factory) -> Path:
    """A tiny Llama GGUF (original context 32), as llama.cpp's converter writes it."""
    return write_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf", tiny_model("llama"))


@pytest.fixture
def no_weights(monkeypatch):
    """Any weight read fails the test."""

    def load(*args, **kwargs):
        raise AssertionError("weights were read")

    monkeypatch.setattr(HFTarget, "load", load)
    monkeypatch.setattr("posenc.hf.load_causal_lm", load)


def _cli(*args) -> tuple[int, str]:
    return _cli_of_strings(*map(str, args))


def _tree(folder: Path) -> list[str]:
    """Every path under ``folder``, hidden ones included."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# ---------------------------------------------------------------------------------------------------------------------
# --plan


def test_plan_prints_the_plan_and_an_estimate_and_writes_nothing(llama, corpus, tmp_path, monkeypatch, no_weights):
    monkeypatch.chdir(tmp_path)  # the default --out (runs/extend-<time>) would land here
    before = _tree(tmp_path)
    out = tmp_path / "out"
    code, text = _cli("extend", llama, "--corpus", corpus, "--lengths", "32,128", *STUDY, "--out", out, "--plan")
    assert code == 0, text
    assert "Plan: 2 models (none, yarn x2) x perplexity and passkey (1 depth x 1 key) at lengths 32, 128 (original " \
           "64): " in text
    assert "Time: about 0:00:" in text and "before any weight is loaded" in text
    assert "refines it after timed forwards" in text
    assert "Nothing written (--plan)" in text
    code, text = _cli("extend", llama, "--corpus", corpus, "--lengths", "32,128", *STUDY, "--plan", "--quiet")
    assert code == 0 and "Plan: 2 models" in text  # --quiet still prints what --plan is for
    assert _tree(tmp_path) == before and not out.exists()


def test_the_plan_is_the_one_the_study_prints_and_a_resumed_plan_counts_what_is_left(llama, corpus, tmp_path):
    out = tmp_path / "out"
    args = ["extend", llama, "--corpus", corpus, "--lengths", "32,128", *STUDY, "--eval-tokens", "128", "--out", out]
    code, planned = _cli(*args, "--plan")
    assert code == 0 and not out.exists()
    code, ran = _cli(*args)
    assert code == 0, ran
    [plan_line] = [line for line in planned.splitlines() if line.startswith("Plan:")]
    [run_line] = [line for line in ran.splitlines() if line.startswith("Plan:")]
    assert run_line.startswith(plan_line)  # the run adds its calibrated time to the same line
    files = _tree(out)
    code, text = _cli(*args, "--plan", "--resume")
    assert code == 0 and f"Plan: nothing left to measure in {out}" in text and _tree(out) == files
    code, text = _cli(*args[:-2], "--depths", "0.25", "--out", out, "--plan", "--resume")  # other settings
    assert code == 2 and "--resume=" in text and "these differ: ['depths']" in text and _tree(out) == files


def test_plan_of_a_lab_model_says_it_has_no_estimate(corpus, tmp_path):
    run = _lab_run(tmp_path / "rope", "rope", corpus, steps=1)
    before = _tree(tmp_path)
    code, text = _cli("extend", run, "--corpus", corpus, "--methods", "yarn", "--factors", "2", "--lengths", "1x,2x",
                      "--depths", "0.5", "--trials", "1", "--eval-tokens", "256", "--out", tmp_path / "o",
                      "--plan")
    assert code == 0, text
    assert "Plan: 2 models (none, yarn x2)" in text and "at lengths 32, 64 (original 32)" in text
    assert "no estimate before the run for a lab model" in text and _tree(tmp_path) == before
    code, text = _cli("extend", "new", "--task", "passkey", "--train-len", "104", "--train-steps", "7", "--lengths",
                      "1x,2x", "--methods", "yarn", "--out", tmp_path / "o", "--plan")
    assert code == 0 and "at lengths 104, 208 (original 104)" in text, text
    assert f"First: the passkey task trained for 7 steps at 104 bytes ({tmp_path / 'o' / 'runs' / 'passkey'}" in text
    assert _tree(tmp_path) == before


def test_plan_checks_the_save_path_and_names_it(llama, corpus, tmp_path, no_weights):
    args = ["extend", llama, "--corpus", corpus, "--lengths", "32,128", *STUDY, "--out", tmp_path / "out", "--plan"]
    code, text = _cli(*args, "--save", tmp_path / "saved")
    assert code == 0 and f"Would write yarn x2 to {tmp_path / 'saved'} (a transformers folder)" in text
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "mine.txt").write_text("mine")
    code, text = _cli(*args, "--save", tmp_path / "used")
    assert code == 2 and text.count("\n") == 1 and "expected a new or empty folder" in text
    assert _tree(tmp_path) == ["used", "used/mine.txt"]


def test_longrope_without_its_searched_factors_is_refused_before_anything_is_measured(llama, corpus, tmp_path,
                                                                                       no_weights):
    """LongRoPE's long_factor comes from a search that no option sets: the study refuses it at its plan, naming the
    setting and the Python call that takes searched factors -- not after measuring the unpatched model."""
    args = ["extend", llama, "--corpus", corpus, "--lengths", "32,128", "--methods", "longrope", "--factors", "2"]
    code, text = _cli(*args, "--out", tmp_path / "out", "--plan")
    assert code == 2 and text.count("\n") == 1 and "methods='longrope' is invalid" in text, text
    assert "long_factor comes from a search" in text and "extend_context(model, 'longrope', F, long_factor=" in text
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("finetune", [[], ["--finetune-steps", "2"]])
def test_drope_is_planned_once_beside_a_factor_method(llama, corpus, tmp_path, no_weights, finetune):
    """DroPE has no factor: ``--methods yarn,drope --factors 2`` plans drope once, labelled ``drope``; zero-shot, the
    plan says it is not the authors' DroPE (no recalibration); fine-tuned, that it is recalibrated at the original
    context (issue 50, point 1; ``tests/lab/extend/study/test_drope.py`` runs it)."""
    args = ["extend", llama, "--corpus", corpus, "--lengths", "32,128", "--methods", "yarn,drope", "--factors", "2"]
    code, text = _cli(*args, *finetune, "--out", tmp_path / "out", "--plan")
    text = " ".join(text.split())
    assert code == 0 and "(none, yarn x2, drope" in text, text
    if finetune:
        assert "drope +ft2" in text and "(drope: recalibrated at the original context, 64 tokens at most)" in text
    else:
        assert "zero-shot drope is RoPE dropped without recalibration (an ablation), not DroPE" in text
    assert not (tmp_path / "out").exists()


def test_extend_help_says_a_plan_and_estimate_come_first():
    from posenc.cli import build_parser

    text = " ".join(build_parser().commands["extend"].format_help().split())
    assert "a plan is printed (the models, lengths and forwards) with a time estimate" in text
    assert "refined after timed forwards" in text and "--plan prints that plan and estimate" in text
    assert "--plan print the plan (models, lengths, forwards) and its time estimate, made before any weight" in text


# ---------------------------------------------------------------------------------------------------------------------
# Lengths as multiples of the model's context


def test_multiples_resolve_against_the_original_context():
    cfg = ExtendConfig(model="m", lengths=("0.5x", 300, "1.5X", "2x"), eval_tokens="4x")
    assert cfg.lengths == ("0.5x", 300, "1.5x", "2x") and cfg.has_multiples  # the original is not known yet
    resolved = resolve_lengths(cfg, 100)
    assert resolved.lengths == (50, 300, 150, 200) and resolved.eval_tokens == 400 and not resolved.has_multiples
    # Known from the settings (original_len, or a new model's train_len): resolved at once.
    assert ExtendConfig(model="m", original_len=8192, lengths=("0.5x", "1.5x")).lengths == (4096, 12288)
    assert ExtendConfig(model="new", task="passkey", train_len=128, lengths=("1x", "2x")).lengths == (128, 256)
    tuned = ExtendConfig(model="m", original_len=64, lengths=("2x",), finetune_steps=1, finetune_window="0.5x")
    assert tuned.finetune_window == 32
    with pytest.raises(ValueError, match=r"^lengths=\[64, 64\] is invalid: .*one beyond the original context of 64"):
        ExtendConfig(model="m", original_len=64, lengths=("1x", 64))
    with pytest.raises(ValueError, match=r"^lengths='0.001x' is invalid: expected a multiple giving at least one"):
        resolve_lengths(ExtendConfig(model="m", lengths=("0.001x", 8)), 100)


@pytest.mark.parametrize("bad", ["x2", "-1x", "0x", "2xx", "1.5", "0", "2 x", "x", ".x", True, "0.1k", "k", "2kx"])
def test_a_bad_length_is_refused_naming_the_setting(bad):
    with pytest.raises(ValueError, match=rf"^lengths={bad!r} is invalid: expected a length in tokens \(4096, or 16k"):
        ExtendConfig(model="m", lengths=(64, bad))


def test_lengths_in_thousands_of_1024_tokens():
    """``16k`` is 16,384 tokens, as the README and the field write lengths; resolved at once (no original needed)."""
    cfg = ExtendConfig(model="m", lengths=("16k", "12K", "1.5k", 4096, "2x"))
    assert cfg.lengths == (16384, 12288, 1536, 4096, "2x")


def test_cli_multiples_are_stored_as_tokens_and_resume_compares_tokens(llama, corpus, tmp_path):
    out = tmp_path / "out"
    code, text = _cli("extend", llama, "--corpus", corpus, "--lengths", "0.5x,2x", "--eval-tokens", "2x", *STUDY,
                      "--out", out)
    assert code == 0, text
    settings = json.loads((out / "extend.json").read_text())
    assert (settings["lengths"], settings["eval_tokens"]) == ([32, 128], 128)
    assert {r["length"] for r in read_results(out / "results.csv")} == {32, 128}
    code, text = _cli("extend", llama, "--corpus", corpus, "--lengths", "32,128", "--eval-tokens", "128", *STUDY,
                      "--out", out, "--resume")  # the same study in tokens
    assert code == 0 and "none: 4 of 4 measurements done, skipped" in text


def test_cli_multiples_of_a_gguf_context_read_from_its_header(llama_gguf, corpus, tmp_path, no_weights):
    code, text = _cli("extend", llama_gguf, "--corpus", corpus, "--lengths", "1x,1024,3x", *STUDY, "--out",
                      tmp_path / "out", "--plan")
    assert code == 0, text
    assert "at lengths 32, 96, 1024 (original 32)" in text


@pytest.mark.parametrize(
    ("option", "value"),
    [("--lengths", "x2"), ("--lengths", "0x"), ("--lengths", "2xx"), ("--lengths", "4096,2xx"), ("--lengths", "-1x"),
     ("--finetune-window", "x2"), ("--eval-tokens", "0x")],
)
def test_cli_bad_multiples_fail_in_one_line(llama, tmp_path, option, value):
    out = tmp_path / "out"
    code, text = _cli("extend", llama, f"{option}={value}", "--out", out)
    assert code == 2 and text.count("\n") == 1 and "Traceback" not in text, text
    assert text.startswith(f"posenc extend: argument {option}: {value!r} is invalid") and not out.exists()
    code, text = _cli("extend", llama, option, value, "--out", out)  # "-1x" looks like an option to argparse
    assert code == 2 and text.count("\n") == 1 and f"argument {option}: " in text and not out.exists()


def test_pick_refuses_what_only_a_study_resolves(llama, corpus, tmp_path):
    for args, match in ((["--finetune-steps", "1", "--finetune-window", "1x"], "--finetune-window='1x' is invalid"),
                        (["--no-baseline"], "--no-baseline=True is invalid")):
        code, text = _cli("extend", llama, "--pick", "--target", "2x", *args, "--out", tmp_path / "p")
        assert code == 2 and text.count("\n") == 1 and match in text and not (tmp_path / "p").exists()


# ---------------------------------------------------------------------------------------------------------------------
# posenc export


def test_export_writes_only_the_folder_and_it_reloads_extended(llama, tmp_path):
    from posenc.hf import extend_context, load_causal_lm

    work = tmp_path / "work"
    work.mkdir()
    saved = work / "f"
    code, text = _cli("export", llama, "--method", "yarn", "--factor", "2", "--save", saved, "--device", "cpu",
                      "--dtype", "float32")
    assert code == 0, text
    assert f"Wrote yarn x2 of LlamaForCausalLM (llama) from {llama.name} to {saved} (a transformers folder, float32 " \
           "weights, as the source holds them; context 64 -> 128 tokens)" in text
    assert "AutoModelForCausalLM.from_pretrained(" in text
    assert _tree(work) == ["f", *sorted(f"f/{p.name}" for p in saved.iterdir())]  # no run folder, nothing partial
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in saved.iterdir()}
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(saved, local_files_only=True).eval()
    rope = reloaded.config.rope_parameters
    assert (rope["rope_type"], rope["factor"], rope["original_max_position_embeddings"]) == ("yarn", 2.0, 64)
    assert reloaded.config.max_position_embeddings == 128
    # The reloaded model computes what posenc's in-memory patch computes, past the original context too.
    patched, _ = load_causal_lm(llama, dtype=torch.float32)
    extend_context(patched, "yarn", 2.0)
    ids = torch.randint(0, reloaded.config.vocab_size, (1, 120), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        got = reloaded(ids).logits
        torch.testing.assert_close(got, patched.eval()(ids).logits, rtol=0, atol=1e-6)
        plain = transformers.AutoModelForCausalLM.from_pretrained(llama, local_files_only=True).eval()(ids).logits
    assert (got - plain).abs().max() > 100 * (got - patched(ids).logits).abs().max()  # it is extended


def test_export_into_an_empty_folder_the_user_made(llama, tmp_path):
    (tmp_path / "empty").mkdir()
    code, text = _cli("export", llama, "--method", "linear", "--factor", "4", "--save", tmp_path / "empty", "--quiet")
    assert code == 0 and text == ""
    config = json.loads((tmp_path / "empty" / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == "linear" and config["rope_parameters"]["factor"] == 4.0
    assert _tree(tmp_path) == ["empty", *sorted(f"empty/{p.name}" for p in (tmp_path / "empty").iterdir())]


def test_export_gguf_from_a_gguf(llama_gguf, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    saved = work / "tiny-yarn.gguf"
    code, text = _cli("export", llama_gguf, "--method", "yarn", "--factor", "2", "--save", saved, "--dtype", "float32")
    assert code == 0, text
    assert f"to {saved} (a GGUF file llama.cpp runs, tensors as in the source; context 32 -> 64 tokens)" in text
    assert f"llama-cli -m {saved} -c 64" in text
    assert _tree(work) == ["tiny-yarn.gguf"]
    header = read_gguf_header(saved).metadata
    assert header["llama.rope.scaling.type"] == "yarn" and header["llama.rope.scaling.factor"] == 2.0
    assert header["llama.rope.scaling.original_context_length"] == 32 and header["llama.context_length"] == 64


@pytest.fixture
def bf16_units(monkeypatch):
    """A CPU with bfloat16 units, where --dtype auto means bfloat16 for posenc extend."""
    caps = {**torch.cpu.get_capabilities(), "avx512_bf16": True}
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)


@pytest.fixture(scope="module")
def llama_bf16(llama, tmp_path_factory) -> Path:
    """The tiny Llama folder saved in bfloat16."""
    folder = tmp_path_factory.mktemp("llama-bf16")
    transformers.AutoModelForCausalLM.from_pretrained(llama, dtype=torch.bfloat16).save_pretrained(folder)
    transformers.AutoTokenizer.from_pretrained(llama).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("source", ["llama", "llama_bf16", "llama_gguf"])
def test_export_writes_the_source_weights_unchanged(source, request, tmp_path, bf16_units):
    """With --dtype auto on a CPU with bfloat16 units, export loaded a float32 model in bfloat16 and wrote it as
    float32: every weight bf16-rounded in a folder whose config says float32, logits 3.2e-3 from extend_context on
    the original. Now the source's weights are written bit for bit in its own dtype (a GGUF's dequantized values
    in float32), the line says which, and the reload computes what extend_context computes on the original."""
    from safetensors.torch import load_file

    from posenc.hf import extend_context, load_causal_lm

    path = request.getfixturevalue(source)
    saved = tmp_path / "f"
    code, text = _cli("export", path, "--method", "yarn", "--factor", "2", "--save", saved)
    assert code == 0, text
    original, _ = load_causal_lm(path, dtype=None if source != "llama_bf16" else torch.bfloat16)
    dtype = {"llama_bf16": "bfloat16"}.get(source, "float32")
    written = load_file(saved / "model.safetensors")
    expected = original.state_dict()
    assert written.keys() <= expected.keys() and written
    for name, tensor in written.items():
        assert tensor.dtype == expected[name].dtype and torch.equal(tensor, expected[name]), name
    assert json.loads((saved / "config.json").read_text())["dtype"] == dtype
    assert f"(a transformers folder, {dtype} weights, as the source holds them; context" in text
    # float32 forwards of the source extended in memory and of the folder (transformers' load and posenc's)
    extended, _ = load_causal_lm(path)
    extend_context(extended, "yarn", 2.0)
    loads = [transformers.AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32, local_files_only=True),
             load_causal_lm(saved)[0]]
    ids = torch.randint(0, extended.config.vocab_size, (1, 100), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        for reloaded in loads:
            torch.testing.assert_close(reloaded.eval()(ids).logits, extended(ids).logits, rtol=0, atol=0)


def test_export_with_another_dtype_says_it_converted(llama, tmp_path, bf16_units):
    from safetensors import safe_open

    saved = tmp_path / "f"
    code, text = _cli("export", llama, "--method", "yarn", "--factor", "2", "--save", saved, "--dtype", "bfloat16")
    assert code == 0, text
    assert "(a transformers folder, bfloat16 weights, converted from the source's float32 (--dtype); context" in text
    with safe_open(saved / "model.safetensors", "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118 - safe_open is no dict == {"BF16"}


@pytest.mark.parametrize(
    ("method", "extra"),
    [("yarn+string", []), ("self_extend", ["--original-len", "48"]), ("dca", ["--dtype", "bfloat16"])],
)
def test_a_refused_export_names_the_python_that_rebuilds_the_model(llama, tmp_path, monkeypatch, method, extra):
    """No saved config runs these: the refusal names the Python that rebuilds the model posenc extend measures,
    every call with the arguments the study passes (YaRN, then STRING; the original length given; the dtype), and
    running it literally gives that model's logits. It used to say "save the model unpatched and re-apply it after
    loading with extend_context(model, 'self_extend', 2)", which missed --original-len and the dtype."""
    import posenc.hf
    from posenc.deploy.source import load_weights
    from posenc.lab.extend.targets.load import load_target

    if "bfloat16" in extra:  # a CPU with bfloat16 units, where --dtype bfloat16 is allowed
        caps = {**torch.cpu.get_capabilities(), "avx512_bf16": True}
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    dtype = ["--dtype", "float32"] if "--dtype" not in extra else []
    with pytest.MonkeyPatch.context() as guard:  # any weight read before the refusal fails the test
        guard.setattr(HFTarget, "load", lambda self: pytest.fail("weights were read"))
        guard.setattr("posenc.hf.load_causal_lm", lambda *a, **k: pytest.fail("weights were read"))
        code, text = _cli("export", llama, "--method", method, "--factor", "2", "--save", tmp_path / "f", *extra,
                          *dtype)
    assert code == 2 and "a method a saved config runs as posenc measures it" in text and "Traceback" not in text
    assert _tree(tmp_path) == []
    python = text[text.index("No folder is needed to run it in Python: ") :].split(": ", 1)[1].strip()
    assert python.startswith(f"model, tokenizer = posenc.hf.load_causal_lm({str(llama)!r}")
    assert ("original_max_position_embeddings=48" in python) == ("--original-len" in extra)
    assert ("dtype='bfloat16'" in python) == ("bfloat16" in extra)
    scope = {"posenc": posenc}
    exec(python, scope)
    options = dict(zip(extra[::2], extra[1::2], strict=True))
    original = int(options["--original-len"]) if "--original-len" in options else None
    cfg = ExtendConfig(model=str(llama), methods=(method,), factors=(2.0,), device="cpu",
                       dtype=options.get("--dtype", "float32"), original_len=original)
    target = load_target(cfg, tmp_path / "out", device="cpu", progress=False)
    measured = load_weights(target.source, device=target.device, dtype=target.dtype, attn=target.attn)
    target._extend(measured, method, 2.0)
    ids = torch.randint(0, 300, (1, 120), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        torch.testing.assert_close(scope["model"](ids).logits, measured(ids).logits, rtol=0, atol=0)


@pytest.fixture(scope="module")
def bloom(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bloom")
    tokenizer = byte_bpe_tokenizer(folder)
    tiny_model("bloom", vocab_size=len(tokenizer)).save_pretrained(folder)
    return folder


def test_export_refusals_come_before_anything_is_read_or_written(llama, llama_gguf, bloom, corpus, tmp_path,
                                                                 no_weights):
    work = tmp_path / "work"
    work.mkdir()
    (work / "used").mkdir()
    (work / "used" / "mine.txt").write_text("mine")
    (work / "mine.gguf").write_bytes(b"mine")
    run = _lab_run(tmp_path / "lab", "rope", corpus, steps=1)
    before = _tree(work)
    cases = [
        ([llama, "--method", "self_extend", "--save", work / "f"], "a method a saved config runs as posenc measures"),
        ([llama, "--method", "dca_vllm", "--save", work / "f"], "for ['qwen2', 'qwen3'] only, not 'llama'"),
        ([bloom, "--method", "linear", "--original-len", "32", "--save", work / "f"], "expected a RoPE model"),
        ([llama, "--method", "yarn", "--save", work / "used"], "expected a new or empty folder"),
        ([llama, "--method", "yarn", "--save", work / "f.gguf"], "a GGUF model to start from"),
        ([llama_gguf, "--method", "dynamic", "--save", work / "f.gguf"], "no GGUF key records"),
        ([llama_gguf, "--method", "yarn", "--save", work / "mine.gguf"], "a file that does not exist yet"),
        ([llama, "--method", "nope", "--save", work / "f"], "method='nope' is invalid"),
        ([run, "--method", "yarn", "--save", work / "f"], "expected a pretrained model"),
        # under a regular file: refused now, not once the weights have loaded
        ([llama, "--method", "yarn", "--save", work / "mine.gguf" / "f"], f"a path under folders ({work}/mine.gguf "
         "is a file)"),
        ([llama_gguf, "--method", "yarn", "--save", work / "mine.gguf" / "sub" / "f.gguf"], "mine.gguf is a file"),
        # the method's fault, named as such; and what export cannot make from a factor
        ([llama_gguf, "--method", "yarm", "--save", work / "f.gguf"], "method='yarm' is invalid: expected one of"),
        ([llama, "--method", "yarm+string", "--save", work / "f"], "method='yarm' is invalid"),
        ([llama, "--method", "longrope", "--save", work / "f"], "method='longrope' is invalid: expected a method "
         "export can make from a factor alone: LongRoPE's per-frequency long_factor comes from a search"),
        ([llama, "--method", "none", "--save", work / "f"], "method='none' is invalid: expected an extension method: "
         "export writes an extended model"),
        ([llama, "--method", "drope", "--save", work / "f"], "method='drope' is invalid: expected a method export "
         "can make from a factor alone: DroPE has no factor"),
        ([llama, "--methods", "yarn,dynamic", "--save", work / "f"], "expected one method: export writes one model"),
    ]
    for args, match in cases:
        code, text = _cli("export", *args, "--factor", "2")
        assert code == 2 and text.count("\n") == 1 and match in text and "Traceback" not in text, (args, text)
        assert _tree(work) == before
    assert (work / "mine.gguf").read_bytes() == b"mine" and (work / "used" / "mine.txt").read_text() == "mine"
    code, text = _cli("export", llama, "--method", "yarn", "--factor", "1", "--save", work / "f")
    assert code == 2 and "factor=1.0 is invalid: expected a factor > 1 for yarn: at 1 it is the unpatched" in text
    assert _tree(work) == before
    code, text = _cli("export", llama, "--method", "yarn", "--factor", "0.5", "--save", work / "f")
    assert code == 2 and "argument --factor: '0.5' is invalid: expected a finite number >= 1" in text


@pytest.mark.parametrize("gguf", [False, True])
def test_an_interrupted_export_leaves_nothing(llama, llama_gguf, tmp_path, monkeypatch, gguf):
    """Interrupted while the model is written (a file half written): nothing is left, not even the folders created
    above --save, and the message says so (it said "before anything was written" and left the folders)."""
    import gguf

    def interrupted_folder(self, folder, *args, **kwargs):
        Path(folder, "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    def interrupted_file(self, *args, **kwargs):  # the header is in the file by now
        raise KeyboardInterrupt

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", interrupted_folder)
    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", interrupted_file)
    (tmp_path / "mine").mkdir()
    save = tmp_path / "mine" / "new" / "deeper" / ("f.gguf" if gguf else "f")
    code, text = _cli("export", llama_gguf if gguf else llama, "--method", "yarn", "--factor", "2", "--save", save)
    assert code == 130 and _tree(tmp_path) == ["mine"], _tree(tmp_path)
    assert f"posenc export: interrupted; {save} was not written and nothing it created is left" in text


def test_export_files_follow_the_umask(llama, tmp_path):
    """transformers writes model.safetensors as 0600; every exported file gets what a plain open() gives."""
    import os

    old = os.umask(0o027)
    try:
        code, text = _cli("export", llama, "--methods", "yarn", "--factors", "2", "--save", tmp_path / "f", "--quiet")
    finally:
        os.umask(old)
    assert code == 0, text
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "f").iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o640}, modes
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o750


def test_method_and_factor_in_either_spelling():
    """export takes --method/--factor, extend --methods/--factors: each takes the other's spelling too."""
    from posenc.cli import build_parser

    parser = build_parser()
    for spelling in (["--method", "yarn", "--factor", "2"], ["--methods", "yarn", "--factors", "2"]):
        export = parser.parse_args(["export", "m", *spelling, "--save", "f"])
        extend = parser.parse_args(["extend", "m", *spelling])
        assert (export.method, export.factor) == ("yarn", 2.0)
        assert (extend.methods, extend.factors) == (("yarn",), (2.0,))
    for command in ("export", "extend"):  # an error names the option as it was typed
        for option in ("--factor", "--factors"):
            code, text = _cli(command, "m", "--method", "yarn", "--save", "f", option, "0.5")
            assert code == 2 and text.startswith(f"posenc {command}: argument {option}: '0.5' is invalid"), text


# ---------------------------------------------------------------------------------------------------------------------
# --no-baseline


def test_a_study_without_the_baseline_has_no_none_rows_and_a_report(llama, corpus, tmp_path):
    out = tmp_path / "out"
    code, text = _cli("extend", llama, "--corpus", corpus, "--lengths", "32,128", *STUDY, "--no-baseline", "--out", out)
    assert code == 0, text
    assert "Plan: 1 model (yarn x2)" in text
    rows = read_results(out / "results.csv")
    assert rows and {r["method"] for r in rows} == {"yarn"}
    assert json.loads((out / "extend.json").read_text())["baseline"] is False
    report = (out / "report.md").read_text()
    assert "the unpatched model was left out (`--no-baseline`)" in report
    assert "`none` is the model as trained" not in report
    assert "- At 128 tokens the best is yarn x2 with perplexity" in report and "- yarn x2: " in report
    assert "| yarn x2 |" in report and "| none |" not in report
    # A study with the baseline stores the settings as studies made before the setting did: they still resume.
    cfg = ExtendConfig(model=str(llama), methods=("yarn",), factors=(2.0,), lengths=(32, 128), corpus=str(corpus),
                       **{**TINY, "trials": 1, "depths": (0.5,)})
    rows = run_extend(cfg, tmp_path / "with", progress=False)
    assert {r["method"] for r in rows} == {"none", "yarn"}
    assert "baseline" not in json.loads((tmp_path / "with" / "extend.json").read_text())
