"""The deciding pick in words: the verdict (``Verdict``), ``pick.md`` and the summary printed at the end."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from posenc.lab.common.files import write_text_atomic
from posenc.lab.extend.pick import inside, rules
from posenc.lab.extend.pick.plan import PickPlan
from posenc.lab.extend.settings.config import ExtendConfig
from posenc.lab.extend.stats import paired
from posenc.lab.extend.study.report import label
from posenc.lab.extend.targets.base import PretrainedTarget

SCORE = ("answer probability: the teacher-forced probability of the whole key, exp(log-probability), averaged over a "
         "document's keys -- the chance that sampling at temperature 1 writes the key")
FOUND = "keys found: every answer token the argmax (greedy decoding's exact match), averaged over a document's keys"
RULE = ("after each look (documents 8, 16, 32, ... per model still sampled), a model shown worse than another (paired "
        "on the same documents) leaves the set that could be the best; one shown more than {delta:g} worse stops being "
        "sampled; the pick is the cheapest to serve among the models shown within {delta:g} of every model -- "
        "*better* when it is the only one not shown worse --, or, when every model's upper bound is below the "
        f"floor of {paired.FLOOR:g}, no candidate retrieves; at the cap or a deadline, if nothing is shown, the best "
        "estimate among the models not shown worse, said not to be decided, with those models (they could still be "
        "the best)")
INTERVALS = ("Intervals: each model's mean at 95% over its documents, clustered by document (Student's t on the "
             "document means, floored at what the keys resolve; Miller 2024); the race's claims hold jointly at 95%: "
             "each pair's interval spends its error over the planned looks and across the models (Bonferroni), so "
             "stopping at any look or a deadline keeps it (posenc.lab.extend.stats.paired). Seeded simulations in "
             "the suite check coverage and error rates under the stopping rule.")


@dataclass(frozen=True)
class Verdict:
    """What the race says, in words: ``status`` is ``paired``'s ("better", "within", "none", "open")."""

    status: str
    pick: tuple | None
    reason: str
    contenders: list[tuple]

    @classmethod
    def of(cls, state: Any, ended: str, model_type: str | None, delta: float) -> Verdict:  # noqa: ANN401
        d, units = state.decision, state.units
        contenders = [u for u, c in zip(units, d.contenders.tolist(), strict=True) if c and u[0] != "none"]
        if d.status == "none":
            return cls("none", None, f"no candidate retrieves at the target: every model's rate of keys found is "
                       f"below {paired.FLOOR:g} beyond noise (upper bounds: {_bounds(d, units)})", [])
        if d.status == "reference":
            return cls("none", None, "no candidate retrieves at the target: the unpatched model is the only one not "
                       f"shown worse, and every method is shown more than {delta:g} below a model "
                       f"(upper bounds: {_bounds(d, units)})", [])
        i = int(d.pick)
        pick = units[i]
        where = rules.SERVING[rules.serving(pick[0], model_type)][1]
        est = _mean(d, i)
        if d.status == "better":
            reason = (f"{label(*pick)} ({est} of keys found) is shown better than every other model raced, paired "
                      f"on the same documents; it is served as {where}")
        elif d.status == "within":
            reason = (f"{label(*pick)} ({est} of keys found) is shown within {delta:g} of every model raced and "
                      f"is the cheapest of those to serve: {where}")
        else:
            endings = {"cap": "every look was made", "deadline": "the deadline came",
                       "interrupted": "the run was interrupted"}
            reason = (f"could not tell ({endings.get(ended, 'sampling ended')}): {label(*pick)} has the best estimate "
                      f"among the models not shown worse, {est}; the best is among "
                      f"{', '.join(label(*u) for u in contenders)} "
                      f"(none of them shown worse than another); served as {where}")
        if bool(d.above_reference):
            reason += "; shown above the unpatched model (the method rescues retrieval)"
        else:
            reason += "; not shown above the unpatched model"
        return cls(d.status, pick, reason, contenders)


def _bounds(d: Any, units: Sequence[tuple]) -> str:  # noqa: ANN401
    return ", ".join(f"{label(*u)} {100 * float(d.mean_high[i]):.0f}%" for i, u in enumerate(units))


def _mean(d: Any, i: int) -> str:  # noqa: ANN401
    """A model's mean score with its interval, in percent."""
    return f"{100 * float(d.mean[i]):.0f}% [{100 * float(d.mean_low[i]):.0f}-{100 * float(d.mean_high[i]):.0f}]"


def write(out: Path, body: str) -> None:
    write_text_atomic(out / "pick.md", body)


def unfinished(out: Path, stage: str, interrupted: bool) -> str:
    came = "The run was interrupted (Ctrl-C or SIGTERM)" if interrupted else "The deadline (--budget) came"
    return (f"# Pick in {out}: not finished\n\n{came} during {stage}; what was measured is kept. "
            "Continue with the same command and `--resume` (and a new --budget).\n")


def nothing_whole(target: PretrainedTarget, pick_plan: PickPlan, ppl_rows: Sequence[dict]) -> str:
    return (f"# Which method for {target.name} at {pick_plan.target} tokens?\n\n## Verdict: no candidate retrieves at "
            f"{pick_plan.target}\n\nEvery candidate's perplexity past L at the target is above {rules.PPL_BREAK:g}x "
            "the best one's: each breaks the language model there (screen-ppl/report.md).\n\n")


def _row(i: int, u: tuple, state: Any, costs: dict, ppl: dict, model_type: str | None,  # noqa: ANN401
         delta: float) -> list[str]:
    d, f = state.decision, state.prob_decision
    n = state.documents.get(u, 0)
    cost = costs.get(u)
    if n < state.look:
        status = f"stopped after {n} documents: shown more than {delta:g} below another"
    else:
        status = f"to the last look ({state.look} documents)"
    if u[0] == "none":
        status = f"reference, {status}"
    cells = [
        label(*u), f"{n}", _mean(d, i), _mean(f, i),
        "n/a" if ppl.get(u) is None else f"{ppl[u]:.3g}", "n/a" if cost is None else cost.text(),
        "-" if cost is None or u[0] == "none" else (cost.worse or "no cost shown"), status,
        "unpatched" if u[0] == "none" else rules.serving(u[0], model_type),
    ]
    return cells


def pick_text(cfg: ExtendConfig, target: PretrainedTarget, pick_plan: PickPlan, settings: Any, state: Any,  # noqa: ANN401
              verdict: Verdict, costs: dict, ppl_rows: Sequence[dict], saved: Path | None, took: str) -> str:
    from posenc.lab.extend.pick.report import candidates_text

    ppl = {u: rules.ppl_past_of(ppl_rows, u, pick_plan.target) for u in state.units}
    head = {"better": "shown better", "within": f"shown within {settings.delta:g}, the cheapest to serve",
            "open": "could not tell", "none": "no candidate retrieves"}[verdict.status]
    title = "no candidate retrieves" if verdict.pick is None else label(*verdict.pick)
    lines = [
        f"# Which method for {target.name} at {pick_plan.target} tokens?", "", candidates_text(pick_plan, target), "",
        f"## The pick: {title} ({head})", "", verdict.reason + ".", "",
        f"The rule: {RULE.format(delta=settings.delta)}", "",
        f"## At the target, {pick_plan.target} tokens", "",
        "| model | documents | keys found | answer probability | ppl past L at T | inside L (vs unpatched) | costs "
        "short prompts | raced | served as |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = sorted(range(len(state.units)), key=lambda i: -float(state.decision.mean[i]))
    lines += ["| " + " | ".join(_row(i, state.units[i], state, costs, ppl, target.model_type, settings.delta)) + " |"
              for i in order]
    f = state.prob_decision
    lines += [
        "",
        f"Documents of {settings.asking.text()} each ({max(state.documents.values(), default=0)} at most per "
        f"model), the same documents for every model in the same order; one forward per document"
        f"{_asked(settings)}. Scores: {FOUND} "
        f"(what decides); {SCORE} (reported beside). {INTERVALS}",
        "",
        *relation_lines(state, settings),
        "",
        *clustering_lines(state, settings),
        f"On the answer probability, the same rule says: {f.status}"
        + ("" if f.status in ("open", "none", "reference") else f" ({label(*state.units[int(f.pick)])})") + ".",
        "",
        f"## Inside the original context ({target.original_len} tokens)", "",
        f"Perplexity at {target.original_len // 4} and {target.original_len} tokens ({target.original_len} held-out "
        f"tokens each, the same windows for every model) against the unpatched model's, and {inside.DOCUMENTS} "
        f"documents of keys at {target.original_len}: a model more than {100 * inside.PPL_MARGIN:g}% worse in "
        "perplexity, or shown below the unpatched model on keys, costs short prompts"
        + (" and was not raced (--keep-short)." if settings.keep_short else "."),
        "",
    ]
    if verdict.pick is not None and (c := costs.get(verdict.pick)) is not None:
        lines += [f"The pick inside L: {c.sentence()}.", ""]
    lines += [took, ""]
    if saved is not None:
        lines += [f"Saved to `{saved}`.", ""]
    return "\n".join(lines)


def relation_lines(state: Any, settings: Any) -> list[str]:  # noqa: ANN401
    """How the answer probability reported beside relates to the retrieval rate the race decides on (keys found),
    model by model, over the documents each has at the target (``paired.rate_relation``)."""
    if state.arrays is None:
        return []
    found, prob, present = state.arrays
    rel = paired.rate_relation(found, prob, present)
    lines = ["The score and the retrieval rate (every document each model has at the target): "]
    parts = []
    for i, u in enumerate(state.units):
        if not bool(present[i].any()):
            continue
        on_found = "n/a" if math.isnan(float(rel.prob_found[i])) else f"{float(rel.prob_found[i]):.2f}"
        on_missed = "n/a" if math.isnan(float(rel.prob_missed[i])) else f"{float(rel.prob_missed[i]):.2f}"
        parts.append(f"{label(*u)}: keys found {100 * float(rel.found[i]):.0f}%, answer probability "
                     f"{100 * float(rel.prob[i]):.0f}% (difference {100 * float(rel.difference[i]):+.0f} points "
                     f"[{100 * float(rel.low[i]):+.0f} to {100 * float(rel.high[i]):+.0f}]; mean probability "
                     f"{on_found} on keys found, {on_missed} on keys missed)")
    lines[0] += "; ".join(parts) + "."
    return lines


def clustering_lines(state: Any, settings: Any) -> list[str]:  # noqa: ANN401
    """What a document of several keys was worth at the target (``paired.clustering`` over the models of
    ``settings.keys`` keys): none for one key per document."""
    k = settings.keys
    rows = [i for i, u in enumerate(state.units) if settings.asking.keys_of(u) == k]
    if k < 2 or state.arrays is None or not rows:
        return []
    found, _, present = state.arrays
    index = torch.tensor(rows)
    means, mask = paired.cluster_means(found[index], present[index]), present[index].any(-1)
    f = float(paired.clustering(means, mask))
    if math.isnan(f):
        return [f"Keys within a document: no model of {k} keys varies between its documents yet, so how much a "
                "document is worth in independent keys is not read off them.", ""]
    rho = (f * k - 1) / (k - 1)
    return [f"Keys within a document ({len(rows)} models of {k} keys, {int(mask.sum())} documents at the target): "
            f"the document means vary as {f:.2f} times one key's variance, so a document of {k} keys was worth about "
            f"{1 / f:.1f} independent keys (intra-document correlation about {rho:.2f}); every interval counts each "
            "document once.", ""]


def summary(verdict: Verdict, state: Any, costs: dict) -> str:  # noqa: ANN401
    lines = [f"Pick: {'none' if verdict.pick is None else label(*verdict.pick)} ({verdict.status}). {verdict.reason}."]
    if verdict.pick is not None and (c := costs.get(verdict.pick)) is not None:
        lines.append(f"Inside the original context: {c.sentence()}.")
    return "\n".join(lines)


def stages_text(pick_plan: PickPlan, target: PretrainedTarget, settings: Any) -> str:  # noqa: ANN401
    """The deciding pick's stages and an estimate: every candidate to the cap (at most) and the race as it goes on a
    tie of three to the cap (about), at the plan's seconds per token-equivalent."""
    from posenc.lab.extend.study.plan import duration_text

    spu, t, original = pick_plan.seconds_per_unit, pick_plan.target, target.original_len
    weights = [rules.cost_factor(c.method, pick_plan.remap_cost) for c in pick_plan.candidates]
    models = 1 + sum(weights)
    at_t, at_l = target.forward_cost(t) * spu, target.forward_cost(original) * spu
    quarter = target.forward_cost(original // 4) * spu
    screen = models * at_t
    inner = models * (4 * quarter + at_l + inside.DOCUMENTS * at_l)
    from posenc.lab.extend.pick.deciding import plan_of

    looks = list(plan_of(settings.documents).looks)
    first = looks[0] * models * at_t
    most = settings.documents * models * at_t
    about = first + (settings.documents - looks[0]) * min(3.0, models) * at_t
    lines = [
        f"1. Perplexity past L at {t} tokens, each candidate and the unpatched model (a candidate above "
        f"{rules.PPL_BREAK:g}x the best is out): about {duration_text(screen)}",
        f"2. Inside the context: perplexity at {original // 4} and {original} tokens and {inside.DOCUMENTS} documents "
        f"of {settings.asking.text()} at {original}, each model left: about {duration_text(inner)}",
        f"3. The race at {t} tokens: documents of {settings.asking.text()} (one forward each), looks at "
        f"{', '.join(map(str, looks))} documents per model still sampled, delta {settings.delta:g}: the first look "
        f"for every model about {duration_text(first)}; to the cap with three tied about {duration_text(about)}, "
        f"at most {duration_text(most)}",
        f"About {duration_text(screen + inner + about)} in all (at most {duration_text(screen + inner + most)}); a "
        "race that decides stops sooner",
    ]
    return "\n".join(lines)


def left_text(out: Path, pick_plan: PickPlan, target: PretrainedTarget, settings: Any) -> str:  # noqa: ANN401
    """``--plan --resume``: where the folder stands, stage by stage (read from its files; nothing written)."""
    from posenc.lab.extend.pick import evidence
    from posenc.lab.extend.pick.stages import stage_rows
    from posenc.lab.extend.stats.rates import UNPATCHED

    if (out / "pick.md").is_file() and (out / "pick.md").read_text(encoding="utf-8").startswith("# Which method"):
        done = " (pick.md holds a verdict; --resume replays it and measures only what its race still wants)"
    else:
        done = ""
    units = [UNPATCHED, *(c.unit for c in pick_plan.candidates)]
    ppl = rules.ppl_measured(stage_rows(out, "screen-ppl"), pick_plan.target)
    needles = evidence.read(out / evidence.NEEDLES_FILE)
    quarter, whole = inside.lengths(target.original_len)
    rows = inside.read(out / inside.INSIDE_FILE)
    inner = sum(1 for u in units if inside.ppl_of(rows, u, quarter) is not None and inside.ppl_of(rows, u, whole)
                is not None and evidence.documents_of(needles, u, whole, settings.asking.keys_of(u))
                >= inside.DOCUMENTS)
    at_t = {u: evidence.documents_of(needles, u, pick_plan.target, settings.asking.keys_of(u)) for u in units}
    race = ", ".join(f"{label(*u)} {n}" for u, n in at_t.items() if n)
    return (f"Resumed from {out}{done}: perplexity at the target for {len(ppl & set(units))} of {len(units)} models; "
            f"the cost inside the context for {inner}; documents at the target: {race or 'none yet'}")


def _asked(settings: Any) -> str:  # noqa: ANN401
    """How the keys were asked, where not in the document (``asking``)."""
    if settings.ask == "document":
        return ""
    return (" (asked blind: each key in a branch that sees the haystack with its own needle alone, so each is a "
            "single passkey, not told apart by its door; run as a causal prefill of the filler and one masked "
            "suffix, DCA's in one forward with the T x T mask; posenc.lab.extend.pick.asking)")
