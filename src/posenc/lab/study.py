"""``posenc lab``: train once per encoding at length L, evaluate at L..16L, write the CSV, plot and report.

Every finished piece is kept: each encoding trains in ``OUT/runs/<encoding>/`` (checkpointed, resumable, skipped
once done) and each evaluation is upserted into ``OUT/results.csv`` as soon as it is measured, so an interrupted
study continues with ``--resume`` where it stopped and never redoes or loses a completed run.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

import posenc
from posenc._checks import check_choice, check_positive_int, fail
from posenc.lab import dist
from posenc.lab import evaluate as ev
from posenc.lab.data import load_corpus, train_batch
from posenc.lab.devices import resolve_device
from posenc.lab.model import GPT, ModelConfig, check_layer_part, check_layer_spec, split_encoding
from posenc.lab.progress import progress_bar, skipped
from posenc.lab.report import environment, print_table, read_results, upsert_results, write_report
from posenc.lab.runfiles import check_settings
from posenc.lab.tasks import copy_batch, recall_batch
from posenc.lab.train import DONE_FILE, TrainConfig, rank_rows, step_generator, train

#: The default study: the classic families plus the two later ones the all-encodings comparison found most telling
#: (Sandwich: flat and best past L; FoPE: the rotary encoding that degrades least); xPos tells the same story as RoPE.
#: experiments/length-extrapolation/all-encodings has every encoding.
DEFAULT_ENCODINGS = ("nope", "sinusoidal", "learned", "rope", "alibi", "t5", "sandwich", "fope")
TASKS = ("lm", "copy", "recall")
#: ``--encodings all``: every registered sequence encoding (``sequence_encodings``), in the registry's order.
ALL = "all"

#: Per task: the defaults of ``posenc lab --task`` for the flags not given (``batch_size``/``n_heads`` absent:
#: StudyConfig's 32 / 4). Copy and recall train on rows whose content varies from 1 symbol / pair up to L
#: (``_task_batches``) and are evaluated with full-size content at L..16L. Measured on the 2-core CPU with these
#: mixed-length batches (uncontended: ~90k tokens/s, so 3000 steps x 64 x 16 tokens is ~35 s per encoding, about
#: 4-5 min for the 7 default encodings with evaluation; several times longer when the machine is shared):
#:   recall, L=16, 2000 steps, batch 64, 8 heads: exact match at L: alibi 100% (98% at 2L), nope 40%, learned 46%,
#:     rope 22%, sinusoidal 11%; with 4 heads rope 100% (93% at 2L) but alibi 12%. The phase change that learns the
#:     lookup comes between ~1500 and ~3000 steps, hence 3000 steps. With these defaults (a partial run): nope 61%
#:     at L, 2% at 2L, 0% beyond; the other encodings not yet measured at 3000 steps.
#:   copy, L=16 (vocab 16), 3000 steps, batch 32, 4 heads: rope 100% at L, 0% at 2L; alibi 0%. ALiBi with 8 heads,
#:     batch 64, 2000 steps: 1%. Copy with repeated symbols needs positions (which copy of a symbol is meant), and
#:     ALiBi / NoPE did not learn it in these budgets; ``_task_findings`` flags that in the report.
TASK_DEFAULTS = {
    "lm": {"train_len": 64, "steps": 1000},
    "copy": {"train_len": 16, "steps": 3000, "batch_size": 64, "n_heads": 8},
    "recall": {"train_len": 16, "steps": 3000, "batch_size": 64, "n_heads": 8},
}


@dataclass(frozen=True, kw_only=True)
class StudyConfig:
    """Everything that defines a study; stored as ``OUT/study.json`` and checked on ``--resume``.

    ``encodings`` holds names from ``posenc.available()`` (an encoding in every layer) or per-layer hybrids
    ``BASE/OTHER:N``: OTHER in every N-th layer (layers N, 2N, ... counting from 1, as transformers'
    ``no_rope_layer_interval``), BASE in the others, with ``2 <= N <= n_layers``; e.g. ``rope/nope:4`` (Yang et al.
    2025; SmolLM3) and ``rope/nope_temperature:4`` (Llama 4, whose NoPE layers scale their queries: the lab sets
    ``floor_scale`` to ``train_len`` so the temperature changes within the evaluated lengths). Absolute encodings
    (sinusoidal, learned) cannot be chosen per layer. A hybrid's RoPE scalings apply to its BASE layers; it trains
    in ``OUT/runs/BASE-OTHER-everyN`` and keeps its spec as the ``encoding`` of its CSV rows.
    """

    task: str = "lm"
    encodings: tuple[str, ...] = DEFAULT_ENCODINGS
    train_len: int = 64
    eval_lens: tuple[int, ...] | None = None  # None: L, 2L, 4L, 8L, 16L
    steps: int = 1000
    batch_size: int = 32
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    lr: float = 3e-3
    seed: int = 0
    stride: int | None = None
    finetune_steps: int = 0
    eval_tokens: int = 16384
    corpus: str | None = None
    corpus_bytes: int = 4_000_000
    device: str = "cpu"
    extensions: bool = True

    def __post_init__(self) -> None:
        check_choice("task", self.task, TASKS)
        check_positive_int("train_len", self.train_len)
        for n in ("steps", "batch_size", "dim", "n_layers", "n_heads", "eval_tokens"):
            check_positive_int(n, getattr(self, n))
        if self.dim % self.n_heads or (self.dim // self.n_heads) % 2:
            fail("dim", self.dim, f"a multiple of 2 * n_heads = {2 * self.n_heads} (an even head size for RoPE)")
        if not self.encodings:
            fail("encodings", self.encodings, f"at least one of {posenc.available()}")
        if ALL in self.encodings:  # stored expanded, so a resumed study runs the same list whatever is registered later
            expanded = [e for spec in self.encodings for e in (sequence_encodings() if spec == ALL else (spec,))]
            object.__setattr__(self, "encodings", tuple(dict.fromkeys(expanded)))
        for spec in self.encodings:
            base, other, _ = check_layer_spec(spec, n_layers=self.n_layers, name="encodings")
            for name in (base,) if other is None else (base, other):
                if name not in posenc.available():
                    fail("encodings", name, f"names from {posenc.available()}")
                hd = self.dim // self.n_heads
                encoding = posenc.build(name, dim=self.dim, num_heads=self.n_heads, head_dim=hd, max_len=self.train_len)
                if encoding.position_kind != "sequence":
                    fail("encodings", spec, "encodings of token sequences (grid encodings belong to `posenc vision`)")
                if other is not None:
                    check_layer_part(encoding, name, spec, "encodings")
        for length in self.lengths:
            check_positive_int("eval_lens", length)
        if self.stride is not None and not 0 < self.stride <= min(self.lengths):
            fail(
                "stride",
                self.stride,
                f"a positive number of tokens up to the shortest eval length, {min(self.lengths)}",
            )
        if self.finetune_steps < 0:
            fail("finetune_steps", self.finetune_steps, "0 (no fine-tuning) or a positive number of steps")

    @property
    def lengths(self) -> tuple[int, ...]:
        return self.eval_lens or tuple(self.train_len * m for m in (1, 2, 4, 8, 16))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def sequence_encodings() -> tuple[str, ...]:
    """Every registered encoding of token sequences (``--encodings all``): grid and M-RoPE encodings belong to
    ``posenc vision``."""
    facts = {"dim": 64, "num_heads": 4, "head_dim": 16, "max_len": 64, "grid_size": (4, 4)}
    return tuple(name for name in posenc.available() if posenc.build(name, **facts).position_kind == "sequence")


def run_name(encoding: str) -> str:
    """The folder name of ``encoding``'s run under ``OUT/runs``: the name, or ``BASE-OTHER-everyN`` for a per-layer
    ``BASE/OTHER:N`` (no ``/`` or ``:`` in a path; registered names are identifiers, so no two specs collide)."""
    base, other, interval = split_encoding(encoding, "encodings")
    return base if other is None else f"{base}-{other}-every{interval}"


def _build_options(name: str, train_len: int) -> dict:
    if name == "t5":
        return {"bidirectional": False}  # the decoder (causal) form of T5's buckets
    if name == "nope_temperature":
        return {"floor_scale": train_len}  # Llama 4's 8192 would keep every lab position at temperature 1
    return {}


def _model_config(cfg: StudyConfig, encoding: str) -> ModelConfig:
    base, other, _ = split_encoding(encoding, "encodings")
    if other is None:
        extra = _build_options(base, cfg.train_len)
    else:
        extra = {name: options for name in (base, other) if (options := _build_options(name, cfg.train_len))}
    return ModelConfig(
        vocab_size=256,
        dim=cfg.dim,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        max_len=cfg.train_len,
        encoding=encoding,
        encoding_config=extra,
    )


def _lm_batches(train_data: torch.Tensor, cfg: StudyConfig):  # noqa: ANN202
    """Step ``s`` draws the same global batch whatever the number of ranks or restarts; each rank takes its rows."""

    def batch_fn(step: int, rank: int, world: int):  # noqa: ANN202
        x, y = train_batch(
            train_data, length=cfg.train_len, batch=cfg.batch_size, generator=step_generator(cfg.seed, step)
        )
        rows = rank_rows(cfg.batch_size, rank, world)
        return x[rows], y[rows], None

    return batch_fn


def batch_fn_for(cfg: StudyConfig, corpus):  # noqa: ANN001, ANN201
    return _lm_batches(corpus.train, cfg) if cfg.task == "lm" else _task_batches(cfg)


def _task_maker(task: str):  # noqa: ANN202
    return copy_batch if task == "copy" else recall_batch


def _task_batches(cfg: StudyConfig):  # noqa: ANN202
    """Task instances of ``train_len`` tokens whose content size varies per row, from one copied symbol (one recall
    pair) up to the full length: training sees every length up to L, as in Kazemnejad et al. 2023 (sec. 3)."""
    make = _task_maker(cfg.task)
    vary = {"min_symbols": 1} if cfg.task == "copy" else {"min_pairs": 1}

    def batch_fn(step: int, rank: int, world: int):  # noqa: ANN202
        x, y, mask = make(cfg.batch_size, cfg.train_len, generator=step_generator(cfg.seed, step), **vary)
        rows = rank_rows(cfg.batch_size, rank, world)
        return x[rows], y[rows], mask[rows]

    return batch_fn


def run_study(cfg: StudyConfig, out: Path, *, resume: bool = False, progress: bool = True) -> list[dict]:
    """Run (or continue) the study; returns the result rows. Files land in ``out``."""
    start = time.perf_counter()
    out = Path(out)
    resolve_device(cfg.device, allow_auto=False)
    dist.init()
    torch.manual_seed(cfg.seed)
    corpus = load_corpus(cfg.corpus, max_bytes=cfg.corpus_bytes) if cfg.task == "lm" else None
    # Only now, with the device and corpus checked, is the folder claimed: a bad input leaves nothing behind.
    if dist.is_main():
        check_settings(out, cfg.to_dict(), resume, command="lab", what="study")
    dist.barrier()
    results_csv = out / "results.csv"
    done = {_key(r) for r in read_results(results_csv)} if results_csv.exists() else set()
    for encoding in cfg.encodings:
        device = dist.device() if cfg.device.startswith("cuda") and dist.is_distributed() else cfg.device
        model = GPT(_model_config(cfg, encoding), seed=cfg.seed).to(device)
        tcfg = TrainConfig(steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed, length=cfg.train_len)
        if not dist.is_main():  # other ranks only train; rank 0 evaluates and writes
            run_dir = out / "runs" / run_name(encoding)
            train(model, batch_fn_for(cfg, corpus), tcfg, run_dir, resume=True, progress=False)
            continue
        batch_fn = batch_fn_for(cfg, corpus)
        if progress and not (out / "runs" / run_name(encoding) / DONE_FILE).is_file():  # else train() says so
            print(f"\n[{encoding}] training at length {cfg.train_len} for {cfg.steps} steps")
        train(model, batch_fn, tcfg, out / "runs" / run_name(encoding), resume=True, progress=progress)
        extensions = ev.extension_names(encoding) if cfg.extensions else ("none",)
        plan = [(extension, length) for extension in extensions for length in cfg.lengths]
        todo = [(e, n) for e, n in plan if (encoding, e, 0, cfg.train_len, n, cfg.stride or 0) not in done]
        if progress and (message := skipped(encoding, len(plan) - len(todo), len(plan))):
            print(message)
        with progress_bar(progress, len(todo), f"{encoding} evaluation") as advance:
            for extension, length in todo:
                row = _evaluate(model, cfg, corpus, encoding, extension, length)
                upsert_results(results_csv, [row])  # kept as soon as measured: an interrupted study loses no row
                done.add(_key(row))
                advance()
        if encoding == "rope" and cfg.finetune_steps:
            for row in _finetune(model, cfg, corpus, out, done, progress):
                upsert_results(results_csv, [row])
                done.add(_key(row))
    if not dist.is_main():
        dist.cleanup()
        return []
    rows = read_results(results_csv)
    _finish(out, cfg, rows, corpus, time.perf_counter() - start, progress)
    dist.cleanup()
    return rows


def _finetune(model, cfg: StudyConfig, corpus, out: Path, done: set, progress: bool):  # noqa: ANN001, ANN202
    """Position Interpolation's recipe (Chen et al. 2023, sec. 3): fine-tune briefly at the target length with each
    scaling in place, then evaluate there. Yields result rows as they are measured; each fine-tune is its own
    resumable run in ``OUT/runs/rope-<scaling>-<length>``."""
    trained = {k: v.detach().clone() for k, v in model.state_dict().items()}
    plan = [(e, n) for e in ("none", *ev.ROPE_SCALINGS) for n in cfg.lengths if n > cfg.train_len]
    todo = [(e, n) for e, n in plan if ("rope", e, cfg.finetune_steps, cfg.train_len, n, cfg.stride or 0) not in done]
    if progress and (message := skipped("rope fine-tuned", len(plan) - len(todo), len(plan))):
        print(message)
    for extension, length in todo:
        model.load_state_dict(trained)
        swap = ev.extended_encoding(model, extension, train_len=cfg.train_len, eval_len=length)
        original = model.encoding
        if swap is not None:
            model.set_encoding(swap)
        batch = max(1, cfg.batch_size * cfg.train_len // length)  # the same tokens per step as pre-training
        tune = dataclasses.replace(cfg, train_len=length, batch_size=batch)
        tcfg = TrainConfig(
            steps=cfg.finetune_steps, batch_size=batch, lr=cfg.lr * 0.1, seed=cfg.seed + 1, length=length, warmup=0
        )
        run_dir = out / "runs" / f"rope-{extension}-{length}"
        train(
            model,
            batch_fn_for(tune, corpus),
            tcfg,
            run_dir,
            resume=True,
            progress=progress,
            description=f"rope+{extension} @{length}",
        )
        row = _evaluate(model, cfg, corpus, "rope", "none", length)  # the scaling is already in place
        model.set_encoding(original)
        yield {**row, "scaling": extension, "finetune_steps": cfg.finetune_steps}
    model.load_state_dict(trained)


def _key(row: dict) -> tuple:
    return (
        row["encoding"],
        row["scaling"],
        row["finetune_steps"] or 0,
        row["train_len"],
        row["eval_len"],
        row["stride"] or 0,
    )


def _evaluate(model, cfg: StudyConfig, corpus, encoding: str, extension: str, length: int) -> dict:  # noqa: ANN001
    swap = ev.extended_encoding(model, extension, train_len=cfg.train_len, eval_len=length)
    trained = model.encoding
    if swap is not None:
        model.set_encoding(swap)
    try:
        if cfg.task == "lm":
            score = ev.perplexity(model, corpus.val, length=length, stride=cfg.stride, max_tokens=cfg.eval_tokens)
            accuracy = None
        else:
            make = _task_maker(cfg.task)
            score, accuracy = ev.task_accuracy(
                model,
                lambda n, g: make(n, length, generator=g),
                length=length,
                n_sequences=256,
                seed=cfg.seed + 10_000 + length,
            )
            accuracy = None if score.status != "ok" else accuracy
    finally:
        model.set_encoding(trained)
    return {
        "encoding": encoding,
        "scaling": extension,
        "finetune_steps": 0,
        "train_len": cfg.train_len,
        "eval_len": length,
        "stride": cfg.stride or 0,
        "loss": score.loss,
        "ppl": score.ppl,
        "accuracy": accuracy,
        "tokens": score.tokens,
        "status": score.status,
    }


def _finish(out: Path, cfg: StudyConfig, rows: list[dict], corpus, seconds: float, progress: bool) -> None:  # noqa: ANN001
    from posenc.lab.plots import plot_extrapolation

    metric = "ppl" if cfg.task == "lm" else "accuracy"
    plot_extrapolation(
        out / "results.csv",
        out / "extrapolation.png",
        metric=metric,
        corpus=cfg.corpus or ("Python standard library" if cfg.task == "lm" else f"{cfg.task} task"),
    )
    findings = findings_for(rows, cfg)
    env = environment()
    write_report(
        out, results_csv=out / "results.csv", config=cfg.to_dict(), environment=env, seconds=seconds, findings=findings
    )
    if progress:
        print_table(rows, metric)
        for line in findings:
            print(line)
        print(f"\nWrote {out / 'results.csv'}, {out / 'extrapolation.png'}, {out / 'report.md'} in {seconds:.0f} s")


def findings_for(rows: Sequence[dict], cfg: StudyConfig) -> list[str]:
    """Plain statements about the measured table: the literature's pattern at 8x, then each encoding's ratio."""
    if cfg.task != "lm":
        return _task_findings(rows, cfg)
    far = cfg.train_len * 8
    by = {
        (r["encoding"], r["scaling"], r["eval_len"]): r for r in rows if r["status"] == "ok" and not r["finetune_steps"]
    }
    lines = _literature_check(by, cfg, far)
    for encoding in cfg.encodings:
        for extension in ev.extension_names(encoding):
            base, long = by.get((encoding, "none", cfg.train_len)), by.get((encoding, extension, far))
            if base is None:
                continue
            label = encoding if extension == "none" else f"{encoding} + {extension}"
            if long is None:
                lines.append(f"- {label}: not applicable at 8x ({far} tokens)")
                continue
            ratio = long["ppl"] / base["ppl"]
            lines.append(
                f"- {label}: perplexity {base['ppl']:.2f} at {cfg.train_len} -> {long['ppl']:.2f} at {far} "
                f"({ratio:.2f}x)"
            )
    if "rope" in cfg.encodings and cfg.extensions:
        lines.append(
            "- dynamic NTK equals NTK here by construction: every evaluation window has the same length L', so "
            "dynamic's per-call factor is L'/L, NTK's static one."
        )
    return lines


def _ratio(by: dict, encoding: str, extension: str, train_len: int, far: int) -> float | None:
    base, long = by.get((encoding, "none", train_len)), by.get((encoding, extension, far))
    return None if base is None or long is None else long["ppl"] / base["ppl"]


def _literature_check(by: dict, cfg: StudyConfig, far: int) -> list[str]:
    """Press et al. 2022 (Fig. 1): at several times the training length ALiBi stays near its own perplexity while
    sinusoidal (and learned) positions degrade badly. Say whether this run shows it, with the numbers."""
    if far not in cfg.lengths:
        return []
    lines = [f"Literature check at 8x the training length ({far} tokens):"]
    alibi = _ratio(by, "alibi", "none", cfg.train_len, far)
    if alibi is not None:
        verdict = (
            "within 10% of its own perplexity at 1x, as in the ALiBi paper"
            if alibi <= 1.10
            else "NOT within 10% of its own perplexity at 1x, unlike the ALiBi paper (too few --steps?)"
        )
        lines.append(f"- ALiBi: {alibi:.2f}x, {verdict}.")
    sinus = _ratio(by, "sinusoidal", "none", cfg.train_len, far)
    if sinus is not None:
        verdict = "far worse, as in the paper" if sinus > 1.5 else "not far worse, unlike the paper"
        lines.append(f"- sinusoidal: {sinus:.2f}x, {verdict}.")
    if "learned" in cfg.encodings:
        interp = _ratio(by, "learned", "interpolate", cfg.train_len, far)
        text = "" if interp is None else f"; with its table linearly interpolated to {far} positions: {interp:.2f}x"
        lines.append(f"- learned: cannot run past its {cfg.train_len}-entry table as trained{text}.")
    lines += _newer_claims(by, cfg, far)
    lines.append("")
    return lines


#: The later papers' claims, checked the same way at 8x: (encoding, rivals, paper, its claim). Each line appears
#: when the encoding and at least one rival ran.
NEWER_CLAIMS = (
    ("kerple", ("alibi",), "Chi et al. 2022", "KERPLE extrapolates better than ALiBi"),
    ("sandwich", ("alibi",), "Chi et al. 2023", "Sandwich extrapolates like ALiBi"),
    ("fire", ("t5", "alibi", "kerple"), "Li et al. 2024", "FIRE beats T5, ALiBi and KERPLE at long lengths"),
    ("p_rope", ("rope",), "Barbero et al. 2024", "dropping RoPE's lowest frequencies loses nothing"),
    ("cope", ("rope",), "Golovneva et al. 2024", "CoPE generalises to longer contexts than RoPE"),
)


def _newer_claims(by: dict, cfg: StudyConfig, far: int) -> list[str]:
    """One line per later paper whose encodings ran: its claim, the perplexities at 8x, and whether they agree."""
    at = {e: by[(e, "none", far)]["ppl"] for (e, s, n) in by if s == "none" and n == far}
    claims = list(NEWER_CLAIMS)
    claims += [(e, ("rope",), "Yang et al. 2025", "a RoPE/NoPE hybrid extrapolates better than RoPE alone")
               for e in cfg.encodings if "/" in e and split_encoding(e, "encodings")[0] == "rope"]  # fmt: skip
    lines = []
    for encoding, rivals, paper, claim in claims:
        ran = [r for r in rivals if r in at]
        if encoding not in at or not ran:
            continue
        mine = at[encoding]
        numbers = ", ".join(f"{r} {at[r]:.2f}" for r in ran)
        if encoding in ("sandwich", "p_rope"):  # claims of parity: within 10%
            held = all(mine <= 1.10 * at[r] for r in ran)
        else:
            held = all(mine < at[r] for r in ran)
        verdict = "agrees" if held else "does NOT agree"
        lines.append(f"- {paper}: {claim}. Here {encoding} {mine:.2f} vs {numbers}: this run {verdict}.")
    return lines


def _task_findings(rows: Sequence[dict], cfg: StudyConfig) -> list[str]:
    """Flag encodings that never learned the task: their extrapolation numbers mean nothing."""
    lines = []
    for r in rows:
        unlearned = r["scaling"] == "none" and r["eval_len"] == cfg.train_len and (r["accuracy"] or 0.0) < 0.5
        if unlearned and r["status"] == "ok":
            lines.append(
                f"- {r['encoding']}: exact match {r['accuracy'] or 0.0:.0%} at the training length: the task was not "
                "learned; raise --steps (or lower --train-len) before reading its extrapolation."
            )
    return lines
