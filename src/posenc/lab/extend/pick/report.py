"""``--pick``'s text: the plan as printed (``plan_text``, ``left_text`` on a resume), the summary printed at the end
and ``pick.md`` (the rule, the pick and how sure, the ranked table, screening, the commands that run it elsewhere)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posenc.lab.common.files import write_text_atomic
from posenc.lab.extend.needles.shared_prefix import LENGTH_DEPENDENT_REMAP
from posenc.lab.extend.pick import racing, rules
from posenc.lab.extend.pick.plan import PickPlan, final_measurements, ruler_tasks
from posenc.lab.extend.settings import composed
from posenc.lab.extend.settings.config import ExtendConfig
from posenc.lab.extend.stats import race, sampling
from posenc.lab.extend.stats.rates import UNPATCHED, model_of
from posenc.lab.extend.study import plan
from posenc.lab.extend.study.report import LENGTH_DEPENDENT, label
from posenc.lab.extend.targets.base import PretrainedTarget


def plan_text(pick_plan: PickPlan, target: PretrainedTarget, cfg: ExtendConfig) -> str:
    return candidates_text(pick_plan, target) + "\n" + stages_text(pick_plan, cfg)


def candidates_text(pick_plan: PickPlan, target: PretrainedTarget) -> str:
    """The plan's first lines, from the config alone: the candidates and what was left out, and why."""
    names = ", ".join(label(c.method, c.factor, 0) for c in pick_plan.candidates)
    lines = [
        f"Pick for {target.name} at {pick_plan.target} tokens (trained for {target.original_len}): "
        f"{len(pick_plan.candidates)} candidates ({names})"
    ]
    if pick_plan.left_out:
        lines.append("Left out: " + "; ".join(f"{m}: {why}" for m, why in pick_plan.left_out.items()))
    return "\n".join(lines)


def stages_text(pick_plan: PickPlan, cfg: ExtendConfig) -> str:
    """The plan's stages and its time estimate."""
    cap = pick_plan.cap
    lines = []
    depths = pick_plan.depths
    cells = f"passkey at depth{'s' if len(depths) > 1 else ''} {', '.join(f'{d:g}' for d in depths)}"
    cells += f" and RULER {', '.join(ruler_tasks(cfg))}" if cfg.task == "ruler" else ""
    lines.append(
        f"1. Screening, each candidate and the unpatched model: perplexity at {pick_plan.target} tokens (a candidate "
        f"above {rules.PPL_BREAK:g}x the best is out), then passkeys at {pick_plan.screen} tokens in rounds of "
        f"{sampling.ROUND} per depth for the candidates in the 98% credible set of the best, to at most "
        f"{racing.SCREEN_CAP}, until {racing.KEEP} or fewer remain (the whole set goes on): at most "
        f"{plan.duration_text(pick_plan.screen_seconds)}"
    )
    if pick_plan.tuned:
        lines.append(f"   fine-tuning {', '.join(label(*u) for u in pick_plan.tuned)}: about "
                     f"{plan.duration_text(pick_plan.finetune_seconds)}")
    lines.append(
        f"2. Race at {pick_plan.target} tokens, the screened set and the unpatched model"
        f"{' and the fine-tuned' if pick_plan.tuned else ''}: {cells}, up to {cap} needles per cell in rounds of "
        f"{sampling.ROUND}, paired on the same needles; {race.RULE if cfg.adaptive else 'every model to the cap'}: "
        f"about {plan.duration_text(pick_plan.race_seconds)} with {racing.KEEP} methods raced "
        f"({_race_expectation(cfg)}; at most {plan.duration_text(pick_plan.final_seconds)})"
    )
    source = ("timed forwards of the model on this machine" if pick_plan.calibrated else
              "this machine's matrix-multiply speed and the model's size, before any weight is loaded")
    if any(rules.is_remapping(c.method) for c in pick_plan.candidates):
        source += (f"; a remapping candidate at {pick_plan.remap_cost:.3g}x a frequency one per forward "
                   + (f"({pick_plan.remap_measured})" if pick_plan.remap_measured else
                      "(not measured here: the ratio on an idle AMD EPYC)"))
    deadline = (f"; sampling stops at the deadline, {plan.duration_text(pick_plan.budget)} from the start (--budget)"
                if pick_plan.budget else "")
    lines.append(
        f"About {plan.duration_text(pick_plan.about_seconds)} in all (at most "
        f"{plan.duration_text(pick_plan.most_seconds)}), from {source} ({pick_plan.seconds_per_unit * 1e3:.3g} ms "
        f"per token-equivalent); a race that decides stops sooner{deadline}"
    )
    return "\n".join(lines)


def _race_expectation(cfg: ExtendConfig) -> str:
    if not cfg.adaptive:
        return "every model to the cap"
    return "as on a tie: the pick and its strongest challenger to the cap, the others a round or two"


def left_text(out: Path, pick_plan: PickPlan, target: PretrainedTarget) -> str:
    """A resumed pick's ``--plan``: where each stage stands (replayed from its stored needles) and, at most, the time
    left: nothing for a finished pick."""
    from posenc.lab.extend.study.run import read_results, read_samples

    def rows(stage: str) -> list[dict]:
        path = out / stage / "results.csv"
        return read_results(path) if path.exists() else []

    spu = pick_plan.seconds_per_unit
    cost_t = target.forward_cost(pick_plan.target)
    units = [UNPATCHED, *(c.unit for c in pick_plan.candidates)]
    weight = {c.unit: rules.cost_factor(c.method, pick_plan.remap_cost) for c in pick_plan.candidates}
    weight[UNPATCHED] = 1.0
    ppl = rules.ppl_measured(rows("screen-ppl"), pick_plan.target)
    left = sum(weight[u] * cost_t for u in units if u not in ppl) * spu
    screening = [("passkey", pick_plan.screen, d) for d in pick_plan.depths]
    screened = [model_of(r) for r in rows("screen-passkey") if r["metric"] == "passkey"]
    field = racing.Field(list(dict.fromkeys([UNPATCHED, *screened])), screening, racing.SCREEN_CAP)
    look = racing.replay_screen(field, *racing.needles(field, read_samples(out / "screen-passkey" / "samples.csv")))
    if len(ppl) < len(units) or look.wanted or not screened:
        left += pick_plan.screen_seconds - sum(weight.get(u, 1.0) * cost_t for u in ppl) * spu
        left += pick_plan.final_seconds + pick_plan.finetune_seconds
        state = f"screening: perplexity for {len(ppl)} of {len(units)} models, passkeys under way"
    else:
        kept = [u for u, k in zip(field.units, look.look.tolist(), strict=True) if k and u != UNPATCHED]
        final_units = [UNPATCHED, *kept, *pick_plan.tuned]
        final = [m for m in final_measurements(target.cfg, pick_plan) if m[0] != "ppl"]
        field = racing.Field(final_units, final, pick_plan.cap)
        scores, counts = racing.needles(field, read_samples(out / "final" / "samples.csv"))
        replay = racing.race_replay(final_units, target.model_type, fixed=not target.cfg.adaptive)
        now = replay(field, scores, counts) if rows("final") else None
        measured = {model_of(r) for r in rows("final") if r["metric"] == "ppl"}
        left += sum(weight.get(u, 1.0) * cost_t for u in final_units if u not in measured) * spu
        if now is None or now.wanted:
            n = counts if now is None else now.n
            left += sum(weight.get(u, 1.0) * len(final) * max(0, pick_plan.cap - int(n[i])) * cost_t
                        for i, u in enumerate(final_units)) * spu
            state = f"the race: {', '.join(f'{label(*u)} {int(counts[i])}' for i, u in enumerate(final_units))} " \
                    "needles per cell"
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
        (["DCA's logit factor"] if names & set(LENGTH_DEPENDENT_REMAP) else [])
    return [f"{', '.join(label(*u) for u in moving)}: answers generated with the KV cache while "
            f"{' and '.join(what)} follow{'s' if len(what) == 1 else ''} each step's length; earlier tokens' hidden "
            "states keep the length of the step that computed them (`posenc.hf.CacheStaleWarning`). The rates "
            "stand as what a server with a KV cache runs, not as the full forward at each length."]


def standing_row(s: rules.Standing) -> dict[str, Any]:
    return {
        "model": label(*s.unit), "needles": s.text(), **{m: r.text() for m, r in s.by_metric.items()},
        "p_best": s.p_best, "loss": s.loss, "ppl_past": s.ppl_past, "serving": s.serving, "active": s.active,
    }


def _ranked_table(ranked: list[rules.Standing], outcome: rules.Outcome) -> list[str]:
    metrics = list(dict.fromkeys(m for s in ranked for m in s.by_metric))
    head = ["", "model", "needles at T (pooled)", *metrics, "P(best)", "ppl past L", "raced", "served as"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, s in enumerate(ranked, 1):
        mark = "**pick**" if s is outcome.pick else "runner-up" if s is outcome.runner_up else str(i)
        status = (f"sampled when the race ended (n = {s.n})" if s.active else
                  f"stopped: {label(*s.beaten_by)} better" if s.beaten_by else
                  "stopped")
        cells = [mark, label(*s.unit), s.text(), *[s.by_metric[m].text() if m in s.by_metric else "n/a"
                                                   for m in metrics],
                 "-" if s.unit[0] == "none" else f"{s.p_best:.2f}",
                 "n/a" if s.ppl_past is None else f"{s.ppl_past:.3g}", status,
                 "unpatched" if s.unit[0] == "none" else s.serving]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _ahead_note(ranked: list[rules.Standing]) -> list[str]:
    """The cells with needles past their model's pooled n (a round cut between the model's cells), as one line."""
    ahead = [f"{label(*s.unit)}: {r.n - s.n} needles of {m} measured past its pooled n = {s.n}"
             for s in ranked for m, r in s.by_metric.items() if r.n > s.n]
    if not ahead:
        return []
    return ["; ".join(ahead) + ". A round was cut between the model's cells: each cell's column counts every needle "
            "it has, the pooled rate and the race the needles every cell has; the same command with `--resume` "
            "measures the rest of the round."]


def summary(ranked: list[rules.Standing], outcome: rules.Outcome, saved: Path | None) -> str:
    text = "\n\n".join(["\n".join(_ranked_table(ranked, outcome)), *_ahead_note(ranked),
                        f"Pick: {label(*outcome.pick.unit)}. {outcome.reason}."])
    if saved is not None:
        text += f"\nSaved to {saved}"
    return text


def commands(target: PretrainedTarget, pick_plan: PickPlan, outcome: rules.Outcome, saved: Path | None,
             cfg: ExtendConfig) -> list[str]:
    """How to run and evaluate the pick outside posenc."""
    method = outcome.pick.unit[0]
    kind = outcome.pick.serving
    folder = str(saved) if saved is not None else "DIR"
    t = pick_plan.target
    lines = []
    if saved is None:
        lines.append("Write it: the same command with `--resume --save DIR` (a new folder; `FILE.gguf` for llama.cpp "
                     "where the method has a GGUF key) writes the pick without measuring again.")
    if saved is not None and saved.suffix.lower() == ".gguf":
        return [*lines, "```bash", f"llama-cli -m {shlex.quote(folder)} -c {t}", "```"]
    task = ruler_tasks(cfg)[0]
    meta = f"'{{\"max_seq_lengths\":[{t}]}}'"
    shell = []
    if kind in ("config", "dynamic"):
        shell.append(f"lm_eval --model hf --model_args {shlex.quote(f'pretrained={folder},max_length={t}')} "
                     f"--tasks {task} --metadata {meta} --batch_size 1")
    if kind in ("config", "dynamic", "dca_vllm"):
        shell.append(f"lm_eval --model vllm --model_args {shlex.quote(f'pretrained={folder},max_model_len={t}')} "
                     f"--tasks {task} --metadata {meta} --batch_size auto")
    if shell:
        lines += ["", "```bash", *shell, "```"]
    if kind == "dca_vllm":
        lines.append("transformers loads this folder unextended: evaluate it with vLLM, or in Python load it with "
                     f"`posenc.hf.load_causal_lm({folder!r})`, which re-applies DCA.")
    if kind == "patch":
        factor = f"{outcome.pick.unit[1]:g}"
        lines.append(f"No saved config runs {method}: in Python, `{target.calls(method, outcome.pick.unit[1])}` "
                     "rebuilds the model measured here; evaluate it with "
                     f"`posenc extend MODEL --methods {method} --factors {factor} --task ruler`.")
    return lines


def pick_text(
    cfg: ExtendConfig,
    target: PretrainedTarget,
    pick_plan: PickPlan,
    cap: int,
    verdicts: list[rules.Screened],
    ranked: list[rules.Standing],
    outcome: rules.Outcome,
    saved: Path | None,
    took: str,
) -> str:
    """``pick.md``: the plan, the pick and how sure, the ranked table at the target, screening and the commands that
    run the pick elsewhere."""
    sure = "shown" if outcome.shown else f"best with probability {outcome.pick.p_best:.2f}, not shown better"
    lines = [
        f"# Which method for {target.name} at {pick_plan.target} tokens?",
        "",
        plan_text(pick_plan, target, cfg),
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
                     "command with `--resume` continues it.")
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
        "Intervals: each model's pooled rate and each cell has its own anytime-valid 95% interval "
        "(`posenc.lab.extend.stats.confidence`): valid wherever sampling stopped, so wider than Wilson's fixed-n "
        "ones, but 95% each, not jointly, and not for the model the race selected; what the race claims jointly "
        "(shown better, shown within 0.05) rests on its pairwise intervals, Bonferroni-split over the pairs. "
        "P(best): the posterior chance of the highest pooled rate among the methods (independent Beta posteriors); "
        "after a race cut early it is not a calibrated chance (an audit's simulations: P(best) near 0.34 after one or "
        "two rounds where the pick was the best 17-23% of the time). Served as: "
        + "; ".join(f"{k}: {where}" for k, (_, where) in rules.SERVING.items()),
        "",
        "## Screening",
        "",
        f"| candidate | ppl past L at {pick_plan.target} | passkey at {pick_plan.screen} | P(best) there | verdict |",
        "|---|---|---|---|---|",
    ]
    for v in verdicts:
        ppl = "n/a" if v.ppl_past is None else f"{v.ppl_past:.3g}"
        p = "-" if v.p_best is None or v.unit[0] == "none" else f"{v.p_best:.2f}"
        why = "the model as trained (reference)" if v.unit[0] == "none" else v.why
        lines.append(f"| {label(*v.unit)} | {ppl} | {v.passkey.text() if v.passkey else 'n/a'} | {p} | {why} |")
    stages = "`screen-ppl/report.md`, `screen-passkey/report.md`, `final/report.md`"
    lines += ["", "## Run it elsewhere", "", *commands(target, pick_plan, outcome, saved, cfg), "",
              f"The stages' own reports: {stages}. {took}"]
    return "\n".join(lines) + "\n"


def write_pick(out: Path, text: str) -> None:
    """``pick.md`` in ``out`` (``pick_text``, or ``unfinished_text`` before there is a pick)."""
    write_text_atomic(out / "pick.md", text)


def unfinished_text(out: Path, stage: str, interrupted: bool) -> str:
    """``pick.md`` of a run that ended (the deadline, or an interrupt) before ``stage`` was over, with the command that
    continues."""
    came = "The run was interrupted (Ctrl-C or SIGTERM)" if interrupted else "The deadline (--budget) came"
    return (f"# Pick in {out}: not finished\n\n{came} during {stage}; what was measured is kept. "
            "Continue with the same command and `--resume` (and a new --budget).\n")
