"""``posenc lab``: train once per encoding at length L, evaluate at L..16L, write the CSV, plot and report.

Every finished piece is kept: each encoding trains in ``OUT/runs/<encoding>/`` (checkpointed, resumable, skipped
once done) and each evaluation is upserted into ``OUT/results.csv`` as soon as it is measured, so an interrupted
study continues with ``--resume`` where it stopped and never redoes or loses a completed run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

import torch

from posenc._checks import fail
from posenc._devices import resolve_device
from posenc.lab.common import dist
from posenc.lab.common import evaluate as ev
from posenc.lab.common.corpus import load_corpus, train_batch
from posenc.lab.common.files import read_json
from posenc.lab.common.gpt import GPT, KEY_COUNT_KEY, ModelConfig, check_key_count_record, split_encoding, split_local
from posenc.lab.common.progress import progress_bar, skipped
from posenc.lab.common.report import environment
from posenc.lab.common.runfiles import check_settings
from posenc.lab.common.scaling import ROPE_SCALINGS
from posenc.lab.common.train import CONFIG_FILE, DONE_FILE, TrainConfig, rank_rows, step_generator, train
from posenc.lab.length.config import StudyConfig
from posenc.lab.length.evaluate import extended_encoding, extension_names
from posenc.lab.length.plot import plot_extrapolation
from posenc.lab.length.report import findings_for, print_table, read_results, upsert_results, write_report
from posenc.lab.length.tasks import copy_batch, recall_batch


def run_name(encoding: str) -> str:
    """The folder name of ``encoding``'s run under ``OUT/runs``: the name, or ``BASE-OTHER-everyN`` for a per-layer
    ``BASE/OTHER:N`` (no ``/`` or ``:`` in a path; registered names are identifiers, so no two specs collide), with
    ``-chunkC`` for a chunked ``SPEC@C``, ``-windowW`` for a windowed ``SPEC~W`` and ``-sinks`` for ``SPEC+sinks``."""
    layers, chunk, window, sinks = split_local(encoding, "encodings")
    base, other, interval = split_encoding(layers, "encodings")
    name = base if other is None else f"{base}-{other}-every{interval}"
    name = name if chunk is None else f"{name}-chunk{chunk}"
    name = name if window is None else f"{name}-window{window}"
    return f"{name}-sinks" if sinks else name


def _build_options(name: str, train_len: int) -> dict:
    if name == "t5":
        return {"bidirectional": False}  # the decoder (causal) form of T5's buckets
    if name == "nope_temperature":
        return {"floor_scale": train_len}  # Llama 4's 8192 would keep every lab position at temperature 1
    return {}


def _model_config(cfg: StudyConfig, spec: str) -> ModelConfig:
    encoding, chunk, window, sinks = split_local(spec, "encodings")
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
        attention_chunk_size=chunk,
        sliding_window=window,
        sinks=sinks,
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


def run_study(cfg: StudyConfig, out: Path, *, resume: bool = False, progress: bool = True, jobs: int = 1) -> list[dict]:
    """Run (or continue) the study; returns the result rows. Files land in ``out``.

    ``jobs`` > 1 trains and evaluates that many encodings at once, each in its own process with ``threads // jobs``
    torch threads (CPU only, not under torchrun). A tiny lab model does not keep two threads busy: on a 2-core CPU
    one 1-thread step took 1.25x a 2-thread one, so two encodings at a time finish the study ~1.6x sooner
    (``default_jobs``). Each encoding's rows are written as soon as it finishes; an interrupted study keeps every
    finished encoding, and each training run its checkpoint.
    """
    start = time.perf_counter()
    out = Path(out)
    resolve_device(cfg.device, allow_auto=False)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        fail("jobs", jobs, "a positive number of encodings to run at once")
    dist.init()
    torch.manual_seed(cfg.seed)
    corpus = load_corpus(cfg.corpus, max_bytes=cfg.corpus_bytes) if cfg.task == "lm" else None
    # Only now, with the device and corpus checked, is the folder claimed: a bad input leaves nothing behind.
    if dist.is_main():
        _check_saved_runs(cfg, out)
        check_settings(out, cfg.to_dict(), resume, command="lab", what="study")
    dist.barrier()
    results_csv = out / "results.csv"
    done = {_key(r) for r in read_results(results_csv)} if results_csv.exists() else set()

    def keep(rows: list[dict]) -> None:
        upsert_results(results_csv, rows)  # kept as soon as measured: an interrupted study loses no row
        done.update(_key(r) for r in rows)

    jobs = min(jobs, len(cfg.encodings))
    if jobs > 1 and not dist.is_distributed() and cfg.device == "cpu":
        _run_parallel(cfg, out, done, jobs, keep, progress)
    else:
        for encoding in cfg.encodings:
            _run_encoding(cfg, corpus, out, encoding, frozenset(done), keep, progress)
    if not dist.is_main():
        dist.cleanup()
        return []
    rows = read_results(results_csv)
    _finish(out, cfg, rows, corpus, time.perf_counter() - start, progress)
    dist.cleanup()
    return rows


def _check_saved_runs(cfg: StudyConfig, out: Path) -> None:
    """Refuse, before anything is written, a run already in ``out`` that this posenc would not resume or evaluate as
    the model it trained: SSMax layers with a window or chunks saved when their ``n`` was ``p + 1`` (no
    ``KEY_COUNT_KEY`` in its ``config.json``; ``posenc.lab.common.gpt.check_key_count_record``)."""
    for spec in cfg.encodings:
        path = out / "runs" / run_name(spec) / CONFIG_FILE
        if not path.is_file():
            continue
        stored = read_json(path, "config")
        model = stored.get("model") if isinstance(stored, dict) else None
        if isinstance(model, dict):  # anything else: train() refuses it with its own message
            # not "delete the run and resume": results.csv keeps that model's rows, and a resume skips them
            remedy = f"retrain it with a fresh --out (the rows of {spec!r} in {out / 'results.csv'} come from it too)"
            check_key_count_record(_model_config(cfg, spec), model.get(KEY_COUNT_KEY), str(path), remedy)


def default_jobs(cfg: StudyConfig) -> int:
    """Encodings run at once by ``posenc lab`` unless told: one per CPU core on CPU (each with one thread of the
    cores), one on a GPU or under torchrun."""
    if cfg.device != "cpu" or dist.is_distributed():
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, torch.get_num_threads(), len(cfg.encodings)))


def _run_encoding(cfg: StudyConfig, corpus, out: Path, encoding: str, done: frozenset, keep, progress: bool) -> None:  # noqa: ANN001
    """Train ``encoding`` (resumed or skipped once done), evaluate what ``done`` lacks, pass each row to ``keep``."""
    device = dist.device() if cfg.device.startswith("cuda") and dist.is_distributed() else cfg.device
    model = GPT(_model_config(cfg, encoding), seed=cfg.seed).to(device)
    tcfg = TrainConfig(steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed, length=cfg.train_len)
    if not dist.is_main():  # other ranks only train; rank 0 evaluates and writes
        run_dir = out / "runs" / run_name(encoding)
        train(model, batch_fn_for(cfg, corpus), tcfg, run_dir, resume=True, progress=False)
        return
    batch_fn = batch_fn_for(cfg, corpus)
    if progress and not (out / "runs" / run_name(encoding) / DONE_FILE).is_file():  # else train() says so
        print(f"\n[{encoding}] training at length {cfg.train_len} for {cfg.steps} steps")
    train(model, batch_fn, tcfg, out / "runs" / run_name(encoding), resume=True, progress=progress)
    extensions = extension_names(encoding) if cfg.extensions else ("none",)
    plan = [(extension, length) for extension in extensions for length in cfg.lengths]
    todo = [(e, n) for e, n in plan if (encoding, e, 0, cfg.train_len, n, cfg.stride or 0) not in done]
    if progress and (message := skipped(encoding, len(plan) - len(todo), len(plan))):
        print(message)
    with progress_bar(progress, len(todo), f"{encoding} evaluation") as advance:
        for extension, length in todo:
            keep([_evaluate(model, cfg, corpus, encoding, extension, length)])
            advance()
    if encoding == "rope" and cfg.finetune_steps:
        for row in _finetune(model, cfg, corpus, out, set(done), progress):
            keep([row])


def _worker(cfg: StudyConfig, out: Path, encoding: str, done: frozenset, threads: int) -> list[dict]:
    """One encoding in a worker process (``run_study(jobs > 1)``): its rows, returned to the parent to write."""
    torch.set_num_threads(threads)
    torch.manual_seed(cfg.seed)
    corpus = load_corpus(cfg.corpus, max_bytes=cfg.corpus_bytes) if cfg.task == "lm" else None
    rows: list[dict] = []
    _run_encoding(cfg, corpus, out, encoding, done, rows.extend, False)
    return rows


def _run_parallel(cfg: StudyConfig, out: Path, done: set, jobs: int, keep, progress: bool) -> None:  # noqa: ANN001
    """Every encoding in a pool of ``jobs`` spawned processes; rows written by this process as each finishes."""
    threads = max(1, torch.get_num_threads() // jobs)
    context = multiprocessing.get_context("spawn")  # no fork of a process holding torch's thread pools
    if progress:
        print(f"Training and evaluating {len(cfg.encodings)} encodings, {jobs} at a time ({threads} thread each)")
    stop = {"term": False}

    def on_term(signum, frame):  # noqa: ANN001, ANN202 - SIGTERM to this process alone: stop the workers cleanly
        stop["term"] = True
        raise KeyboardInterrupt

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_term) if main_thread else None
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=context)
    try:
        with progress_bar(progress, len(cfg.encodings), "encodings") as advance:
            waiting, running = list(cfg.encodings), set()
            while waiting or running:  # at most `jobs` submitted: nothing queued to start after an interruption
                while waiting and len(running) < jobs:
                    running.add(pool.submit(_worker, cfg, out, waiting.pop(0), frozenset(done), threads))
                finished, running = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    keep(future.result())
                    advance()
    except KeyboardInterrupt:
        # Ctrl-C reached the workers too (one process group); a SIGTERM to this process is passed on. Each worker
        # finishes its step and checkpoints (train's handler); the encodings not started are dropped.
        if stop["term"]:
            for process in list(getattr(pool, "_processes", {}).values()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def _finetune(model, cfg: StudyConfig, corpus, out: Path, done: set, progress: bool):  # noqa: ANN001, ANN202
    """Position Interpolation's recipe (Chen et al. 2023, sec. 3): fine-tune briefly at the target length with each
    scaling in place, then evaluate there. Yields result rows as they are measured; each fine-tune is its own
    resumable run in ``OUT/runs/rope-<scaling>-<length>``."""
    trained = {k: v.detach().clone() for k, v in model.state_dict().items()}
    plan = [(e, n) for e in ("none", *ROPE_SCALINGS) for n in cfg.lengths if n > cfg.train_len]
    todo = [(e, n) for e, n in plan if ("rope", e, cfg.finetune_steps, cfg.train_len, n, cfg.stride or 0) not in done]
    if progress and (message := skipped("rope fine-tuned", len(plan) - len(todo), len(plan))):
        print(message)
    for extension, length in todo:
        model.load_state_dict(trained)
        swap = extended_encoding(model, extension, train_len=cfg.train_len, eval_len=length)
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
    swap = extended_encoding(model, extension, train_len=cfg.train_len, eval_len=length)
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
