"""``posenc extend MODEL --target T --pick``: screen every candidate method, race the contenders at T, name the pick
-- and say how sure that is.

One folder (``--out``) holds the whole pick and resumes like every study (``--resume``; Ctrl-C or SIGTERM keeps each
finished measurement and rewrites ``pick.md`` and the stages' reports from them, saying so; every decision is replayed
from the stored needles, so a resumed pick takes the same rounds):

    pick.json       the settings and the candidates (checked on resume)
    screen-ppl/     a ``posenc extend`` study: every candidate and the unpatched model, perplexity at T
    screen-passkey/ a ``posenc extend`` study: the candidates whose perplexity is not broken (``rules.broken``) and the
                    unpatched model, passkeys at a shorter length (``rules.screen_length``) in rounds, each round for
                    the candidates in the 98% credible set of the best (``posenc.lab.extend.pick.racing``)
    final/          a ``posenc extend`` study: the credible set, the unpatched model and, with ``finetune_steps``, a
                    fine-tuned YaRN at T: perplexity at T and needle cells at T raced in rounds -- paired on the same
                    needles, a model dropped once another is better beyond noise (``posenc.lab.extend.stats.race``)
    pick.md         the rule, the pick and how sure (its posterior chance of being the best, the expected loss, what
                    each cheaper method would cost in rate), the ranked table with anytime-valid intervals, screening,
                    and the commands that run it elsewhere

``--budget`` is a deadline for this invocation: when it passes, sampling stops and the pick is made from what was
measured (a resume continues); a round cut there or by an interrupt counts in the standings with every needle it
measured (the intervals are anytime-valid). The plan's estimates (*about*, as a tie races; *at most*, every
contender to the cap) come from timed forwards of the model itself and of a remapping candidate
(``targets.hf.HFTarget.calibrate``, ``remap_cost``); they never refuse a budget.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from posenc._checks import fail
from posenc._devices import resolve_device
from posenc.lab.common.files import write_text_atomic
from posenc.lab.common.runfiles import check_out, check_settings
from posenc.lab.extend.needles.shared_prefix import LENGTH_DEPENDENT_REMAP
from posenc.lab.extend.pick import ledger, racing, rules
from posenc.lab.extend.stats import confidence, race, sampling
from posenc.lab.extend.stats import rates as rates_mod
from posenc.lab.extend.stats.rates import RULER_PREFIX, UNPATCHED, model_of
from posenc.lab.extend.study import plan
from posenc.lab.extend.study.config import STOP_WIDTH, ExtendConfig, drops
from posenc.lab.extend.study.report import LENGTH_DEPENDENT, label
from posenc.lab.extend.targets import composed
from posenc.lab.extend.targets.load import load_target

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
        }  # fmt: skip


def run_pick(
    cfg: ExtendConfig,
    target: str | int,
    out: str | Path,
    *,
    budget: str | float | None = None,
    resume: bool = False,
    progress: bool = True,
    save: str | Path | None = None,
    save_type: str = "source",
    plan_only: bool = False,
) -> dict[str, Any]:
    """Pick the method that makes ``cfg.model`` work at ``target`` tokens (or ``"4x"``, ``"32k"``); returns the
    outcome.

    ``cfg``: the model and the study settings that apply to every stage (``corpus``, ``depths`` -- default 0.5 --,
    ``task`` -- ``ruler`` adds ``ruler_tasks`` at T --, ``finetune_*`` to add a fine-tuned YaRN, ``dtype``,
    ``device``, ``seed``); ``methods`` limits the candidates; ``trials`` (or ``ruler_samples``) is the race's cap,
    needles per cell (default ``rules.DEFAULT_CAP``); ``stop_width`` 0 samples every raced model to the cap (a fixed
    design) instead of racing; ``lengths`` / ``factors`` are set by the pick and refused. ``budget``: seconds or a
    duration (``"1h30"``): a deadline for this invocation, after which sampling stops and the pick is made from what
    was measured. ``save``: a new folder (or ``.gguf`` file) the pick is written to; with it only candidates that
    format can carry compete. ``plan_only``: print the plan and its estimate, write nothing.

    Returns a dict: ``pick`` (its label), ``unit``, ``reason``, ``shown``, ``ended``, ``standings`` (rows of the
    ranked table), ``saved`` (the path or None), ``plan`` (``PickPlan``).

    Raises:
        ValueError: bad settings (a target not beyond the original context or past the held-out text, a lab model,
            settings the pick sets itself), a folder that holds something else, or a ``--resume`` with other settings
            -- all before any weight is loaded.
    """
    start = time.perf_counter()
    out = Path(out)
    for name in ("lengths", "factors"):
        if getattr(cfg, name) is not None:
            fail(name, getattr(cfg, name), f"left out with --pick (it sets {name} itself from --target)")
    for method in cfg.methods or ():
        if drops(method):
            fail("methods", method, "a method --pick races at the target's factor: DroPE has no factor and is only "
                 "DroPE once recalibrated; measure it with posenc extend MODEL --methods drope --finetune-steps N",
                 )  # fmt: skip
    if cfg.trials is not None and cfg.ruler_samples is not None and cfg.trials != cfg.ruler_samples:
        fail("ruler_samples", cfg.ruler_samples, f"left out or equal to --trials ({cfg.trials}): a raced model's "
             "cells advance together, one cap for all")  # fmt: skip
    seconds = rules.parse_budget(budget)
    deadline = racing.Deadline.after(seconds)
    before = check_out(out, "pick")
    device = resolve_device(cfg.device, allow_auto=True)
    if cfg.task == "ruler":
        from posenc.lab.extend.needles.ruler import require

        require()  # lm-eval missing: the pip command now, not after screening
    model = load_target(cfg, out / "final", device=device, progress=progress)  # config and tokenizer only
    if model.kind == "lab":
        fail("model", cfg.model, "a pretrained model for --pick (a lab model cannot follow a passkey prompt)")
    stored = (before or {}) if resume else {}  # a resumed pick keeps its candidates
    decided = make_plan(cfg, model, target, device=device, budget=seconds, save=save, save_type=save_type, out=out,
                        stored=stored.get("candidates"))  # fmt: skip
    settings = {k: v for k, v in cfg.to_dict().items() if k != "out"}
    settings.update(decided.settings())
    stages = stage_configs(cfg, decided, decided.cap)
    resolved = [plan.resolve(stage, kind=model.kind, original=model.original_len,
                             default_methods=model.default_methods, device=device) for stage in stages]  # fmt: skip
    model.use(resolved[-1])  # the corpus once: every stage reads the same text; the race's adds its fine-tuning text
    if model.heldout_tokens < decided.target + 1:
        fail("target", target, f"a length the held-out text can fill: {model.corpus_name} gives "
             f"{model.heldout_tokens} held-out tokens, so at most {model.heldout_tokens - 1}; a lower --target or a "
             "bigger --corpus")  # fmt: skip
    for stage in resolved:  # every stage's settings against the model and the machine, before anything is written
        plan.check(stage, model, device=device)
    if plan_only or progress:  # the candidates at once, a line per timed forward, then the stages and the estimate
        print(candidates_text(decided, model), flush=True)
        decided = _calibrated(decided, model, plan_only, report=_say)
        print(stages_text(decided, cfg))
    if plan_only and resume and before:
        print(left_text(out, decided, model))
    if plan_only:
        return {"plan": decided}
    check_settings(out, {**settings, "cap": decided.cap}, resume, command="pick", what="pick")
    calibrated = decided.calibrated  # a probe's plan is not claimed as this run's
    with ledger.timed(out, plan_seconds=decided.most_seconds if calibrated else None,
                      plan_about_seconds=decided.about_seconds if calibrated else None,
                      start=start) as entry:  # fmt: skip
        result = _measure_and_pick(cfg, model, decided, stages, out, deadline, start, save=save,
                                   save_type=save_type, device=device, progress=progress)  # fmt: skip
        # picked: decided (the race settled), cap or deadline (the best estimate then; a --resume races on);
        # deadline: it came before a pick could be made
        entry["ended"] = "deadline" if result["pick"] is None else f"picked: {result['ended']}"
    return result


def _measure_and_pick(cfg: ExtendConfig, model: Any, decided: PickPlan, stages: Sequence[ExtendConfig], out: Path,
                      deadline: racing.Deadline, start: float, *, save: str | Path | None, save_type: str,
                      device: str, progress: bool) -> dict[str, Any]:  # fmt: skip
    """The stages, in order (each resumable), then the decision, the save and ``pick.md`` (``_conclude``), whose time
    line gives this run's seconds since ``start`` (``time.perf_counter()``) beside the earlier runs' in
    ``runs.jsonl`` (``ledger``). Ctrl-C or SIGTERM while measuring: the stages' reports and ``pick.md`` are rewritten
    from everything measured, saying the run was interrupted (nothing is saved), and the interrupt goes on."""
    made = {name: _rows(out, name) for name in STAGES}  # what each stage held before this run
    try:
        _measure(cfg, model, decided, stages, out, deadline, progress)
    except KeyboardInterrupt:
        try:
            _rewrite_stage_reports(stages, model, out, made, time.perf_counter() - start, device)
            _conclude(cfg, stages[2], model, decided, out, start, interrupted=True, save=None, save_type=save_type,
                      device=device, progress=progress)  # fmt: skip
        except Exception as err:  # the interrupt comes first; a report that could not be written is said, not raised
            print(f"posenc: the reports in {out} were not rewritten after the interrupt ({type(err).__name__}: {err})",
                  file=sys.stderr)  # fmt: skip
        raise
    return _conclude(cfg, stages[2], model, decided, out, start, interrupted=False, save=save, save_type=save_type,
                     device=device, progress=progress)  # fmt: skip


#: The pick's three studies, in the order they run (``stage_configs``).
STAGES = ("screen-ppl", "screen-passkey", "final")


def _rows(out: Path, stage: str) -> list[dict]:
    from posenc.lab.extend.study.run import read_results

    path = out / stage / "results.csv"
    return read_results(path) if path.is_file() else []


def _measure(cfg: ExtendConfig, model: Any, decided: PickPlan, stages: Sequence[ExtendConfig], out: Path,
             deadline: racing.Deadline, progress: bool) -> None:  # fmt: skip
    """Run the stages as far as the deadline lets them (each study resumes where it stands)."""
    from posenc.lab.extend.study.run import run_extend

    ppl_cfg, keys_cfg, final_cfg = stages
    units = [c.unit for c in decided.candidates]
    ppl_rows = run_extend(ppl_cfg, out / "screen-ppl", resume=True, progress=progress, units=units,
                          measurements=[("ppl", decided.target, None)], stop=deadline.passed)  # fmt: skip
    if not {UNPATCHED, *units} <= _ppl_measured(ppl_rows, decided.target):  # the deadline came first
        return
    whole = [u for u in units if u not in rules.broken(ppl_rows, units, target=decided.target)]
    run_extend(keys_cfg, out / "screen-passkey", resume=True, progress=progress, units=whole,
               measurements=_screening_cells(decided),
               more_rounds=racing.policy(racing.replay_screen, racing.SCREEN_CAP, deadline),
               stop=deadline.passed)  # fmt: skip
    screen = _screened(out, decided)
    if screen is None:  # the deadline came first: screening is not over
        return
    raced = screen[1]
    if progress:
        print(f"Screening: {', '.join(label(*u) for u in raced) or 'nothing'} go on to {decided.target} tokens")
    if not raced:
        why = "; ".join(f"{label(*v.unit)}: {v.why}" for v in screen[0])
        fail("methods", [c.method for c in decided.candidates], "a candidate that keeps perplexity and finds keys at "
             f"{decided.screen} tokens: none does; {why}")  # fmt: skip
    final_units = [UNPATCHED, *raced]
    replay = _race_replay(final_units, model.model_type, fixed=not cfg.adaptive)
    run_extend(final_cfg, out / "final", resume=True, progress=progress, units=raced,
               measurements=_final_measurements(final_cfg, decided),
               more_rounds=racing.policy(replay, decided.cap, deadline), stop=deadline.passed)  # fmt: skip


def _screening_cells(decided: PickPlan) -> list[tuple]:
    return [("passkey", decided.screen, d) for d in decided.depths]


def _screened(out: Path, decided: PickPlan) -> tuple[list[rules.Screened], list[tuple]] | None:
    """Screening from its stored rows and needles: (each candidate's verdict, the models that go on to the race --
    the credible set and the fine-tuned ones); None while screening is not over (perplexity or passkey rounds left)."""
    from posenc.lab.extend.study.run import read_samples

    units = [c.unit for c in decided.candidates]
    ppl_rows = _rows(out, "screen-ppl")
    if not {UNPATCHED, *units} <= _ppl_measured(ppl_rows, decided.target):
        return None
    broken = rules.broken(ppl_rows, units, target=decided.target)
    screening = _screening_cells(decided)
    field = racing.Field([UNPATCHED, *(u for u in units if u not in broken)], screening, racing.SCREEN_CAP)
    screen_scores, screen_counts = racing.needles(field, read_samples(out / "screen-passkey" / "samples.csv"))
    screen_look = racing.replay_screen(field, screen_scores, screen_counts)
    if screen_look.wanted:
        return None
    kept_mask, n_screen = screen_look.look, screen_look.n
    hits = torch.stack([screen_scores[0, i, :, : n_screen[i]].sum() / len(screening) for i in range(len(field.units))])
    p_best, _ = confidence.probability_best(hits, n_screen.to(torch.float64))
    kept = [u for u, k in zip(field.units, kept_mask.tolist(), strict=True) if k and u != UNPATCHED]
    screen_rows = ppl_rows + [r for r in _rows(out, "screen-passkey") if r["metric"] == "passkey"]
    chances = dict(zip(field.units, p_best.tolist(), strict=True))
    verdicts = rules.screened(screen_rows, [UNPATCHED, *units], target=decided.target, screen=decided.screen,
                              broken_units=broken, kept=kept, p_best=chances, keep=racing.KEEP)  # fmt: skip
    return verdicts, kept + decided.tuned


def _conclude(cfg: ExtendConfig, final_cfg: ExtendConfig, model: Any, decided: PickPlan, out: Path, start: float, *,
              interrupted: bool, save: str | Path | None, save_type: str, device: str,
              progress: bool) -> dict[str, Any]:  # fmt: skip
    """The pick from what the folder holds (nothing is measured here): the race (``final_cfg``, the last of
    ``stage_configs``) replayed from its stored needles, then the standings from every needle measured (a round cut
    by the deadline or an interrupt counts too: the intervals are anytime-valid), the decision, the save (``save``)
    and ``pick.md``."""
    from posenc.lab.extend.study.run import read_samples

    screen = _screened(out, decided)
    if screen is None:
        return _unfinished(out, "screening", progress, interrupted)
    verdicts, raced = screen
    final_units = [UNPATCHED, *raced]
    measurements = _final_measurements(final_cfg, decided)
    field = racing.Field.of(final_units, measurements, decided.cap)
    scores, per_cell = racing.stored(field, read_samples(out / "final" / "samples.csv"))
    counts = racing.together(field, per_cell)
    look = _race_replay(final_units, model.model_type, fixed=not cfg.adaptive)(field, scores, counts)
    if look.look is None:  # before every raced model's first round
        return _unfinished(out, "the race's first round", progress, interrupted)
    cut = "interrupted" if interrupted else "deadline"  # how a race that is not over ended
    ended = "decided" if bool(look.look.stop[0]) else cut if look.wanted else "cap"
    if bool((counts > look.n).any()):  # a round under way: the last look at every needle measured
        tier, reference = _tiers(final_units, model.model_type)
        look = racing.Replay(counts, look.wanted, race.verdict(scores, counts[None], look.look.active, tier,
                                                               reference))  # fmt: skip
    final_rows = _rows(out, "final")
    ranked = standings(final_rows, field, look, scores, per_cell, model.model_type, decided.target)
    why_not = _savable(model, save, save_type, cfg, out, decided.target) if save is not None else None
    outcome = rules.decide(ranked, look.look, final_units, lambda u: label(*u), ended=ended, savable=why_not)
    saved = _save(final_cfg, out, outcome.pick.unit, save, save_type, device, progress) if save else None
    took = ledger.total_text(ledger.read(out), time.perf_counter() - start)
    text = report(cfg, model, decided, decided.cap, verdicts, ranked, outcome, saved, took)
    write_text_atomic(out / "pick.md", text)
    if progress:
        print(summary(ranked, outcome, saved))
        if interrupted:
            print(f"Interrupted: {out / 'pick.md'} and the stages' reports rewritten from what was measured")
    return {
        "pick": label(*outcome.pick.unit), "unit": outcome.pick.unit, "reason": outcome.reason, "saved": saved,
        "shown": outcome.shown, "ended": ended, "standings": [_standing_row(s) for s in ranked], "plan": decided,
        "cap": decided.cap,
    }  # fmt: skip


def _rewrite_stage_reports(stages: Sequence[ExtendConfig], model: Any, out: Path, made: dict[str, list[dict]],
                           seconds: float, device: str) -> None:  # fmt: skip
    """After an interrupt: each stage that measured something this run gets its figures and ``report.md`` again from
    its ``results.csv`` (``study.run.rewrite_report``; nothing loaded), so no report is older than its results."""
    from posenc.lab.extend.study.run import rewrite_report

    for name, stage in zip(STAGES, stages, strict=True):
        rows = _rows(out, name)
        if rows != made[name]:
            rewrite_report(stage, out / name, model, seconds, resumed=len(made[name]), device=device)


def _ppl_measured(rows: Sequence[dict], target: int) -> set[tuple]:
    """The models the perplexity screen has measured at ``target``."""
    return {model_of(r) for r in rows if r["metric"] == "ppl" and r["length"] == target}


def _tiers(units: Sequence[tuple], model_type: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The race's serving tier of each model (cheaper first; the unpatched model last) and which is the reference."""
    tier = torch.tensor([rules.SERVING[rules.serving(u[0], model_type)][0] if u[0] != "none" else 9 for u in units])
    return tier, torch.tensor([u[0] == "none" for u in units])


def _race_replay(units: Sequence[tuple], model_type: str | None, *, fixed: bool) -> Any:
    """The race's replay over ``units`` (the unpatched model first): paired elimination and LUCB rounds, or with
    ``fixed`` every model to the cap (``--stop-width 0``)."""
    tier, reference = _tiers(units, model_type)

    def replay(field: racing.Field, scores: torch.Tensor, counts: torch.Tensor) -> racing.Replay:
        if not fixed:
            return racing.replay_race(field, scores, counts, tier, reference)
        n = counts.clamp(max=field.cap)
        wanted = [i for i in range(len(field.units)) if counts[i] < field.cap]
        if bool((n == 0).any()):  # a model not measured yet (a deadline in the first pass): no look, as replay_race
            return racing.Replay(n, wanted, None)
        full = torch.full((1, len(field.units)), field.cap, dtype=torch.long)
        v = race.verdict(scores, torch.minimum(full, n[None]), torch.ones_like(full, dtype=torch.bool), tier,
                         reference)  # fmt: skip
        return racing.Replay(n, wanted, dataclasses.replace(v, stop=torch.tensor([not wanted]) & v.shown))

    return replay


def _unfinished(out: Path, stage: str, progress: bool, interrupted: bool) -> dict[str, Any]:
    """The run ended (the deadline, or an interrupt) before ``stage`` was over: nothing to pick from yet; the command
    that continues."""
    came = "The run was interrupted (Ctrl-C or SIGTERM)" if interrupted else "The deadline (--budget) came"
    text = (f"# Pick in {out}: not finished\n\n{came} during {stage}; what was measured is kept. "
            "Continue with the same command and `--resume` (and a new --budget).\n")  # fmt: skip
    write_text_atomic(out / "pick.md", text)
    if progress:
        print(f"{'Interrupted' if interrupted else 'Deadline'}: {stage} is not over; continue with --resume")
    return {"pick": None, "ended": "interrupted" if interrupted else "deadline", "stage": stage}


def standings(rows: Sequence[dict], field: racing.Field, look: racing.Replay, scores: torch.Tensor,
              per_cell: torch.Tensor, model_type: str | None, target: int) -> list[rules.Standing]:  # fmt: skip
    """Each raced model at the target from the race's last look, best estimate first: pooled rate with its
    anytime-valid interval (over the look's n needles per cell), each cell's rate from every needle it has
    (``per_cell``, (M, C): a round cut between a model's cells leaves the first ones ahead of its pooled n), whether it
    was still sampled, who beat it, its posterior chance of being the best method and the expected loss of picking
    it."""

    v, n = look.look, look.n
    low, high = race.pooled_interval(scores, n[None])
    methods = torch.tensor([u[0] != "none" for u in field.units])
    pooled_hits = race.pooled(scores, n[None])[0] * n
    p_best = torch.zeros(len(field.units), dtype=torch.float64)
    loss = torch.zeros(len(field.units), dtype=torch.float64)
    p, expected = confidence.probability_best(pooled_hits[methods], n[methods].to(torch.float64))
    p_best[methods], loss[methods] = p, expected
    out = []
    for i, unit in enumerate(field.units):
        by = {}
        for j, (metric, _, depth) in enumerate(field.cells):
            k = int(per_cell[i, j])
            cell = scores[0, i, j, :k]
            key = metric if depth is None else f"{metric} @{depth:g}"
            by[key] = rates_mod.Rate(float(cell.sum()), k, anytime=True)
        beaten = (v.low[0, :, i] > 0).nonzero()
        ppl = next((float(r["ppl"]) for r in rows if model_of(r) == unit and r["metric"] == "ppl_past"
                    and r["length"] == target and r["status"] == "ok"), None)  # fmt: skip
        out.append(rules.Standing(
            unit=unit, estimate=float(v.estimate[0, i]), interval=(float(low[0, i]), float(high[0, i])), n=int(n[i]),
            by_metric=by, ppl_past=ppl, serving=rules.serving(unit[0], model_type), active=bool(v.active[0, i]),
            beaten_by=field.units[int(beaten[0])] if beaten.numel() else None, p_best=float(p_best[i]),
            loss=float(loss[i]),
        ))  # fmt: skip
    return sorted(out, key=lambda s: (-s.estimate, rules.SERVING[s.serving][0]))


#: The race's default passkey depth: one cell (RULER's needle tasks place their needles at many depths themselves).
DEPTHS = (0.5,)


def make_plan(cfg: ExtendConfig, model: Any, target: str | int, *, device: str, budget: float | None,
              save: str | Path | None, save_type: str, out: Path, stored: list | None = None) -> PickPlan:  # fmt: skip
    """The candidates, the lengths, the cap and an upper bound of the time, from the model's config alone (the
    speed: a matrix-multiply probe until ``_calibrated`` times the model itself). ``stored``: the candidates of the
    pick being resumed (a ``--save`` added on resume then chooses among those it can write)."""
    from posenc.hf._remap_patch import REMAP_MODEL_TYPES

    original = model.original_len
    length = rules.parse_target(target, original)
    savable = _savable(model, save, save_type, cfg, out, length) if save is not None else None
    candidates, left_out = rules.candidates(
        original, length, model_type=model.model_type, remapping=model.model_type in REMAP_MODEL_TYPES,
        methods=cfg.methods, savable=savable if stored is None else None,
    )  # fmt: skip
    if stored is not None:
        kept = {(str(m), float(f)) for m, f in stored}
        candidates = [c for c in candidates if (c.method, c.factor) in kept]
    for c in list(candidates):  # a method this model cannot take (ALiBi: linear only) is left out, saying why
        try:
            model.check_patch(c.method, c.factor)
        except ValueError as err:
            candidates.remove(c)
            left_out[c.method] = str(err)
    if not candidates:
        fail("methods", list(cfg.methods or ()), f"a method this model takes; left out: {left_out}")
    screen = rules.screen_length(original, length)
    if screen < model.min_passkey:
        fail("target", target, f"a target whose screening length ({screen}) fits a passkey prompt "
             f"({model.min_passkey} tokens)")  # fmt: skip
    depths = tuple(cfg.depths) if cfg.depths is not None else DEPTHS
    factor = length / original
    tuned = (
        [(FINETUNED_METHOD, factor, cfg.finetune_steps, p) for p in cfg.finetune_positions]
        if cfg.finetune_steps
        else []
    )
    cap = cfg.trials or cfg.ruler_samples or rules.DEFAULT_CAP
    spu = plan.probe_seconds_per_unit(model.dims, model.dtype, device)
    return _estimate(PickPlan(length, screen, candidates, left_out, depths, tuned, cap, spu, 0.0, 0.0, 0.0, budget),
                     model, cfg)  # fmt: skip


def _estimate(decided: PickPlan, model: Any, cfg: ExtendConfig) -> PickPlan:
    """The plan's time at ``decided.seconds_per_unit``: screening's perplexity for every candidate and its passkeys
    to ``SCREEN_CAP`` for all of them (as when they tie); the race at most with the ``KEEP`` most expensive
    candidates, the unpatched model and the fine-tuned ones each to the cap in every cell (``final_seconds``), and
    about as LUCB samples a tie (``race_seconds``: ``racing.tied_race`` for ``KEEP`` candidates at their mean cost and
    the fine-tuned ones; every model to the cap with ``--stop-width 0``). Each raced model also gets one perplexity
    forward at the target. On the idle 2-core Xeon the 16k pick took 0.55x its "at most" and, from that run's plan
    inputs, 0.83x its "about" (experiments/picking-a-method/README.md)."""
    spu = decided.seconds_per_unit
    cost_t, cost_s = model.forward_cost(decided.target), model.forward_cost(decided.screen)
    weights = sorted((rules.cost_factor(c.method, decided.remap_cost) for c in decided.candidates), reverse=True)
    screen_seconds = (1 + sum(weights)) * (cost_t + len(decided.depths) * racing.SCREEN_CAP * cost_s) * spu
    window = cfg.finetune_window or decided.target
    finetune_seconds = len(decided.tuned) * cfg.finetune_steps * 3 * model.forward_cost(window) * spu
    cells = len(decided.depths) + (len(_ruler_tasks(cfg)) if cfg.task == "ruler" else 0)
    models = 1 + sum(weights[: racing.KEEP]) + len(decided.tuned)  # in plain-forward units
    final_seconds = models * (1 + cells * decided.cap) * cost_t * spu
    race_seconds = final_seconds
    if cfg.adaptive:
        keep = min(racing.KEEP, len(weights))
        raced = keep + len(decided.tuned)
        mean = (sum(weights) / max(1, len(weights)) * keep + len(decided.tuned)) / max(1, raced)
        n = racing.tied_race(raced, cells, decided.cap).to(torch.float64)
        race_seconds = float((1 + cells * n[0]) + mean * (1 + cells * n[1:]).sum()) * cost_t * spu
    return dataclasses.replace(decided, screen_seconds=screen_seconds, final_seconds=final_seconds,
                               finetune_seconds=finetune_seconds, race_seconds=race_seconds)  # fmt: skip


#: ``--pick --plan`` loads a model to time its forwards only up to this many bytes of weights (in the dtype it runs
#: in); a bigger one keeps the probe's estimate, so the plan stays a matter of a minute or so.
LOAD_FOR_PLAN_BYTES = 4 * 2**30


def _say(text: str) -> None:
    print(text, flush=True)


def _calibrated(decided: PickPlan, model: Any, plan_only: bool, report: Callable[[str], None] | None = None
                ) -> PickPlan:  # fmt: skip
    """The plan's estimate from the model's own speed: its weights loaded, forwards of up to 1024, 4096 and 8192
    tokens timed (``HFTarget.calibrate``: the linear and quadratic parts of a forward's cost on this machine) and
    one of a remapping candidate at the longest (``HFTarget.remap_cost``), in place of the probe. For SmolLM2 at
    32,768 tokens that is under a minute on a 2-core CPU; a model too big to load quickly keeps the probe's estimate
    under ``--plan`` (``LOAD_FOR_PLAN_BYTES``). ``report`` gets a line before the weights load and one per timed
    forward (minutes each on a loaded machine)."""
    if plan_only and model.dims.params * model.weight_bytes > LOAD_FOR_PLAN_BYTES:
        return decided
    if report is not None:
        report(f"Loading {model.name} ({model.dims.params * model.weight_bytes / 2**20:,.0f} MiB of weights) to time "
               "its forwards on this machine for the estimate")  # fmt: skip
    model.load()
    spu = model.calibrate([decided.target], report=report)[0]
    decided = dataclasses.replace(decided, seconds_per_unit=spu, calibrated=True)
    remaps = [c for c in decided.candidates if rules.is_remapping(c.method)]
    if remaps and hasattr(model, "remap_cost"):  # one remapping forward timed against the plain one
        first = next((c for c in remaps if c.method == "self_extend"), remaps[0])
        measured = model.remap_cost(first.method, first.factor, decided.target, report=report)
        if measured is not None:
            ratio, how = measured
            decided = dataclasses.replace(decided, remap_cost=ratio, remap_measured=how)
    return _estimate(decided, model, model.cfg)


def _savable(model: Any, save: str | Path, save_type: str, cfg: ExtendConfig, out: Path, length: int) -> Any:
    """``--save``'s path checked now (with a method it takes), and the rule that leaves out what it cannot carry."""
    from posenc.hf.save import remap_save_problem
    from posenc.lab.extend.study.run import GGUF_METHODS, check_save

    gguf = Path(save).suffix.lower() == ".gguf"
    probe = dataclasses.replace(cfg, methods=("yarn",), factors=(length / model.original_len,), finetune_steps=0)
    check_save(save, probe, model, out, save_type)  # the path, the source and the folder, before anything runs

    def why(method: str) -> str | None:
        if gguf:
            return None if method in GGUF_METHODS else "llama.cpp runs no GGUF key for it (--save FILE.gguf)"
        if (remap := composed.remapping(method)) is not None:
            return remap_save_problem(model.model_type, remap)
        return None

    return why


def stage_configs(cfg: ExtendConfig, decided: PickPlan, cap: int) -> tuple[ExtendConfig, ...]:
    """The settings of the three studies: screening's perplexity at T, screening's passkeys at the shorter length
    (rounds to ``racing.SCREEN_CAP`` per depth) and the race at T (rounds to ``cap`` per cell; with the user's
    ``stop_width`` 0 the race's replay takes every raced model to the cap)."""
    methods = tuple(dict.fromkeys(c.method for c in decided.candidates))
    factors = tuple(sorted({c.factor for c in decided.candidates}))
    common = dict(methods=methods, factors=factors, depths=decided.depths, eval_tokens=decided.target, out=None)
    zero_shot = dict(
        task="lm", finetune_steps=0, finetune_positions=("plain",), finetune_window=None, finetune_lr=None,
        finetune_corpus=None, ruler_tasks=None, ruler_samples=None,
    )  # fmt: skip
    ppl = dataclasses.replace(cfg, **common, **zero_shot, lengths=(decided.target,), trials=1, stop_width=0.0)
    keys = dataclasses.replace(cfg, **common, **zero_shot, lengths=(decided.screen,), trials=racing.SCREEN_CAP,
                               stop_width=STOP_WIDTH)  # fmt: skip
    if decided.tuned and FINETUNED_METHOD not in methods:
        common["methods"] = (*methods, FINETUNED_METHOD)
    final = dataclasses.replace(cfg, **common, lengths=(decided.target,), trials=cap,
                                ruler_samples=cap if cfg.task == "ruler" else None,
                                stop_width=STOP_WIDTH)  # rounds, needles kept one by one  # fmt: skip
    return ppl, keys, final


def _final_measurements(cfg: ExtendConfig, decided: PickPlan) -> list[tuple]:
    ruler = [(RULER_PREFIX + t, decided.target, None) for t in _ruler_tasks(cfg)] if cfg.task == "ruler" else []
    return [("ppl", decided.target, None)] + [("passkey", decided.target, d) for d in decided.depths] + ruler


def _ruler_tasks(cfg: ExtendConfig) -> tuple[str, ...]:
    from posenc.lab.extend.needles.ruler import DEFAULT_TASKS

    return tuple(cfg.ruler_tasks or DEFAULT_TASKS)


def _save(cfg: ExtendConfig, out: Path, unit: tuple, save: str | Path, save_type: str, device: str,
          progress: bool) -> Path:  # fmt: skip
    """Write the pick: the race's model reloaded and patched again (a fine-tuned one from its finished run)."""
    from posenc.lab.extend.study.run import _model_for, _write, check_save

    method, factor, steps, positions = unit
    one = dataclasses.replace(cfg, methods=(method,), factors=(factor,), finetune_steps=steps,
                              finetune_positions=(positions,))  # fmt: skip
    final = out / "final"
    model_target = load_target(one, final, device=device, progress=False)
    resolved = plan.resolve(one, kind=model_target.kind, original=model_target.original_len,
                            default_methods=model_target.default_methods, device=device)  # fmt: skip
    resolved = dataclasses.replace(resolved, dtype=str(model_target.dtype).removeprefix("torch."))
    model_target.use(resolved)
    path = check_save(save, resolved, model_target, out, save_type)
    model_target.load()
    patched, _, _ = _model_for(model_target, unit)
    _write(model_target, patched, path, save_type, progress)  # posenc.deploy's write path, as --save's
    if progress:
        print(f"Saved the pick, {label(*unit)}, to {path}")
    return path


# ---------------------------------------------------------------------------------------------------------------------
# Text


def plan_text(decided: PickPlan, model: Any, cfg: ExtendConfig) -> str:
    return candidates_text(decided, model) + "\n" + stages_text(decided, cfg)


def candidates_text(decided: PickPlan, model: Any) -> str:
    """The plan's first lines, from the config alone: the candidates and what was left out, and why."""
    names = ", ".join(label(c.method, c.factor, 0) for c in decided.candidates)
    lines = [
        f"Pick for {model.name} at {decided.target} tokens (trained for {model.original_len}): "
        f"{len(decided.candidates)} candidates ({names})"
    ]
    if decided.left_out:
        lines.append("Left out: " + "; ".join(f"{m}: {why}" for m, why in decided.left_out.items()))
    return "\n".join(lines)


def stages_text(decided: PickPlan, cfg: ExtendConfig) -> str:
    """The plan's stages and its time estimate."""
    cap = decided.cap
    lines = []
    cells = f"passkey at depth{'s' if len(decided.depths) > 1 else ''} {', '.join(f'{d:g}' for d in decided.depths)}"
    cells += f" and RULER {', '.join(_ruler_tasks(cfg))}" if cfg.task == "ruler" else ""
    lines.append(
        f"1. Screening, each candidate and the unpatched model: perplexity at {decided.target} tokens (a candidate "
        f"above {rules.PPL_BREAK:g}x the best is out), then passkeys at {decided.screen} tokens in rounds of "
        f"{sampling.ROUND} per depth for the candidates in the 98% credible set of the best, to at most "
        f"{racing.SCREEN_CAP}, until {racing.KEEP} or fewer remain (the whole set goes on): at most "
        f"{plan.duration_text(decided.screen_seconds)}"
    )
    if decided.tuned:
        lines.append(f"   fine-tuning {', '.join(label(*u) for u in decided.tuned)}: about "
                     f"{plan.duration_text(decided.finetune_seconds)}")  # fmt: skip
    lines.append(
        f"2. Race at {decided.target} tokens, the screened set and the unpatched model"
        f"{' and the fine-tuned' if decided.tuned else ''}: {cells}, up to {cap} needles per cell in rounds of "
        f"{sampling.ROUND}, paired on the same needles; {race.RULE if cfg.adaptive else 'every model to the cap'}: "
        f"about {plan.duration_text(decided.race_seconds)} with {racing.KEEP} methods raced "
        f"({_race_expectation(cfg)}; at most {plan.duration_text(decided.final_seconds)})"
    )
    source = ("timed forwards of the model on this machine" if decided.calibrated else
              "this machine's matrix-multiply speed and the model's size, before any weight is loaded")  # fmt: skip
    if any(rules.is_remapping(c.method) for c in decided.candidates):
        source += (f"; a remapping candidate at {decided.remap_cost:.3g}x a frequency one per forward "
                   + (f"({decided.remap_measured})" if decided.remap_measured else
                      "(not measured here: the ratio on an idle AMD EPYC)"))  # fmt: skip
    deadline = (f"; sampling stops at the deadline, {plan.duration_text(decided.budget)} from the start (--budget)"
                if decided.budget else "")  # fmt: skip
    lines.append(
        f"About {plan.duration_text(decided.about_seconds)} in all (at most "
        f"{plan.duration_text(decided.most_seconds)}), from {source} ({decided.seconds_per_unit * 1e3:.3g} ms per "
        f"token-equivalent); a race that decides stops sooner{deadline}"
    )
    return "\n".join(lines)


def _race_expectation(cfg: ExtendConfig) -> str:
    if not cfg.adaptive:
        return "every model to the cap"
    return "as on a tie: the pick and its strongest challenger to the cap, the others a round or two"


def left_text(out: Path, decided: PickPlan, model: Any) -> str:
    """A resumed pick's ``--plan``: where each stage stands (replayed from its stored needles) and, at most, the time
    left: nothing for a finished pick."""
    from posenc.lab.extend.study.run import read_results, read_samples

    def rows(stage: str) -> list[dict]:
        path = out / stage / "results.csv"
        return read_results(path) if path.exists() else []

    spu = decided.seconds_per_unit
    cost_t = model.forward_cost(decided.target)
    units = [UNPATCHED, *(c.unit for c in decided.candidates)]
    weight = {c.unit: rules.cost_factor(c.method, decided.remap_cost) for c in decided.candidates} | {UNPATCHED: 1.0}
    ppl = _ppl_measured(rows("screen-ppl"), decided.target)
    left = sum(weight[u] * cost_t for u in units if u not in ppl) * spu
    screening = [("passkey", decided.screen, d) for d in decided.depths]
    screened = [model_of(r) for r in rows("screen-passkey") if r["metric"] == "passkey"]
    field = racing.Field(list(dict.fromkeys([UNPATCHED, *screened])), screening, racing.SCREEN_CAP)
    look = racing.replay_screen(field, *racing.needles(field, read_samples(out / "screen-passkey" / "samples.csv")))
    if len(ppl) < len(units) or look.wanted or not screened:
        left += decided.screen_seconds - sum(weight.get(u, 1.0) * cost_t for u in ppl) * spu
        left += decided.final_seconds + decided.finetune_seconds
        state = f"screening: perplexity for {len(ppl)} of {len(units)} models, passkeys under way"
    else:
        kept = [u for u, k in zip(field.units, look.look.tolist(), strict=True) if k and u != UNPATCHED]
        final_units = [UNPATCHED, *kept, *decided.tuned]
        final = [m for m in _final_measurements(model.cfg, decided) if m[0] != "ppl"]
        field = racing.Field(final_units, final, decided.cap)
        scores, counts = racing.needles(field, read_samples(out / "final" / "samples.csv"))
        replay = _race_replay(final_units, model.model_type, fixed=not model.cfg.adaptive)
        now = replay(field, scores, counts) if rows("final") else None
        measured = {model_of(r) for r in rows("final") if r["metric"] == "ppl"}
        left += sum(weight.get(u, 1.0) * cost_t for u in final_units if u not in measured) * spu
        if now is None or now.wanted:
            n = counts if now is None else now.n
            left += sum(weight.get(u, 1.0) * len(final) * max(0, decided.cap - int(n[i])) * cost_t
                        for i, u in enumerate(final_units)) * spu  # fmt: skip
            state = f"the race: {', '.join(f'{label(*u)} {int(counts[i])}' for i, u in enumerate(final_units))} " \
                    "needles per cell"  # fmt: skip
        else:
            state = "finished (pick.md)"
    return f"Resumed from {out}: {state}. Left: at most {plan.duration_text(max(0.0, left))}"


def stale_cache_note(units: Sequence[tuple]) -> list[str]:
    """Said once in ``pick.md`` where a raced model's attention follows the sequence's length (dynamic NTK's
    frequencies, DCA's logit factor): its needles come from generation with the KV cache
    (``posenc.hf.CacheStaleWarning``, kept quiet while the pick runs)."""
    moving = [u for u in units if set(composed.parts(u[0])) & LENGTH_DEPENDENT]
    if not moving:
        return []
    names = {p for u in moving for p in composed.parts(u[0])}
    what = (["dynamic NTK's frequencies (posenc re-rotates the cached keys to each step's: dynamic scaling with a "
             "cache, YaRN section 3.3)"] if "dynamic" in names else []) + \
        (["DCA's logit factor"] if names & set(LENGTH_DEPENDENT_REMAP) else [])  # fmt: skip
    return [f"{', '.join(label(*u) for u in moving)}: answers generated with the KV cache while "
            f"{' and '.join(what)} follow{'s' if len(what) == 1 else ''} each step's length; earlier tokens' hidden "
            "states keep the length of the step that computed them (`posenc.hf.CacheStaleWarning`). The rates "
            "stand as what a server with a KV cache runs, not as the full forward at each length."]  # fmt: skip


def _standing_row(s: rules.Standing) -> dict[str, Any]:
    return {
        "model": label(*s.unit), "needles": s.text(), **{m: r.text() for m, r in s.by_metric.items()},
        "p_best": s.p_best, "loss": s.loss, "ppl_past": s.ppl_past, "serving": s.serving, "active": s.active,
    }  # fmt: skip


def _ranked_table(ranked: list[rules.Standing], outcome: rules.Outcome) -> list[str]:
    metrics = list(dict.fromkeys(m for s in ranked for m in s.by_metric))
    head = ["", "model", "needles at T (pooled)", *metrics, "P(best)", "ppl past L", "raced", "served as"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, s in enumerate(ranked, 1):
        mark = "**pick**" if s is outcome.pick else "runner-up" if s is outcome.runner_up else str(i)
        status = ("to the end" if s.active else f"stopped: {label(*s.beaten_by)} better" if s.beaten_by else
                  "stopped")  # fmt: skip
        cells = [mark, label(*s.unit), s.text(), *[s.by_metric[m].text() if m in s.by_metric else "n/a"
                                                   for m in metrics],
                 "-" if s.unit[0] == "none" else f"{s.p_best:.2f}",
                 "n/a" if s.ppl_past is None else f"{s.ppl_past:.3g}", status,
                 "unpatched" if s.unit[0] == "none" else s.serving]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _ahead_note(ranked: list[rules.Standing]) -> list[str]:
    """The cells with needles past their model's pooled n (a round cut between the model's cells), as one line."""
    ahead = [f"{label(*s.unit)}: {r.n - s.n} needles of {m} measured past its pooled n = {s.n}"
             for s in ranked for m, r in s.by_metric.items() if r.n > s.n]  # fmt: skip
    if not ahead:
        return []
    return ["; ".join(ahead) + ". A round was cut between the model's cells: each cell's column counts every needle "
            "it has, the pooled rate and the race the needles every cell has; the same command with `--resume` "
            "measures the rest of the round."]  # fmt: skip


def summary(ranked: list[rules.Standing], outcome: rules.Outcome, saved: Path | None) -> str:
    text = "\n\n".join(["\n".join(_ranked_table(ranked, outcome)), *_ahead_note(ranked),
                        f"Pick: {label(*outcome.pick.unit)}. {outcome.reason}."])  # fmt: skip
    if saved is not None:
        text += f"\nSaved to {saved}"
    return text


def commands(model: Any, decided: PickPlan, outcome: rules.Outcome, saved: Path | None,
             cfg: ExtendConfig) -> list[str]:  # fmt: skip
    """How to run and evaluate the pick outside posenc."""
    method = outcome.pick.unit[0]
    kind = outcome.pick.serving
    folder = str(saved) if saved is not None else "DIR"
    t = decided.target
    lines = []
    if saved is None:
        lines.append("Write it: the same command with `--resume --save DIR` (a new folder; `FILE.gguf` for llama.cpp "
                     "where the method has a GGUF key) writes the pick without measuring again.")  # fmt: skip
    if saved is not None and saved.suffix.lower() == ".gguf":
        return [*lines, "```bash", f"llama-cli -m {shlex.quote(folder)} -c {t}", "```"]
    task = _ruler_tasks(cfg)[0]
    meta = f"'{{\"max_seq_lengths\":[{t}]}}'"
    shell = []
    if kind in ("config", "dynamic"):
        shell.append(f"lm_eval --model hf --model_args {shlex.quote(f'pretrained={folder},max_length={t}')} "
                     f"--tasks {task} --metadata {meta} --batch_size 1")  # fmt: skip
    if kind in ("config", "dynamic", "dca_vllm"):
        shell.append(f"lm_eval --model vllm --model_args {shlex.quote(f'pretrained={folder},max_model_len={t}')} "
                     f"--tasks {task} --metadata {meta} --batch_size auto")  # fmt: skip
    if shell:
        lines += ["", "```bash", *shell, "```"]
    if kind == "dca_vllm":
        lines.append("transformers loads this folder unextended: evaluate it with vLLM, or in Python load it with "
                     f"`posenc.hf.load_causal_lm({folder!r})`, which re-applies DCA.")
    if kind == "patch":
        factor = f"{outcome.pick.unit[1]:g}"
        lines.append(f"No saved config runs {method}: in Python, `{model.calls(method, outcome.pick.unit[1])}` "
                     "rebuilds the model measured here; evaluate it with "
                     f"`posenc extend MODEL --methods {method} --factors {factor} --task ruler`.")  # fmt: skip
    return lines


def report(cfg: ExtendConfig, model: Any, decided: PickPlan, cap: int, verdicts: list[rules.Screened],
           ranked: list[rules.Standing], outcome: rules.Outcome, saved: Path | None,
           took: str) -> str:  # fmt: skip
    sure = "shown" if outcome.shown else f"best with probability {outcome.pick.p_best:.2f}, not shown better"
    lines = [
        f"# Which method for {model.name} at {decided.target} tokens?",
        "",
        plan_text(decided, model, cfg),
        "",
        f"## The pick: {label(*outcome.pick.unit)} ({sure})",
        "",
        f"The rule: {race.RULE if cfg.adaptive else 'every raced model to the cap, then the best estimate'}.",
        "",
        outcome.reason + ".",
    ]
    if outcome.ended in ("deadline", "interrupted"):
        how = "the deadline (--budget) came" if outcome.ended == "deadline" else "the run was interrupted"
        lines.append(f"The race is not over ({how}): this is the best estimate from every needle measured; the same "
                     "command with `--resume` continues it.")  # fmt: skip
    if outcome.runner_up is not None:
        r = outcome.runner_up
        lines.append(f"Runner-up: {label(*r.unit)}, {r.text()}, best with probability {r.p_best:.2f}.")
    lines += ["", "## At the target", "", *_ranked_table(ranked, outcome), ""]
    if ahead := _ahead_note(ranked):
        lines += [*ahead, ""]
    if note := stale_cache_note([s.unit for s in ranked]):
        lines += [*note, ""]
    lines += [
        f"Needles: up to {cap} per cell in rounds of {sampling.ROUND}, the same needles (keys, documents) for every "
        "model in the same order; a model's cells advance together, and its pooled rate weighs each cell the same. "
        "Intervals are anytime-valid 95% intervals (`posenc.lab.extend.stats.confidence`): valid wherever sampling "
        "stopped, so wider than Wilson's fixed-n ones. P(best): the posterior chance of the highest pooled rate "
        "among the methods (independent Beta posteriors). Served as: "
        + "; ".join(f"{k}: {where}" for k, (_, where) in rules.SERVING.items()),
        "",
        "## Screening",
        "",
        f"| candidate | ppl past L at {decided.target} | passkey at {decided.screen} | P(best) there | verdict |",
        "|---|---|---|---|---|",
    ]
    for v in verdicts:
        ppl = "n/a" if v.ppl_past is None else f"{v.ppl_past:.3g}"
        p = "-" if v.p_best is None or v.unit[0] == "none" else f"{v.p_best:.2f}"
        why = "the model as trained (reference)" if v.unit[0] == "none" else v.why
        lines.append(f"| {label(*v.unit)} | {ppl} | {v.passkey.text() if v.passkey else 'n/a'} | {p} | {why} |")
    stages = "`screen-ppl/report.md`, `screen-passkey/report.md`, `final/report.md`"
    lines += ["", "## Run it elsewhere", "", *commands(model, decided, outcome, saved, cfg), "",
              f"The stages' own reports: {stages}. {took}"]  # fmt: skip
    return "\n".join(lines) + "\n"
