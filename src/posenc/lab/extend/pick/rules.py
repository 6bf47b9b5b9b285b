"""``--pick``'s rules: which methods compete, which survive screening, how many samples each may get, and which one
wins -- pure functions of settings and ``results.csv`` rows (``posenc.lab.extend.pick.run`` runs them).

The question: *this model was trained for L tokens; which method makes it work at T, and how sure is that?*

- Candidates (``candidates``): every training-free method of both families with its paper's parameters at the
  factor ``T / L`` -- frequency scalings (``linear``, ``ntk``, ``dynamic``, ``yarn``, ``llama3``) and remapping methods
  (``self_extend``, ``dca``, ``rerope``, ``leaky_rerope``, ``lm_infinite``; ``string`` where the target is within its
  reach of 2L - W, ``yarn+string`` at any target; ``dca_vllm``, what vLLM serves, on Qwen2/Qwen3; not
  ``streaming_llm``, ``NOT_CANDIDATES``) --
  plus the variants their papers offer as a setting: YaRN and Self-Extend set for twice the target (``VARIANTS``;
  YaRN's scale factor and Self-Extend's group size grow with it). LongRoPE is not a candidate: its
  per-frequency factors come from a search, not a rule. With ``--save`` only what that format can carry competes.
- Screening (``broken``, ``screened``): each candidate's perplexity past L at T (one forward); out if more than
  ``PPL_BREAK`` times the best one's (the method breaks the language model). The others get passkeys at a shorter
  length between L and T in rounds, each round for the candidates in the credible set of the best
  (``posenc.lab.extend.pick.racing.replay_screen``); the set goes on.
- Racing at T (``posenc.lab.extend.stats.race``, run by ``posenc.lab.extend.pick.racing``): the survivors and the
  unpatched model are sampled on the same needles, paired, with anytime-valid intervals; a model stops once another is
  better beyond noise.
- The pick (``decide``): the last method standing, or the cheapest to serve (``SERVING``: a RoPE config every engine
  reads, then one transformers reads, then what only serving engines read, then a run-time patch) shown within
  ``race.DELTA`` of every model still sampled; otherwise the best estimate, said to be not shown better, with its
  chance of being the best and what each cheaper method would cost.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from posenc._checks import fail
from posenc.lab.extend.pick.budget import parse_budget as parse_budget
from posenc.lab.extend.stats.rates import Rate, model_of, pool, row_rate

FREQUENCY_CANDIDATES = ("linear", "ntk", "dynamic", "yarn", "llama3")
#: ``yarn+string``: YaRN at the target's factor, then STRING within that context (``composed``), which reaches any
#: target where STRING alone reaches at most 2L - W.
REMAP_CANDIDATES = ("self_extend", "dca", "rerope", "leaky_rerope", "lm_infinite", "string", "yarn+string")
#: Remapping methods that never compete, and why.
NOT_CANDIDATES = {
    "streaming_llm": "it attends to its sinks and a window of recent tokens only: by design it cannot retrieve what "
    "lies before its window (a streaming method, not a retrieval one)",
}
#: Methods also measured at this multiple of the target's factor (the setting their papers vary).
VARIANTS = {"yarn": 2.0, "self_extend": 2.0}
#: Screening: a perplexity past L above this multiple of the best candidate's is out.
PPL_BREAK = 2.0
#: Needles per cell at T when --trials is left out (the issue's n >= 20).
DEFAULT_CAP = 20

#: A remapping candidate's time per sample relative to a frequency method's, until the plan measures it on the
#: machine (``run._calibrated``, ``HFTarget.remap_cost``): SmolLM2-135M, bfloat16, an idle 2-core AMD EPYC,
#: 2026-11-26, at 8,192 tokens: Self-Extend's prefill 1.35x YaRN's (32.9 vs 24.3 s), a passkey generate 1.56x (36.7
#: vs 23.5 s). On a Xeon with AMX 1.6-2.7x quiet, up to 10x under load (BENCHMARKS.md, "A needle's cost on a Xeon with
#: AMX"): hence measured.
REMAP_COST = 1.5

#: How a saved pick is served, cheapest first: (tier, where it runs).
SERVING = {
    "config": (0, "a RoPE config every engine reads (transformers, vLLM, SGLang, llama.cpp via GGUF)"),
    "dynamic": (1, "a RoPE config transformers reads (vLLM and SGLang serve it at one fixed base; no GGUF key; "
                "transformers' cached decoding is stale)"),
    "dca_vllm": (2, "a dual_chunk_attention_config vLLM reads for Qwen2/Qwen3, SGLang for Qwen2 (transformers loads "
                 "it unextended)"),
    "patch": (3, "a run-time patch: posenc.hf.extend_context after loading, in transformers only"),
}
CONFIG_METHODS = ("none", "linear", "ntk", "yarn", "llama3", "longrope")


def serving(method: str, model_type: str | None) -> str:
    """The ``SERVING`` key of ``method`` on a model of ``model_type``."""
    from posenc.hf.save import DCA_SERVED_MODEL_TYPES

    if method in CONFIG_METHODS:
        return "config"
    if method == "dynamic":
        return "dynamic"
    if method == "dca_vllm" and model_type in DCA_SERVED_MODEL_TYPES:
        return "dca_vllm"
    return "patch"


def is_remapping(method: str) -> bool:
    """Whether a candidate runs posenc's remapping attention (Self-Extend, DCA, ..., and FREQUENCY+string)."""
    return method in REMAP_CANDIDATES or method in ("dca_vllm", *NOT_CANDIDATES)


def cost_factor(method: str, remap_cost: float = REMAP_COST) -> float:
    """A candidate's time per sample relative to a frequency method's: ``remap_cost`` for remapping methods (the
    plan's measured ratio on this machine, ``REMAP_COST`` before it is measured), 1 otherwise."""
    return remap_cost if is_remapping(method) else 1.0


def parse_target(text: str | int, original: int | None) -> int:
    """``--target``: tokens (``32768``) or a multiple of the original context (``4x``, ``1.5x``; rounded as
    ``--lengths`` multiples are, ``config.resolve_length``), beyond the original context."""
    from posenc.lab.extend.settings.config import length_form, resolve_length

    form = length_form("target", text)
    if isinstance(form, str):
        if original is None:
            fail("target", text, "a length in tokens (the model's original context is unknown, so no multiple)")
        length = resolve_length("target", form, original)
    else:
        length = form
    if original is not None and length <= original:
        fail("target", text, f"a length beyond the original context of {original} tokens")
    return length


def screen_length(original: int, target: int) -> int:
    """The shorter length screening's passkeys run at: halfway from the original context to the target."""
    return (original + target) // 2


@dataclass(frozen=True)
class Candidate:
    method: str
    factor: float
    why: str  # the rule that set its parameters

    @property
    def unit(self) -> tuple[str, float, int, str]:
        return (self.method, self.factor, 0, "plain")


def remapping_model_types() -> tuple[str, ...]:
    """The model types whose attention posenc's remapping methods patch: every layer
    (``posenc.hf._remap_patch.REMAP_MODEL_TYPES``), or the layers of one type (``LAYER_TYPE_REMAP_MODEL_TYPES``:
    Gemma 3's global layers, its sliding ones keeping their window)."""
    from posenc.hf._remap_patch import LAYER_TYPE_REMAP_MODEL_TYPES, REMAP_MODEL_TYPES

    return (*REMAP_MODEL_TYPES, *LAYER_TYPE_REMAP_MODEL_TYPES)


def candidates(
    original: int, target: int, *, model_type: str | None, remapping: bool, methods: Sequence[str] | None = None,
    savable: Callable[[str], str | None] | None = None,
) -> tuple[list[Candidate], dict[str, str]]:
    """The methods that compete, and those left out with why.

    ``remapping``: whether the model takes remapping methods (:func:`remapping_model_types`).
    ``methods``: the user's list (``--methods``) instead of every method. ``savable(method) -> str | None``: why
    ``--save`` could not write a method (None: it can)."""
    from posenc.hf.save import DCA_SERVED_MODEL_TYPES

    factor = target / original
    every = list(FREQUENCY_CANDIDATES)
    if remapping:
        every += list(REMAP_CANDIDATES)
        if model_type in DCA_SERVED_MODEL_TYPES:
            every.insert(every.index("dca") + 1, "dca_vllm")
    left_out: dict[str, str] = {}
    if methods is not None:
        unknown = [m for m in methods if m not in every and m != "longrope"]
        if remapping and any(m in NOT_CANDIDATES for m in methods):
            bad = next(m for m in methods if m in NOT_CANDIDATES)
            fail("methods", list(methods), f"candidates --pick can measure: {bad} is not one: {NOT_CANDIDATES[bad]}")
        if unknown:
            fail("methods", list(methods), f"candidates --pick can measure on this model: {every}")
        if "longrope" in methods:
            search = "per-frequency factors come from a search (give them to posenc.hf.extend_context instead)"
            fail("methods", list(methods), f"training-free methods with a rule for their parameters: longrope's "
                 f"{search}")
        every = [m for m in every if m in methods]
    else:
        left_out["longrope"] = "its per-frequency factors come from a search, not from a rule"
        if remapping:
            left_out.update(NOT_CANDIDATES)
        else:
            left_out["remapping methods"] = (
                f"posenc remaps the attention of {', '.join(remapping_model_types())} models, not {model_type}"
            )
    out = []
    for method in every:
        if method == "string":  # STRING shifts distances into the training length: it reaches at most 2L - W
            from posenc.remapping import remap_method

            try:
                remap_method("string", original=original, target=target)
            except ValueError as err:
                left_out["string"] = str(err).split(": expected ", 1)[-1]
                continue
        why = savable(method) if savable is not None else None
        if why:
            left_out[method] = why
            continue
        out.append(Candidate(method, factor, f"the paper's rule for {original} -> {target} tokens"))
        if method in VARIANTS:
            bigger = factor * VARIANTS[method]
            out.append(Candidate(method, bigger, f"the paper's rule set for {round(original * bigger)} tokens"))
    if not out:
        fail("methods", list(methods or every), f"at least one candidate for this model, target and save; left out: "
             f"{left_out}")
    return out, left_out


# ---------------------------------------------------------------------------------------------------------------------
# Screening


def ppl_past_of(rows: Sequence[Mapping[str, Any]], unit: tuple, length: int) -> float | None:
    for r in rows:
        if r["metric"] == "ppl_past" and r["length"] == length and model_of(r) == unit and r["status"] == "ok":
            return float(r["ppl"])
    return None


def ppl_measured(rows: Sequence[Mapping[str, Any]], target: int) -> set[tuple]:
    """The models the perplexity screen has measured at ``target``."""
    return {model_of(r) for r in rows if r["metric"] == "ppl" and r["length"] == target}


def broken(rows: Sequence[Mapping[str, Any]], units: Sequence[tuple], *, target: int) -> dict[tuple, str]:
    """The candidates whose perplexity past the original context at ``target`` is more than ``PPL_BREAK`` times the
    best candidate's (or not finite): unit -> why. They get no passkeys."""
    ppl = {u: ppl_past_of(rows, u, target) for u in units}
    finite = [p for p in ppl.values() if p is not None and math.isfinite(p)]
    if not finite:
        return {}
    best = min(finite)
    return {u: f"perplexity past L {'n/a' if p is None else f'{p:.3g}'} > {PPL_BREAK:g}x the best ({best:.3g})"
            for u, p in ppl.items() if p is None or not math.isfinite(p) or p > PPL_BREAK * best}


@dataclass(frozen=True)
class Screened:
    unit: tuple
    ppl_past: float | None
    passkey: Rate | None  # pooled over the screening cells, anytime-valid interval
    p_best: float | None  # posterior chance of being the best at the screening length
    kept: bool
    why: str


def screened(rows: Sequence[Mapping[str, Any]], units: Sequence[tuple], *, target: int, screen: int,
             broken_units: Mapping[tuple, str], kept: Sequence[tuple], p_best: Mapping[tuple, float],
             keep: int) -> list[Screened]:
    """Screening's verdict on each of ``units`` for the report: out by perplexity, or in or out of the credible set
    (``posenc.lab.extend.pick.racing.screen``)."""
    out = []
    for u in units:
        cells = [row_rate(r, anytime=True) for r in rows if r["metric"] == "passkey" and r["length"] == screen
                 and model_of(r) == u]
        rate = pool([c for c in cells if c is not None]) if cells else None
        if u in broken_units:
            why = broken_units[u]
        elif u in kept:
            why = "goes on: in the 98% credible set of the best"
        else:
            why = f"out: outside the 98% credible set of the best after {rate.n if rate else 0} keys"
        out.append(Screened(u, ppl_past_of(rows, u, target), rate, p_best.get(u), u in kept, why))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# The pick


@dataclass(frozen=True)
class Standing:
    """One raced model at the target."""

    unit: tuple
    estimate: float  # pooled rate, each cell weighing the same
    interval: tuple[float, float]  # its anytime-valid 95% interval
    n: int  # needles per cell
    by_metric: dict[str, Rate]  # each cell's rate, anytime-valid interval
    ppl_past: float | None
    serving: str
    active: bool  # still sampled when the race ended
    beaten_by: tuple | None  # a model shown better than it
    p_best: float  # posterior chance of the highest rate (among the methods)
    loss: float  # expected loss of picking it, in rate

    def text(self) -> str:
        low, high = self.interval
        return f"{100 * self.estimate:.0f}% [{100 * low:.0f}-{100 * high:.0f}] (n = {self.n} per cell)"


@dataclass(frozen=True)
class Outcome:
    pick: Standing
    runner_up: Standing | None
    shown: bool  # the pick is shown: better beyond noise than every other, or the cheapest shown within DELTA
    ended: str  # "decided", "cap" (the pick and its challenger have the cap), "deadline", "interrupted"
    reason: str
    costs: list[tuple[Standing, float, float, float]]  # cheaper methods: (it, pick - it, low, high)


def decide(standings: Sequence[Standing], verdict: Any, units: Sequence[tuple], name: Any, *, ended: str,
           savable: Callable[[str], str | None] | None = None) -> Outcome:
    """The pick from the race's last look (``posenc.lab.extend.stats.race.verdict`` over ``units``, the unpatched model
    among them), in words. ``savable(method) -> str | None``: why ``--save`` cannot write a method (a save added on
    resume): the pick is then the best estimate among those it can write, reported as such."""
    from posenc.lab.extend.stats.race import DELTA

    by_unit = {s.unit: s for s in standings}
    index = {u: i for i, u in enumerate(units)}
    methods = [s for s in standings if s.unit[0] != "none"]
    if not methods:
        fail("rows", [], "needle rates at the target for at least one method (a finished race)")
    pick = by_unit[units[int(verdict.pick[0])]]
    shown = bool(verdict.shown[0]) and ended == "decided"
    if savable is not None:
        writable = [s for s in methods if not savable(s.unit[0])]
        if not writable:
            fail("save", "--save", "a format one of the measured methods can be written in; "
                 + ", ".join(f"{name(s.unit)}: {savable(s.unit[0])}" for s in methods))
        if pick not in writable:
            pick, shown = max(writable, key=lambda s: (s.estimate, -SERVING[s.serving][0])), False
    i = index[pick.unit]
    low, high = verdict.low[0], verdict.high[0]
    others = sorted((s for s in methods if s is not pick), key=lambda s: -s.estimate)
    runner_up = others[0] if others else None
    costs = [(s, pick.estimate - s.estimate, float(low[i, index[s.unit]]), float(high[i, index[s.unit]]))
             for s in others if SERVING[s.serving][0] < SERVING[pick.serving][0]]
    where = SERVING[pick.serving][1]
    if shown and not any(s.active for s in methods if s is not pick):
        reason = (f"{name(pick.unit)} finds {pick.text()} of the needles at the target, better beyond noise than "
                  f"every other method raced (paired on the same needles); it is served as {where}")
    elif shown:
        reason = (f"{name(pick.unit)}, {pick.text()}, is shown within {DELTA:g} of every model still in the race "
                  f"and is the cheapest of them to serve: {where}")
    else:
        endings = {"cap": "the pick and its strongest challenger reached the cap", "deadline": "the deadline came",
                   "interrupted": "the run was interrupted"}
        why = endings.get(ended, "sampling ended")
        reason = (f"{name(pick.unit)} has the best estimate, {pick.text()}, but is not shown better than "
                  f"{', '.join(name(s.unit) for s in others if s.beaten_by is None) or 'the others'} ({why}); best "
                  f"with probability {pick.p_best:.2f}, expected loss {pick.loss:.3f} in rate; it is served as "
                  f"{where}")
        reason += _p_best_note(pick, max(methods, key=lambda s: s.p_best), name)
    for s, cost, lo, hi in costs:
        reason += (f"; {name(s.unit)} ({SERVING[s.serving][1].split(' (')[0]}) would cost {cost:+.2f} in rate "
                   f"[{lo:+.2f} to {hi:+.2f}]")
    reference = [u for u in units if u[0] == "none"]
    if reference:
        j = index[reference[0]]
        base = by_unit[reference[0]]
        if float(low[i, j]) > 0:
            reason += (f"; the unpatched model finds {base.text()}, shown below it: the method rescues "
                       "retrieval")
        else:
            reason += (f"; the unpatched model finds {base.text()}, not shown below it: that it rescues retrieval "
                       "at all is not shown at this n")
    if not pick.estimate:
        reason += ". No method found a needle at the target"
    return Outcome(pick, runner_up, shown, ended, reason, costs)


def _p_best_note(pick: Standing, top: Standing, name: Any) -> str:
    """Where another method has the higher P(best) than the best estimate: which, and why the two differ."""
    if top.p_best <= pick.p_best:
        return ""
    if pick.n < top.n:
        why = (f"with {pick.n} needles per cell against {top.n}, the uniform priors behind P(best) pull "
               f"{name(pick.unit)}'s posterior further toward 50%")
    elif pick.n > top.n:
        why = f"its posterior is wider (n = {top.n} per cell against {pick.n}): more chance of being the highest"
    else:
        why = "P(best) weighs each posterior's spread as well as its center"
    return (f"; {name(top.unit)} has the higher P(best), {top.p_best:.2f} ({why}); the pick is the best estimate, "
            "and neither is shown better than the other")
