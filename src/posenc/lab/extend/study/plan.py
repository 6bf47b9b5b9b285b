"""What a ``posenc extend`` study will do, decided before any weight is loaded.

- ``resolve``: the settings the user left out, by the model's kind. A lab model keeps the lab's study (factors 2 and
  4 at 1x-8x its training length, five depths, five keys). A pretrained model gets a study sized to finish: on CPU
  ``none``, ``yarn x2`` and ``dynamic x2`` at half and 1.5x the original context (4096 and 12288 tokens for
  SmolLM2-135M, 24 forwards: 6 min 43 s on a 2-core Xeon with AMX, about 14 minutes on a 2-core AVX2 EPYC, float32);
  on CUDA factors 2, 4, 8 at 0.5x, 2x, 4x, 8x.
- ``check``: the settings against each other and against the machine: lengths vs the original context, the tokens
  scored vs the lengths, the held-out text vs the longest length, the passkey prompt vs the lengths, and the memory a
  forward at the longest length needs vs what is free. A study that cannot finish fails in its first seconds.
- ``forward_cost`` and ``StudyProgress``: work counted in token-equivalents of compute, so the bar's ETA means
  something when one forward at 12k tokens costs five at 4k.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from posenc._checks import fail
from posenc.lab.extend.settings.config import (
    ExtendConfig,
    check_lengths,
    drops,
    filled,
    token_lengths,
    tokens,
    unit_factors,
)
from posenc.lab.extend.targets.base import PretrainedTarget, Target, as_pretrained
from posenc.lab.extend.targets.cost import HEAD_CHUNK, ModelDims

DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
LAB_EVAL_TOKENS = 16384
#: Settings left out, by target: lab models (the toy study), pretrained models on CPU and on CUDA. ``multiples``
#: are lengths as multiples of the original context. The CPU plan for SmolLM2-135M (docs/guides/labs.md: 7-14 minutes
#: on 2 cores): 3 models x (ppl: 3 forwards at 4096 + 1 at 12288; passkey: 2 depths x 1 key at each length).
#: ``ruler``: RULER documents per task and length (task ``ruler``).
PLANS: dict[str, dict[str, Any]] = {
    "lab": {"factors": (2.0, 4.0), "multiples": (1, 2, 4, 8), "depths": DEFAULT_DEPTHS, "trials": 5, "ruler": None},
    "cpu": {"factors": (2.0,), "multiples": (0.5, 1.5), "depths": (0.25, 0.75), "trials": 1, "ruler": 2},
    "cuda": {
        "factors": (2.0, 4.0, 8.0),
        "multiples": (0.5, 2, 4, 8),
        "depths": (0.1, 0.5, 0.9),
        "trials": 2,
        "ruler": 10,
    },
}
_GIB = 2**30


def plan_name(kind: str, device: str) -> str:
    return "lab" if kind == "lab" else "cuda" if device.startswith("cuda") else "cpu"


def resolve(
    cfg: ExtendConfig, *, kind: str, original: int, default_methods: Sequence[str], device: str
) -> ExtendConfig:
    """``cfg`` with every setting left out (None) filled in for this model's kind and device; given ones kept.

    ``eval_tokens`` left out: the longest length for a pretrained model (each length scores the same tokens, the
    longest in one forward), ``max(16384, longest)`` for a lab model."""
    plan = PLANS[plan_name(kind, device)]
    lengths = cfg.lengths or tuple(sorted({max(1, round(original * m)) for m in plan["multiples"]}))
    longest = max(lengths)
    eval_tokens = cfg.eval_tokens
    ruler: dict[str, Any] = {}
    if cfg.task == "ruler":
        from posenc.lab.extend.needles.ruler import DEFAULT_TASKS

        ruler = {
            "ruler_tasks": cfg.ruler_tasks or DEFAULT_TASKS,
            "ruler_samples": cfg.ruler_samples if cfg.ruler_samples is not None else plan["ruler"],
        }
    if eval_tokens is None:
        eval_tokens = max(LAB_EVAL_TOKENS, longest) if kind == "lab" else longest
    return dataclasses.replace(
        cfg,
        methods=cfg.methods or tuple(default_methods),
        factors=cfg.factors or plan["factors"],
        lengths=tuple(lengths),
        depths=cfg.depths if cfg.depths is not None else plan["depths"],
        trials=cfg.trials if cfg.trials is not None else plan["trials"],
        eval_tokens=eval_tokens,
        **ruler,
    )


def check(cfg: ExtendConfig, target: Target, *, device: str) -> None:
    """Every setting against the others and the machine, before any weight is loaded (``target`` has its config,
    tokenizer and held-out tokens, no weights). Raises ValueError naming the setting to change."""
    lengths = sorted(set(token_lengths(cfg)))
    longest = lengths[-1]
    check_lengths(lengths, target.original_len)
    if tokens(cfg.eval_tokens, "eval_tokens") < longest:
        fail(
            "eval_tokens",
            cfg.eval_tokens,
            f"at least the longest length, {longest} (--eval-tokens: one full window per length; leave it out to "
            f"score {longest} tokens at every length)",
        )
    check_finetune(cfg, target)
    if target.kind == "lab":
        return  # the corpus was checked in bytes when loaded; lab models are small
    pretrained = as_pretrained(target)
    available = pretrained.heldout_tokens
    if available < longest + 1:
        fail(
            "lengths",
            lengths,
            f"lengths the held-out text can fill: {pretrained.corpus_name} gives {available} held-out tokens, so at "
            f"most {available - 1}; lower --lengths or pass a bigger --corpus",
        )
    if longest < target.min_passkey:
        fail(
            "lengths",
            lengths,
            f"at least one length of {target.min_passkey} tokens or more, the shortest passkey prompt with this "
            "tokenizer (shorter lengths are reported n/a)",
        )
    check_memory(pretrained, longest, device)
    if cfg.finetune_steps:
        window = max(cfg.finetune_window_for(t) for t in finetune_targets(cfg, target))
        check_finetune_memory(target, window, device)


def finetune_targets(cfg: ExtendConfig, target: Target) -> list[int]:
    """The target contexts the study fine-tunes at, sorted: ``factor * original`` per factor of a scaling method (a
    lab model's unpatched one too), the original context itself for ``drope`` (its recalibration)."""
    methods = [*filled(cfg.methods, "methods"), *(("none",) if target.kind == "lab" else ())]
    return sorted({round(target.original_len * f) for m in methods for f in unit_factors(cfg, m)})


def check_finetune(cfg: ExtendConfig, target: Target) -> None:
    """The fine-tuning positions against the model (``pose`` and ``random`` need one that reads position ids:
    not a transformers ALiBi model), the window against the targets (``factor * original``; ``drope``: at most the
    original context, where it is recalibrated) and the fine-tuning text."""
    if not cfg.finetune_steps or (target.kind == "lab" and cfg.task == "passkey"):
        return
    if target.kind != "lab":  # a lab model reads its positions, ALiBi included
        from posenc.lab.extend.targets.finetune import check_positions_reach

        check_positions_reach(cfg.finetune_positions, as_pretrained(target).model_type)
    targets = finetune_targets(cfg, target)
    window = None if cfg.finetune_window is None else tokens(cfg.finetune_window, "finetune_window")
    methods = filled(cfg.methods, "methods")
    dropping = [m for m in methods if drops(m)]
    if dropping and window is not None and window > target.original_len:
        fail(
            "finetune_window",
            window,
            f"at most the original context, {target.original_len}, with method {dropping[0]!r}: DroPE is "
            "recalibrated at the context the model was pretrained for (its authors' recipe, SakanaAI/DroPE), never "
            "beyond it; leave --finetune-window out to recalibrate at the original context, or fine-tune the other "
            "methods in longer windows in a study without drope",
        )
    if window is not None and window > targets[0]:
        fail("finetune_window", window, f"at most the shortest target context, {targets[0]} (factor x original)")
    sampled = [p for p in cfg.finetune_positions if p != "plain"]
    if sampled and window is not None and window == targets[0]:
        fail(
            "finetune_window",
            window,
            f"a window shorter than the target {targets[0]}: {sampled[0]} positions spread a window over a longer "
            "target (at the target itself they are plain positions)",
        )
    if sampled and target.kind != "lab":
        from posenc.lab.extend.settings import composed

        remapped = [m for m in methods if composed.remapping(m) is not None]
        if remapped:
            fail(
                "finetune_positions",
                list(cfg.finetune_positions),
                f"'plain' for remapping methods ({', '.join(remapped)}): their attention reads the cached keys at "
                "contiguous positions, so skipped or random positions would be misread",
            )
    need = cfg.finetune_window_for(targets[-1]) + 1
    if target.train_tokens < need:
        name, value = ("finetune_corpus", cfg.finetune_corpus) if cfg.finetune_corpus else ("corpus", cfg.corpus)
        fail(
            name,
            value,
            f"a fine-tuning text of at least {need} tokens (one {need - 1}-token window and its next token); "
            f"{target.train_tokens} given",
        )


# ---------------------------------------------------------------------------------------------------------------------
# Memory and compute


#: How fast a whole forward runs relative to ``probe_seconds_per_unit``'s matrix products (FLOPs per second of the
#: model's ``2 * params`` per token-equivalent over the probe's). Measured: SmolLM2-135M, bfloat16, 2-core AMD EPYC
#: (AVX512-BF16), torch 2.13.0, idle machine, 2026-11-26: a 16,384-token forward took 88.9 s (1.75 ms per
#: token-equivalent) while the probe ran at ~405 GFLOP/s (396-421 in three probes): 2 * 134.5e6 / (1.75e-3 * 405e9).
#: Attention dominates that forward (80% of its CPU time, ``torch.profiler``); shorter ones run nearer the probe.
PROBE_EFFICIENCY = 0.38


def probe_seconds_per_unit(dims: ModelDims, dtype: torch.dtype, device: str, seconds: float = 0.25) -> float:
    """Seconds per ``forward_cost`` unit on this machine, estimated before any weight is loaded: the speed of the
    model's own MLP matrix product (512 tokens x hidden x intermediate, in ``dtype`` on ``device``) for about
    ``seconds``, scaled by ``PROBE_EFFICIENCY``. Rough (elementwise work, attention and the machine's other load are
    not in it); a study refines it after loading (``calibrate``)."""
    tokens = 512
    a = torch.randn(tokens, dims.hidden, dtype=dtype, device=device)
    b = torch.randn(dims.hidden, dims.intermediate, dtype=dtype, device=device)
    a @ b  # warm-up
    _sync_device(device)
    runs, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or runs < 3:
        a @ b
        runs += 1
        if runs % 8 == 0:
            _sync_device(device)
    _sync_device(device)
    elapsed = time.perf_counter() - start
    rate = 2.0 * tokens * dims.hidden * dims.intermediate * runs / elapsed  # FLOP/s
    return 2.0 * dims.params / (rate * PROBE_EFFICIENCY)


def _sync_device(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))


def memory_needed(dims: ModelDims, length: int, *, weight_bytes: int, act_bytes: int) -> dict[str, float]:
    """A conservative estimate (bytes) of a study's peak at ``length`` tokens: the weights twice (the model and its
    patched copy), one layer's activations (inference mode keeps no others; attention through SDPA, no (S, S)
    scores), the head's logits chunk, the passkey decode's KV cache, and the (S, S) mask of sliding-window layers.
    Measured for SmolLM2-135M at 12288 tokens, float32: 1.48 GiB peak for one model; this gives 2.9 GiB for two."""
    parts = {
        "weights": 2.0 * dims.params * weight_bytes,
        "activations": float(length)
        * (8 * dims.hidden + 4 * dims.intermediate + 4 * dims.heads * dims.head_dim)
        * act_bytes,
        "logits": 3.0 * min(length, HEAD_CHUNK) * dims.vocab * 4,
        "kv_cache": 2.0 * dims.layers * length * dims.kv_heads * dims.head_dim * act_bytes,
        "mask": float(length) ** 2 if dims.masked else 0.0,
        "slack": 0.25 * _GIB,
    }
    parts["total"] = sum(parts.values())
    return parts


def available_memory(device: str) -> int | None:
    """Free bytes on ``device``: CUDA's free memory, or the host's ``MemAvailable``; None where unknown."""
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_memory(target: PretrainedTarget, length: int, device: str) -> None:
    need = memory_needed(target.dims, length, weight_bytes=target.weight_bytes, act_bytes=target.act_bytes)
    _check_fits(need, device, "lengths", length, f"a longest length that fits in memory: {target.name} at {length} "
                "tokens", "lower --lengths")


def _check_fits(need: dict[str, float], device: str, name: str, value: object, what: str, advice: str) -> None:
    """Refuse ``name=value`` when the estimate ``need`` (parts and their ``total``, bytes) exceeds free memory."""
    free = available_memory(device)
    if free is None or need["total"] <= free:
        return
    parts = ", ".join(f"{k} {v / _GIB:.2f}" for k, v in need.items() if k != "total" and v)
    fail(name, value, f"{what} needs about {need['total'] / _GIB:.1f} GiB ({parts} GiB) and {free / _GIB:.1f} GiB is "
         f"free on {device}; {advice}")


def finetune_memory_needed(dims: ModelDims, window: int, *, weight_bytes: int) -> dict[str, float]:
    """A conservative estimate (bytes) of a fine-tune's peak in ``window``-token windows, one sequence per step:
    the weights three times (the loaded model, the patched copy, its gradients), AdamW's two moments, every layer's
    activations kept for the backward (float32), and the logits with their gradient."""
    per_token_layer = 16 * dims.hidden + 6 * dims.intermediate + 6 * dims.heads * dims.head_dim
    parts = {
        "weights_and_grads": 3.0 * dims.params * weight_bytes,
        "adam": 2.0 * dims.params * 4,
        "activations": float(window) * dims.layers * per_token_layer * 4,
        "logits": 3.0 * window * dims.vocab * 4,
        "mask": float(window) ** 2 if dims.masked else 0.0,
        "slack": 0.5 * _GIB,
    }
    parts["total"] = sum(parts.values())
    return parts


def check_finetune_memory(target: Target, window: int, device: str) -> None:
    if target.kind == "lab":
        return
    pretrained = as_pretrained(target)
    need = finetune_memory_needed(pretrained.dims, window, weight_bytes=pretrained.weight_bytes)
    _check_fits(need, device, "finetune_window", window, f"a fine-tuning window that fits in memory: {target.name} "
                f"fine-tuned on {window}-token windows", "pass a smaller --finetune-window")


def duration_text(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


# ---------------------------------------------------------------------------------------------------------------------
# Progress across the whole study


class StudyProgress:
    """One ETA for the whole study, shown by a rich bar per model (fine-tuning runs print their own bars between).

    Work is counted in ``forward_cost`` units; the ETA is the remaining work times the seconds per unit measured so
    far (before the first forward: the calibration's, if any), counting down between forwards.
    """

    def __init__(self, enabled: bool, total: float, forwards: int, seconds_per_unit: float | None = None) -> None:
        self.enabled, self.total, self.forwards = enabled, float(total), forwards
        self.seconds_per_unit = seconds_per_unit
        self.done, self.forwards_done, self.spent = 0.0, 0, 0.0
        self._last: float | None = None

    def eta(self) -> float | None:
        rate = self.spent / self.done if self.done > 0 else self.seconds_per_unit
        if rate is None:
            return None
        since = time.perf_counter() - self._last if self._last is not None else 0.0
        return max(0.0, (self.total - self.done) * rate - since)

    def status(self) -> str:
        eta = self.eta()
        left = "" if eta is None else f" ETA {duration_text(eta)}"
        return f"{self.forwards_done}/{self.forwards} forwards{left}"

    @contextlib.contextmanager
    def bar(self, description: str) -> Iterator[Callable[..., None]]:
        """A bar for one model; yields ``tick(cost, forwards=1)``, called after each forward."""
        self._last = time.perf_counter()
        redraw: list[Callable[[], None]] = []

        def tick(cost: float, forwards: int = 1) -> None:
            now = time.perf_counter()
            assert self._last is not None  # set while a bar is open
            self.spent += now - self._last
            self._last = now
            self.done += cost
            self.forwards_done += forwards
            for draw in redraw:
                draw()

        try:
            if not self.enabled:
                yield tick
                return
            from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
            from rich.text import Text

            study = self

            class Status(ProgressColumn):  # rendered at every refresh: the ETA counts down during a forward
                def render(self, task: Any) -> Text:
                    return Text(study.status())

            columns = (TextColumn("[bold]{task.description}"), BarColumn(), TimeElapsedColumn(), Status())
            with Progress(*columns, refresh_per_second=2) as progress:
                # rich's hint says int; a task's progress is a float (rich.progress.Task.completed)
                task = progress.add_task(description, total=self.total, completed=self.done)  # type: ignore[arg-type]
                redraw.append(lambda: progress.update(task, completed=self.done))
                yield tick
        finally:
            self._last = None
