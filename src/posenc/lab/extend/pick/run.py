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
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from posenc._checks import fail
from posenc._devices import resolve_device
from posenc.lab.common.runfiles import check_out, check_settings
from posenc.lab.extend.pick import ledger, racing, rules
from posenc.lab.extend.pick import report as pick_report
from posenc.lab.extend.pick.plan import (
    STAGES,
    PickPlan,
    calibrated,
    final_measurements,
    make_plan,
    savable,
    screening_cells,
    stage_configs,
)
from posenc.lab.extend.pick.stages import save_pick, stage_rows
from posenc.lab.extend.settings.config import ExtendConfig, drops
from posenc.lab.extend.stats import confidence, race
from posenc.lab.extend.stats import rates as rates_mod
from posenc.lab.extend.stats.rates import UNPATCHED, model_of
from posenc.lab.extend.study import plan
from posenc.lab.extend.study.report import label
from posenc.lab.extend.targets.base import PretrainedTarget, as_pretrained
from posenc.lab.extend.targets.load import load_target


def run_pick(
    cfg: ExtendConfig,
    target_length: str | int,
    out: str | Path,
    *,
    budget: str | float | None = None,
    resume: bool = False,
    progress: bool = True,
    save: str | Path | None = None,
    save_type: str = "source",
    plan_only: bool = False,
    keys: int | None = None,
    delta: float | None = None,
    keep_short: bool = False,
    design: str | None = None,
    ask: str | None = None,
) -> dict[str, Any]:
    """Pick the method that makes ``cfg.model`` work at ``target_length`` tokens (``--target``: or ``"4x"``,
    ``"32k"``); returns the outcome.

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
                 )
    if cfg.trials is not None and cfg.ruler_samples is not None and cfg.trials != cfg.ruler_samples:
        fail("ruler_samples", cfg.ruler_samples, f"left out or equal to --trials ({cfg.trials}): a raced model's "
             "cells advance together, one cap for all")
    seconds = rules.parse_budget(budget)
    deadline = racing.Deadline.after(seconds)
    before = check_out(out, "pick")
    device = resolve_device(cfg.device, allow_auto=True)
    if cfg.task == "ruler":
        from posenc.lab.extend.needles.ruler import require

        require()  # lm-eval missing: the pip command now, not after screening
    target = load_target(cfg, out / "final", device=device, progress=progress)  # config and tokenizer only
    if target.kind == "lab":
        fail("model", cfg.model, "a pretrained model for --pick (a lab model cannot follow a passkey prompt)")
    target = as_pretrained(target)
    stored = (before or {}) if resume else {}  # a resumed pick keeps its candidates
    asked_dtype = cfg.dtype
    measured = _measured_dtype(out) if stored else None
    if measured is not None and cfg.dtype is None:
        # --dtype auto picks per machine (as a study's resume, study.run): the pick's own target, which scores the
        # race's documents, goes on in the dtype its stages were measured in, so its needles stay comparable
        cfg = dataclasses.replace(cfg, dtype=measured)
    if measured is not None and stored.get("dtype") is None and asked_dtype == measured:
        asked_dtype = None  # naming the dtype an auto pick ran in is resuming it as it began
    if design not in (None, *DESIGNS):
        fail("design", design, f"one of {DESIGNS} or None (a new pick: keys; a resumed one: as it began)")
    # a folder made before the deciding race resumes as it began
    deciding = design == "keys" if design else (not stored or stored.get("design") == "keys")
    settings_keys = _keys_settings(cfg, keys, delta, keep_short, deciding, ask, stored)
    pick_plan = make_plan(cfg, target, target_length, device=device, budget=seconds, save=save, save_type=save_type,
                          out=out, stored=stored.get("candidates"))
    settings = {k: v for k, v in cfg.to_dict().items() if k != "out"}
    settings["dtype"] = asked_dtype  # what was asked (auto resolved per machine: above)
    settings.update(pick_plan.settings())
    if settings_keys is not None:
        settings.update(settings_keys.stored())
    stages = stage_configs(cfg, pick_plan, pick_plan.cap)
    resolved = [plan.resolve(stage, kind=target.kind, original=target.original_len,
                             default_methods=target.default_methods, device=device) for stage in stages]
    target.use(resolved[-1])  # the corpus once: every stage reads the same text; the race's adds its fine-tuning text
    if target.heldout_tokens < pick_plan.target + 1:
        fail("target", target_length, f"a length the held-out text can fill: {target.corpus_name} gives "
             f"{target.heldout_tokens} held-out tokens, so at most {target.heldout_tokens - 1}; a lower --target or a "
             "bigger --corpus")
    for stage in resolved:  # every stage's settings against the model and the machine, before anything is written
        plan.check(stage, target, device=device)
    if settings_keys is not None:
        from posenc.lab.extend.pick.keys_run import check

        check(target, settings_keys, cfg.seed)
    if plan_only or progress:  # the candidates at once, a line per timed forward, then the stages and the estimate
        print(pick_report.candidates_text(pick_plan, target), flush=True)
        pick_plan = calibrated(pick_plan, target, plan_only, report=_say)
        if settings_keys is None:
            print(pick_report.stages_text(pick_plan, cfg))
        else:
            from posenc.lab.extend.pick.keys_report import stages_text

            print(stages_text(pick_plan, target, settings_keys))
    if plan_only and resume and before:
        if settings_keys is None:
            print(pick_report.left_text(out, pick_plan, target))
        else:
            from posenc.lab.extend.pick.keys_report import left_text

            print(left_text(out, pick_plan, target, settings_keys))
    if plan_only:
        return {"plan": pick_plan}
    check_settings(out, {**settings, "cap": pick_plan.cap}, resume, command="pick", what="pick")
    timed = pick_plan.calibrated  # a probe's plan is not claimed as this run's
    with ledger.timed(out, plan_seconds=pick_plan.most_seconds if timed else None,
                      plan_about_seconds=pick_plan.about_seconds if timed else None,
                      start=start) as entry:
        if settings_keys is not None:
            from posenc.lab.extend.pick.keys_run import measure_and_pick

            result = measure_and_pick(cfg, target, pick_plan, settings_keys, out, deadline, start, save=save,
                                      save_type=save_type, device=device, progress=progress)
        else:
            result = _measure_and_pick(cfg, target, pick_plan, stages, out, deadline, start, save=save,
                                       save_type=save_type, device=device, progress=progress)
        # picked: decided (the race settled), cap or deadline (the best estimate then; a --resume races on);
        # deadline: it came before a pick could be made; no candidate: the verdict is that none retrieves
        if result.get("verdict") == "none":
            entry["ended"] = "no candidate retrieves"
        else:
            entry["ended"] = "deadline" if result["pick"] is None else f"picked: {result['ended']}"
    return result


#: How a pick measures: ``keys``, the deciding race on documents of K keys (``keys_run``, every new pick); ``rounds``,
#: screening by passkeys at a shorter length then binary needles at T in rounds (the folders made before it).
DESIGNS = ("keys", "rounds")


def _measured_dtype(out: Path) -> str | None:
    """The dtype a pick's stages ran in (each stage's extend.json records it resolved), None before any ran."""
    for stage in ("screen-ppl", "screen-passkey", "final", "inside"):
        path = out / stage / "extend.json"
        if path.is_file():
            dtype = json.loads(path.read_text(encoding="utf-8")).get("dtype")
            if isinstance(dtype, str):
                return dtype
    return None


def _keys_settings(cfg: ExtendConfig, keys: int | None, delta: float | None, keep_short: bool,
                   deciding: bool, ask: str | None, stored: dict[str, Any]) -> Any:  # noqa: ANN401
    """The deciding race's settings (``keys_run.Settings``), or None for a folder made before it (which refuses
    them). Left out: a resumed folder's own (``keys``; ``ask``, "document" where it has none: it was made before
    ``ask``), else the defaults (``ask`` "document" for one key)."""
    from posenc._checks import check_choice, check_positive_int
    from posenc.lab.extend.pick.asking import ASKS
    from posenc.lab.extend.pick.keys_run import Settings

    if not deciding:
        for name, value in (("keys", keys), ("delta", delta), ("keep_short", keep_short or None), ("ask", ask)):
            if value is not None:
                fail(name, value, "left out when resuming a pick made before the deciding race (its folder has no "
                     "documents of keys; start a new --out for them)")
        return None
    if cfg.task == "ruler" or cfg.ruler_samples is not None:
        fail("task", cfg.task, "lm or passkey with a new --pick: its race measures documents of --keys passkeys at the "
             "target (RULER: posenc extend MODEL --task ruler --methods M)")
    if keys is not None:
        check_positive_int("keys", keys)
    if ask is not None:
        check_choice("ask", ask, ASKS)
    if delta is not None and (isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1):
        fail("delta", delta, "a margin in rate between 0 and 1 (0.05: within 5 points of the best)")
    if cfg.trials is not None and cfg.trials < 2:
        fail("trials", cfg.trials, "at least 2 documents per model with --pick (the race pairs documents)")
    defaults = Settings()
    if stored.get("design") == "keys":  # resumed: what it began with
        keys = keys if keys is not None else stored.get("keys")
        ask = ask if ask is not None else stored.get("ask", "document")
    keys = keys if keys is not None else defaults.keys
    ask = ask if ask is not None else (defaults.ask if keys > 1 else "document")
    return Settings(keys=keys, documents=cfg.trials if cfg.trials is not None else defaults.documents,
                    delta=float(delta) if delta is not None else defaults.delta, keep_short=keep_short, ask=ask)


def _measure_and_pick(
    cfg: ExtendConfig,
    target: PretrainedTarget,
    pick_plan: PickPlan,
    stages: Sequence[ExtendConfig],
    out: Path,
    deadline: racing.Deadline,
    start: float,
    *,
    save: str | Path | None,
    save_type: str,
    device: str,
    progress: bool,
) -> dict[str, Any]:
    """The stages, in order (each resumable), then the decision, the save and ``pick.md`` (``_conclude``), whose time
    line gives this run's seconds since ``start`` (``time.perf_counter()``) beside the earlier runs' in
    ``runs.jsonl`` (``ledger``). Ctrl-C or SIGTERM while measuring: the stages' reports and ``pick.md`` are rewritten
    from everything measured, saying the run was interrupted (nothing is saved), and the interrupt goes on."""
    made = {name: stage_rows(out, name) for name in STAGES}  # what each stage held before this run
    try:
        _measure(cfg, target, pick_plan, stages, out, deadline, progress)
    except KeyboardInterrupt:
        try:
            _rewrite_stage_reports(stages, target, out, made, time.perf_counter() - start, device)
            _conclude(cfg, stages[2], target, pick_plan, out, start, interrupted=True, save=None,
                      save_type=save_type, device=device, progress=progress)
        except Exception as err:  # the interrupt comes first; a report that could not be written is said, not raised
            print(f"posenc: the reports in {out} were not rewritten after the interrupt ({type(err).__name__}: {err})",
                  file=sys.stderr)
        raise
    return _conclude(cfg, stages[2], target, pick_plan, out, start, interrupted=False, save=save,
                     save_type=save_type, device=device, progress=progress)


def _measure(cfg: ExtendConfig, target: PretrainedTarget, pick_plan: PickPlan, stages: Sequence[ExtendConfig],
             out: Path, deadline: racing.Deadline, progress: bool) -> None:
    """Run the stages as far as the deadline lets them (each study resumes where it stands)."""
    from posenc.lab.extend.study.run import run_extend

    ppl_cfg, keys_cfg, final_cfg = stages
    units = [c.unit for c in pick_plan.candidates]
    ppl_rows = run_extend(ppl_cfg, out / "screen-ppl", resume=True, progress=progress, units=units,
                          measurements=[("ppl", pick_plan.target, None)], stop=deadline.passed)
    if not {UNPATCHED, *units} <= rules.ppl_measured(ppl_rows, pick_plan.target):  # the deadline came first
        return
    whole = [u for u in units if u not in rules.broken(ppl_rows, units, target=pick_plan.target)]
    run_extend(keys_cfg, out / "screen-passkey", resume=True, progress=progress, units=whole,
               measurements=screening_cells(pick_plan),
               more_rounds=racing.policy(racing.replay_screen, racing.SCREEN_CAP, deadline),
               stop=deadline.passed)
    screen = _screened(out, pick_plan)
    if screen is None:  # the deadline came first: screening is not over
        return
    raced = screen[1]
    if progress:
        print(f"Screening: {', '.join(label(*u) for u in raced) or 'nothing'} go on to {pick_plan.target} tokens")
    if not raced:
        why = "; ".join(f"{label(*v.unit)}: {v.why}" for v in screen[0])
        fail("methods", [c.method for c in pick_plan.candidates], "a candidate that keeps perplexity and finds keys "
             f"at {pick_plan.screen} tokens: none does; {why}")
    final_units = [UNPATCHED, *raced]
    replay = racing.race_replay(final_units, target.model_type, fixed=not cfg.adaptive)
    run_extend(final_cfg, out / "final", resume=True, progress=progress, units=raced,
               measurements=final_measurements(final_cfg, pick_plan),
               more_rounds=racing.policy(replay, pick_plan.cap, deadline), stop=deadline.passed)


def _screened(out: Path, pick_plan: PickPlan) -> tuple[list[rules.Screened], list[tuple]] | None:
    """Screening from its stored rows and needles: (each candidate's verdict, the models that go on to the race --
    the credible set and the fine-tuned ones); None while screening is not over (perplexity or passkey rounds left)."""
    from posenc.lab.extend.study.run import read_samples

    units = [c.unit for c in pick_plan.candidates]
    ppl_rows = stage_rows(out, "screen-ppl")
    if not {UNPATCHED, *units} <= rules.ppl_measured(ppl_rows, pick_plan.target):
        return None
    broken = rules.broken(ppl_rows, units, target=pick_plan.target)
    screening = screening_cells(pick_plan)
    field = racing.Field([UNPATCHED, *(u for u in units if u not in broken)], screening, racing.SCREEN_CAP)
    screen_scores, screen_counts = racing.needles(field, read_samples(out / "screen-passkey" / "samples.csv"))
    screen_look = racing.replay_screen(field, screen_scores, screen_counts)
    if screen_look.wanted:
        return None
    kept_mask, n_screen = screen_look.look, screen_look.n
    hits = torch.stack([screen_scores[0, i, :, : n_screen[i]].sum() / len(screening) for i in range(len(field.units))])
    p_best, _ = confidence.probability_best(hits, n_screen.to(torch.float64))
    kept = [u for u, k in zip(field.units, kept_mask.tolist(), strict=True) if k and u != UNPATCHED]
    screen_rows = ppl_rows + [r for r in stage_rows(out, "screen-passkey") if r["metric"] == "passkey"]
    chances = dict(zip(field.units, p_best.tolist(), strict=True))
    verdicts = rules.screened(screen_rows, [UNPATCHED, *units], target=pick_plan.target, screen=pick_plan.screen,
                              broken_units=broken, kept=kept, p_best=chances, keep=racing.KEEP)
    return verdicts, kept + pick_plan.tuned


def _conclude(
    cfg: ExtendConfig,
    final_cfg: ExtendConfig,
    target: PretrainedTarget,
    pick_plan: PickPlan,
    out: Path,
    start: float,
    *,
    interrupted: bool,
    save: str | Path | None,
    save_type: str,
    device: str,
    progress: bool,
) -> dict[str, Any]:
    """The pick from what the folder holds (nothing is measured here): the race (``final_cfg``, the last of
    ``stage_configs``) replayed from its stored needles, then the standings from every needle measured (a round cut
    by the deadline or an interrupt counts too: the intervals are anytime-valid), the decision, the save (``save``)
    and ``pick.md``."""
    from posenc.lab.extend.study.run import read_samples

    screen = _screened(out, pick_plan)
    if screen is None:
        return _unfinished(out, "screening", progress, interrupted)
    verdicts, raced = screen
    final_units = [UNPATCHED, *raced]
    measurements = final_measurements(final_cfg, pick_plan)
    field = racing.Field.of(final_units, measurements, pick_plan.cap)
    scores, per_cell = racing.stored(field, read_samples(out / "final" / "samples.csv"))
    counts = racing.together(field, per_cell)
    look = racing.race_replay(final_units, target.model_type, fixed=not cfg.adaptive)(field, scores, counts)
    if look.look is None:  # before every raced model's first round
        return _unfinished(out, "the race's first round", progress, interrupted)
    cut = "interrupted" if interrupted else "deadline"  # how a race that is not over ended
    ended = "decided" if bool(look.look.stop[0]) else cut if look.wanted else "cap"
    if bool((counts > look.n).any()):  # a round under way: the last look at every needle measured
        tier, reference = racing.tiers(final_units, target.model_type)
        look = racing.Replay(counts, look.wanted, race.verdict(scores, counts[None], look.look.active, tier,
                                                               reference))
    final_rows = stage_rows(out, "final")
    ranked = standings(final_rows, field, look, scores, per_cell, target.model_type, pick_plan.target)
    why_not = savable(target, save, save_type, cfg, out, pick_plan.target) if save is not None else None
    outcome = rules.decide(ranked, look.look, final_units, lambda u: label(*u), ended=ended, savable=why_not)
    saved = save_pick(final_cfg, out, outcome.pick.unit, save, save_type, device, progress) if save else None
    took = ledger.total_text(ledger.read(out), time.perf_counter() - start)
    pick_report.write_pick(out, pick_report.pick_text(cfg, target, pick_plan, pick_plan.cap, verdicts, ranked, outcome,
                                                      saved, took))
    if progress:
        print(pick_report.summary(ranked, outcome, saved))
        if interrupted:
            print(f"Interrupted: {out / 'pick.md'} and the stages' reports rewritten from what was measured")
    return {
        "pick": label(*outcome.pick.unit), "unit": outcome.pick.unit, "reason": outcome.reason, "saved": saved,
        "shown": outcome.shown, "ended": ended, "standings": [pick_report.standing_row(s) for s in ranked],
        "plan": pick_plan, "cap": pick_plan.cap,
    }


def _rewrite_stage_reports(stages: Sequence[ExtendConfig], target: PretrainedTarget, out: Path,
                           made: dict[str, list[dict]], seconds: float, device: str) -> None:
    """After an interrupt: each stage that measured something this run gets its figures and ``report.md`` again from
    its ``results.csv`` (``study.run.rewrite_report``; nothing loaded), so no report is older than its results."""
    from posenc.lab.extend.study.run import rewrite_report

    for name, stage in zip(STAGES, stages, strict=True):
        rows = stage_rows(out, name)
        if rows != made[name]:
            rewrite_report(stage, out / name, target, seconds, resumed=len(made[name]), device=device)


def _unfinished(out: Path, stage: str, progress: bool, interrupted: bool) -> dict[str, Any]:
    """The run ended (the deadline, or an interrupt) before ``stage`` was over: nothing to pick from yet; the command
    that continues."""
    pick_report.write_pick(out, pick_report.unfinished_text(out, stage, interrupted))
    if progress:
        print(f"{'Interrupted' if interrupted else 'Deadline'}: {stage} is not over; continue with --resume")
    return {"pick": None, "ended": "interrupted" if interrupted else "deadline", "stage": stage}


def standings(rows: Sequence[dict], field: racing.Field, look: racing.Replay, scores: torch.Tensor,
              per_cell: torch.Tensor, model_type: str | None, target: int) -> list[rules.Standing]:
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
                    and r["length"] == target and r["status"] == "ok"), None)
        out.append(rules.Standing(
            unit=unit, estimate=float(v.estimate[0, i]), interval=(float(low[0, i]), float(high[0, i])), n=int(n[i]),
            by_metric=by, ppl_past=ppl, serving=rules.serving(unit[0], model_type), active=bool(v.active[0, i]),
            beaten_by=field.units[int(beaten[0])] if beaten.numel() else None, p_best=float(p_best[i]),
            loss=float(loss[i]),
        ))
    return sorted(out, key=lambda s: (-s.estimate, rules.SERVING[s.serving][0]))


def _say(text: str) -> None:
    print(text, flush=True)
