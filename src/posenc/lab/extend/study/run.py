"""``posenc extend``'s study (``run_extend``): patch a trained model afresh for every method and factor, verify the
patch took, and measure it beside the unpatched model (``none``) at every length.

Measured: perplexity over Press et al. 2022's non-overlapping windows, whole (``ppl``) and past the original context
(``ppl_past``, the same forward's per-position losses); passkey retrieval over a length x depth grid (Mohtashami &
Jaggi 2023, ``needles.passkey``); lm-eval's RULER tasks with ``task="ruler"`` (``needles.ruler``). ``finetune_steps``
adds Position Interpolation's short fine-tune at ``factor * original`` (Chen et al. 2023, sec. 3); ``task="passkey"``
(lab models) first trains the passkey task (``OUT/runs/passkey``). The model is a lab run folder, a pretrained model
(``posenc.hf.resolve_model``: GGUF, transformers folder, ``smollm2``) or ``new``; the settings left out are filled in
by ``study.plan`` and every one is checked before any weight is loaded. Results are upserted into ``results.csv``
(``COLUMNS``) as each measurement finishes, so ``resume`` skips what is done; ``--save`` writes the one patched model
through ``posenc.deploy``. The guide: docs/guides/labs.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence, Set
from pathlib import Path
from typing import Any

import torch

from posenc._checks import fail
from posenc._devices import resolve_device
from posenc.lab.common.progress import skipped
from posenc.lab.common.runfiles import KeyedCSV, check_out, check_resumable, check_settings, write_marker
from posenc.lab.extend.settings.config import (
    DROPE_ZERO_SHOT,
    STOP_WIDTH,
    ExtendConfig,
    check_lengths,
    drops,
    filled,
    resolve_lengths,
    token_lengths,
    unit_factors,
)
from posenc.lab.extend.stats import sampling
from posenc.lab.extend.stats.rates import RULER_PREFIX, Rate, model_of
from posenc.lab.extend.study import plan
from posenc.lab.extend.study.report import finish, label, precision_text
from posenc.lab.extend.targets.base import PretrainedTarget, Target, Tick, as_pretrained
from posenc.lab.extend.targets.finetune import plot_losses, run_folder
from posenc.lab.extend.targets.load import load_target, original_len_of

#: ``metric`` values: perplexity over whole windows, over the targets at positions >= the original context (the query
#: position past anything trained; same forward), passkey accuracy, and ``ruler:<task>`` (a RULER task's score).
METRICS = ("ppl", "ppl_past", "passkey")
#: ``accuracy`` = ``hits / n`` (passkey: keys found of ``n``; RULER: the sum of per-document scores in [0, 1]) with
#: its Wilson 95% interval ``ci_low``-``ci_high``. Files written before these columns read them as empty.
COLUMNS = [
    "metric", "method", "factor", "finetune_steps", "finetune_positions", "original_len", "length", "depth",
    "loss", "ppl", "accuracy", "hits", "n", "ci_low", "ci_high", "status", "interval",
]
KEY_COLUMNS = ("metric", "method", "factor", "finetune_steps", "finetune_positions", "length", "depth")
#: The settings that differ when a task-lm study is resumed with ``--task ruler`` to add RULER to it.
RULER_SETTINGS = ("task", "ruler_tasks", "ruler_samples")
#: Settings added after studies were first written: left out of a study's settings while at their default, so a
#: study started before them resumes.
LATER_SETTINGS = {"finetune_window": None, "finetune_positions": ["plain"], "finetune_corpus": None, "baseline": True}
#: ``OUT/results.csv``: one row per measurement, keyed by ``KEY_COLUMNS``.
RESULTS = KeyedCSV(
    columns=tuple(COLUMNS),
    key=KEY_COLUMNS,
    ints=frozenset({"finetune_steps", "original_len", "length", "n"}),
    floats=frozenset({"factor", "depth", "loss", "ppl", "accuracy", "hits", "ci_low", "ci_high"}),
    required=tuple(c for c in KEY_COLUMNS if c != "finetune_positions"),  # files written before it existed...
    defaults={"finetune_positions": "plain", "interval": "wilson"},  # ...read it as plain; intervals were Wilson's
    command="posenc extend",
)
read_results = RESULTS.read
upsert_results = RESULTS.upsert
result_key = RESULTS.key_of
#: ``OUT/samples.csv`` (pretrained models, rounds): each needle's score -- a passkey key found (1) or not (0), a
#: RULER document's score in [0, 1] -- by its ``index`` in its cell's fixed sequence: the same index is the same
#: needle for every model, which is what a race pairs models on (``posenc.lab.extend.stats.race``).
SAMPLE_KEY = ("metric", "method", "factor", "finetune_steps", "finetune_positions", "length", "depth", "index")
SAMPLES = KeyedCSV(
    columns=(*SAMPLE_KEY, "score"),
    key=SAMPLE_KEY,
    ints=frozenset({"finetune_steps", "length", "index"}),
    floats=frozenset({"factor", "depth", "score"}),
    command="posenc extend",
)
SAMPLES_FILE = "samples.csv"


# ---------------------------------------------------------------------------------------------------------------------
# The run


Unit = tuple[str, float, int, str]  # (method, factor, finetune_steps, finetune_positions): one measured model
Measurement = tuple[str, int, float | None]  # (metric, length, depth): one measurement of a model


def _row(metric: str, unit: Unit, original: int, length: int, depth: float | None) -> dict:
    method, factor, steps, positions = unit
    return {
        "metric": metric, "method": method, "factor": factor, "finetune_steps": steps,
        "finetune_positions": positions, "original_len": original, "length": length, "depth": depth, "loss": None,
        "ppl": None, "accuracy": None, "hits": None, "n": 0, "ci_low": None, "ci_high": None, "status": "n/a",
    }


def rate(row: dict, hits: float, n: int, anytime: bool = False) -> dict:
    """``row`` with a rate measured: ``hits`` of ``n`` (sum of scores in [0, 1]) and its 95% interval: Wilson's for
    a fixed count, the anytime-valid one (``anytime``) where rounds stopped sampling once the rate was clear --
    ``interval`` says which."""
    low, high = Rate(hits, n, anytime).interval
    row.update(accuracy=hits / n, hits=hits, n=n, ci_low=low, ci_high=high, status="ok",
               interval="anytime" if anytime else "wilson")
    return row


def _units(cfg: ExtendConfig, methods: Sequence[str], kind: str) -> list[Unit]:
    """The models to measure: the unpatched one first, each patch zero-shot, then each patch fine-tuned with each
    kind of positions (``drope``: once, at factor 1, whatever the factors; fine-tuned at the original context, its
    recalibration). A lab model is also fine-tuned unpatched at each target (what fine-tuning alone gives); a
    pretrained model is not (each fine-tune costs minutes there, and the methods are what the study compares).
    ``cfg.baseline`` False: no unpatched model at all (``--no-baseline``)."""
    units = [("none", 1.0, 0, "plain")] + [(m, f, 0, "plain") for m in methods for f in unit_factors(cfg, m)]
    if cfg.finetune_steps:
        tuned = ("none", *methods) if kind == "lab" else tuple(methods)
        factors = filled(cfg.factors, "factors")
        units += [(m, f, cfg.finetune_steps, p) for p in cfg.finetune_positions for m in tuned
                  for f in (factors if m == "none" else unit_factors(cfg, m))]
    return units if cfg.baseline else [u for u in units if u[0] != "none"]


def _only(grid: list[Unit], units: Sequence[Unit] | None) -> list[Unit]:
    """The study's models: ``grid`` (``_units``), or the ``units`` of it asked for, in the grid's order."""
    if units is None:
        return grid
    asked = set()
    for unit in units:
        unit = (str(unit[0]), float(unit[1]), int(unit[2]), str(unit[3])) if len(unit) == 4 else unit
        if unit not in grid:
            fail("units", list(unit), f"models of the study's grid {[list(u) for u in grid]}")
        asked.add(unit)
    return [u for u in grid if u[0] == "none" and not u[2] or u in asked]


def _only_measurements(grid: list[tuple], asked: Sequence[tuple] | None) -> list[tuple]:
    """The study's measurements: ``grid``, or those of it asked for, in the grid's order."""
    if asked is None:
        return grid
    wanted = {(str(m), int(n), None if d is None else float(d)) for m, n, d in asked}
    unknown = wanted - set(grid)
    if unknown:
        fail("measurements", sorted(map(list, unknown), key=str), f"measurements of the study's grid {grid}")
    return [m for m in grid if m in wanted]


def _measurements(cfg: ExtendConfig, lengths: Sequence[int]) -> list[Measurement]:
    """(metric, length, depth) per model; a ``ppl`` measurement also writes ``ppl_past`` past the original length."""
    ppl: list[Measurement] = [("ppl", n, None) for n in lengths] if cfg.task in ("lm", "ruler") else []
    tasks = filled(cfg.ruler_tasks, "ruler_tasks") if cfg.task == "ruler" else ()
    ruler: list[Measurement] = [(RULER_PREFIX + t, n, None) for t in tasks for n in lengths]
    return ppl + [("passkey", n, d) for n in lengths for d in filled(cfg.depths, "depths")] + ruler


def _keys(unit: Unit, original: int, metric: str, length: int, depth: float | None) -> set:
    """The ``results.csv`` keys one measurement writes."""
    metrics = ("ppl", "ppl_past") if metric == "ppl" and length > original else (metric,)
    return {result_key(_row(m, unit, original, length, depth)) for m in metrics}


def _cost(target: Target, cfg: ExtendConfig, metric: str, length: int, measured: int = 0) -> tuple[float, int]:
    """(compute in ``plan.forward_cost`` units, forwards) of one measurement, at most (a rate's cap, less the
    ``measured`` samples it already has)."""
    if metric.startswith(RULER_PREFIX):
        n = filled(cfg.ruler_samples, "ruler_samples") - measured
    elif metric == "ppl":
        n = target.windows(length)
    else:
        n = filled(cfg.trials, "trials") - measured if length >= target.min_passkey else 0
    return n * target.forward_cost(length), n


def check_save(
    save: str | Path | None, cfg: ExtendConfig, target: Target, out: Path, save_type: str = "source"
) -> Path | None:
    """``--save DIR`` or ``--save FILE.gguf`` checked by ``posenc.deploy.formats.check_save`` with the study's
    values: one patched pretrained RoPE model (exactly one method and one factor; ``drope`` takes no factor and is
    saved recalibrated only), into a new or empty folder that is not the study's own, or a new GGUF file llama.cpp
    runs (``posenc.deploy.formats.GGUF_METHODS``)."""
    from posenc.deploy.formats import check_save as check

    pretrained = target.kind != "lab"
    methods, factors = filled(cfg.methods, "methods"), filled(cfg.factors, "factors")
    return check(
        save, methods=methods, factors=factors, pretrained=pretrained,
        model_type=as_pretrained(target).model_type if pretrained else None,
        source=as_pretrained(target).source if pretrained else None,
        original_len=target.original_len, rebuild=lambda: as_pretrained(target).calls(methods[0], factors[0]),
        finetune_steps=cfg.finetune_steps, finetune_positions=cfg.finetune_positions, out=out, save_type=save_type,
    )


def write_saved(target: PretrainedTarget, model: Any, path: Path, save_type: str, check: bool) -> Path:
    """The one patched model written where ``check_save`` said (``posenc.deploy.formats.save``)."""
    from posenc.deploy.formats import save as write

    return write(model, path, source=target.source, tokenizer=target.tokenizer, config=target.config,
                 tensor_type=save_type, check=check)


def saved_unit(cfg: ExtendConfig) -> Unit:
    """The model ``--save`` writes: the study's one method at its one factor (``drope``: 1), fine-tuned if it is."""
    method = filled(cfg.methods, "methods")[0]
    return (method, unit_factors(cfg, method)[0], cfg.finetune_steps, cfg.finetune_positions[0])


def _saved_as(path: Path) -> str:
    from posenc.deploy.formats import saved_as

    return saved_as(path)


def run_extend(
    cfg: ExtendConfig,
    out: str | Path | None = None,
    *,
    resume: bool = False,
    progress: bool = True,
    save: str | Path | None = None,
    save_type: str = "source",
    units: Sequence[Unit] | None = None,
    measurements: Sequence[tuple[str, int, float | None]] | None = None,
    plan_only: bool = False,
    more_rounds: Any = None,
    stop: Any = None,
) -> list[dict[str, Any]]:
    """Run (or continue) the study; returns the rows of ``OUT/results.csv``. Files land in ``out`` (or ``cfg.out``).

    ``plan_only`` (``posenc extend --plan``): every check below, then the plan and a time estimate printed, and
    nothing written (``out`` is not created; a ``--resume`` plan reads what is there and counts what is left): the
    estimate comes from the model's dimensions and a short matrix-multiply probe of this machine
    (``plan.probe_seconds_per_unit``), not from the weights, which are never loaded. Returns the rows already
    measured (a new study: none).

    ``units``: measure only these models of the study's ``methods x factors`` (and fine-tuned) grid, each a
    ``(method, factor, finetune_steps, finetune_positions)`` tuple (``--pick``'s stages); the unpatched model is
    always measured (unless ``cfg.baseline`` is False). ``measurements``: likewise only these ``(metric, length,
    depth)`` of the study's grid (depth None but for passkey). Both are stored with the settings and checked on
    resume. ``more_rounds``: what samples rate cells after their first round, called as ``_more_rounds`` is (its
    default: cell by cell until each is decided, ``posenc.lab.extend.stats.sampling``); ``--pick`` races models instead.
    ``stop``: called before each model's first measurements; when it says True no further model is started (a
    ``--pick`` deadline; what was measured is kept and ``resume`` continues).
    A pretrained model's needles are kept one by one in ``samples.csv`` (``SAMPLES``).

    ``save``: a new or empty folder; the study's one patched model (exactly one method and one factor) is written
    there as a transformers folder (a frequency method's config carries it, so ``from_pretrained`` loads it extended;
    ``dca_vllm`` on Qwen2/Qwen3 is written as ``dual_chunk_attention_config``, which vLLM (Qwen2/Qwen3) and SGLang
    (Qwen2) read and transformers ignores; other remapping methods are refused) as soon as the
    weights are loaded, before anything is measured, so stopping the study early still leaves it (a fine-tuned one
    once fine-tuned); with task ``ruler``, ``report.md``'s ``lm_eval`` commands name that folder. A path ending in
    ``.gguf`` writes a GGUF file instead (``posenc.hf.save_gguf``; a GGUF source and a method llama.cpp runs,
    ``GGUF_METHODS``), its tensors in ``save_type`` (default each source tensor's); a path ending in a separator
    (``x.gguf/``) names a folder and is refused.

    Raises:
        ValueError: bad settings, a path that holds no model (a truncated or corrupt GGUF, an architecture posenc
            does not handle, ``smollm2`` without its package), a method the model does not take, a ``layer_type``
            it does not have, no length beyond the original context, fewer tokens scored than a length, lengths the
            held-out text cannot fill or memory cannot hold: all checked before any weight is loaded.
    """
    start = time.perf_counter()
    if not isinstance(cfg, ExtendConfig):
        fail("cfg", type(cfg).__name__, "a posenc.lab.extend.settings.config.ExtendConfig")
    out = out if out is not None else cfg.out
    if out is None:
        fail("out", None, "an output folder (the out argument or ExtendConfig.out)")
    out = Path(out)
    before = check_out(out, "extend")  # a folder that is not an extend run is refused before the model is loaded
    device = resolve_device(cfg.device, allow_auto=True)
    if cfg.task == "ruler":
        from posenc.lab.extend.needles.ruler import require

        require()  # lm-eval missing: the pip command, before anything is loaded
    torch.manual_seed(cfg.seed)
    if cfg.lengths is not None and (known := original_len_of(cfg)) is not None:
        check_lengths(token_lengths(resolve_lengths(cfg, known)), known)  # from the config alone, before any weights
    if resume and before is not None and cfg.dtype is None and isinstance(before.get("dtype"), str):
        # --dtype auto resolves per machine (bfloat16 where the CPU has units for it): a study resumed on another
        # machine goes on in the dtype it was measured in
        cfg = dataclasses.replace(cfg, dtype=before["dtype"])
    target = load_target(cfg, out, device=device, progress=progress)  # pretrained: config and tokenizer only
    cfg = _resolved(cfg, target, device)
    made_before_rounds = before is not None and "stop_width" not in before
    if made_before_rounds and cfg.stop_width in (None, 0.0, STOP_WIDTH):
        cfg = dataclasses.replace(cfg, stop_width=None)  # a study made before rounds resumes with its fixed counts
    target.use(cfg)
    plan.check(cfg, target, device=device)
    methods = filled(cfg.methods, "methods")
    measured = _only(_units(cfg, methods, target.kind), units)
    lengths = tuple(sorted(set(token_lengths(cfg))))
    for method in methods:  # every patch is checked before anything is measured (pretrained: on a meta copy)
        target.check_patch(method, unit_factors(cfg, method)[0])
    save_to = check_save(save, cfg, target, out, save_type)
    settings = {k: v for k, v in cfg.to_dict().items() if k != "out"}
    settings = {k: v for k, v in settings.items() if k not in LATER_SETTINGS or v != LATER_SETTINGS[k]}
    if cfg.task != "ruler":  # studies started before RULER existed resume with the same settings
        settings = {k: v for k, v in settings.items() if not k.startswith("ruler_")}
    if before is not None and "dtype" not in before and target.dtype == target.legacy_dtype():
        del settings["dtype"]  # a study started before dtype was a setting, resumed in the dtype it ran in
    if made_before_rounds and cfg.stop_width is None:
        del settings["stop_width"]
    if units is not None:
        settings["units"] = [list(u) for u in measured]
    grid = _only_measurements(_measurements(cfg, lengths), measurements)
    if measurements is not None:
        settings["measurements"] = [list(m) for m in grid]
    adding_ruler = _adds_ruler(before, settings, resume)
    if plan_only:
        if not adding_ruler:
            check_resumable(out, settings, resume, command="extend", what="run")  # reads only
        return _print_plan(cfg, target, out, grid, lengths, measured, measurements is not None, device, save_to)
    if cfg.task == "ruler":  # lm-eval builds the documents from the tokenizer: bad lengths and counts fail here
        if not adding_ruler:
            check_resumable(out, settings, resume, command="extend", what="run")  # before the slow build
        if progress:
            tasks = ", ".join(filled(cfg.ruler_tasks, "ruler_tasks"))
            print(f"Building RULER documents with lm-eval: {tasks} at lengths {list(lengths)}")
        as_pretrained(target).build_ruler(lengths)
    if adding_ruler:
        write_marker(out, "extend", settings)  # now a task-ruler study; its measured rows stay as they are
        if progress:
            print(f"Adding RULER {', '.join(filled(cfg.ruler_tasks, 'ruler_tasks'))} to the task-lm study in {out}")
    else:
        check_settings(out, settings, resume, command="extend", what="run")
    target.load()
    save_unit = None
    if save_to is not None:
        if cfg.finetune_steps:  # written once fine-tuned, below
            save_unit = saved_unit(cfg)
        else:
            factor = unit_factors(cfg, methods[0])[0]
            model, _ = target.patched(methods[0], factor)
            write_saved(as_pretrained(target), model, save_to, save_type, progress)
            del model
            if progress:
                print(f"Saved {label(methods[0], factor, 0)} to {save_to} ({_saved_as(save_to)})")
    target.prepare()
    results = out / "results.csv"
    samples = None if target.kind == "lab" else out / SAMPLES_FILE
    rows_before = read_results(results) if results.exists() else []
    done, work, more, left = _left(cfg, target, grid, measured, rows_before)
    resumed = len(done)
    forwards = sum(_cost(target, cfg, *m)[1] for m in left)
    calibration = target.calibrate(lengths) if progress and forwards else None  # may refit the cost model
    total = sum(_cost(target, cfg, *m)[0] for m in left)
    study = plan.StudyProgress(progress, total, forwards, calibration[0] if calibration else None)
    if progress and forwards:
        rounds = {model_of(r) for r in more}  # models with only further rounds left (a resumed study)
        print(_plan_text(cfg, target, work, lengths, forwards, study, calibration, rounds,
                         grid if measurements is not None else None))
    described: dict[str, Any] = {}
    tuned: dict[str, Path] = {}
    stopped = False
    for unit, todo in work:
        if todo and stop is not None and stop():  # a deadline (--pick --budget): what is measured is kept
            stopped = True
            break
        method, factor, steps, positions = unit
        name = label(*unit)
        if progress and (message := skipped(name, len(grid) - len(todo), len(grid), "measurements")):
            print(message)
        run_dir = run_folder(out, _slug(name))
        if steps and run_dir.is_dir():
            tuned[name] = run_dir
        if not todo and unit != save_unit:
            continue
        model, described[name], tuned_dir = model_for(target, unit)
        if tuned_dir is not None:
            tuned[name] = tuned_dir
        if save_to is not None and unit == save_unit:
            write_saved(as_pretrained(target), model, save_to, save_type, progress)
            if progress:
                print(f"Saved {name} to {save_to} ({_saved_as(save_to)})")
        with study.bar(name) as tick, _said_in_report(target):
            for metric, length, depth in todo:
                rows = _measure(target, model, unit, metric, length, depth, tick, samples)
                upsert_results(results, rows)
                done.update(result_key(r) for r in rows)
        del model
    if stopped and not results.is_file():
        return []  # stopped before anything was measured: no report to write
    if not stopped:
        with _said_in_report(target):
            (more_rounds or _more_rounds)(target, cfg, measured, grid, results, study, described, samples)
    rows = read_results(results)
    if rows and rows == rows_before and save_to is None and (out / "report.md").is_file():
        # a resumed study with nothing left: its report already tells every row, with the time and patches of the
        # runs that measured them (rewritten now it would say 2 s and no patches)
        if progress:
            print(f"Nothing left to measure in {out}: its report.md stands")
        return rows
    plot_losses(tuned, out / "finetune.png", unit="byte" if target.kind == "lab" else "token")
    finish(out, cfg, target, rows, described, time.perf_counter() - start, progress, resumed, saved=save_to)
    return rows


def rewrite_report(cfg: ExtendConfig, out: Path, target: Target, seconds: float, *, resumed: int, device: str) -> None:
    """A study's figures and ``report.md`` again from its ``results.csv`` alone -- nothing loaded, nothing measured,
    nothing printed --, as ``run_extend`` writes them when it ends: what ``--pick`` does for its stages after an
    interrupt. ``target``: the model's config and tokenizer (``load_target``); ``seconds``: the run's time so far;
    ``resumed``: the measurements the study held before this run."""
    finish(out, _resolved(cfg, target, device), target, read_results(out / "results.csv"), {}, seconds, False, resumed)


def _resolved(cfg: ExtendConfig, target: Target, device: str) -> ExtendConfig:
    """The settings as the study runs them on ``target``: lengths in tokens ("2x" -> tokens: extend.json and resume
    compare integers), the defaults ``plan.resolve`` fills in, and the dtype ``auto`` resolved (kept on resume)."""
    cfg = resolve_lengths(cfg, target.original_len)
    cfg = plan.resolve(
        cfg, kind=target.kind, original=target.original_len, default_methods=target.default_methods, device=device
    )
    return dataclasses.replace(cfg, dtype=str(target.dtype).removeprefix("torch."))


@contextlib.contextmanager
def _said_in_report(target: Target) -> Iterator[None]:
    """The warnings a study expects while it measures, said once in its report instead of between progress bars:
    ``CacheStaleWarning`` (a length-dependent patch -- dynamic NTK, DCA -- generating with the KV cache) and
    ``ReachExceededWarning`` (a length past what a patch was derived for, which a study measures on purpose)."""
    if target.kind == "lab":  # lab models are patched by posenc.lab, not posenc.hf: nothing warns
        yield
        return
    from posenc.hf import CacheStaleWarning, ReachExceededWarning

    with warnings.catch_warnings():
        for category in (CacheStaleWarning, ReachExceededWarning):
            warnings.filterwarnings("ignore", category=category)
        yield


def _left(cfg: ExtendConfig, target: Target, grid: Sequence[tuple], measured: Sequence[Unit],
          rows: Sequence[dict]) -> tuple[set, list, list, list]:
    """What a study has left, from the rows already in ``results.csv``: (the keys done; per model, the measurements
    not done; the rate cells under way that need more rounds; every measurement left as ``(metric, length, samples
    already measured)``, what ``_cost`` takes)."""
    done = {result_key(r) for r in rows}
    work = [(u, [m for m in grid if not _keys(u, target.original_len, *m) <= done]) for u in measured]
    more = sampling.pending(rows, cfg) if rows else []  # resumed cells under way
    left = [(m[0], m[1], 0) for _, todo in work for m in todo] + [(r["metric"], r["length"], r["n"]) for r in more]
    return done, work, more, left


def _print_plan(cfg: ExtendConfig, target: Target, out: Path, grid: list[tuple], lengths: Sequence[int],
                measured: list[Unit], subset: bool, device: str, save_to: Path | None) -> list[dict]:
    """``plan_only``: print what the study would run and an estimate of its time, from the settings, the model's
    dimensions and this machine's matrix-multiply speed (no weight loaded, nothing written); returns the rows
    already measured in ``out`` (a resumed study's), else []."""
    results = out / "results.csv"
    rows = read_results(results) if results.exists() else []
    original = target.original_len
    _, work, more, todo = _left(cfg, target, grid, measured, rows)
    forwards = sum(_cost(target, cfg, *m)[1] for m in todo)
    units = sum(_cost(target, cfg, *m)[0] for m in todo)
    tunes = [u for u, left in work if left and u[2] and not run_folder(out, _slug(label(*u))).is_dir()]
    lines = []
    if not forwards and not tunes:
        lines.append(f"Plan: nothing left to measure in {out} ({len(rows)} measurements there)")
    else:
        rounds = {model_of(r) for r in more}
        study = plan.StudyProgress(False, units, forwards)
        lines.append(_plan_text(cfg, target, work, lengths, forwards, study, None, rounds, grid if subset else None))
        if target.kind == "lab" and cfg.task == "passkey":
            lines.append(f"First: the passkey task trained for {cfg.train_steps} steps at {original} bytes "
                         f"({out / 'runs' / 'passkey'}; resumed or skipped where a run is there)")
        if target.kind == "lab":
            lines.append("Time: no estimate before the run for a lab model (small; the study's bar times it)")
        else:
            spu = plan.probe_seconds_per_unit(as_pretrained(target).dims, target.dtype, device)
            tuning = sum(cfg.finetune_steps * 3 * target.forward_cost(cfg.finetune_window_for(
                round(original * u[1]))) for u in tunes)
            caps = [filled(cfg.trials, "trials")]
            caps += [filled(cfg.ruler_samples, "ruler_samples")] if cfg.task == "ruler" else []
            most = " at most" if any(_up_to(cfg, cap) for cap in caps) else ""  # rounds may stop a cell early
            lines.append(
                f"Time:{most} about {plan.duration_text((units + tuning) * spu)} on {device}, estimated from this "
                f"machine's matrix-multiply speed and the model's size ({spu * 1e3:.3g} ms per token-equivalent) "
                "before any weight is loaded; the study refines it after timed forwards"
                + (" (fine-tuning included)" if tunes else "")
            )
    if save_to is not None:
        name = label(*saved_unit(cfg))
        lines.append(f"Would write {name} to {save_to} ({_saved_as(save_to)})")
    lines.append(f"Nothing written (--plan): the same command without --plan runs it into {out}")
    print("\n".join(lines))
    return rows


def model_for(target: Target, unit: Unit) -> tuple[Any, dict, Path | None]:
    """One measured model: (model, its patch's description, its fine-tuning run folder or None). A fine-tune that
    finished before is reloaded, not rerun."""
    method, factor, steps, positions = unit
    if method == "none":
        model, description = (target.copy() if steps else target.model), {"method": "none"}
    else:
        model, description = target.patched(method, factor)
    tuned = None
    if steps:
        tuned = target.finetune(model, _slug(label(*unit)), round(target.original_len * factor), positions)
    return model, description, tuned


def _more_rounds(target: Target, cfg: ExtendConfig, units: Sequence[Unit], grid: Sequence[tuple], results: Path,
                 study: Any, described: dict, samples: Path | None = None) -> None:
    """``stop_width``: further rounds for the rate cells not yet decided (``posenc.lab.extend.stats.sampling``).

    The next round always goes to the undecided cell with the fewest samples (then the first model, then the first
    measurement in the study's order): round by round over the cells, each model loaded once per round. The choice
    depends only on the rows in ``results.csv``, so a study stopped anywhere and resumed takes the same rounds and
    ends with the same counts."""
    rows = {result_key(r): r for r in read_results(results)} if results.exists() else {}
    order = {unit: i for i, unit in enumerate(units)}
    place = {m: i for i, m in enumerate(grid)}

    def next_round() -> Mapping[str, Any] | None:
        todo = [r for r in sampling.pending(list(rows.values()), cfg) if model_of(r) in order]
        rank = lambda r: (r["n"], order[model_of(r)], place.get((r["metric"], r["length"], r["depth"]), 0))  # noqa: E731
        return min(todo, key=rank, default=None)

    cell = next_round()
    while cell is not None:
        unit = model_of(cell)
        name = label(*unit)
        model, described[name], _ = model_for(target, unit)
        with study.bar(f"{name}: more samples") as tick:
            while cell is not None and model_of(cell) == unit:
                count = min(sampling.round_size(cfg, cell["metric"]), sampling.cap(cfg, cell["metric"]) - cell["n"])
                row = add_samples(target, model, dict(cell), count, tick, samples)
                upsert_results(results, [row])
                rows[result_key(row)] = row
                cell = next_round()
        del model


def add_samples(target: Target, model: Any, row: dict, count: int, tick: Any, samples: Path | None = None) -> dict:
    """``row`` (a rate cell, ``n`` samples measured) with the next ``count`` samples of its fixed sequence added;
    with ``samples`` (a pretrained model), each one's score is kept there by its index."""
    start, hits = row["n"] or 0, row["hits"] or 0.0
    metric, length, depth = row["metric"], row["length"], row["depth"]
    if metric.startswith(RULER_PREFIX):
        pretrained = as_pretrained(target)
        task, suite = metric.removeprefix(RULER_PREFIX), pretrained.suite
        if suite is None:
            raise RuntimeError(f"{target.name}: RULER measured before build_ruler() built its documents")
        documents = suite.samples[task][length][start : start + count]  # lm-eval's documents of this length, in order
        chosen = {**suite.samples, task: {**suite.samples[task], length: documents}}
        pretrained.suite = dataclasses.replace(suite, samples=chosen)  # this round's documents only
        try:
            score = pretrained.ruler(model, task, length, tick=tick)
        finally:
            pretrained.suite = suite
        _keep_samples(samples, row, start, score.scores)
        return rate(row, hits + score.hits, start + score.n, anytime=True)
    cfg, seed = target.cfg, sampling.round_seed(_passkey_seed(target.cfg, length, depth), start)
    target.cfg = dataclasses.replace(cfg, trials=count)  # one call per round: its keys share one prompt prefix
    outcomes: list[float] | None = [] if samples is not None else None
    try:
        extra = {} if outcomes is None else {"outcomes": outcomes}
        found = round(target.passkey(model, length, depth, seed, tick=tick, **extra) * count)
    finally:
        target.cfg = cfg
    _keep_samples(samples, row, start, outcomes)
    return rate(row, hits + found, start + count, anytime=True)


def _keep_samples(path: Path | None, row: Mapping[str, Any], start: int, scores: Sequence[float] | None) -> None:
    """Each needle's score of a round into ``samples.csv``, indexed from ``start`` in its cell's sequence."""
    if path is None or not scores:
        return
    keys = {k: row[k] for k in SAMPLE_KEY if k != "index"}
    SAMPLES.upsert(path, [{**keys, "index": start + i, "score": float(x)} for i, x in enumerate(scores)])


def read_samples(path: Path) -> dict[tuple, list[float | None]]:
    """``samples.csv`` as ``(unit, metric, length, depth) -> scores by index`` (None where an index is missing)."""
    cells: dict[tuple, dict[int, float]] = {}
    for r in SAMPLES.read(path) if path.exists() else []:
        cell = (model_of(r), r["metric"], r["length"], r["depth"])
        cells.setdefault(cell, {})[r["index"]] = r["score"]
    return {c: [got.get(i) for i in range(max(got) + 1)] for c, got in cells.items()}


def _passkey_seed(cfg: ExtendConfig, length: int, depth: float) -> int:
    """A passkey cell's seed: the same keys for every method."""
    return cfg.seed * 1_000_003 + length * 101 + round(1000 * depth)


def _adds_ruler(before: dict | None, settings: dict, resume: bool) -> bool:
    """Whether this resumes a task-``lm`` study with ``task="ruler"`` and every other setting the same: RULER is then
    added to it (its perplexity and passkey rows are what task ``ruler`` measures too)."""
    if not resume or before is None or before.get("task") != "lm" or settings.get("task") != "ruler":
        return False
    now = json.loads(json.dumps(settings))
    return {k: v for k, v in before.items() if k not in RULER_SETTINGS} == {
        k: v for k, v in now.items() if k not in RULER_SETTINGS
    }


def _slug(name: str) -> str:
    """A model's label as a folder name: ``yarn x2 +ft40 pose`` -> ``yarn-x2-ft40-pose``."""
    return name.replace(" ", "-").replace("+", "")


def _plan_text(cfg: ExtendConfig, target: Target, work: list, lengths: Sequence[int], forwards: int, study: Any,
               calibration: tuple[float, int, float] | None, rounds: Set[Unit] = frozenset(),
               grid: Sequence[tuple] | None = None) -> str:
    models = [label(*u) for u, todo in work if todo or u in rounds]
    metrics = {m for m, _, _ in grid} if grid is not None else None  # None: every measurement of the settings
    depths = sorted({d for m, _, d in grid if m == "passkey"}) if grid is not None else filled(cfg.depths, "depths")
    trials = filled(cfg.trials, "trials")
    keys = f"{_count(len(depths), 'depth')} x {_up_to(cfg, trials)}{_count(trials, 'key')}"
    parts = []
    if cfg.task != "passkey" and (metrics is None or "ppl" in metrics):
        parts.append("perplexity")
    if metrics is None or "passkey" in metrics:
        parts.append(f"passkey ({keys})")
    most = _up_to(cfg, trials) if "passkey" in (metrics or {"passkey"}) else ""
    ruler = [t for t in (cfg.ruler_tasks or ()) if metrics is None or RULER_PREFIX + t in metrics]
    if cfg.task == "ruler" and ruler:
        samples = filled(cfg.ruler_samples, "ruler_samples")
        documents = _count(samples, "document")
        parts.append(f"RULER {', '.join(ruler)} ({_up_to(cfg, samples)}{documents} each)")
        most = most or _up_to(cfg, samples)
    per_length = " and ".join(parts)
    shown = sorted({n for _, n, _ in grid}) if grid is not None else lengths
    text = (
        f"Plan: {_count(len(models), 'model')} ({', '.join(models)}) x {per_length} at lengths "
        f"{', '.join(map(str, shown))} (original {target.original_len}): {most}{forwards} forwards in "
        f"{precision_text(cfg.dtype, target.kind)}"
    )
    if calibration is not None:
        _, n, seconds = calibration
        text += f", about {plan.duration_text(study.eta())} (a {n}-token forward took {seconds:.2f} s)"
    tunes = [label(*u) for u, todo in work if todo and u[2]]
    if tunes:
        unit = "byte" if target.kind == "lab" else "token"
        windows = f"{cfg.finetune_window}-{unit} windows" if cfg.finetune_window else "windows of the target length"
        if any(drops(u[0]) for u, todo in work if todo and u[2]):
            windows += f" (drope: recalibrated at the original context, {target.original_len} {unit}s at most)"
        text += (
            f"; before their measurements, {_count(len(tunes), 'fine-tune')} of {cfg.finetune_steps} steps in "
            f"{windows} (each with its own bar and ETA; a finished one is reloaded, not rerun)"
        )
    if any(drops(u[0]) and not u[2] for u, todo in work if todo):
        text += f". Note: {DROPE_ZERO_SHOT}"
    return text


def _up_to(cfg: ExtendConfig, cap: int) -> str:
    """``"up to "`` where a count is a cap that rounds may stop short of (``stop_width``, a cap above one round)."""
    return "up to " if cfg.adaptive and cap > sampling.ROUND else ""


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _measure(target: Target, model: Any, unit: Unit, metric: str, length: int, depth: float | None, tick: Tick,
             samples: Path | None = None) -> list[dict]:
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
    rated = metric.startswith(RULER_PREFIX) or length >= target.min_passkey
    if target.cfg.adaptive and rated:  # the first round; _more_rounds adds the others the cell needs
        return [add_samples(target, model, row, sampling.round_size(target.cfg, metric), tick, samples)]
    if metric.startswith(RULER_PREFIX):
        score = as_pretrained(target).ruler(model, metric.removeprefix(RULER_PREFIX), length, tick=tick)
        return [rate(row, score.hits, score.n)]
    if length >= target.min_passkey:
        assert depth is not None  # a passkey measurement has a depth
        seed = _passkey_seed(target.cfg, length, depth)  # fixed counts: the keys studies drew before rounds
        trials = filled(target.cfg.trials, "trials")
        rate(row, round(target.passkey(model, length, depth, seed, tick=tick) * trials), trials)
    return [row]
