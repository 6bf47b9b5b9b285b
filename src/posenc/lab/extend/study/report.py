"""What ``posenc extend`` says from ``results.csv`` alone: the tables, the findings and ``report.md`` (never by
rerunning a model); ``finish`` draws the figures (``study.plot``) beside them."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posenc.lab.common.files import write_text_atomic
from posenc.lab.common.report import config_and_environment, duration, environment, wide_console
from posenc.lab.extend.needles.shared_prefix import LENGTH_DEPENDENT_REMAP
from posenc.lab.extend.settings import composed
from posenc.lab.extend.settings.config import DROPE_ZERO_SHOT, ExtendConfig, drops, filled, unit_factors
from posenc.lab.extend.settings.labels import label
from posenc.lab.extend.stats.rates import (
    RULER_PREFIX,
    UNPATCHED,
    Rate,
    is_rate_metric,
    model_of,
    pool,
    rates,
    ruler_task,
    unit_order,
)
from posenc.lab.extend.stats.sampling import rule_text
from posenc.lab.extend.study.plot import curves, draw, mean

#: Patches whose attention depends on the sequence's length: cached generation is not the full forward there.
LENGTH_DEPENDENT = {"dynamic", *LENGTH_DEPENDENT_REMAP}

if TYPE_CHECKING:
    from posenc.lab.extend.targets.base import Target


def table(rows: Sequence[Mapping[str, Any]], metric: str) -> tuple[list[str], list[list[str]]]:
    """Headers and cells: one line per method and factor, one column per length; passkey and RULER cells are rates
    (``3/4 75% [30-95]``: hits of n pooled over depths, the 95% Wilson interval in percent)."""
    original = next((r["original_len"] for r in rows if r["original_len"]), None)
    lengths = sorted({r["length"] for r in rows if r["metric"] == metric})
    headers = ["method"] + [
        f"{n} (original)" if n == original else f"{n} ({n / original:g}x)" if original else str(n) for n in lengths
    ]
    cells = []
    if is_rate_metric(metric):
        for unit, by_rate in rates(rows, metric).items():
            cells.append([label(*unit)] + [
                "-" if n not in by_rate else "n/a" if (r := by_rate[n]) is None else r.text() for n in lengths
            ])
        return headers, cells
    for unit, by_length in curves(rows, metric).items():
        line = [label(*unit)]
        for n in lengths:
            value = mean(by_length.get(n, []))
            if n not in by_length:
                line.append("-")
            elif value is None:
                line.append("n/a")
            else:
                line.append(f"{100 * value:.0f}%" if metric == "passkey" else f"{value:.2f}")
        cells.append(line)
    return headers, cells


def counts(rows: Sequence[Mapping[str, Any]], metric: str, depths: Sequence[float]) -> tuple[list, list[list[str]]]:
    """Headers and cells of the samples each cell got: one line per model, one column per length, ``n`` per depth
    joined by ``/`` (``-``: not measured; ``n/a``: the length is too short for the task)."""
    headers, _ = table(rows, metric)
    lengths = sorted({r["length"] for r in rows if r["metric"] == metric})
    n: dict[tuple, dict[tuple, int]] = {}
    for r in rows:
        if r["metric"] == metric:
            n.setdefault(model_of(r), {})[(r["length"], r["depth"])] = int(r["n"] or 0)
    cells = []
    for unit in sorted(n, key=unit_order):
        by = n[unit]
        line = [label(*unit)]
        for length in lengths:
            got = [by.get((length, d)) for d in depths]
            line.append("n/a" if all(n == 0 for n in got) else "/".join("-" if n is None else str(n) for n in got))
        cells.append(line)
    return headers, cells


def format_counts(rows: Sequence[Mapping[str, Any]], metric: str, depths: Sequence[float]) -> str:
    return _markdown(*counts(rows, metric, depths))


def interval_name(cfg: ExtendConfig) -> str:
    """Which 95% interval a study's rates carry: Wilson's at fixed counts, an anytime-valid one where rounds stopped
    each cell once clear (``posenc.lab.extend.stats.confidence.rate_interval``: valid wherever a cell stopped)."""
    return "anytime-valid" if cfg.adaptive else "Wilson"


def format_table(rows: Sequence[Mapping[str, Any]], metric: str) -> str:
    return _markdown(*table(rows, metric))


def _markdown(headers: list[str], cells: list[list[str]]) -> str:
    rule = "|:--|" + "--:|" * (len(headers) - 1)
    return "\n".join(["| " + " | ".join(headers) + " |", rule, *("| " + " | ".join(c) + " |" for c in cells)]) + "\n"


def print_table(rows: Sequence[Mapping[str, Any]], metric: str) -> None:
    from rich.table import Table

    headers, cells = table(rows, metric)
    title = {
        "ppl": "Perplexity by length (lower is better)",
        "ppl_past": "Perplexity past the original context only (lower is better)",
        "passkey": "Passkey keys found by length, pooled over depths: hits/n, %, 95% interval (higher is better)",
    }.get(metric) or f"RULER {ruler_task(metric)} (lm-eval) by length: score hits/n, %, 95% interval"
    out = Table(title=title)
    for j, h in enumerate(headers):
        out.add_column(h, justify="left" if j == 0 else "right", style="cyan" if j == 0 else None)
    for line in cells:
        out.add_row(*line)
    console = wide_console()
    console.width = max(console.width, 100)
    console.print(out)


def _passkey_advice(
    within: float | None, original: int, cfg: ExtendConfig | None, kind: str, *, tried_within: bool = False
) -> str:
    """What to change when no method retrieved a key past the original length, given the settings that were used
    (never advice the user already followed). ``tried_within``: a length up to the original was in the plan."""
    units = "bytes" if kind == "lab" else "tokens"
    if within is None:
        if tried_within:  # measured n/a: the prompt does not fit in the original context
            return (
                f"the passkey prompt does not fit in the original {original} {units}, so whether the model retrieves "
                "at all is unknown: test a model with a longer original context"
            )
        return (
            f"retrieval was not measured within the original {original} {units}, so whether the model retrieves at "
            f"all is unknown: add a length up to {original} to --lengths"
        )
    if within == 0:
        if cfg is not None and cfg.task == "passkey":
            lower = " or lower --train-len" if cfg.is_new else ""
            return (
                f"the model did not learn retrieval at its training length {original} in {cfg.train_steps} steps: "
                f"raise --train-steps (e.g. {max(3000, 3 * cfg.train_steps)}){lower}"
            )
        first = "the model cannot retrieve even at its original length, so there is nothing to rescue"
        return f"{first}; `--task passkey` trains retrieval first" if kind == "lab" else first
    if cfg is not None and cfg.finetune_steps:
        return f"not even after {cfg.finetune_steps} fine-tuning steps at the target length: raise --finetune-steps"
    return "try `--finetune-steps`: Position Interpolation is meant to be followed by brief fine-tuning"


def findings_for(
    rows: Sequence[Mapping[str, Any]], original: int, cfg: ExtendConfig | None = None, *, kind: str = "lab"
) -> list[str]:
    """Plain statements read off the table: each method against the unpatched model past the original length.

    ``cfg`` (the settings used) and ``kind`` (``lab`` or ``hf``, the target's) make the advice fit what was run."""
    lines = []
    units = "bytes" if kind == "lab" else "tokens"  # the lab's models read bytes
    ppl, keys = curves(rows, "ppl"), rates(rows, "passkey")
    if ppl:
        far = max(n for by in ppl.values() for n in by)
        base = ppl.get(UNPATCHED, {})
        inside = [n for by in ppl.values() for n in by if n <= original]
        ref = max(inside) if inside else original  # the original length, else the longest measured within it
        where = f"the original {original} {units}" if ref == original else f"{ref} (within the original {original})"
        at_orig, at_far = mean(base.get(ref, [])), mean(base.get(far, []))
        if at_orig is not None and at_far is not None:
            lines.append(
                f"- Unpatched: perplexity {at_orig:.2f} at {where} -> {at_far:.2f} at {far} ({far / original:g}x)."
            )
        scored = {
            u: v for u, by in ppl.items() if (u[0] != "none" or u[2]) and (v := mean(by.get(far, []))) is not None
        }
        if scored and not base:  # --no-baseline: the methods against each other only
            best = min(scored, key=scored.__getitem__)
            lines.append(
                f"- At {far} {units} the best is {label(*best)} with perplexity {scored[best]:.2f} (the unpatched "
                "model was left out of this study: --no-baseline)."
            )
        elif scored and at_far is not None:
            best = min(scored, key=scored.__getitem__)
            rescued = sorted(label(*u) for u, v in scored.items() if v < at_far)
            lines.append(
                f"- At {far} {units} the best is {label(*best)} with perplexity {scored[best]:.2f} "
                f"({scored[best] / at_far:.2f}x the unpatched {at_far:.2f}); lower than unpatched there: "
                f"{', '.join(rescued) or 'none of them'}."
            )
        for u, by in ppl.items():
            if u[0] == "none" and not u[2]:
                continue
            near, long = mean(by.get(ref, [])), mean(by.get(far, []))
            if near is not None and long is not None and not base:
                lines.append(f"- {label(*u)}: {near:.2f} at {ref}, {long:.2f} at {far}.")
            elif near is not None and long is not None and at_orig is not None:
                lines.append(
                    f"- {label(*u)}: {near:.2f} at {ref} ({near / at_orig:.2f}x unpatched there), {long:.2f} at {far}."
                )
        beyond = {u: mean(by.get(far, [])) for u, by in curves(rows, "ppl_past").items()}
        beyond = {u: v for u, v in beyond.items() if v is not None}
        if beyond:
            lines.append(
                f"- Past the original {original} {units} only (targets at positions {original}-{far - 1} of "
                f"{far}-{units[:-1]} windows): " + ", ".join(f"{label(*u)} {v:.2f}" for u, v in beyond.items()) + "."
            )
    if keys:
        lines += _passkey_findings(rows, original, cfg, kind)
    lines += _ruler_findings(rows, original, units)
    return lines or ["- Nothing measured."]


def _split(by: Mapping[int, Rate | None], original: int, past: bool) -> Rate | None:
    """The rate pooled over the lengths within (``past`` False) or past the original context."""
    return pool([r for n, r in by.items() if (n > original) == past])


def _best(at: Mapping[tuple, Rate]) -> tuple[tuple, list[str]]:
    """The unit with the highest rate, and the labels of the others within noise of it."""
    best = max(at, key=lambda u: at[u].value)
    return best, [label(*u) for u, r in at.items() if u != best and not r.beyond_noise(at[best])]


def _versus(rate: Rate, base: Rate | None, name: str = "the unpatched model") -> str:
    if base is None:
        return ""
    if not rate.beyond_noise(base):
        return f" (within noise of {name})"
    return f" ({'above' if rate.value > base.value else 'below'} {name} beyond noise)"


def _passkey_findings(
    rows: Sequence[Mapping[str, Any]], original: int, cfg: ExtendConfig | None, kind: str
) -> list[str]:
    """Passkey as rates: hits of n pooled over depths and lengths within / past the original context, each with its
    Wilson 95% interval; a difference is called real only where the intervals are disjoint."""
    keys = rates(rows, "passkey")
    base = keys.get(UNPATCHED, {})
    within, beyond = _split(base, original, False), _split(base, original, True)
    lines = []
    if within is not None or beyond is not None:
        lines.append(
            "- Passkey, unpatched (keys found, pooled over depths; 95% interval): "
            + (f"{within.text()} within the original length" if within is not None else "not measured within")
            + (f", {beyond.text()} past it." if beyond is not None else ".")
        )
    patched = {u: by for u, by in keys.items() if u[0] != "none" or u[2]}
    kept = {u: r for u, by in patched.items() if (r := _split(by, original, False)) is not None}
    past = {u: r for u, by in patched.items() if (r := _split(by, original, True)) is not None}
    if kept and (within is not None or not base):  # without a baseline (--no-baseline): the rates alone
        lines.append(
            "- Passkey within the original length after patching: "
            + ", ".join(f"{label(*u)} {r.text()}{_versus(r, within)}" for u, r in kept.items())
            + "."
        )
    if past and all(r.hits == 0 for r in past.values()):
        tried = any(r["metric"] == "passkey" and r["length"] <= original for r in rows)
        why = _passkey_advice(None if within is None else within.value, original, cfg, kind, tried_within=tried)
        if not base and not any(r["method"] == "none" for r in rows):
            why = ("the unpatched model was left out (--no-baseline), so whether the model retrieves at all is not "
                   "in this study")
        lines.append(f"- Passkey past the original length: no method retrieved a single key ({why}).")
    elif past:
        best, tied = _best(past)
        lines.append(
            f"- Passkey past the original length (pooled over lengths and depths): best {label(*best)} with "
            f"{past[best].text()}{_versus(past[best], beyond)}"
            + "".join(f"; {label(*u)} {r.text()}{_versus(r, beyond)}" for u, r in past.items() if u != best)
            + (f". Within noise of the best: {', '.join(tied)}." if tied else ".")
        )
    return lines


def _ruler_findings(rows: Sequence[Mapping[str, Any]], original: int, units: str) -> list[str]:
    """Per RULER task, each model at the longest length and within the original context, against the unpatched
    model; then whether RULER, passkey and perplexity name the same best method at the longest length."""
    lines = []
    metrics = [m for m in dict.fromkeys(r["metric"] for r in rows) if m.startswith(RULER_PREFIX)]
    for metric in metrics:
        task = ruler_task(metric)
        groups = rates(rows, metric)
        lengths = sorted({n for by in groups.values() for n, r in by.items() if r is not None})
        if not lengths:
            continue
        base = groups.get(UNPATCHED, {})
        for n in sorted({lengths[-1], *[m for m in lengths if m <= original][-1:]}, reverse=True):
            where = f"past the original {original} {units}" if n > original else "within the original context"
            scored = [(u, r) for u, by in groups.items() if (r := by.get(n)) is not None]
            lines.append(
                f"- RULER {task} at {n} {units} ({where}): "
                + ", ".join(
                    f"{label(*u)} {r.text()}" + ("" if u == UNPATCHED else _versus(r, base.get(n))) for u, r in scored
                )
                + "."
            )
    far = max((r["length"] for r in rows if is_rate_metric(r["metric"]) or r["metric"] == "ppl"), default=None)
    if metrics and far is not None and far > original:
        lines += _agreement(rows, metrics, far, units)
    return lines


def _agreement(rows: Sequence[Mapping[str, Any]], metrics: Sequence[str], far: int, units: str) -> list[str]:
    """Which method each measure ranks first at ``far`` (and which are within noise of it), and whether they agree.
    A retrieval measure on which nothing scored names no best."""
    bests: dict[str, tuple[str, list[str]] | None] = {}  # measure -> (best, others within noise of it) or None
    for metric in [*metrics, "passkey"]:
        at = {u: r for u, by in rates(rows, metric).items() if (r := by.get(far)) is not None}
        if at:
            best, tied = _best(at)
            name = "passkey" if metric == "passkey" else f"RULER {ruler_task(metric)}"
            bests[name] = (label(*best), tied) if at[best].hits > 0 else None
    ppl = {u: v for u, by in curves(rows, "ppl").items() if (v := mean(by.get(far, []))) is not None}
    if ppl:
        bests["perplexity"] = (label(*min(ppl, key=ppl.__getitem__)), [])
    named = "; ".join(
        f"{m}: " + ("nothing found" if b is None else b[0] + (f" (within noise of {', '.join(b[1])})" if b[1] else ""))
        for m, b in bests.items()
    )
    ranked = {m: b for m, b in bests.items() if b is not None}
    if len(ranked) < 2:
        return [f"- Best method at {far} {units} by each measure: {named}."] if len(bests) > 1 else []
    winners = {b[0] for b in ranked.values()}
    if len(winners) == 1:
        verdict = f"they agree on {winners.pop()}"
    else:
        noisy = [m for m, b in ranked.items() if b[1]]
        verdict = "they disagree" + (
            f" (where {', '.join(noisy)} cannot tell the best apart from others)" if noisy else ""
        )
    return [f"- Best method at {far} {units} by each measure: {named} — {verdict}."]


def write_report(
    out: Path,
    rows: Sequence[Mapping[str, Any]],
    cfg: ExtendConfig,
    target: Target,
    described: Mapping[str, Any],
    findings: Sequence[str],
    seconds: float,
    resumed: int = 0,
    saved: Path | None = None,
) -> Path:
    """``OUT/report.md``. ``saved``: the folder or GGUF file ``run_extend(save=...)`` wrote this run (the RULER
    section's ``lm_eval`` commands then name that folder instead of a ``DIR`` placeholder)."""
    env = environment(target.device)
    original = target.original_len
    unit = unit_of(target)
    baseline = "`none` is the model as trained. " if any(r["method"] == "none" for r in rows) else (
        "the unpatched model was left out (`--no-baseline`). ")
    lines = [
        "# posenc extend: context extension",
        "",
        f"Model: {target.name} in {precision_text(cfg.dtype, target.kind)}, original context {original} {unit}s. "
        "Each method patched at factors "
        f"{', '.join(f'{f:g}' for f in filled(cfg.factors, 'factors'))}"
        + (" (drope once: it has no factor)" if any(drops(m) for m in filled(cfg.methods, 'methods')) else "")
        + " and measured at "
        f"{', '.join(map(str, sorted({r['length'] for r in rows})))} {unit}s; {baseline}"
        f"Time taken: {duration(seconds)}"
        + (f" by this run, which resumed a study with {resumed} measurements already made." if resumed else "."),
        "",
        f"Layers changed by each patch: {target.layers_note}.",
        "",
    ]
    dropped = {r["finetune_steps"] for r in rows if drops(r["method"])}
    if dropped:
        how = "posenc.hf.extend_context(model, 'drope')"
        if target.kind == "lab":
            how = "model.set_encoding(posenc.build('nope'))"
        text = f"DroPE (`drope`): RoPE dropped from every layer (`{how}`)."
        tuned = sorted(s for s in dropped if s)
        if tuned and trains_on_passkey(cfg, target):
            text += (
                f" `drope +ft{tuned[0]}` is it recalibrated on the task the model was trained on, not as its authors "
                f"do (SakanaAI/DroPE: the plain LM loss on text): every parameter, {PASSKEY_ROWS}, within the "
                f"original context, for {tuned[0]} steps."
            )
        elif tuned:
            window = cfg.finetune_window or original
            text += (
                f" `drope +ft{tuned[0]}` is it recalibrated as its authors do (SakanaAI/DroPE): the plain LM loss "
                f"on every parameter in {window}-{unit} windows at plain positions, within the original context, "
                f"for {tuned[0]} steps (theirs: billions of tokens)."
            )
        if 0 in dropped:
            text += f" Note: {DROPE_ZERO_SHOT}."
        lines += [text, ""]
    notes = getattr(target, "remap_notes", {})
    if notes:
        lines += [
            "Remapping methods (every layer's attention; the rotary module returns the identity), with the "
            "parameters their papers' rules give for the original context and the factor (overridable through "
            "`posenc.hf.extend_context`): " + "; ".join(f"{m}: `{text}`" for m, text in notes.items()) + ".",
            "",
        ]
    generated = {r["method"] for r in rows if r["metric"] == "passkey" or r["metric"].startswith("ruler")}
    stale = sorted({m for m in generated if set(composed.parts(m)) & LENGTH_DEPENDENT})
    if stale and target.kind != "lab":
        lines += [
            f"Answers (passkey, RULER) of {', '.join(stale)} are generated with the KV cache, and these patches "
            "depend on the sequence's length (dynamic NTK's frequencies, DCA's logit factor): the cached keys follow "
            "each step's length, but the earlier tokens' hidden states keep the length of the step that computed "
            "them, so this is each method with a KV cache (for dynamic NTK as YaRN, section 3.3, defines it), not "
            "the full forward at each length (`posenc.hf.CacheStaleWarning`, not printed during the study). The "
            "measurement stands as what a server with a KV cache runs.",
            "",
        ]
    if target.kind != "lab" and any(r["length"] > r["original_len"] * r["factor"] for r in rows
                                    if r["method"] not in ("none", "dynamic") and not drops(r["method"])):
        lines += [
            "Some lengths are past the context a patch was derived for (its factor x the original context; "
            "`posenc.hf.ReachExceededWarning`, not printed during the study): those rows measure each method beyond "
            "its own reach, as the study asks.",
            "",
        ]
    if any(r["metric"] == "ppl" for r in rows):
        corpus = cfg.corpus or "the Python standard library"
        lines += [
            "## Perplexity",
            "",
            f"Held-out perplexity per {unit} on {corpus} by evaluation length (non-overlapping windows, up to "
            f"{cfg.eval_tokens} {unit}s scored per length; lower is better). `-`: not measured; `n/a`: not enough "
            "text. All numbers: [results.csv](results.csv).",
            "",
            format_table(rows, "ppl"),
        ]
        if (out / "extend.png").is_file():
            lines += ["![perplexity by length](extend.png)", ""]
    if any(r["metric"] == "ppl_past" for r in rows):
        lines += [
            "### Past the original context",
            "",
            f"The same forwards scored only where the model has never been: targets predicted at positions "
            f">= {original} in each window (metric `ppl_past`). A method that keeps the whole-window perplexity "
            "low only thanks to the first positions shows here.",
            "",
            format_table(rows, "ppl_past"),
        ]
    if any(r["metric"] == "passkey" for r in rows):
        depths = filled(cfg.depths, "depths")
        lines += [
            "## Passkey retrieval",
            "",
            f"Keys found (exact match) of keys tried, pooled over depths "
            f"{', '.join(f'{d:g}' for d in depths)} (Mohtashami & Jaggi 2023): `hits/n rate "
            f"[95% {interval_name(cfg)} interval]`. `n/a`: the length is shorter than the prompt "
            f"({target.min_passkey} {unit}s). The heatmaps "
            "give every depth; two rates differ beyond noise only where their intervals are disjoint. Keys: "
            f"{rule_text(cfg, 'keys', filled(cfg.trials, 'trials'))}; a cell is a model at one length and depth.",
            "",
            format_table(rows, "passkey"),
        ]
        if cfg.adaptive:
            lines += [
                f"Keys tried per cell (n at depths {', '.join(f'{d:g}' for d in depths)}, in that order). Where "
                "a model's depths got different n, its pooled rate above is the mean of its depths' rates, with "
                "Kish's effective n for equal weights (k^2 / sum 1/n_i), so no depth counts more for having taken "
                "more keys:",
                "",
                format_counts(rows, "passkey", depths),
            ]
        if (out / "passkey.png").is_file():
            lines += ["![passkey keys found by length and depth](passkey.png)", ""]
    ruler_metrics = [m for m in dict.fromkeys(r["metric"] for r in rows) if m.startswith(RULER_PREFIX)]
    if ruler_metrics:
        lines += _ruler_section(rows, ruler_metrics, cfg, target, saved)
    if (out / "rates.png").is_file():
        lines += ["![retrieval rates by length with 95% intervals](rates.png)", ""]
    lines += _finetune_section(out, cfg, target)
    lines += ["## Findings", "", *findings, "", "## Patches applied", ""]
    lines += [f"- `{label}`: `{json.dumps(d, default=str)}`" for label, d in described.items()] or ["- (none this run)"]
    lines += ["", *config_and_environment({**cfg.to_dict(), "original_len": original}, env, seconds)]
    return write_text_atomic(out / "report.md", "\n".join(lines))


#: What a lab model studied on the passkey task is fine-tuned on (``LabTarget.finetune``: ``passkey.passkey_batch``).
PASSKEY_ROWS = (
    "passkey rows in windows of the target length (filler, the needle, the question; the loss on the key's five "
    "digits only)"
)


def trains_on_passkey(cfg: ExtendConfig, target: Target) -> bool:
    """Whether the fine-tuned models learned the passkey task rather than text: a lab model studied with
    ``--task passkey`` is fine-tuned on that task's rows (``LabTarget.finetune``); a pretrained model reads text."""
    return target.kind == "lab" and cfg.task == "passkey"


def _finetune_section(out: Path, cfg: ExtendConfig, target: Target) -> list[str]:
    """How the fine-tuned models were trained: steps, window, positions, text, and the loss curve."""
    if not cfg.finetune_steps:
        return []
    unit = unit_of(target)
    window = f"{cfg.finetune_window}-{unit} windows" if cfg.finetune_window else "windows of the target length"
    kinds = {
        "plain": "`plain` positions 0..W-1",
        "pose": "`pose`: PoSE's two chunks with a position skip (Zhu et al. 2024)",
        "random": "`random`: a sorted random subset of the target's positions (Ruoss et al. 2023)",
    }
    if trains_on_passkey(cfg, target):
        what = f"on {PASSKEY_ROWS}, keys and depths drawn at random"
    else:
        text = cfg.finetune_corpus or f"the training split of {cfg.corpus or 'the Python standard library'}"
        what = (
            f"in {window}, read at {'; '.join(kinds[p] for p in cfg.finetune_positions)}; text: {text} (disjoint "
            "from the held-out text measured above)"
        )
    lines = [
        "## Fine-tuning",
        "",
        f"Each fine-tuned model (`+ft{cfg.finetune_steps}`): the patched model trained {cfg.finetune_steps} steps "
        f"{what}. Runs, checkpoints and losses: `runs/finetune-*`.",
        "",
    ]
    if (out / "finetune.png").is_file():
        lines += ["![fine-tuning loss by step](finetune.png)", ""]
    return lines


def _ruler_section(
    rows: Sequence[Mapping[str, Any]], metrics: Sequence[str], cfg: ExtendConfig, target: Target, saved: Path | None
) -> list:
    """The RULER tables, how they were measured, and the ``lm_eval`` commands that rebuild them for a saved model:
    the folder this run saved (``saved``), else a ``DIR`` placeholder for one ``--save DIR`` would write (a GGUF
    file is not what ``lm_eval --model hf`` loads)."""
    from posenc.lab.extend.needles import ruler

    suite = getattr(target, "suite", None)
    documents = rule_text(cfg, "documents", filled(cfg.ruler_samples, "ruler_samples"))
    lines = [
        "## RULER (lm-evaluation-harness)",
        "",
        f"RULER (Hsieh et al. 2024) as lm-eval {ruler.LM_EVAL_VERSION} builds it from the model's tokenizer: the first "
        "n documents of each length, greedy decoding, every prompt whole (max_length = the "
        "longest prompt + the generation bound; a truncated prompt is an error). Score: the share of expected "
        "strings in the answer (lm-eval's `string_match_all`), as `hits/n rate [95% " + interval_name(cfg)
        + " interval]`. Documents: "
        f"{documents}; a cell is a model at one task and length, its n in the "
        "table.",
        "",
    ]
    for metric in metrics:
        task = ruler_task(metric)
        bound = ruler.GEN_TOKENS.get(task, "?")
        lines += [f"### {task} (generation bound {bound} tokens)", "", format_table(rows, metric)]
    if suite is not None:
        suites = {m: suite for m in metrics}
        folder: Path | str
        if saved is not None and saved.suffix.lower() != ".gguf":
            folder = Path(os.path.abspath(saved))  # the commands run from anywhere
            method = filled(cfg.methods, "methods")[0]
            unit = (method, unit_factors(cfg, method)[0], cfg.finetune_steps, cfg.finetune_positions[0])
            intro = f"for the model this run saved to `{folder}` (`{label(*unit)}`; the numbers equal its row above):"
            suites = {m: _documents_of(suite, rows, m, unit) for m in metrics}  # the n its cells stopped at
        else:
            folder = "DIR"
            early = ", where its cells took every document (a cell that stopped at n: the first n)" * cfg.adaptive
            intro = (
                "for a model written by `posenc extend --save DIR` (one method and factor; the numbers equal this "
                f"table's row for it{early}):"
            )
        lines += [
            f"The same documents through the `lm_eval` command line, {intro}",
            "",
            "```bash",
            *(ruler.lm_eval_command(folder, suites[m], ruler_task(m), dtype=cfg.dtype or "float32") for m in metrics),
            "```",
            "",
        ]
    return lines


def _documents_of(suite: Any, rows: Sequence[Mapping[str, Any]], metric: str, unit: tuple) -> Any:
    """``suite`` with each length's documents cut to the ``n`` one model's cell took (``stop_width``: cells stop
    early); lengths it did not measure keep them all."""
    import dataclasses

    task = ruler_task(metric)
    took = {r["length"]: r["n"] for r in rows if r["metric"] == metric and model_of(r) == unit and r["n"]}
    documents = {n: docs[: took.get(n, len(docs))] for n, docs in suite.samples[task].items()}
    return dataclasses.replace(suite, samples={**suite.samples, task: documents})


def precision_text(dtype: str | None, kind: str) -> str:
    """How the model computes: ``float32``, or ``bfloat16 (RoPE tables and rotation in float32, ...)``: a remapping
    method's spans in the model's dtype, their merge in float32 (``posenc.hf._remap_patch.HALF_DTYPES``)."""
    dtype = dtype or "float32"
    if dtype == "float32" or kind == "lab":
        return dtype
    return f"{dtype} (RoPE tables and rotation in float32, remapped attention's spans in {dtype} merged in float32)"


def unit_of(target: Target) -> str:
    """What a length counts: bytes for the byte-level lab models, tokens for a transformers model."""
    return "byte" if target.kind == "lab" else "token"


def finish(out: Path, cfg: ExtendConfig, target, rows, described, seconds: float, progress: bool,  # noqa: ANN001
           resumed: int = 0, saved: Path | None = None) -> None:
    """Draw the figures (only those with something to show), write the report, print the tables and findings.
    ``saved``: what ``--save`` wrote this run, named in the report."""
    original = target.original_len
    figures = draw(rows, out, name=target.name, original=original, unit=unit_of(target))
    findings = findings_for(rows, original, cfg, kind=target.kind)
    write_report(out, rows, cfg, target, described, findings, seconds, resumed, saved)
    if progress:
        for metric in dict.fromkeys(["ppl", "ppl_past", "passkey", *(r["metric"] for r in rows)]):
            if any(r["metric"] == metric for r in rows):
                print_table(rows, metric)
        for line in findings:
            print(line)
        print(f"\nWrote {out / 'results.csv'}, {', '.join([*figures, 'report.md'])} in {seconds:.0f} s")
