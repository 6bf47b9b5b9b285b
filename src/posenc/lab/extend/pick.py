"""``--pick``'s rules: which methods compete, which survive screening, how many samples each may get, and which one
wins -- pure functions of settings and ``results.csv`` rows (``posenc.lab.extend.picking`` runs them).

The question: *this model was trained for L tokens; which method makes it work at T, and how sure is that?*

- Candidates (``candidates``): every training-free method of both families with its paper's parameters at the
  factor ``T / L`` -- frequency scalings (``linear``, ``ntk``, ``dynamic``, ``yarn``, ``llama3``) and remapping methods
  (``self_extend``, ``dca``, ``rerope``, ``leaky_rerope``, ``lm_infinite``; ``string`` where the target is within its
  reach of 2L - W, ``yarn+string`` at any target; ``dca_vllm``, what vLLM serves, on Qwen2/Qwen3; not
  ``streaming_llm``, ``NOT_CANDIDATES``) --
  plus the variants their papers offer as a setting: YaRN and Self-Extend set for twice the target (``VARIANTS``;
  YaRN's scale factor and Self-Extend's group size grow with it). LongRoPE is not a candidate: its
  per-frequency factors come from a search, not a rule. With ``--save`` only what that format can carry competes.
- Screening (``broken``, ``survivors``): each candidate's perplexity past L at T (one forward); out if more than
  ``PPL_BREAK`` times the best one's (the method breaks the language model). The others get one round of passkeys at
  a shorter length between L and T; out if beyond noise below the best one's; the rest ranked (passkey, then
  perplexity) and the first ``KEEP`` go on.
- Racing at T (``posenc.lab.extend.sampling``): the survivors and the unpatched model get needle samples in rounds;
  a cell stops once its Wilson interval is disjoint from the best's or narrow, so samples go to the cells still in
  contention (successive halving by evidence, not by a fixed fraction). ``caps`` turns a time budget into the most
  samples a cell may get.
- The pick (``choose``): the highest pooled needle rate at T; when others are within noise of it, the cheapest to
  serve among them (``SERVING``: a RoPE config every engine reads, then one transformers and vLLM read, then what
  only vLLM/SGLang serve, then a run-time patch), then the lower perplexity past L.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from posenc._checks import fail
from posenc.lab.extend.rates import RULER_PREFIX, Rate, is_rate_metric, model_of, pool, row_rate

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
#: Screening: at most this many candidates go on to the race at T.
KEEP = 4
#: Samples per needle cell at T when no budget is given (the issue's n >= 20), and the most a budget may buy.
DEFAULT_CAP = 20
MAX_CAP = 200

#: A remapping candidate's time per sample relative to a frequency method's, for the plan's estimate. Measured on
#: SmolLM2-135M, bfloat16, an idle 2-core AMD EPYC, 2026-11-26, at 8,192 tokens: Self-Extend's prefill 1.35x YaRN's
#: (32.9 vs 24.3 s), a passkey generate 1.56x (36.7 vs 23.5 s); DCA's attention alone 1.3-2.0x (BENCHMARKS.md).
REMAP_COST = 1.5

#: How a saved pick is served, cheapest first: (tier, where it runs).
SERVING = {
    "config": (0, "a RoPE config every engine reads (transformers, vLLM, SGLang, llama.cpp via GGUF)"),
    "dynamic": (1, "a RoPE config transformers and vLLM read (no GGUF key; transformers' cached decoding is stale)"),
    "dca_vllm": (2, "a dual_chunk_attention_config vLLM and SGLang serve (transformers loads it unextended)"),
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


def cost_factor(method: str) -> float:
    """A candidate's time per sample relative to a frequency method's (``REMAP_COST`` for remapping methods)."""
    return REMAP_COST if method in REMAP_CANDIDATES or method in ("dca_vllm", *NOT_CANDIDATES) else 1.0


def parse_target(text: str | int, original: int | None) -> int:
    """``--target``: tokens (``32768``) or a multiple of the original context (``4x``, ``1.5x``; rounded as
    ``--lengths`` multiples are, ``config.resolve_length``), beyond the original context."""
    from posenc.lab.extend.config import length_form, resolve_length

    form = length_form("target", text)
    if isinstance(form, str) and original is None:
        fail("target", text, "a length in tokens (the model's original context is unknown, so no multiple)")
    length = resolve_length("target", form, original) if isinstance(form, str) else form
    if original is not None and length <= original:
        fail("target", text, f"a length beyond the original context of {original} tokens")
    return length


def parse_budget(text: str | float | None) -> float | None:
    """``--budget``: seconds (``5400``), or ``90m``, ``1.5h``, ``2h30m``, ``45s``; None: no budget."""
    if text is None:
        return None
    value = str(text).strip().lower()
    parts = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?", value)
    if not value or not parts or not any(parts.groups()):
        fail("budget", text, "a time: seconds (5400) or 90m, 1.5h, 2h30m")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in parts.groups())
    total = 3600 * hours + 60 * minutes + seconds
    if total <= 0:
        fail("budget", text, "a time above zero")
    return total


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


def candidates(
    original: int, target: int, *, model_type: str | None, remapping: bool, methods: Sequence[str] | None = None,
    savable: Any = None,
) -> tuple[list[Candidate], dict[str, str]]:
    """The methods that compete, and those left out with why.

    ``remapping``: whether the model takes remapping methods (``posenc.hf._remap_patch.REMAP_MODEL_TYPES``).
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
            why = "per-frequency factors come from a search (give them to posenc.hf.extend_context instead)"
            fail("methods", list(methods), f"training-free methods with a rule for their parameters: longrope's {why}")
        every = [m for m in every if m in methods]
    else:
        left_out["longrope"] = "its per-frequency factors come from a search, not from a rule"
        if remapping:
            left_out.update(NOT_CANDIDATES)
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
             f"{left_out}")  # fmt: skip
    return out, left_out


# ---------------------------------------------------------------------------------------------------------------------
# Screening


@dataclass(frozen=True)
class Screened:
    unit: tuple
    ppl_past: float | None
    passkey: Rate | None
    kept: bool
    why: str


def _ppl_past(rows: Sequence[Mapping[str, Any]], unit: tuple, length: int) -> float | None:
    for r in rows:
        if r["metric"] == "ppl_past" and r["length"] == length and model_of(r) == unit and r["status"] == "ok":
            return float(r["ppl"])
    return None


def _passkey(rows: Sequence[Mapping[str, Any]], unit: tuple, length: int) -> Rate | None:
    return pool([row_rate(r) for r in rows if r["metric"] == "passkey" and r["length"] == length
                 and model_of(r) == unit])  # fmt: skip


def broken(rows: Sequence[Mapping[str, Any]], units: Sequence[tuple], *, target: int) -> dict[tuple, str]:
    """The candidates whose perplexity past the original context at ``target`` is more than ``PPL_BREAK`` times the
    best candidate's (or not finite): unit -> why. They get no passkeys."""
    ppl = {u: _ppl_past(rows, u, target) for u in units}
    finite = [p for p in ppl.values() if p is not None and math.isfinite(p)]
    if not finite:
        return {}
    best = min(finite)
    return {u: f"perplexity past L {'n/a' if p is None else f'{p:.3g}'} > {PPL_BREAK:g}x the best ({best:.3g})"
            for u, p in ppl.items() if p is None or not math.isfinite(p) or p > PPL_BREAK * best}  # fmt: skip


def survivors(rows: Sequence[Mapping[str, Any]], units: Sequence[tuple], *, target: int, screen: int,
              keep: int = KEEP) -> list[Screened]:  # fmt: skip
    """Screening's verdict on each of ``units`` (in order) from the screening study's rows: perplexity past the
    original context at ``target`` and passkey rates at ``screen``. Every candidate must have been measured."""
    ppl = {u: _ppl_past(rows, u, target) for u in units}
    keys = {u: _passkey(rows, u, screen) for u in units}
    missing = [u for u in units if ppl[u] is None and keys[u] is None]
    if missing:
        fail("rows", [list(u) for u in missing], "screening rows for every candidate (a finished screening study)")
    verdict = broken(rows, units, target=target)
    rated = [keys[u] for u in units if keys[u] is not None and u not in verdict]
    best_key = max(rated, key=lambda r: r.value) if rated else None
    for u in units:
        k = keys[u]
        if u not in verdict and best_key is not None and k is not None and k.beyond_noise(best_key) \
                and k.value < best_key.value:
            verdict[u] = f"passkey {k.text()} beyond noise below the best ({best_key.text()})"
    rank_key = lambda u: (-(keys[u].value if keys[u] else 0.0), ppl[u] if ppl[u] is not None else math.inf)  # noqa: E731
    order = sorted((u for u in units if u not in verdict), key=rank_key)
    for rank, u in enumerate(order):
        if rank >= keep:
            verdict[u] = f"ranked {rank + 1} of {len(order)} in screening; {keep} go on"
    return [Screened(u, ppl[u], keys[u], u not in verdict, verdict.get(u, "goes on")) for u in units]


# ---------------------------------------------------------------------------------------------------------------------
# Budget


def caps(budget: float | None, *, fixed: float, per_model: float, models: float, cells: int, sample: float,
         floor: int) -> int:  # fmt: skip
    """The most samples a needle cell at T may get so that the whole pick fits ``budget`` seconds when every cell
    runs to its cap: ``fixed`` seconds (screening, fine-tuning), ``per_model`` seconds for each of ``models`` (in
    plain-forward units: a remapping model counts ``REMAP_COST``; its
    perplexity forward), ``cells`` needle cells per model, ``sample`` seconds per sample. A multiple of ``floor``
    (one round), at most ``MAX_CAP``; no budget: ``DEFAULT_CAP``.

    Raises:
        ValueError: a budget that does not buy one round per cell, naming the budget that would."""
    if budget is None:
        return DEFAULT_CAP
    left = budget - fixed - models * per_model
    n = int(left / (models * cells * sample) // floor * floor) if left > 0 else 0
    if n < floor:
        need = fixed + models * (per_model + cells * floor * sample)
        what = f"screening and one round of {floor} samples per cell at the target"
        fail("budget", f"{budget:.0f} s", f"at least {math.ceil(need)} s for this plan ({what}), on this machine's "
             "estimated speed; or fewer --methods")  # fmt: skip
    return min(n, MAX_CAP)


# ---------------------------------------------------------------------------------------------------------------------
# The pick


@dataclass(frozen=True)
class Standing:
    unit: tuple
    needles: Rate | None  # every needle cell at T pooled (passkey depths, RULER tasks), each weighing the same
    by_metric: dict[str, Rate | None]
    ppl_past: float | None
    serving: str


def standings(rows: Sequence[Mapping[str, Any]], units: Sequence[tuple], *, target: int,
              model_type: str | None) -> list[Standing]:  # fmt: skip
    """Each of ``units`` at ``target`` from the race's rows, best first: pooled needle rate, then the cheaper to
    serve, then the lower perplexity past L."""
    out = []
    for u in units:
        cells = [r for r in rows if model_of(r) == u and r["length"] == target and is_rate_metric(r["metric"])]
        metrics = sorted({r["metric"] for r in cells}, key=lambda m: (m.startswith(RULER_PREFIX), m))
        by = {m: pool([row_rate(r) for r in cells if r["metric"] == m]) for m in metrics}
        out.append(Standing(u, pool(list(by.values())), by, _ppl_past(rows, u, target), serving(u[0], model_type)))
    return sorted(out, key=_rank_key)


def _rank_key(s: Standing) -> tuple:
    return (-(s.needles.value if s.needles else -1.0), SERVING[s.serving][0],
            s.ppl_past if s.ppl_past is not None else math.inf)  # fmt: skip


@dataclass(frozen=True)
class Pick:
    pick: Standing
    runner_up: Standing | None
    tied: list[Standing]  # within noise of the best rate (the best included)
    reason: str


def choose(ranked: Sequence[Standing], name: Any, savable: Any = None) -> Pick:
    """The pick among the methods (the unpatched model is ranked but never picked); ``name(unit) -> str`` labels
    them in the reason. ``savable(method) -> str | None``: why ``--save`` cannot write a method; only those it can
    are picked (a save added when resuming a pick measured without one)."""
    methods = [s for s in ranked if s.unit[0] != "none" and s.needles is not None]
    if savable is not None:
        unsaved = [s for s in methods if savable(s.unit[0])]
        methods = [s for s in methods if not savable(s.unit[0])]
        if not methods:
            fail("save", "--save", f"a format one of the measured methods can be written in; "
                 f"{', '.join(f'{name(s.unit)}: {savable(s.unit[0])}' for s in unsaved)}")  # fmt: skip
    if not methods:
        fail("rows", [], "needle rates at the target for at least one method (a finished race)")
    best = max(methods, key=lambda s: s.needles.value)
    tied = [s for s in methods if not s.needles.beyond_noise(best.needles)]
    pick = min(tied, key=lambda s: (SERVING[s.serving][0], -s.needles.value,
                                    s.ppl_past if s.ppl_past is not None else math.inf))  # fmt: skip
    others = [s for s in methods if s is not pick]
    runner_up = others[0] if others else None
    where = SERVING[pick.serving][1]
    if len(tied) == 1:
        beaten = ", ".join(name(s.unit) for s in others) or "no other method"
        reason = (f"{name(pick.unit)} finds {pick.needles.text()} of the needles at the target, beyond noise above "
                  f"every other method ({beaten}); it is served as {where}")  # fmt: skip
    else:
        names = ", ".join(f"{name(s.unit)} {s.needles.text()}" for s in tied)
        reason = (f"{len(tied)} methods are within noise of the best needle rate ({names}); {name(pick.unit)} is "
                  f"the cheapest of them to serve: {where}")  # fmt: skip
        if pick is not best:
            reason += f" (the highest point estimate, {name(best.unit)}, is not beyond noise of it)"
    reason += _versus_unpatched(pick, [s for s in ranked if s.unit[0] == "none"])
    return Pick(pick, runner_up, tied, reason)


def _versus_unpatched(pick: Standing, unpatched: list[Standing]) -> str:
    """Whether the pick rescues retrieval at all: its rate against the unpatched model's."""
    if not pick.needles.hits:
        return ". No method found a needle at the target: nothing here rescues retrieval at this length"
    if not unpatched or unpatched[0].needles is None:
        return ""
    base = unpatched[0].needles
    if pick.needles.beyond_noise(base) and pick.needles.value > base.value:
        return f"; the unpatched model finds {base.text()}, beyond noise below it: the method rescues retrieval"
    return (f"; the unpatched model finds {base.text()}, within noise of it: that it rescues retrieval at all is not "
            "shown at this n")  # fmt: skip
