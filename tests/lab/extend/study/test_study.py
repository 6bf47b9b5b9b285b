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
from posenc.lab.common import evaluate as ev
from posenc.lab.common.corpus import load_corpus
from posenc.lab.common.gpt import GPT, ModelConfig
from posenc.lab.common.scaling import EXTEND_METHODS
from posenc.lab.common.train import TrainConfig, load_model, step_generator, train
from posenc.lab.extend.settings.config import ExtendConfig
from posenc.lab.extend.study.run import run_extend
from posenc.lab.extend.targets.lab import LabTarget

pytestmark = pytest.mark.usefixtures("one_thread")
ORIGINAL = 32
TINY = {"depths": (0.0, 1.0), "trials": 2, "eval_tokens": 256, "corpus_bytes": 40_000, "device": "cpu"}


def _lab_run(folder: Path, encoding: str, corpus: Path, steps: int = 25) -> Path:
    """A tiny byte GPT trained a few steps at ORIGINAL bytes with posenc.lab.common.train.train (enough to use
    positions)."""
    model = GPT(ModelConfig(dim=32, n_layers=1, n_heads=2, max_len=ORIGINAL, encoding=encoding))
    data = load_corpus(str(corpus), max_bytes=20_000).train

    def batch_fn(step, rank, world):
        from posenc.lab.common.corpus import train_batch

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
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):  # errors go to stderr
        code = main(list(args))
    return code, buf.getvalue()


def test_rope_checkpoint_every_method_end_to_end(rope_run, corpus, tmp_path):
    lengths = (ORIGINAL, 2 * ORIGINAL, 128)
    cfg = ExtendConfig(model=str(rope_run), factors=(2.0,), lengths=lengths, corpus=str(corpus), **TINY)
    rows = run_extend(cfg, tmp_path / "out", progress=False)
    methods = ("none", *EXTEND_METHODS["rope"])
    assert {r["method"] for r in rows} == set(methods)
    past = [n for n in lengths if n > ORIGINAL]  # ppl_past: only where a window reaches past the original length
    assert len(rows) == len(methods) * (len(lengths) * (1 + len(TINY["depths"])) + len(past))
    for r in rows:
        assert r["factor"] == (1.0 if r["method"] == "none" else 2.0) and r["original_len"] == ORIGINAL
        if r["metric"] == "ppl":
            assert r["status"] == "ok" and 1.0 < r["ppl"] < 256.0 and r["n"] == 256
        elif r["metric"] == "ppl_past":  # 256 targets in windows of n, those at positions >= 32 of each
            assert r["status"] == "ok" and r["length"] in past and r["n"] == 256 - 256 // r["length"] * ORIGINAL
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
        if n > ORIGINAL:  # the same forward's losses, past the original length only
            assert _by(rows, "ppl_past", "none", 1.0, n)["ppl"] == pytest.approx(past_ppl(model, val, n), rel=1e-6)
            assert _by(rows, "ppl_past", "linear", 2.0, n)["ppl"] == pytest.approx(
                past_ppl(_Positions(model, 2.0), val, n), rel=1e-5
            )
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


@torch.no_grad()
def past_ppl(model, val, n, original=ORIGINAL):
    """Perplexity of the targets at positions >= original of the non-overlapping windows of n covering 256 targets,
    written out: each window's logits, the losses of its positions original..n-1."""
    losses = []
    for start in range(0, 256, n):
        x, y = val[start : start + n].long()[None], val[start + 1 : start + n + 1].long()[None]
        loss = torch.nn.functional.cross_entropy(model(x)[0].float(), y[0], reduction="none")  # (n,)
        losses.append(loss[original:])
    return math.exp(torch.cat(losses).double().mean())


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
    )
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
    dropped = ("ppl,yarn,2.0,2,plain,32,64,", "ppl,none,1.0,0,plain,32,32,")
    kept = [line for line in text if not line.startswith(dropped)]
    assert len(kept) == len(text) - 2
    (out / "results.csv").write_text("\n".join(kept) + "\n")
    calls = []
    measure = LabTarget.perplexity
    monkeypatch.setattr(LabTarget, "perplexity", lambda self, m, n, **kw: calls.append(n) or measure(self, m, n, **kw))
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
    )
    rows = run_extend(cfg, tmp_path / "out", progress=False)
    assert json.loads((tmp_path / "out" / "runs" / "passkey" / "done.json").read_text())["steps"] == 3
    assert {r["metric"] for r in rows} == {"passkey"}
    assert len(rows) == 3 * 2 * 3 and all(r["status"] == "ok" and 0 <= r["accuracy"] <= 1 for r in rows)
    # No perplexity measured: no extend.png (it would pretend to be one), and the report links only what exists.
    assert (tmp_path / "out" / "passkey.png").is_file() and not (tmp_path / "out" / "extend.png").exists()
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Passkey, unpatched" in report and "(passkey.png)" in report and "extend.png" not in report
    assert "original context 104 bytes" in report


def test_cli_runs_and_reports_bad_input(rope_run, corpus, tmp_path):
    code, text = _cli(
        "extend", str(rope_run), "--methods", "ntk", "--factors", "2", "--lengths", "32,64", "--depths", "0.5",
        "--trials", "1", "--corpus", str(corpus), "--eval-tokens", "256", "--device", "cpu", "--out",
        str(tmp_path / "cli"),
    )
    assert code == 0 and "ntk x2" in text and (tmp_path / "cli" / "report.md").is_file()
    code, text = _cli("extend", str(rope_run), "--factors", "0.5", "--out", str(tmp_path / "bad"))
    assert code == 2 and text.startswith("posenc extend: argument --factors: '0.5' is invalid")
    # A factor of 1 would measure the unpatched model under a method's name (and call it the best): an error.
    code, text = _cli("extend", str(rope_run), "--factors", "1", "--methods", "yarn", "--out", str(tmp_path / "one"))
    assert code == 2 and "factors" in text and "> 1" in text and "Traceback" not in text
    assert not (tmp_path / "one").exists()


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"factors": (0.5,)}, r"factors=0\.5 is invalid: expected a number >= 1"),
        ({"factors": (1.0,), "methods": ("yarn",)}, r"factors=1\.0 is invalid: expected a factor > 1 for yarn: at 1 "
         r"it is the unpatched model"),
        ({"factors": (2.0, 1)}, r"factors=1 is invalid: expected a factor > 1 \(at 1 every method but STRING is the "
         r"unpatched model"),
        ({"lengths": (8, 16)}, r"lengths=\[8, 16\] is invalid: .*one beyond the original context of 32 tokens"),
        ({"lengths": (32,)}, r"lengths=\[32\] is invalid: expected lengths with at least one beyond the original "),
        ({"lengths": (32, 64), "eval_tokens": 48}, r"eval_tokens=48 is invalid: expected at least the longest .* 64"),
        ({"layer_type": "full_attention"}, r"layer_type='full_attention' is invalid: expected None for a posenc lab"),
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
    with pytest.raises(ValueError, match=r"model=.* is invalid: expected a model \(this folder holds none of them\)"):
        run_extend(ExtendConfig(model=str(tmp_path), **TINY), tmp_path / "out", progress=False)
    with pytest.raises(ValueError, match="no such file or folder"):
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
    from lab.extend.needles.test_passkey import byte_bpe_tokenizer

    tokenizer = byte_bpe_tokenizer(folder)
    if kind in ("llama", "qwen2"):
        config_class, model_class = {
            "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
            "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        }[kind]
        config = config_class(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            bos_token_id=0, eos_token_id=1,
        )
        model = model_class(config)
    elif kind == "gemma3":  # a sliding layer (window 16, base 1e4) then a global one (base 1e6), as Gemma 3's 5:1
        config = transformers.Gemma3TextConfig(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=16,
            layer_types=["sliding_attention", "full_attention"], bos_token_id=0, eos_token_id=1, pad_token_id=1,
        )
        model = transformers.Gemma3ForCausalLM(config)
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

    from posenc.lab.extend.targets.hf import _Logits

    folder = _hf_folder(tmp_path / "llama")
    cfg = ExtendConfig(
        model=str(folder), methods=("linear", "yarn"), factors=(2.0,), lengths=(64, 128), corpus=str(corpus),
        **{**TINY, "trials": 1},
    )
    rows = run_extend(cfg, tmp_path / "out", progress=False)
    assert len(rows) == 3 * (2 * 3 + 1) and all(r["original_len"] == 64 for r in rows)  # + ppl_past at 128
    assert all(r["status"] == "ok" for r in rows if r["metric"] in ("ppl", "ppl_past"))
    # Reference: transformers' own linear RoPE scaling from the config, same weights, same tokens.
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    text = bytes(load_corpus(str(corpus), max_bytes=TINY["corpus_bytes"]).val.tolist()).decode().replace("\0", "\n\n")
    tokens = torch.tensor(tokenizer(text)["input_ids"])
    for rope, method in (({"rope_type": "default", "rope_theta": 10000.0}, "none"),
                         ({"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}, "linear")):
        reference = transformers.LlamaForCausalLM.from_pretrained(folder, rope_parameters=rope).eval()
        for n in (64, 128):
            ppl = ev.perplexity(_Logits(reference), tokens, length=n, max_tokens=256, batch_size=1).ppl
            assert _by(rows, "ppl", method, 1.0 if method == "none" else 2.0, n)["ppl"] == pytest.approx(ppl, rel=1e-5)
        past = past_ppl(_Logits(reference), tokens, 128, original=64)
        factor = 1.0 if method == "none" else 2.0
        assert _by(rows, "ppl_past", method, factor, 128)["ppl"] == pytest.approx(past, rel=1e-5)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "LlamaForCausalLM" in report
    assert "Layers changed by each patch: all 2 layers (rotary embedding model.rotary_emb)" in report


def test_a_study_resumed_where_auto_means_another_dtype_goes_on_in_its_own(corpus, tmp_path, monkeypatch):
    """``--dtype auto`` resolves per machine: a study begun in float32, resumed where auto means bfloat16, goes on
    in float32 (it was refused: 'these differ: dtype')."""
    from posenc.hf import dtypes

    cfg = ExtendConfig(model=str(_hf_folder(tmp_path / "llama")), methods=("linear",), factors=(2.0,),
                       lengths=(64, 128), corpus=str(corpus), **{**TINY, "trials": 1})
    first = run_extend(cfg, tmp_path / "out", progress=False)
    assert json.loads((tmp_path / "out" / "extend.json").read_text())["dtype"] == "float32"
    monkeypatch.setattr(dtypes, "auto_dtype", lambda device, checkpoint=None: torch.bfloat16)
    assert run_extend(cfg, tmp_path / "out", resume=True, progress=False) == first


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
    )
    rows = run_extend(cfg, tmp_path / "out", progress=False)
    # a pretrained model's unpatched copy is not fine-tuned (the patches are what a study compares)
    # a pretrained model's unpatched copy is not fine-tuned (the patches are what a study compares)
    assert {(r["method"], r["finetune_steps"]) for r in rows} == {("none", 0), ("yarn", 0), ("yarn", 2)}
    for n in (64, 128):
        zero, tuned = _by(rows, "ppl", "yarn", 2.0, n), _by(rows, "ppl", "yarn", 2.0, n, steps=2)
        assert math.isfinite(tuned["ppl"]) and tuned["ppl"] != zero["ppl"]  # the fine-tune changed the weights


def test_an_interruption_keeps_each_finished_row_and_resume_says_what_it_skips(
    rope_run, corpus, tmp_path, monkeypatch, capsys
):
    cfg = ExtendConfig(model=str(rope_run), methods=("linear",), factors=(2.0,), lengths=(ORIGINAL, 64),
                       corpus=str(corpus), **{**TINY, "depths": (0.5,)})
    out = tmp_path / "out"
    measure, calls = LabTarget.perplexity, []

    def perplexity(self, model, length, **kwargs):
        calls.append(length)
        if len(calls) == 2:  # Ctrl-C while the unpatched model's second length is measured
            raise KeyboardInterrupt
        return measure(self, model, length, **kwargs)

    monkeypatch.setattr(LabTarget, "perplexity", perplexity)
    with pytest.raises(KeyboardInterrupt):
        run_extend(cfg, out, progress=False)
    kept = (out / "results.csv").read_text().splitlines()
    assert len(kept) == 2 and kept[1].startswith(f"ppl,none,1.0,0,plain,{ORIGINAL},{ORIGINAL},")

    calls.clear()
    monkeypatch.setattr(LabTarget, "perplexity", lambda self, m, n, **kw: calls.append(n) or measure(self, m, n, **kw))
    rows = run_extend(cfg, out, resume=True, progress=True)
    assert calls == [64, ORIGINAL, 64]  # the unpatched model's missing length, then the patched one's two
    assert len(rows) == 10  # (ppl + passkey) x 2 lengths + ppl_past at 64, for none and linear x2
    said = capsys.readouterr().out
    assert "none: 1 of 4 measurements done, skipped; measuring the other 3" in said
    report = (out / "report.md").read_bytes()
    run_extend(cfg, out, resume=True, progress=True)
    said = capsys.readouterr().out
    assert "none: 4 of 4 measurements done, skipped" in said and "linear x2: 4 of 4 measurements done, skipped" in said
    # nothing left: the report of the runs that measured (their time, their patches) stands
    assert f"Nothing left to measure in {out}: its report.md stands" in said
    assert (out / "report.md").read_bytes() == report


# ---------------------------------------------------------------------------------------------------------------------
# Settings checked before any model work, the study-folder hint, the report's advice and figures


def test_lengths_are_checked_from_the_config_before_any_weights_load(rope_run, tmp_path, monkeypatch):
    from posenc.lab.extend.study import run as extend

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before its lengths were checked")

    monkeypatch.setattr(extend, "load_target", no_loading)
    with pytest.raises(ValueError, match=r"lengths=\[16, 32\] is invalid: .*original context of 32 tokens"):
        run_extend(ExtendConfig(model=str(rope_run), lengths=(16, 32), **TINY), tmp_path / "out", progress=False)
    # Where the original length is a setting, the config itself refuses.
    with pytest.raises(ValueError, match=r"lengths=\[64, 128\] is invalid: .*original context of 128 tokens"):
        ExtendConfig(model="new", task="passkey", train_len=128, lengths=(64, 128))
    with pytest.raises(ValueError, match=r"lengths=\[100\] is invalid: .*none beyond it"):
        ExtendConfig(model=str(rope_run), original_len=100, lengths=(100,))
    assert not (tmp_path / "out").exists()


def test_original_len_of_reads_configs_only(rope_run, tmp_path):
    from posenc.lab.extend.targets.load import original_len_of

    assert original_len_of(ExtendConfig(model=str(rope_run))) == ORIGINAL
    assert original_len_of(ExtendConfig(model=str(rope_run), original_len=48)) == 48
    assert original_len_of(ExtendConfig(model="new", task="passkey", train_len=104)) == 104
    hf = tmp_path / "hf"
    hf.mkdir()
    scaled = {"model_type": "llama", "max_position_embeddings": 8192, "rope_scaling": {"factor": 4.0}}
    scaled["rope_scaling"]["original_max_position_embeddings"] = 2048
    (hf / "config.json").write_text(json.dumps(scaled))
    assert original_len_of(ExtendConfig(model=str(hf))) == 2048
    (hf / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_positions": 1024}))
    assert original_len_of(ExtendConfig(model=str(hf))) == 1024
    assert original_len_of(ExtendConfig(model=str(tmp_path / "missing"))) is None


def test_a_lab_study_folder_names_its_runs(rope_run, alibi_run, tmp_path):
    import shutil

    root = tmp_path / "lab"
    for name, run in (("rope", rope_run), ("alibi", alibi_run)):
        shutil.copytree(run, root / "runs" / name)
    (root / "runs" / "notes").mkdir()  # not a run: not offered
    (root / "study.json").write_text(json.dumps({"command": "posenc lab"}))
    expected = (
        f"model='{root}' is invalid: expected a model (this is a posenc lab study folder; pass one of its "
        f"runs: {root / 'runs' / 'alibi'}, {root / 'runs' / 'rope'})"
    )
    with pytest.raises(ValueError) as err:
        run_extend(ExtendConfig(model=str(root), **TINY), tmp_path / "out", progress=False)
    assert str(err.value).startswith(expected)
    assert not (tmp_path / "out").exists()


def _rows(accuracy_within: float | None, accuracy_past: float, original: int = 128) -> list[dict]:
    """Passkey rows as results.csv holds them: the unpatched model and linear x2, at 1x and 2x the original."""
    rows = []
    for method, factor in (("none", 1.0), ("linear", 2.0)):
        for length, accuracy in ((original, accuracy_within), (2 * original, accuracy_past)):
            rows.append({
                "metric": "passkey", "method": method, "factor": factor, "finetune_steps": 0, "original_len": original,
                "length": length, "depth": 0.5, "loss": None, "ppl": None, "accuracy": accuracy, "n": 5,
                "status": "n/a" if accuracy is None else "ok",
            })
    return rows


def test_passkey_advice_fits_the_settings_used():
    from posenc.lab.extend.study.report import findings_for

    trained = ExtendConfig(model="new", task="passkey", train_steps=300)
    advice = findings_for(_rows(0.0, 0.0), 128, trained)[-1]
    assert advice == (
        "- Passkey past the original length: no method retrieved a single key (the model did not learn retrieval at "
        "its training length 128 in 300 steps: raise --train-steps (e.g. 3000) or lower --train-len)."
    )
    assert "--task passkey" not in advice  # the user already passed it
    run = ExtendConfig(model="runs/x", task="passkey", train_steps=2000)
    advice = findings_for(_rows(0.0, 0.0), 128, run)[-1]
    assert "in 2000 steps: raise --train-steps (e.g. 6000))." in advice and "--train-len" not in advice
    zero_shot = ExtendConfig(model="runs/x")
    assert "`--task passkey` trains retrieval first" in findings_for(_rows(0.0, 0.0), 128, zero_shot)[-1]
    assert "--task passkey" not in findings_for(_rows(0.0, 0.0), 128, zero_shot, kind="hf")[-1]
    assert "try `--finetune-steps`" in findings_for(_rows(1.0, 0.0), 128, zero_shot)[-1]
    tuned = ExtendConfig(model="runs/x", finetune_steps=200)
    advice = findings_for(_rows(1.0, 0.0), 128, tuned)[-1]
    assert "not even after 200 fine-tuning steps at the target length: raise --finetune-steps" in advice
    # Nothing at the original length: n/a there (the prompt does not fit), or not in --lengths at all.
    assert "the passkey prompt does not fit in the original 128 bytes" in findings_for(_rows(None, 0.0), 128)[-1]
    past_only = [r for r in _rows(1.0, 0.0) if r["length"] > 128]
    assert "add a length up to 128 to --lengths" in findings_for(past_only, 128, trained)[-1]


def _ppl_rows(values: dict[tuple[str, float], list[float]], lengths=(64, 128, 256, 512)) -> list[dict]:
    return [
        {"metric": "ppl", "method": method, "factor": factor, "finetune_steps": 0, "original_len": 64, "length": n,
         "depth": None, "loss": None, "ppl": ppl, "accuracy": None, "n": 256, "status": "ok"}
        for (method, factor), ppls in values.items() for n, ppl in zip(lengths, ppls, strict=True)
    ]


def _drawn(monkeypatch):
    """Capture the figure save_png is given (the drawing functions import it from posenc.lab.common.plots when
    called)."""
    from posenc.lab.common import plots

    saved = {}
    monkeypatch.setattr(plots, "save_png", lambda fig, path, dpi=150: saved.setdefault("fig", fig) and Path(path))
    return saved


def test_extend_figure_lines_are_distinct_and_its_log_axis_is_labelled(tmp_path, monkeypatch):
    from posenc.lab.extend.study.plot import plot_extend

    saved = _drawn(monkeypatch)
    rows = _ppl_rows({
        ("none", 1.0): [11.6, 12.4, 13.3, 14.9], ("linear", 2.0): [12.2, 12.4, 12.8, 13.7],
        ("linear", 4.0): [12.6, 12.8, 13.2, 14.0], ("ntk", 2.0): [11.9, 12.0, 12.3, 12.8],
        ("dynamic", 2.0): [11.9, 12.0, 12.3, 12.8],
    })
    assert plot_extend(rows, tmp_path / "extend.png", original=64, title="t", unit="byte") == tmp_path / "extend.png"
    fig = saved["fig"]
    fig.canvas.draw()
    ax = fig.axes[0]
    lines = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
    assert [line.get_label() for line in lines] == ["none", "linear x2", "linear x4", "ntk x2", "dynamic x2 (= ntk x2)"]
    styles = [(line.get_color(), line.get_marker(), str(line.get_linestyle())) for line in lines]
    assert len(set(styles)) == len(styles)
    assert lines[-1].get_linestyle() == ":" and lines[-1].get_markerfacecolor() == "none"  # drawn over ntk, visible
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    low, high = ax.get_ylim()
    assert ax.get_yscale() == "log" and len(labels) >= 3, labels
    assert all(low <= float(t) <= high for t in labels) and labels == ["11", "12", "13", "14", "15", "16"]
    assert "per byte" in ax.get_ylabel() and "bytes" in ax.get_xlabel()
    assert "original length 64" in [t.get_text() for t in ax.texts]


def test_no_extend_figure_without_perplexity(tmp_path):
    from posenc.lab.extend.study.plot import plot_extend

    assert plot_extend(_rows(1.0, 0.0), tmp_path / "extend.png", original=128, title="t") is None
    assert not (tmp_path / "extend.png").exists()


def test_passkey_heatmap_is_sequential_and_numbers_contrast(tmp_path, monkeypatch):
    from matplotlib import colormaps

    from posenc.lab.common.plots import HEATMAP, text_colour_on
    from posenc.lab.extend.study.plot import plot_passkey

    saved = _drawn(monkeypatch)
    rows = _rows(1.0, 0.0)
    rows[0].update(accuracy=None, status="n/a")  # the unpatched model at 128: n/a (a grey cell)
    plot_passkey(rows, tmp_path / "passkey.png", original=128)
    panels = [ax for ax in saved["fig"].axes if ax.images]
    assert len(panels) == 2 and HEATMAP in ("cividis", "viridis")
    for ax in panels:
        image = ax.images[0]
        assert image.get_cmap().name.startswith(HEATMAP)
        for text in ax.texts:
            hits, _, n = text.get_text().partition("/")  # keys found / keys tried
            value = None if text.get_text() == "n/a" else int(hits) / int(n)
            cell = image.get_cmap()(float("nan") if value is None else value)
            assert text.get_color() == text_colour_on(cell)
    texts = {t.get_text(): t.get_color() for ax in panels for t in ax.texts}
    assert texts == {"n/a": "black", "0/5": "white", "5/5": "black"}  # dark bottom of cividis, light top, grey n/a
    assert text_colour_on(colormaps[HEATMAP](0.0)) == "white" and text_colour_on((1.0, 1.0, 1.0, 1.0)) == "black"


def test_hf_llama_remapping_methods_end_to_end_and_save(corpus, tmp_path):
    """Remapping methods through ``posenc extend``: each measured (the patch recorded with its parameters), their
    in-window numbers equal the unpatched model's (every method is plain RoPE inside its window); DCA in vLLM's form
    on a Qwen2 saved as ``dual_chunk_attention_config``; ChunkLlama's DCA, DCA on a Llama (vLLM reads the block for
    Qwen2/Qwen3 only) and another remapping method's --save refused before anything is written."""
    import transformers

    folder = _hf_folder(tmp_path / "llama")
    methods = ("self_extend", "dca", "rerope", "lm_infinite")
    cfg = ExtendConfig(
        model=str(folder), methods=methods, factors=(2.0,), lengths=(8, 128), corpus=str(corpus),
        **{**TINY, "trials": 1},
    )
    rows = run_extend(cfg, tmp_path / "out", progress=False)
    assert all(r["status"] == "ok" for r in rows if r["metric"] in ("ppl", "ppl_past"))
    none = _by(rows, "ppl", "none", 1.0, 8)["ppl"]
    for method in methods:  # 8 tokens: inside every window (DCA's first chunk is 48 - 4 = 44 tokens)
        assert _by(rows, "ppl", method, 2.0, 8)["ppl"] == pytest.approx(none, rel=1e-5)
        assert _by(rows, "ppl_past", method, 2.0, 128)["ppl"] > 0
    settings = json.loads((tmp_path / "out" / "extend.json").read_text())
    assert settings["methods"] == list(methods)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "self_extend: `SelfExtend(window=16, group=3): reaches 159 tokens from 64`" in report
    assert "dca: `DualChunk(chunk_size=48, local_window=8, original_max_position_embeddings=64, mscale=0.05)" in report

    qwen = _hf_folder(tmp_path / "qwen2", "qwen2")
    dca = ExtendConfig(model=str(qwen), methods=("dca_vllm",), factors=(2.0,), lengths=(32, 128), corpus=str(corpus),
                       **{**TINY, "trials": 1})
    with pytest.warns(UserWarning, match="transformers ignores"):
        run_extend(dca, tmp_path / "out-dca", progress=False, save=tmp_path / "saved")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert config["dual_chunk_attention_config"] == {
        "chunk_size": 48, "local_size": 8, "original_max_position_embeddings": 64,
    }
    assert transformers.AutoConfig.from_pretrained(tmp_path / "saved").max_position_embeddings == 128

    for model, method, match in (
        (folder, "self_extend", r"extend_context\(model, 'self_extend', 2, original_max_position_embeddings=64\)"),
        (qwen, "dca", r"0.05 ln\(S/L\) \+ 1\)\^2.*'dca_vllm'"),
        (folder, "dca_vllm", r"for \['qwen2', 'qwen3'\] only, not 'llama'"),
    ):
        cfg = ExtendConfig(model=str(model), methods=(method,), factors=(2.0,), lengths=(32, 128),
                           corpus=str(corpus), **{**TINY, "trials": 1})
        with pytest.raises(ValueError, match=match):
            run_extend(cfg, tmp_path / "out-refused", progress=False, save=tmp_path / "saved-refused")
        assert not (tmp_path / "out-refused").exists() and not (tmp_path / "saved-refused").exists()


def test_a_composed_method_is_the_frequency_method_then_string_within_its_context(corpus, tmp_path):
    """``yarn+string``: the study's model equals ``extend_context(yarn, 2)`` then ``extend_context(string, 1)`` (STRING
    within the stretched 128-token context, its offset and local window from that length), measured beside YaRN alone:
    equal inside STRING's offset, different past it; its report names both parts; its --save is refused as STRING's
    is; malformed names are refused before anything is read."""
    import copy

    import transformers

    from posenc.hf import extend_context
    from posenc.lab.extend.study import plan
    from posenc.lab.extend.targets.load import load_target

    folder = _hf_folder(tmp_path / "llama")
    cfg = ExtendConfig(model=str(folder), methods=("yarn", "yarn+string"), factors=(2.0,), lengths=(8, 128),
                       corpus=str(corpus), dtype="float32", **{**TINY, "trials": 1})
    rows = run_extend(cfg, tmp_path / "out", progress=False)
    yarn, both = (_by(rows, "ppl", m, 2.0, 8)["ppl"] for m in ("yarn", "yarn+string"))
    assert both == pytest.approx(yarn, rel=1e-5)  # 8 tokens: every distance below STRING's offset
    assert _by(rows, "ppl", "yarn+string", 2.0, 128)["ppl"] != pytest.approx(_by(rows, "ppl", "yarn", 2.0, 128)["ppl"])
    report = (tmp_path / "out" / "report.md").read_text()
    assert "yarn+string: `yarn x2 over 64, then String(shifted_offset=42, local_window=16" in report

    target = load_target(cfg, tmp_path / "unused", device="cpu", progress=False)
    target.use(plan.resolve(cfg, kind="hf", original=target.original_len, default_methods=("yarn",), device="cpu"))
    target.load()
    patched, description = target.patched("yarn+string", 2.0)
    assert description["frequency"]["rope_parameters"]["new"]["rope_type"] == "yarn"
    manual = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    manual = copy.deepcopy(manual)
    extend_context(manual, "yarn", 2.0, original_max_position_embeddings=64)
    extend_context(manual, "string", 1.0)
    ids = torch.randint(2, 100, (1, 128), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(patched(ids).logits, manual(ids).logits, rtol=0, atol=0)

    with pytest.raises(ValueError, match=r"save=.*string_config.*posenc\.hf\.load_causal_lm\(.*\); posenc\.hf\."
                       r"extend_context\(model, 'yarn', 2, original_max_position_embeddings=64\); posenc\.hf\."
                       r"extend_context\(model, 'string', 1\)"):
        saving = ExtendConfig(**{**cfg.to_dict(), "methods": ("yarn+string",)})
        run_extend(saving, tmp_path / "out-save", progress=False, save=tmp_path / "saved")
    assert not (tmp_path / "out-save").exists() and not (tmp_path / "saved").exists()
    for name, match in (("string+yarn", "methods='string\\+yarn'"), ("yarn+self_extend", "runs within the stretched"),
                        ("yarn+string+dca", "two parts at most")):
        with pytest.raises(ValueError, match=match):
            ExtendConfig(model=str(folder), methods=(name,))


def test_one_factor_rule_for_the_library_studies_and_exports():
    """``posenc.hf.extend.FACTOR_RULE``: factors >= 1 everywhere; at 1 only STRING changes the model, so a study or
    an export takes 1 for STRING (remapping within the original context) and refuses it for the others, while
    ``extend_context`` takes 1 as the identity."""
    from posenc.hf.extend import FACTOR_RULE, check_factor

    assert FACTOR_RULE.startswith("a number >= 1")
    assert ExtendConfig(model="m", methods=("string",), factors=(1.0, 1.5)).factors == (1.0, 1.5)
    with pytest.raises(ValueError, match=r"^factors=1 is invalid: expected a factor > 1 for yarn"):
        ExtendConfig(model="m", methods=("string", "yarn"), factors=(1,))
    assert check_factor(1.0) == 1.0 and check_factor(2, "yarn", as_model=True) == 2.0
    with pytest.raises(ValueError, match=r"^factor=0\.99 is invalid: expected a number >= 1"):
        check_factor(0.99)
