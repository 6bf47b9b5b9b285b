"""``--pick``'s plan: the candidates, the three stages' settings, the cap and the time estimate (``PickPlan``), all
decided before any weight is loaded (the speed: a matrix-multiply probe, then the model's own timed forwards)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from posenc._checks import fail
from posenc.lab.extend.pick import racing, rules
from posenc.lab.extend.settings import composed
from posenc.lab.extend.settings.config import STOP_WIDTH, ExtendConfig
from posenc.lab.extend.stats.rates import RULER_PREFIX
from posenc.lab.extend.study import plan
from posenc.lab.extend.targets.base import PretrainedTarget

#: Where a fine-tuned candidate comes from: PoSE's paper fine-tunes a YaRN (or PI) model; here YaRN at T.
FINETUNED_METHOD = "yarn"


@dataclasses.dataclass(frozen=True)
class PickPlan:
    """Everything decided before any weight is loaded."""

    target: int
    screen: int
    candidates: list[rules.Candidate]
    left_out: dict[str, str]
    depths: tuple[float, ...]
    tuned: list[tuple]
    cap: int
    seconds_per_unit: float
    screen_seconds: float
    final_seconds: float  # at most: every raced model to the cap
    finetune_seconds: float
    budget: float | None
    calibrated: bool = False  # seconds_per_unit from the model's own timed forwards (else the probe)
    remap_cost: float = rules.REMAP_COST  # a remapping candidate's time per sample over a frequency method's
    remap_measured: str = ""  # how remap_cost was measured ("" : the constant, not measured)
    race_seconds: float = 0.0  # about: the race on a tie (``racing.tied_race``), the plan's expectation

    @property
    def most_seconds(self) -> float:
        """The whole pick at most: screening, fine-tuning and every raced model to the cap."""
        return self.screen_seconds + self.finetune_seconds + self.final_seconds

    @property
    def about_seconds(self) -> float:
        """The whole pick as the plan expects it: screening (every candidate to its cap, as when they tie),
        fine-tuning and the race on a tie (``racing.tied_race``)."""
        return self.screen_seconds + self.finetune_seconds + self.race_seconds

    def settings(self) -> dict[str, Any]:
        return {
            "target": self.target, "screen": self.screen, "depths": list(self.depths),
            "candidates": [[c.method, c.factor] for c in self.candidates], "tuned": [list(u) for u in self.tuned],
        }


#: The pick's three studies, in the order they run (``stage_configs``).
STAGES = ("screen-ppl", "screen-passkey", "final")


#: The race's default passkey depth: one cell (RULER's needle tasks place their needles at many depths themselves).
DEPTHS = (0.5,)


def make_plan(
    cfg: ExtendConfig,
    target: PretrainedTarget,
    target_length: str | int,
    *,
    device: str,
    budget: float | None,
    save: str | Path | None,
    save_type: str,
    out: Path,
    stored: list | None = None,
) -> PickPlan:
    """The candidates, the lengths, the cap and an upper bound of the time, from the model's config alone (the
    speed: a matrix-multiply probe until ``calibrated`` times the model itself). ``stored``: the candidates of the
    pick being resumed (a ``--save`` added on resume then chooses among those it can write)."""
    original = target.original_len
    length = rules.parse_target(target_length, original)
    why_not = savable(target, save, save_type, cfg, out, length) if save is not None else None
    candidates, left_out = rules.candidates(
        original, length, model_type=target.model_type, remapping=target.model_type in rules.remapping_model_types(),
        methods=cfg.methods, savable=why_not if stored is None else None,
    )
    if stored is not None:
        kept = {(str(m), float(f)) for m, f in stored}
        candidates = [c for c in candidates if (c.method, c.factor) in kept]
    for c in list(candidates):  # a method this model cannot take (ALiBi: linear only) is left out, saying why
        try:
            target.check_patch(c.method, c.factor)
        except ValueError as err:
            candidates.remove(c)
            left_out[c.method] = str(err)
    if not candidates:
        fail("methods", list(cfg.methods or ()), f"a method this model takes; left out: {left_out}")
    screen = rules.screen_length(original, length)
    if screen < target.min_passkey:
        fail("target", target_length, f"a target whose screening length ({screen}) fits a passkey prompt "
             f"({target.min_passkey} tokens)")
    depths = tuple(cfg.depths) if cfg.depths is not None else DEPTHS
    factor = length / original
    tuned = (
        [(FINETUNED_METHOD, factor, cfg.finetune_steps, p) for p in cfg.finetune_positions]
        if cfg.finetune_steps
        else []
    )
    cap = cfg.trials or cfg.ruler_samples or rules.DEFAULT_CAP
    spu = plan.probe_seconds_per_unit(target.dims, target.dtype, device)
    return estimate(PickPlan(length, screen, candidates, left_out, depths, tuned, cap, spu, 0.0, 0.0, 0.0, budget),
                    target, cfg)


def estimate(pick_plan: PickPlan, target: PretrainedTarget, cfg: ExtendConfig) -> PickPlan:
    """The plan's time at ``pick_plan.seconds_per_unit``: screening's perplexity for every candidate and its passkeys
    to ``SCREEN_CAP`` for all of them (as when they tie); the race at most with the ``KEEP`` most expensive
    candidates, the unpatched model and the fine-tuned ones each to the cap in every cell (``final_seconds``), and
    about as LUCB samples a tie (``race_seconds``: ``racing.tied_race`` for ``KEEP`` candidates at their mean cost and
    the fine-tuned ones; every model to the cap with ``--stop-width 0``). Each raced model also gets one perplexity
    forward at the target. On the idle 2-core Xeon the 16k pick took 0.55x its "at most" and, from that run's plan
    inputs, 0.83x its "about" (experiments/picking-a-method/README.md)."""
    spu = pick_plan.seconds_per_unit
    cost_t, cost_s = target.forward_cost(pick_plan.target), target.forward_cost(pick_plan.screen)
    weights = sorted((rules.cost_factor(c.method, pick_plan.remap_cost) for c in pick_plan.candidates), reverse=True)
    screen_seconds = (1 + sum(weights)) * (cost_t + len(pick_plan.depths) * racing.SCREEN_CAP * cost_s) * spu
    window = cfg.finetune_window_for(pick_plan.target)
    finetune_seconds = len(pick_plan.tuned) * cfg.finetune_steps * 3 * target.forward_cost(window) * spu
    cells = len(pick_plan.depths) + (len(ruler_tasks(cfg)) if cfg.task == "ruler" else 0)
    models = 1 + sum(weights[: racing.KEEP]) + len(pick_plan.tuned)  # in plain-forward units
    final_seconds = models * (1 + cells * pick_plan.cap) * cost_t * spu
    race_seconds = final_seconds
    if cfg.adaptive:
        keep = min(racing.KEEP, len(weights))
        raced = keep + len(pick_plan.tuned)
        mean = (sum(weights) / max(1, len(weights)) * keep + len(pick_plan.tuned)) / max(1, raced)
        n = racing.tied_race(raced, cells, pick_plan.cap).to(torch.float64)
        race_seconds = float((1 + cells * n[0]) + mean * (1 + cells * n[1:]).sum()) * cost_t * spu
    return dataclasses.replace(pick_plan, screen_seconds=screen_seconds, final_seconds=final_seconds,
                               finetune_seconds=finetune_seconds, race_seconds=race_seconds)


#: ``--pick --plan`` loads a model to time its forwards only up to this many bytes of weights (in the dtype it runs
#: in); a bigger one keeps the probe's estimate, so the plan stays a matter of a minute or so.
LOAD_FOR_PLAN_BYTES = 4 * 2**30


def calibrated(
    pick_plan: PickPlan, target: PretrainedTarget, plan_only: bool, report: Callable[[str], None] | None = None
) -> PickPlan:
    """The plan's estimate from the model's own speed: its weights loaded, forwards of up to 1024, 4096 and 8192
    tokens timed (``HFTarget.calibrate``: the linear and quadratic parts of a forward's cost on this machine) and
    one of a remapping candidate at the longest (``HFTarget.remap_cost``), in place of the probe. For SmolLM2 at
    32,768 tokens that is under a minute on a 2-core CPU; a model too big to load quickly keeps the probe's estimate
    under ``--plan`` (``LOAD_FOR_PLAN_BYTES``). ``report`` gets a line before the weights load and one per timed
    forward (minutes each on a loaded machine)."""
    if plan_only and target.dims.params * target.weight_bytes > LOAD_FOR_PLAN_BYTES:
        return pick_plan
    if report is not None:
        report(f"Loading {target.name} ({target.dims.params * target.weight_bytes / 2**20:,.0f} MiB of weights) to "
               "time its forwards on this machine for the estimate")
    target.load()
    spu = target.calibrate([pick_plan.target], report=report)[0]
    pick_plan = dataclasses.replace(pick_plan, seconds_per_unit=spu, calibrated=True)
    remaps = [c for c in pick_plan.candidates if rules.is_remapping(c.method)]
    if remaps and hasattr(target, "remap_cost"):  # one remapping forward timed against the plain one
        first = next((c for c in remaps if c.method == "self_extend"), remaps[0])
        measured = target.remap_cost(first.method, first.factor, pick_plan.target, report=report)
        if measured is not None:
            ratio, how = measured
            pick_plan = dataclasses.replace(pick_plan, remap_cost=ratio, remap_measured=how)
    return estimate(pick_plan, target, target.cfg)


def savable(
    target: PretrainedTarget, save: str | Path, save_type: str, cfg: ExtendConfig, out: Path, length: int
) -> Callable[[str], str | None]:
    """``--save``'s path checked now (with a method it takes), and the rule that leaves out what it cannot carry."""
    from posenc.deploy.formats import GGUF_METHODS
    from posenc.hf.save import remap_save_problem
    from posenc.lab.extend.study.run import check_save

    gguf = Path(save).suffix.lower() == ".gguf"
    probe = dataclasses.replace(cfg, methods=("yarn",), factors=(length / target.original_len,), finetune_steps=0)
    check_save(save, probe, target, out, save_type)  # the path, the source and the folder, before anything runs

    def why(method: str) -> str | None:
        if gguf:
            return None if method in GGUF_METHODS else "llama.cpp runs no GGUF key for it (--save FILE.gguf)"
        if (remap := composed.remapping(method)) is not None:
            return remap_save_problem(target.model_type, remap)
        return None

    return why


def stage_configs(cfg: ExtendConfig, pick_plan: PickPlan, cap: int) -> tuple[ExtendConfig, ...]:
    """The settings of the three studies: screening's perplexity at T, screening's passkeys at the shorter length
    (rounds to ``racing.SCREEN_CAP`` per depth) and the race at T (rounds to ``cap`` per cell; with the user's
    ``stop_width`` 0 the race's replay takes every raced model to the cap)."""
    methods = tuple(dict.fromkeys(c.method for c in pick_plan.candidates))
    factors = tuple(sorted({c.factor for c in pick_plan.candidates}))
    common: dict[str, Any] = dict(
        methods=methods, factors=factors, depths=pick_plan.depths, eval_tokens=pick_plan.target, out=None
    )
    zero_shot: dict[str, Any] = dict(
        task="lm", finetune_steps=0, finetune_positions=("plain",), finetune_window=None, finetune_lr=None,
        finetune_corpus=None, ruler_tasks=None, ruler_samples=None,
    )
    ppl = dataclasses.replace(cfg, **common, **zero_shot, lengths=(pick_plan.target,), trials=1, stop_width=0.0)
    keys = dataclasses.replace(cfg, **common, **zero_shot, lengths=(pick_plan.screen,), trials=racing.SCREEN_CAP,
                               stop_width=STOP_WIDTH)
    if pick_plan.tuned and FINETUNED_METHOD not in methods:
        common["methods"] = (*methods, FINETUNED_METHOD)
    final = dataclasses.replace(cfg, **common, lengths=(pick_plan.target,), trials=cap,
                                ruler_samples=cap if cfg.task == "ruler" else None,
                                stop_width=STOP_WIDTH)  # rounds, needles kept one by one
    return ppl, keys, final


def screening_cells(pick_plan: PickPlan) -> list[tuple]:
    return [("passkey", pick_plan.screen, d) for d in pick_plan.depths]


def final_measurements(cfg: ExtendConfig, pick_plan: PickPlan) -> list[tuple]:
    ruler = [(RULER_PREFIX + t, pick_plan.target, None) for t in ruler_tasks(cfg)] if cfg.task == "ruler" else []
    return [("ppl", pick_plan.target, None)] + [("passkey", pick_plan.target, d) for d in pick_plan.depths] + ruler


def ruler_tasks(cfg: ExtendConfig) -> tuple[str, ...]:
    from posenc.lab.extend.needles.ruler import DEFAULT_TASKS

    return tuple(cfg.ruler_tasks or DEFAULT_TASKS)
