"""``train``: AdamW with linear warmup and cosine decay, resumable bit for bit, data-parallel under ``torchrun``.

One loop for every lab model: the byte-level ``GPT`` (next-token targets ``(B, S)``) and the ``ViT``
(class labels ``(B,)``): the loss is cross-entropy of ``model(x)`` against ``y`` either way.

The caller owns the data: ``batch_fn(step, rank, world)`` returns this rank's share of the global batch for
``step``, a pure function of ``step`` (a generator seeded from ``(seed, step)``, rows ``rank::world``). So a resumed
run and a DDP run see exactly the batches an uninterrupted single process sees, and the loss is normalised by the
global number of scored targets, so DDP's gradient average equals the single-process gradient.

Files in ``run_dir`` (only rank 0 writes; every write is atomic):
    config.json: ``{"model": ModelConfig.to_dict(), "train": TrainConfig.to_dict(), "meta": {...}}``.
    checkpoint.safetensors: weights, optimizer state, step, RNG states (``posenc.lab.common.checkpoint``), every
        ``checkpoint_every`` steps, every ``checkpoint_seconds``, on interruption and at the end.
    metrics.jsonl: one JSON line per ``log_every`` steps: step, loss, lr, tokens_per_s, elapsed (, grad_norm).
    done.json: final_loss, steps, seconds, tokens, tokens_per_s; a later call returns it without training.

Interruption: while the loop runs, SIGINT (Ctrl-C) and SIGTERM only raise a flag; the loop finishes its step, writes
a checkpoint there and raises ``KeyboardInterrupt`` (a second signal raises at once), so a resumed run loses nothing
and stays bit-exact. A SIGKILL or a crash loses at most ``checkpoint_seconds`` of work. Under ``torchrun`` (which
passes the signal on to every rank) the ranks agree on the flag at the next ``log_every`` step, where they already
synchronise, and stop there together: a step boundary seen by one rank alone could leave the others waiting in a
collective.
"""

from __future__ import annotations

import json
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from posenc._checks import check_number, check_positive_int, fail
from posenc._config import DictConfig
from posenc.lab.common import dist
from posenc.lab.common.checkpoint import load_checkpoint, save_checkpoint
from posenc.lab.common.files import read_json, write_atomic, write_json_atomic
from posenc.lab.common.gpt import GPT, ModelConfig

CONFIG_FILE = "config.json"
CHECKPOINT_FILE = "checkpoint.safetensors"
METRICS_FILE = "metrics.jsonl"
DONE_FILE = "done.json"

#: ``TrainConfig`` fields that change neither the data nor the weights: a resumed run may use other values.
BOOKKEEPING_FIELDS = ("log_every", "checkpoint_every", "checkpoint_seconds")

Batch = tuple[torch.Tensor, torch.Tensor, "torch.Tensor | None"]
BatchFn = Callable[[int, int, int], Batch]


@dataclass(frozen=True, kw_only=True)
class TrainConfig(DictConfig):
    """Optimisation settings; ``to_dict``/``from_dict`` round-trip through JSON.

    Args:
        steps: optimizer steps.
        batch_size: GLOBAL batch (sequences per step over all ranks).
        length: tokens per training sequence (per image for a ViT: its patches), for tokens/s and the summary.
        lr: peak learning rate, reached after ``warmup`` steps, then cosine decay to ``lr * min_lr_ratio``.
        min_lr_ratio: final learning rate as a fraction of ``lr``.
        warmup: linear warmup steps; None means ``min(100, steps // 10)``.
        weight_decay: AdamW decay on matrices and embeddings (not on norms).
        betas: AdamW betas.
        grad_clip: clip the global gradient norm to this; 0 disables clipping.
        seed: data seed (the caller's ``batch_fn`` uses it) and, by convention, the model's init seed.
        log_every: steps between metrics lines (and progress-bar loss updates): the only host syncs.
        checkpoint_every: steps between checkpoints; 0 writes one only at the end.
        checkpoint_seconds: also write one when this many seconds have passed since the last (what a SIGKILL or a
            crash can lose; under torchrun checked at ``log_every`` steps); 0 turns the timed ones off.
    """

    steps: int
    batch_size: int
    length: int
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int | None = None
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 10
    checkpoint_every: int = 100
    checkpoint_seconds: float = 30.0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "length", "log_every"):
            check_positive_int(name, getattr(self, name))
        check_number("lr", self.lr, above=0.0)
        check_number("min_lr_ratio", self.min_lr_ratio, minimum=0.0)
        if self.min_lr_ratio > 1:
            fail("min_lr_ratio", self.min_lr_ratio, "a number in [0, 1]")
        if self.warmup is not None and (
            isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0
        ):
            fail("warmup", self.warmup, "a number of steps >= 0, or None for min(100, steps // 10)")
        check_number("weight_decay", self.weight_decay, minimum=0.0)
        betas = tuple(self.betas) if isinstance(self.betas, (list, tuple)) else ()
        if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas):
            fail("betas", self.betas, "two numbers in [0, 1), e.g. (0.9, 0.95)")
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))
        check_number("grad_clip", self.grad_clip, minimum=0.0)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            fail("seed", self.seed, "an integer >= 0")
        if (
            isinstance(self.checkpoint_every, bool)
            or not isinstance(self.checkpoint_every, int)
            or (self.checkpoint_every < 0)
        ):
            fail("checkpoint_every", self.checkpoint_every, "a number of steps >= 0 (0: only at the end)")
        if (
            isinstance(self.checkpoint_seconds, bool)
            or not isinstance(self.checkpoint_seconds, (int, float))
            or not math.isfinite(self.checkpoint_seconds)
            or self.checkpoint_seconds < 0
        ):
            fail("checkpoint_seconds", self.checkpoint_seconds, "a number of seconds >= 0 (0: no timed checkpoints)")

    @property
    def warmup_steps(self) -> int:
        return min(100, self.steps // 10) if self.warmup is None else self.warmup


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for 0-based ``step``: linear warmup to ``lr``, then cosine decay to ``lr * min_lr_ratio``."""
    warmup = cfg.warmup_steps
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    decay_steps = cfg.steps - 1 - warmup
    progress = 0.0 if decay_steps <= 0 else min(1.0, (step - warmup) / decay_steps)
    low = cfg.lr * cfg.min_lr_ratio
    return low + (cfg.lr - low) * 0.5 * (1.0 + math.cos(math.pi * progress))


def step_generator(seed: int, step: int) -> torch.Generator:
    """A CPU generator for the global batch of ``step``: the same on every rank, run and resume."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def rank_rows(batch: int, rank: int, world: int) -> slice:
    """Rows ``rank::world`` of a global batch of ``batch``: this rank's share (sizes differ by at most one)."""
    return slice(rank, batch, world)


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over ``model``'s parameters: weight decay on tensors with 2+ dimensions, none on norms."""
    params = [p for _, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    on_cuda = bool(params) and params[0].is_cuda
    kind = {"fused": True} if on_cuda else {"foreach": True}
    return torch.optim.AdamW(groups, lr=lr_at(0, cfg), betas=cfg.betas, **kind)


def run_config(model: nn.Module, cfg: TrainConfig, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What ``config.json`` holds for this run."""
    return {"model": model.config.to_dict(), "train": cfg.to_dict(), "meta": dict(meta or {})}


def _comparable(config: Mapping[str, Any]) -> tuple[Any, Any]:
    train = {k: v for k, v in dict(config.get("train", {})).items() if k not in BOOKKEEPING_FIELDS}
    return config.get("model"), train


def _check_same_run(run_dir: Path, expected: Mapping[str, Any]) -> None:
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        fail(
            str(path),
            None,
            f"the config of the run whose checkpoint is in {run_dir}; delete {run_dir} or pass a fresh --out",
        )
    stored = read_json(path, "config")
    if not isinstance(stored, dict) or _comparable(stored) != _comparable(expected):
        fail(
            str(path),
            _comparable(stored) if isinstance(stored, dict) else stored,
            f"this run's configuration {_comparable(expected)} to resume; delete {run_dir} or pass a fresh --out",
        )


def _check_batch(batch: object, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, Any]:
    """``(x, y, score_mask[, positions])``: tokens ``x (B, S)`` with next-token targets ``y (B, S)``, or any input
    ``x (B, ...)`` (images) with one class label per row, ``y (B,)``; ``score_mask`` None or bool shaped like ``y``;
    ``positions`` (tokens only) None or the position ids ``(B, S)`` the model reads the tokens at."""
    where = f"batch_fn({step}, ...)"
    if not isinstance(batch, tuple) or len(batch) not in (3, 4):
        fail(where, type(batch).__name__, "a tuple (x, y, score_mask or None[, positions or None])")
    x, y, mask = batch[:3]
    positions = batch[3] if len(batch) == 4 else None
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        fail(f"{where}[0]", getattr(x, "shape", type(x).__name__), "(B, S) token ids or a (B, ...) input batch")
    if not x.is_floating_point() and (x.dim() != 2 or x.dtype == torch.bool):
        fail(f"{where}[0]", (tuple(x.shape), x.dtype), "(B, S) integer token ids, or a floating-point input batch")
    labels = (x.shape[0],) if x.is_floating_point() else tuple(x.shape)
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != labels or y.is_floating_point() or y.dtype == torch.bool:
        fail(f"{where}[1]", getattr(y, "shape", type(y).__name__), f"integer targets of shape {labels}")
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.shape != y.shape or mask.dtype != torch.bool):
        fail(f"{where}[2]", getattr(mask, "shape", type(mask).__name__), f"None or bool {tuple(y.shape)}")
    if positions is not None and (
        not isinstance(positions, torch.Tensor)
        or x.is_floating_point()
        or positions.shape != x.shape
        or positions.is_floating_point()
        or positions.dtype == torch.bool
    ):
        fail(f"{where}[3]", getattr(positions, "shape", type(positions).__name__), f"None or int64 {tuple(x.shape)}")
    return x, y, mask, positions


def _loss_sum(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Summed cross-entropy over the scored targets: logits ``(B, S, V)`` / ``(B, C)``, ``y`` ``(B, S)`` / ``(B,)``."""
    losses = F.cross_entropy(logits.flatten(0, -2).float(), y.flatten(), reduction="none")  # (B * S,) or (B,)
    if mask is None:
        return losses.sum()
    return torch.where(mask.flatten(), losses, 0.0).sum()


class _Progress:
    """A rich progress bar with loss, tokens/s and ETA; does nothing when disabled."""

    def __init__(self, enabled: bool, total: int, start: int, description: str) -> None:
        self.bar = None
        if not enabled:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[tps]} tok/s"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
        )
        self.task = self.bar.add_task(description, total=total, completed=start, loss="-", tps="-")

    def __enter__(self) -> _Progress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.advance(self.task)

    def show(self, loss: float, tokens_per_s: float) -> None:
        if self.bar is not None:
            self.bar.update(self.task, loss=f"{loss:.4f}", tps=f"{tokens_per_s:,.0f}")


class _Interruption:
    """While entered, SIGINT and SIGTERM set ``requested`` instead of raising; a second one raises at once.

    Python runs signal handlers in the main thread only, so elsewhere (a training thread) this installs nothing and
    the signals keep their handlers. The previous handlers come back on exit.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested = False
        self.previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested:  # asked twice: the user will not wait for the step to end
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> _Interruption:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            # None: a handler installed from C, which Python cannot reinstall; the default is the nearest
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def _truncate_metrics(path: Path, step: int) -> None:
    """Keep the metrics lines of steps ``<= step`` (a resumed run rewrites the ones after its checkpoint)."""
    if not path.is_file():
        return
    keep = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line)["step"] <= step:
                keep.append(line)
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # a line cut by a crash
    text = "".join(line + "\n" for line in keep)
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def train(
    model: nn.Module,
    batch_fn: BatchFn,
    cfg: TrainConfig,
    run_dir: str | Path,
    *,
    resume: bool = True,
    progress: bool = True,
    meta: Mapping[str, Any] | None = None,
    description: str | None = None,
) -> dict[str, Any]:
    """Train ``model`` in place for ``cfg.steps`` steps; returns the summary also written to ``done.json``.

    Args:
        model: a lab model (``GPT``, ``ViT``: a module whose ``config`` has ``to_dict()`` and ``encoding``) already
            on its device (``posenc.lab.common.dist.device()`` under torchrun with CUDA).
        batch_fn: ``batch_fn(step, rank, world) -> (x, y, score_mask | None[, positions | None])``, this rank's
            rows of the global batch of ``step`` (0-based), deterministic in ``step``; ``positions`` (token models)
            are passed as ``model(x, positions)`` (PoSE or randomized positions,
            ``posenc.functional.position_sampling``). Loss is over ``score_mask`` (every target
            when None), normalised by the number of scored targets over all ranks.
        cfg: optimisation settings.
        run_dir: folder for the files listed in the module docstring (created if missing).
        resume: continue from ``run_dir``'s checkpoint (same final weights as an uninterrupted run), or return at
            once from ``done.json`` after loading the final weights into ``model``. False starts over.
        progress: show a rich progress bar and say what is resumed or skipped (rank 0 only).
        meta: extra JSON-able facts stored in ``config.json`` (not compared when resuming).
        description: progress-bar label; default the encoding's name.

    Returns:
        ``{"steps", "final_loss", "seconds", "tokens", "tokens_per_s", "resumed_from", "cached"}``; ``final_loss``
        is the mean training loss of the last ``log_every`` steps.

    Raises:
        KeyboardInterrupt: on SIGINT or SIGTERM, after the step in progress and a checkpoint there (see the module
            docstring); the same call with ``resume=True`` continues from it.

    Shapes:
        x, y (B / world, S) int64, score_mask (B / world, S) bool or None, positions (B / world, S) int64 or None
        -> logits (B / world, S, vocab).
    """
    if not isinstance(model, nn.Module) or not hasattr(getattr(model, "config", None), "to_dict"):
        fail("model", type(model).__name__, "a lab model (posenc.lab.common.gpt.GPT or posenc.lab.vision.vit.ViT)")
    if not isinstance(cfg, TrainConfig):
        fail("cfg", type(cfg).__name__, "a posenc.lab.common.train.TrainConfig")
    if not callable(batch_fn):
        fail("batch_fn", batch_fn, "a function (step, rank, world) -> (x, y, score_mask or None)")
    run_dir = Path(run_dir)
    rank, world = dist.init()
    if cfg.batch_size < world:
        fail("batch_size", cfg.batch_size, f"at least the number of processes, {world} (it is the GLOBAL batch)")
    main = rank == 0
    label = description or model.config.encoding
    config = run_config(model, cfg, meta)
    ckpt_path, done_path, metrics_path = run_dir / CHECKPOINT_FILE, run_dir / DONE_FILE, run_dir / METRICS_FILE

    if resume and done_path.is_file():
        _check_same_run(run_dir, config)
        load_checkpoint(ckpt_path, model=model, restore_rng=False)
        summary = read_json(done_path, "done")
        if progress and main:
            print(f"{label}: already trained ({summary.get('steps', cfg.steps)} steps), skipped", flush=True)
        return {**summary, "cached": True}

    optimizer = make_optimizer(model, cfg)
    start, elapsed, last_loss = 0, 0.0, float("nan")
    window_loss, window_steps = 0.0, 0  # the loss summed since the last metrics line, as the checkpoint left it
    if resume and ckpt_path.is_file():
        _check_same_run(run_dir, config)
        state = load_checkpoint(ckpt_path, model=model, optimizer=optimizer)
        start, elapsed = state["step"], float(state["meta"].get("elapsed", 0.0))
        last_loss = float(state["meta"].get("last_loss", float("nan")))
        window_loss, window_steps = float(state["meta"].get("window_loss", 0.0)), int(state["meta"].get("window", 0))
        if main:
            _truncate_metrics(metrics_path, start)
            if progress:
                print(f"resuming {label} from step {start} of {cfg.steps}", flush=True)
    elif main:
        run_dir.mkdir(parents=True, exist_ok=True)
        for stale in (ckpt_path, done_path, metrics_path):
            stale.unlink(missing_ok=True)
    if main:
        write_json_atomic(run_dir / CONFIG_FILE, config)
    dist.barrier()

    device = next(model.parameters()).device
    net = dist.wrap(model)
    net.train()
    params = [p for p in model.parameters() if p.requires_grad]
    # the loss summed since the last log, on device; a resumed window goes on where it stopped, so the metrics match
    # an uninterrupted run's (in float64, a single process's sums are the same bits)
    running = torch.full((), window_loss, device=device, dtype=torch.float64)
    distributed = dist.is_distributed()
    grad_norm = None
    window_tokens, window_start = 0, time.perf_counter()
    run_start = last_saved = time.perf_counter()

    def checkpoint(step: int) -> None:
        nonlocal last_saved
        # Every rank calls this at checkpoint_every steps, so the window may be summed over ranks there; the timed
        # and interrupt checkpoints of a DDP run come only at log steps, where the window is empty (no collective).
        window = float(dist.all_reduce_sum(running.clone())) / world if window_steps else 0.0
        if main:
            meta_out = {
                "elapsed": elapsed + time.perf_counter() - run_start,
                "last_loss": last_loss,
                "window_loss": window,
                "window": window_steps,
            }
            save_checkpoint(ckpt_path, model=model, optimizer=optimizer, step=step, meta=meta_out)
        last_saved = time.perf_counter()

    stopped_at, asked = None, False
    with _Interruption() as interruption, _Progress(progress and main, cfg.steps, start, label) as bar:
        for step in range(start, cfg.steps):
            x, y, mask, positions = _check_batch(batch_fn(step, rank, world), step)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            mask = None if mask is None else mask.to(device, non_blocking=True)
            inputs = (x,) if positions is None else (x, positions.to(device, non_blocking=True))
            lr = lr_at(step, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            count = torch.tensor(float(y.numel()), device=device) if mask is None else mask.sum().float()
            count = dist.all_reduce_sum(count)  # scored targets in the global batch
            loss = _loss_sum(net(*inputs), y, mask) * (world / count.clamp(min=1.0))  # DDP averages over ranks
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip > 0:
                grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip, foreach=True)
            optimizer.step()
            with torch.no_grad():
                running += loss.detach()
            window_steps += 1
            window_tokens += x.shape[0] * cfg.length * world  # cfg.length tokens per row (patches for a ViT)
            done = step + 1
            bar.advance()
            logged = done % cfg.log_every == 0 or done == cfg.steps
            asked = interruption.requested and not distributed  # one process stops at the end of any step
            if logged:
                flag = running.new_tensor(float(interruption.requested))
                total, flags = dist.all_reduce_sum(torch.stack([running, flag])).tolist()  # the host sync
                last_loss = total / world / window_steps
                asked = asked or flags > 0  # every rank sees the same sum: they stop at this step together
                now = time.perf_counter()
                tokens_per_s = window_tokens / max(now - window_start, 1e-9)
                bar.show(last_loss, tokens_per_s)
                if main:
                    line = {
                        "step": done,
                        "loss": last_loss,
                        "lr": lr,
                        "tokens_per_s": tokens_per_s,
                        "elapsed": elapsed + now - run_start,
                    }
                    if grad_norm is not None:
                        line["grad_norm"] = float(grad_norm)
                    with open(metrics_path, "a", encoding="utf-8") as f:
                        f.write(json.dumps(line) + "\n")
                running.zero_()
                window_steps, window_tokens, window_start = 0, 0, now
            if done == cfg.steps:
                break
            if asked:
                checkpoint(done)
                dist.barrier()  # the other ranks wait for rank 0's file before they exit
                stopped_at = done
                break
            timed = cfg.checkpoint_seconds and (logged or not distributed)  # under DDP rank 0's clock decides alone
            if (cfg.checkpoint_every and done % cfg.checkpoint_every == 0) or (
                timed and time.perf_counter() - last_saved >= cfg.checkpoint_seconds
            ):
                checkpoint(done)

        if stopped_at is None:
            seconds = elapsed + time.perf_counter() - run_start
            checkpoint(cfg.steps)
            total_tokens = cfg.steps * cfg.batch_size * cfg.length
            summary = {
                "steps": cfg.steps,
                "final_loss": last_loss,
                "seconds": seconds,
                "tokens": total_tokens,
                "tokens_per_s": total_tokens / max(seconds, 1e-9),
                "resumed_from": start,
            }
            if main:
                write_json_atomic(done_path, summary)
            dist.barrier()
        asked = asked or interruption.requested  # a signal during the last step or the final files
    if stopped_at is not None or asked:
        where = f"at step {stopped_at} of {cfg.steps}" if stopped_at is not None else "after its last step"
        if progress and main:
            print(f"{label}: interrupted {where}; saved in {run_dir}", file=sys.stderr, flush=True)
        raise KeyboardInterrupt(f"{label} interrupted {where}")
    return {**summary, "cached": False}


def load_model(run_dir: str | Path, *, device: str | torch.device = "cpu") -> GPT:
    """The trained ``GPT`` saved in ``run_dir`` (``config.json`` + ``checkpoint.safetensors``), in eval mode."""
    run_dir = Path(run_dir)
    config = read_json(run_dir / CONFIG_FILE, "config")
    if not isinstance(config, dict) or "model" not in config:
        fail(str(run_dir / CONFIG_FILE), config, "a posenc lab config with a 'model' section; rerun training")
    model = GPT(ModelConfig.from_dict(config["model"], where=f"{run_dir / CONFIG_FILE}['model']"))
    load_checkpoint(run_dir / CHECKPOINT_FILE, model=model, restore_rng=False)
    return model.to(device).eval()
