"""``posenc extend``: patch a trained model's positions for a longer context, then measure what each method rescues.

For every method and factor the model is patched afresh (a lab checkpoint: its RoPE rebuilt with the scaling, or
ALiBi's slopes interpolated, ``posenc.lab.evaluate.scaled_encoding``; a transformers model:
``posenc.hf.extend_context`` on a copy), the patch is verified (never an unpatched model measured silently), and
then measured at every length: perplexity on held-out text (Press et al. 2022's non-overlapping windows) and
passkey retrieval over a length x depth grid (Mohtashami & Jaggi 2023, ``posenc.lab.passkey``). Method ``none``,
the model as trained, is measured the same way, so the table shows what each method rescues. ``finetune_steps``
adds Position Interpolation's recipe (Chen et al. 2023, sec. 3): each patched model fine-tuned briefly at its target
length ``factor * original`` before it is measured again.

Models (``ExtendConfig.model``):
    a ``posenc lab`` run folder: ``config.json`` with a ``"model"`` section and ``checkpoint.safetensors``;
    a transformers folder: ``config.json`` with a ``model_type``, the weights and a tokenizer (loaded offline);
    ``new`` or ``new:<encoding>`` (``rope``, ``alibi``) with ``task="passkey"``: a fresh lab model of ``train_len``.

``task="passkey"`` (lab models only: tiny byte models cannot follow an instruction) first trains the passkey task at
the model's training length (``OUT/runs/passkey``, resumable), then tests each method at the long lengths.

Files in ``OUT``: ``results.csv`` (long form, ``COLUMNS``, upserted atomically as each measurement finishes, so
``resume`` skips finished rows), ``extend.png`` (perplexity vs length; task ``lm`` only, none is drawn without
perplexities), ``passkey.png`` (accuracy heatmaps), ``report.md``, ``extend.json`` (the settings,
checked on resume), ``runs/`` (training and fine-tuning runs of lab models).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from posenc._checks import check_choice, check_number, check_positive_int, fail
from posenc._config import DictConfig
from posenc.lab import evaluate as ev
from posenc.lab.devices import resolve_device
from posenc.lab.extend_models import load_target, original_len_of
from posenc.lab.extend_report import finish, label
from posenc.lab.progress import progress_bar, skipped
from posenc.lab.runfiles import KeyedCSV, check_out, check_settings

TASKS = ("lm", "passkey")
#: ``model`` keyword for a fresh lab model (``new`` is RoPE; ``new:alibi`` picks the encoding).
NEW = "new"
DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
COLUMNS = [
    "metric", "method", "factor", "finetune_steps", "original_len", "length", "depth",
    "loss", "ppl", "accuracy", "n", "status",
]  # fmt: skip
KEY_COLUMNS = ("metric", "method", "factor", "finetune_steps", "length", "depth")
#: ``OUT/results.csv``: one row per measurement, keyed by ``KEY_COLUMNS``.
RESULTS = KeyedCSV(
    columns=tuple(COLUMNS),
    key=KEY_COLUMNS,
    ints=frozenset({"finetune_steps", "original_len", "length", "n"}),
    floats=frozenset({"factor", "depth", "loss", "ppl", "accuracy"}),
    command="posenc extend",
)
read_results = RESULTS.read
upsert_results = RESULTS.upsert
result_key = RESULTS.key_of


@dataclass(frozen=True, kw_only=True)
class ExtendConfig(DictConfig):
    """Everything that defines an extension study; stored as ``OUT/extend.json`` and checked on resume.

    Args:
        model: a lab run folder, a transformers model folder, or ``new`` / ``new:<encoding>`` (task passkey).
        methods: extension methods; None: every method for the model's encoding.
        factors: context factors, each > 1 (target context = factor * original length).
        lengths: evaluation lengths in tokens (bytes for lab models), each >= the original length and at least one
            beyond it; None: 1x, 2x, 4x, 8x the original length.
        depths: passkey depths in [0, 1].
        trials: passkey keys per (length, depth) cell.
        finetune_steps: 0, or steps of fine-tuning at the target length after patching (also measured zero-shot).
        finetune_lr: learning rate of that fine-tuning; None: 3e-4 (lab), 2e-5 (transformers).
        corpus: text file or folder for perplexity and fine-tuning; None: the Python standard library.
        corpus_bytes: cap on corpus bytes read.
        eval_tokens: tokens scored per perplexity length.
        task: ``lm`` (perplexity and passkey, zero-shot) or ``passkey`` (lab models: train the task, then test).
        original_len: the model's original context; None: read from the model (required when its config has none).
        train_len: training length of a ``new`` model (bytes; 128 by default: a 2-layer width-64 GPT learns retrieval
            there in ~800 steps, measured on CPU, while at 256 it had not after 700).
        train_steps: passkey training steps (task passkey).
        device: ``auto`` (CUDA when present), ``cpu``, ``cuda``, ``cuda:1``...
        seed: seed of every random draw (keys, depths, batches).
        out: default output folder (``run_extend``'s ``out`` argument wins); not compared on resume.
    """

    model: str
    methods: tuple[str, ...] | None = None
    factors: tuple[float, ...] = (2.0, 4.0)
    lengths: tuple[int, ...] | None = None
    depths: tuple[float, ...] = DEFAULT_DEPTHS
    trials: int = 5
    finetune_steps: int = 0
    finetune_lr: float | None = None
    corpus: str | None = None
    corpus_bytes: int = 4_000_000
    eval_tokens: int = 16384
    task: str = "lm"
    original_len: int | None = None
    train_len: int = 128
    train_steps: int = 1000
    device: str = "auto"
    seed: int = 0
    out: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            fail("model", self.model, "a model folder (lab run or transformers) or 'new' / 'new:<encoding>'")
        for name in ("methods", "factors", "lengths", "depths"):
            value = getattr(self, name)
            if value is not None:
                if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
                    fail(name, value, "a non-empty list")
                object.__setattr__(self, name, tuple(value))
        if self.methods is not None:
            for method in self.methods:
                if not isinstance(method, str) or not method or method == "none":
                    fail("methods", method, "method names (the unpatched model, 'none', is always measured)")
            if len(set(self.methods)) != len(self.methods):
                fail("methods", self.methods, "each method once")
        for factor in self.factors:
            check_number("factors", factor)
            if factor <= 1:  # 1 measures the model as trained again (that is `none`, always measured); < 1 shrinks
                fail("factors", factor, "factors > 1 (target context = factor x original; 1 is the unpatched model)")
        object.__setattr__(self, "factors", tuple(float(f) for f in self.factors))
        if len(set(self.factors)) != len(self.factors):
            fail("factors", self.factors, "each factor once")
        for length in self.lengths or ():
            check_positive_int("lengths", length)
        for depth in self.depths:
            if isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0 <= depth <= 1:
                fail("depths", depth, "fractions in [0, 1] (0: needle first, 1: just before the question)")
        object.__setattr__(self, "depths", tuple(float(d) for d in self.depths))
        for name in ("trials", "corpus_bytes", "eval_tokens", "train_len", "train_steps"):
            check_positive_int(name, getattr(self, name))
        if isinstance(self.finetune_steps, bool) or not isinstance(self.finetune_steps, int) or self.finetune_steps < 0:
            fail("finetune_steps", self.finetune_steps, "0 (zero-shot only) or a positive number of steps")
        if self.finetune_lr is not None:
            check_number("finetune_lr", self.finetune_lr, above=0.0)
        check_choice("task", self.task, TASKS)
        if self.original_len is not None:
            check_positive_int("original_len", self.original_len)
        if self.is_new:
            check_choice("model", self.model, [NEW, *(f"{NEW}:{e}" for e in ev.EXTEND_METHODS)])
            if self.task != "passkey":
                fail("model", self.model, "a model folder; a fresh model ('new') is only trained by --task passkey")
        if self.lengths is not None:
            known = self.original_len or (self.train_len if self.is_new else None)
            if known is not None:
                check_lengths(self.lengths, known)
        if not isinstance(self.device, str) or not self.device:
            fail("device", self.device, "'auto', 'cpu', 'cuda' or 'cuda:<index>'")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            fail("seed", self.seed, "an integer >= 0")

    @property
    def is_new(self) -> bool:
        return self.model == NEW or self.model.startswith(NEW + ":")

    def resolved_device(self) -> str:
        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.device


def check_lengths(lengths: Sequence[int], original: int) -> None:
    """Every evaluation length at or past the original context, at least one beyond it (what extension is for)."""
    shorter = sorted(n for n in lengths if n < original)
    if shorter or max(lengths) <= original:
        why = f"{shorter} shorter than it" if shorter else "none beyond it"
        fail(
            "lengths",
            list(lengths),
            f"lengths >= the original context of {original} tokens, at least one beyond it ({why})",
        )


# ---------------------------------------------------------------------------------------------------------------------
# The run


def _row(metric: str, unit: tuple[str, float, int], original: int, length: int, depth: float | None) -> dict:
    method, factor, steps = unit
    return {
        "metric": metric, "method": method, "factor": factor, "finetune_steps": steps, "original_len": original,
        "length": length, "depth": depth, "loss": None, "ppl": None, "accuracy": None, "n": 0, "status": "n/a",
    }  # fmt: skip


def _units(cfg: ExtendConfig, methods: Sequence[str]) -> list[tuple[str, float, int]]:
    """(method, factor, finetune_steps) to measure: the unpatched model first, each patch zero-shot, then fine-tuned
    (the unpatched model fine-tuned at each target too: what fine-tuning alone gives)."""
    units = [("none", 1.0, 0)] + [(m, f, 0) for m in methods for f in cfg.factors]
    if cfg.finetune_steps:
        units += [(m, f, cfg.finetune_steps) for m in ("none", *methods) for f in cfg.factors]
    return units


def _measurements(cfg: ExtendConfig, lengths: Sequence[int]) -> list[tuple[str, int, float | None]]:
    ppl = [("ppl", n, None) for n in lengths] if cfg.task == "lm" else []
    return ppl + [("passkey", n, d) for n in lengths for d in cfg.depths]


def run_extend(
    cfg: ExtendConfig, out: str | Path | None = None, *, resume: bool = False, progress: bool = True
) -> list[dict[str, Any]]:
    """Run (or continue) the study; returns the rows of ``OUT/results.csv``. Files land in ``out`` (or ``cfg.out``).

    Raises:
        ValueError: bad settings, a folder that holds no model, a model whose positions cannot be extended, a
            method it does not offer, lengths shorter than the original context or none beyond it (checked from the
            model's config before its weights are loaded).
    """
    start = time.perf_counter()
    if not isinstance(cfg, ExtendConfig):
        fail("cfg", type(cfg).__name__, "a posenc.lab.extend.ExtendConfig")
    if out is None and cfg.out is None:
        fail("out", None, "an output folder (the out argument or ExtendConfig.out)")
    out = Path(out if out is not None else cfg.out)
    check_out(out, "extend")  # a folder that is not an extend run is refused before the model is loaded
    device = resolve_device(cfg.device, allow_auto=True)
    torch.manual_seed(cfg.seed)
    if cfg.lengths is not None and (known := original_len_of(cfg)) is not None:
        check_lengths(cfg.lengths, known)  # from the model's config alone: fails before any weights are loaded
    target = load_target(cfg, out, device=device, progress=progress)
    original = target.original_len
    lengths = tuple(sorted(set(cfg.lengths or (original * m for m in (1, 2, 4, 8)))))
    check_lengths(lengths, original)
    methods = cfg.methods or target.default_methods
    for method in methods:  # every patch is checked before anything is measured: bad input fails in seconds
        target.patched(method, cfg.factors[0])
    settings = {k: v for k, v in cfg.to_dict().items() if k != "out"}
    check_settings(out, settings, resume, command="extend", what="run")
    target.prepare()
    results = out / "results.csv"
    done = {result_key(r) for r in read_results(results)} if results.exists() else set()
    plan = _measurements(cfg, lengths)
    described: dict[str, Any] = {}
    for unit in _units(cfg, methods):
        method, factor, steps = unit
        todo = [m for m in plan if result_key({**_row(m[0], unit, original, m[1], m[2])}) not in done]
        name = label(*unit)
        if progress and (message := skipped(name, len(plan) - len(todo), len(plan), "measurements")):
            print(message)
        if not todo:
            continue
        if method == "none":
            model, description = target.copy(), {"method": "none"}
        else:
            model, description = target.patched(method, factor)
        described[name] = description
        if steps:
            target.finetune(model, name.replace(" ", "-").replace("+", ""), round(original * factor))
        with progress_bar(progress, len(todo), name) as advance:
            for metric, length, depth in todo:
                row = _measure(target, model, unit, metric, length, depth)
                upsert_results(results, [row])
                done.add(result_key(row))
                advance()
        del model
    rows = read_results(results)
    finish(out, cfg, target, rows, described, time.perf_counter() - start, progress)
    return rows


def _measure(target, model, unit, metric: str, length: int, depth: float | None) -> dict:  # noqa: ANN001
    row = _row(metric, unit, target.original_len, length, depth)
    if metric == "ppl":
        score = target.perplexity(model, length)
        row.update(loss=score.loss, ppl=score.ppl, n=score.tokens, status=score.status)
    elif length >= target.min_passkey:
        seed = target.cfg.seed * 1_000_003 + length * 101 + round(1000 * depth)  # the same keys for every method
        row.update(accuracy=target.passkey(model, length, depth, seed), n=target.cfg.trials, status="ok")
    return row
