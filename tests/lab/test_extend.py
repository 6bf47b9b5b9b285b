"""``posenc extend`` end to end on tiny models made here: lab checkpoints (RoPE, ALiBi), the passkey task, resume,
a tiny random transformers Llama, and bad input."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest
import torch

from posenc.cli import main
from posenc.lab import evaluate as ev
from posenc.lab.data import load_corpus
from posenc.lab.extend import ExtendConfig, run_extend
from posenc.lab.extend_models import LabTarget
from posenc.lab.model import GPT, ModelConfig
from posenc.lab.train import TrainConfig, load_model, step_generator, train

ORIGINAL = 32
TINY = {"depths": (0.0, 1.0), "trials": 2, "eval_tokens": 256, "corpus_bytes": 40_000, "device": "cpu"}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny models run fastest on one thread; two threads on a busy 2-core machine are ~50x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    for i in range(8):
        text = "".join(f"def f{i}_{j}(x):\n    return x * {j} + {i}\n\n" for j in range(120))
        (folder / f"m{i}.py").write_text(text)
    return folder


def _lab_run(folder: Path, encoding: str, corpus: Path, steps: int = 25) -> Path:
    """A tiny byte GPT trained a few steps at ORIGINAL bytes with posenc.lab.train.train (enough to use positions)."""
    model = GPT(ModelConfig(dim=32, n_layers=1, n_heads=2, max_len=ORIGINAL, encoding=encoding))
    data = load_corpus(str(corpus), max_bytes=20_000).train

    def batch_fn(step, rank, world):
        from posenc.lab.data import train_batch

        x, y = train_batch(data, length=ORIGINAL, batch=8, generator=step_generator(0, step))
        return x, y, None

    tcfg = TrainConfig(steps=steps, batch_size=8, length=ORIGINAL, lr=1e-2, warmup=0)
    train(model, batch_fn, tcfg, folder, progress=False)
    return folder


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory, corpus) -> Path:
    return _lab_run(tmp_path_factory.mktemp("rope"), "rope", corpus)


@pytest.fixture(scope="module")
def alibi_run(tmp_path_factory, corpus) -> Path:
    return _lab_run(tmp_path_factory.mktemp("alibi"), "alibi", corpus)


class _Positions(torch.nn.Module):
    """The trained model run at positions ``arange(S) / factor``: Position Interpolation written out, the reference
    for RoPE ``linear`` (angles m * inv_freq / f) and for ALiBi ``linear`` (bias -slope * (q - k) / f)."""

    def __init__(self, model, factor: float) -> None:
        super().__init__()
        self.model, self.factor, self.encoding = model, factor, model.encoding

    def forward(self, tokens):
        return self.model(tokens, torch.arange(tokens.shape[1], dtype=torch.float32) / self.factor)


def _by(rows, metric, method, factor, length, depth=None, steps=0):
    [row] = [
        r
        for r in rows
        if (r["metric"], r["method"], r["factor"], r["length"], r["depth"], r["finetune_steps"])
        == (metric, method, factor, length, depth, steps)
    ]
    return row


def _cli(*args: str) -> tuple[int, str]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(list(args))
    return code, buf.getvalue()


def test_rope_checkpoint_every_method_end_to_end(rope_run, corpus, tmp_path):
    lengths = (ORIGINAL, 2 * ORIGINAL, 128)
    cfg = ExtendConfig(model=str(rope_run), factors=(2.0,), lengths=lengths, corpus=str(corpus), **TINY)
    rows = run_extend(cfg, tmp_path / "out", progress=False)
    methods = ("none", *ev.EXTEND_METHODS["rope"])
    assert {r["method"] for r in rows} == set(methods)
    assert len(rows) == len(methods) * len(lengths) * (1 + len(TINY["depths"]))
    for r in rows:
        assert r["factor"] == (1.0 if r["method"] == "none" else 2.0) and r["original_len"] == ORIGINAL
        if r["metric"] == "ppl":
            assert r["status"] == "ok" and 1.0 < r["ppl"] < 256.0 and r["n"] == 256
        else:  # the prompt needs 101 bytes: n/a below that, measured above
            assert (r["status"], r["accuracy"] is None) == (("ok", False) if r["length"] == 128 else ("n/a", True))
    # Measured against independent references: the unpatched model, and the model at interpolated positions.
    model = load_model(rope_run)
    val = load_corpus(str(corpus), max_bytes=TINY["corpus_bytes"]).val
    for n in lengths:
        plain = ev.perplexity(model, val, length=n, max_tokens=256).ppl
        pi = ev.perplexity(_Positions(model, 2.0), val, length=n, max_tokens=256).ppl
        assert _by(rows, "ppl", "none", 1.0, n)["ppl"] == pytest.approx(plain, rel=1e-6)
        assert _by(rows, "ppl", "linear", 2.0, n)["ppl"] == pytest.approx(pi, rel=1e-5)
        assert _by(rows, "ppl", "linear", 2.0, n)["ppl"] != pytest.approx(plain, rel=1e-4)
    # Dynamic NTK leaves the model as trained up to the original length, and only there.
    assert _by(rows, "ppl", "dynamic", 2.0, ORIGINAL)["ppl"] == pytest.approx(plain_at(model, val, ORIGINAL), rel=1e-6)
    assert _by(rows, "ppl", "dynamic", 2.0, 128)["ppl"] != pytest.approx(_by(rows, "ppl", "none", 1.0, 128)["ppl"])
    out = tmp_path / "out"
    assert (out / "extend.png").stat().st_size > 10_000 and (out / "passkey.png").stat().st_size > 10_000
    report = (out / "report.md").read_text()
    assert "## Perplexity" in report and "## Passkey retrieval" in report and "| yarn x2 |" in report
    assert "Unpatched: perplexity" in report and '"rope_type": "yarn"' in report
    assert json.loads((out / "extend.json").read_text())["factors"] == [2.0]


def plain_at(model, val, n):
    return ev.perplexity(model, val, length=n, max_tokens=256).ppl


def test_alibi_checkpoint_interpolates_its_slopes(alibi_run, corpus, tmp_path):
    cfg = ExtendConfig(model=str(alibi_run), factors=(2.0, 4.0), lengths=(ORIGINAL, 64), corpus=str(corpus), **TINY)
    rows = run_extend(cfg, tmp_path / "out", progress=False)
    assert {(r["method"], r["factor"]) for r in rows} == {("none", 1.0), ("linear", 2.0), ("linear", 4.0)}
    model = load_model(alibi_run)
    val = load_corpus(str(corpus), max_bytes=TINY["corpus_bytes"]).val
    for factor in (2.0, 4.0):
        for n in (ORIGINAL, 64):
            reference = ev.perplexity(_Positions(model, factor), val, length=n, max_tokens=256).ppl
            assert _by(rows, "ppl", "linear", factor, n)["ppl"] == pytest.approx(reference, rel=1e-5)
    assert (tmp_path / "out" / "passkey.png").is_file() and "| linear x4 |" in (
        tmp_path / "out" / "report.md"
    ).read_text()


def test_finetune_then_resume_skips_finished_rows(rope_run, corpus, tmp_path, monkeypatch):
    cfg = ExtendConfig(
        model=str(rope_run), methods=("yarn",), factors=(2.0,), lengths=(ORIGINAL, 64), finetune_steps=2,
        corpus=str(corpus), **{**TINY, "depths": (0.5,)},
    )  # fmt: skip
    out = tmp_path / "out"
    rows = run_extend(cfg, out, progress=False)
    assert {(r["method"], r["finetune_steps"]) for r in rows} == {("none", 0), ("yarn", 0), ("none", 2), ("yarn", 2)}
    assert (out / "runs" / "finetune-yarn-x2-ft2" / "done.json").is_file()
    tuned, zero = _by(rows, "ppl", "yarn", 2.0, 64, steps=2)["ppl"], _by(rows, "ppl", "yarn", 2.0, 64)["ppl"]
    assert tuned != pytest.approx(zero)  # fine-tuning changed the weights
    with pytest.raises(ValueError, match="--resume"):
        run_extend(cfg, out, progress=False)
    # Drop two rows as if interrupted; resume measures exactly those, fine-tuning again from its cached run.
    text = (out / "results.csv").read_text().splitlines()
    kept = [line for line in text if not line.startswith(("ppl,yarn,2.0,2,32,64,", "ppl,none,1.0,0,32,32,"))]
    assert len(kept) == len(text) - 2
    (out / "results.csv").write_text("\n".join(kept) + "\n")
    calls = []
    measure = LabTarget.perplexity
    monkeypatch.setattr(LabTarget, "perplexity", lambda self, m, n: calls.append(n) or measure(self, m, n))
    again = run_extend(cfg, out, resume=True, progress=False)
    assert sorted(calls) == [ORIGINAL, 64]
    assert {(r["method"], r["finetune_steps"], r["length"]): r["ppl"] for r in again if r["metric"] == "ppl"} == {
        (r["method"], r["finetune_steps"], r["length"]): r["ppl"] for r in rows if r["metric"] == "ppl"
    }  # the same numbers: cached fine-tuning, same windows
    calls.clear()
    run_extend(cfg, out, resume=True, progress=False)
    assert calls == []
    with pytest.raises(ValueError, match="differ"):
        run_extend(ExtendConfig(**{**cfg.to_dict(), "factors": (4.0,)}), out, resume=True, progress=False)


def test_task_passkey_trains_a_fresh_model_then_tests_each_method(tmp_path):
    cfg = ExtendConfig(
        model="new", task="passkey", train_len=104, train_steps=3, methods=("linear", "yarn"), factors=(2.0,),
        lengths=(104, 208), **{**TINY, "depths": (0.0, 0.5, 1.0)},
    )  # fmt: skip
    rows = run_extend(cfg, tmp_path / "out", progress=False)
    assert json.loads((tmp_path / "out" / "runs" / "passkey" / "done.json").read_text())["steps"] == 3
    assert {r["metric"] for r in rows} == {"passkey"}
    assert len(rows) == 3 * 2 * 3 and all(r["status"] == "ok" and 0 <= r["accuracy"] <= 1 for r in rows)
    assert (tmp_path / "out" / "extend.png").is_file() and (tmp_path / "out" / "passkey.png").is_file()
    assert "Passkey, unpatched" in (tmp_path / "out" / "report.md").read_text()


def test_cli_runs_and_reports_bad_input(rope_run, corpus, tmp_path):
    code, text = _cli(
        "extend", str(rope_run), "--methods", "ntk", "--factors", "2", "--lengths", "32,64", "--depths", "0.5",
        "--trials", "1", "--corpus", str(corpus), "--eval-tokens", "256", "--device", "cpu", "--out",
        str(tmp_path / "cli"),
    )  # fmt: skip
    assert code == 0 and "ntk x2" in text and (tmp_path / "cli" / "report.md").is_file()
    code, text = _cli("extend", str(rope_run), "--factors", "0.5", "--out", str(tmp_path / "bad"))
    assert code == 2 and text.startswith("posenc extend: factors=0.5 is invalid")


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"factors": (0.5,)}, r"factors=0\.5 is invalid: expected a number >= 1"),
        ({"lengths": (8, 16)}, r"lengths=\[8, 16\] is invalid: .*original context of 32"),
        ({"methods": ("rope_magic",)}, r"method='rope_magic' is invalid: expected one of \['linear'"),
        ({"methods": ("longrope",)}, r"method='longrope' is invalid"),
        ({"task": "lm", "model": "new"}, "only trained by --task passkey"),
    ],
)
def test_bad_settings_fail_before_any_output(rope_run, corpus, tmp_path, settings, match):
    with pytest.raises(ValueError, match=match):
        cfg = ExtendConfig(**{"model": str(rope_run), "corpus": str(corpus), **TINY, **settings})
        run_extend(cfg, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_a_folder_without_a_model_is_an_error(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="model=.* is invalid: expected a model folder"):
        run_extend(ExtendConfig(model=str(tmp_path), **TINY), tmp_path / "out", progress=False)
    with pytest.raises(ValueError, match="no such folder"):
        run_extend(ExtendConfig(model=str(tmp_path / "missing"), **TINY), tmp_path / "out", progress=False)


def test_a_lab_model_without_positions_to_scale_is_an_error(corpus, tmp_path):
    run = _lab_run(tmp_path / "learned", "learned", corpus, steps=1)
    with pytest.raises(ValueError, match="its encoding is 'learned'"):
        run_extend(ExtendConfig(model=str(run), corpus=str(corpus), **TINY), tmp_path / "out", progress=False)


def test_passkey_task_needs_a_model_trained_long_enough(rope_run, tmp_path):
    with pytest.raises(ValueError, match="trained at >= 101 bytes"):
        run_extend(ExtendConfig(model=str(rope_run), task="passkey", **TINY), tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------------------------------
# transformers models


def _hf_folder(folder: Path, kind: str = "llama") -> Path:
    transformers = pytest.importorskip("transformers")
    from lab.test_passkey import byte_bpe_tokenizer

    tokenizer = byte_bpe_tokenizer(folder)
    if kind == "llama":
        config = transformers.LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            bos_token_id=0, eos_token_id=1,
        )  # fmt: skip
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2, n_positions=64)
        model = transformers.GPT2LMHeadModel(config)
    model.save_pretrained(folder)
    return folder


def _needs_extend_context():
    hf = pytest.importorskip("posenc.hf")
    if not hasattr(hf, "extend_context"):
        pytest.skip("posenc.hf.extend_context is not available yet")


def test_hf_llama_end_to_end_matches_transformers_own_linear_scaling(corpus, tmp_path):
    _needs_extend_context()
    import transformers

    from posenc.lab.extend_models import _Logits

    folder = _hf_folder(tmp_path / "llama")
    cfg = ExtendConfig(
        model=str(folder), methods=("linear", "yarn"), factors=(2.0,), lengths=(64, 128), corpus=str(corpus),
        **{**TINY, "trials": 1},
    )  # fmt: skip
    rows = run_extend(cfg, tmp_path / "out", progress=False)
    assert len(rows) == 3 * 2 * 3 and all(r["original_len"] == 64 for r in rows)
    assert all(r["status"] == "ok" for r in rows if r["metric"] == "ppl")
    # Reference: transformers' own linear RoPE scaling from the config, same weights, same tokens.
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    text = bytes(load_corpus(str(corpus), max_bytes=TINY["corpus_bytes"]).val.tolist()).decode().replace("\0", "\n\n")
    tokens = torch.tensor(tokenizer(text)["input_ids"])
    for rope, method in (({"rope_type": "default", "rope_theta": 10000.0}, "none"),
                         ({"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}, "linear")):  # fmt: skip
        reference = transformers.LlamaForCausalLM.from_pretrained(folder, rope_parameters=rope).eval()
        for n in (64, 128):
            ppl = ev.perplexity(_Logits(reference), tokens, length=n, max_tokens=256, batch_size=1).ppl
            assert _by(rows, "ppl", method, 1.0 if method == "none" else 2.0, n)["ppl"] == pytest.approx(ppl, rel=1e-5)
    assert "LlamaForCausalLM" in (tmp_path / "out" / "report.md").read_text()


def test_hf_model_without_known_positions_is_an_error_naming_it(corpus, tmp_path):
    _needs_extend_context()
    folder = _hf_folder(tmp_path / "gpt2", kind="gpt2")
    with pytest.raises(ValueError, match="gpt2"):
        run_extend(ExtendConfig(model=str(folder), corpus=str(corpus), **TINY), tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_hf_model_rejects_the_passkey_training_task(tmp_path):
    pytest.importorskip("transformers")
    folder = _hf_folder(tmp_path / "llama")
    with pytest.raises(ValueError, match="task='passkey' is invalid"):
        run_extend(ExtendConfig(model=str(folder), task="passkey", **TINY), tmp_path / "out", progress=False)


def test_hf_llama_finetunes_each_patch_at_its_target(corpus, tmp_path):
    _needs_extend_context()
    folder = _hf_folder(tmp_path / "llama")
    cfg = ExtendConfig(
        model=str(folder), methods=("yarn",), factors=(2.0,), lengths=(64, 128), corpus=str(corpus),
        finetune_steps=2, finetune_lr=1e-2, **{**TINY, "trials": 1, "depths": (0.5,)},
    )  # fmt: skip
    rows = run_extend(cfg, tmp_path / "out", progress=False)
    assert {(r["method"], r["finetune_steps"]) for r in rows} == {("none", 0), ("yarn", 0), ("none", 2), ("yarn", 2)}
    for n in (64, 128):
        zero, tuned = _by(rows, "ppl", "yarn", 2.0, n), _by(rows, "ppl", "yarn", 2.0, n, steps=2)
        assert math.isfinite(tuned["ppl"]) and tuned["ppl"] != zero["ppl"]  # the fine-tune changed the weights
