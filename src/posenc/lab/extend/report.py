"""What ``posenc extend`` writes from ``results.csv`` alone: tables, findings, ``extend.png``, ``passkey.png`` and
``report.md`` (never by rerunning a model)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from posenc.lab.common.files import write_text_atomic
from posenc.lab.common.report import config_and_environment, duration, environment, wide_console
from posenc.lab.extend.config import ExtendConfig

if TYPE_CHECKING:
    from posenc.lab.extend.targets import HFTarget, LabTarget


def label(method: str, factor: float, finetune_steps: int) -> str:
    text = "none" if method == "none" and factor == 1 else f"{method} x{factor:g}"
    return text + (f" +ft{finetune_steps}" if finetune_steps else "")


def _lines(rows: Sequence[Mapping[str, Any]], metric: str) -> dict[tuple, dict[int, list[float]]]:
    """(method, factor, finetune_steps) -> length -> measured values (perplexity, or accuracy per depth), in run
    order with the unpatched model first."""
    groups: dict[tuple, dict[int, list[float]]] = {}
    for r in rows:
        if r["metric"] != metric:
            continue
        values = groups.setdefault((r["method"], r["factor"], r["finetune_steps"] or 0), {})
        value = r["accuracy"] if metric == "passkey" else r["ppl"]
        values.setdefault(r["length"], [])
        if r["status"] == "ok" and value is not None:
            values[r["length"]].append(value)
    return dict(sorted(groups.items(), key=lambda g: (g[0][2], g[0][0] != "none")))


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def table(rows: Sequence[Mapping[str, Any]], metric: str) -> tuple[list[str], list[list[str]]]:
    """Headers and cells: one line per method and factor, one column per length (passkey: mean over depths)."""
    original = next((r["original_len"] for r in rows if r["original_len"]), None)
    lengths = sorted({r["length"] for r in rows if r["metric"] == metric})
    headers = ["method"] + [
        f"{n} (original)" if n == original else f"{n} ({n / original:g}x)" if original else str(n) for n in lengths
    ]
    cells = []
    for unit, by_length in _lines(rows, metric).items():
        line = [label(*unit)]
        for n in lengths:
            value = _mean(by_length.get(n, []))
            if n not in by_length:
                line.append("-")
            elif value is None:
                line.append("n/a")
            else:
                line.append(f"{100 * value:.0f}%" if metric == "passkey" else f"{value:.2f}")
        cells.append(line)
    return headers, cells


def format_table(rows: Sequence[Mapping[str, Any]], metric: str) -> str:
    headers, cells = table(rows, metric)
    rule = "|:--|" + "--:|" * (len(headers) - 1)
    return "\n".join(["| " + " | ".join(headers) + " |", rule, *("| " + " | ".join(c) + " |" for c in cells)]) + "\n"


def print_table(rows: Sequence[Mapping[str, Any]], metric: str) -> None:
    from rich.table import Table

    headers, cells = table(rows, metric)
    title = {
        "ppl": "Perplexity by length (lower is better)",
        "ppl_past": "Perplexity past the original context only (lower is better)",
        "passkey": "Passkey accuracy by length, mean over depths (higher is better)",
    }[metric]
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
    ppl, keys = _lines(rows, "ppl"), _lines(rows, "passkey")
    if ppl:
        far = max(n for by in ppl.values() for n in by)
        base = ppl.get(("none", 1.0, 0), {})
        inside = [n for by in ppl.values() for n in by if n <= original]
        ref = max(inside) if inside else original  # the original length, else the longest measured within it
        where = f"the original {original} {units}" if ref == original else f"{ref} (within the original {original})"
        at_orig, at_far = _mean(base.get(ref, [])), _mean(base.get(far, []))
        if at_orig is not None and at_far is not None:
            lines.append(
                f"- Unpatched: perplexity {at_orig:.2f} at {where} -> {at_far:.2f} at {far} ({far / original:g}x)."
            )
        scored = {u: _mean(by.get(far, [])) for u, by in ppl.items() if u[0] != "none" or u[2]}
        scored = {u: v for u, v in scored.items() if v is not None}
        if scored and at_far is not None:
            best = min(scored, key=scored.get)
            rescued = sorted(label(*u) for u, v in scored.items() if v < at_far)
            lines.append(
                f"- At {far} {units} the best is {label(*best)} with perplexity {scored[best]:.2f} "
                f"({scored[best] / at_far:.2f}x the unpatched {at_far:.2f}); lower than unpatched there: "
                f"{', '.join(rescued) or 'none of them'}."
            )
        for u, by in ppl.items():
            if u[0] == "none" and not u[2]:
                continue
            near, long = _mean(by.get(ref, [])), _mean(by.get(far, []))
            if near is not None and long is not None and at_orig is not None:
                lines.append(
                    f"- {label(*u)}: {near:.2f} at {ref} ({near / at_orig:.2f}x unpatched there), {long:.2f} at {far}."
                )
        beyond = {u: _mean(by.get(far, [])) for u, by in _lines(rows, "ppl_past").items()}
        beyond = {u: v for u, v in beyond.items() if v is not None}
        if beyond:
            lines.append(
                f"- Past the original {original} {units} only (targets at positions {original}-{far - 1} of "
                f"{far}-{units[:-1]} windows): " + ", ".join(f"{label(*u)} {v:.2f}" for u, v in beyond.items()) + "."
            )
    if keys:

        def inside(by: Mapping[int, list[float]], past: bool) -> float | None:
            return _mean([v for n, vs in by.items() if (n > original) == past for v in vs])

        base = keys.get(("none", 1.0, 0), {})
        within, beyond = inside(base, False), inside(base, True)
        if within is not None or beyond is not None:
            lines.append(
                "- Passkey, unpatched: "
                + (f"{100 * within:.0f}% within the original length" if within is not None else "not measured within")
                + (f", {100 * beyond:.0f}% past it." if beyond is not None else ".")
            )
        past = {u: inside(by, True) for u, by in keys.items() if u[0] != "none" or u[2]}
        past = {u: v for u, v in past.items() if v is not None}
        kept = {u: inside(by, False) for u, by in keys.items() if u[0] != "none" or u[2]}
        kept = {u: v for u, v in kept.items() if v is not None}
        if kept and within is not None:
            lines.append(
                f"- Passkey within the original length after patching (unpatched {100 * within:.0f}%): "
                + ", ".join(f"{label(*u)} {100 * v:.0f}%" for u, v in kept.items())
                + "."
            )
        if past and max(past.values()) == 0:
            tried = any(r["metric"] == "passkey" and r["length"] <= original for r in rows)
            why = _passkey_advice(within, original, cfg, kind, tried_within=tried)
            lines.append(f"- Passkey past the original length: no method retrieved a single key ({why}).")
        elif past:
            best = max(past, key=past.get)
            others = ", ".join(f"{label(*u)} {100 * v:.0f}%" for u, v in past.items() if u != best)
            lines.append(
                f"- Passkey past the original length: best {label(*best)} with {100 * past[best]:.0f}% (mean over "
                f"lengths and depths){'; ' + others if others else ''}."
            )
    return lines or ["- Nothing measured."]


#: Line styles of ``extend.png`` by factor (the unpatched model is solid): dashed, dash-dot, dash-dot-dot, long dash.
FACTOR_STYLES = ("--", "-.", (0, (5, 1.5, 1, 1.5, 1, 1.5)), (0, (8, 2)))


def plot_extend(
    rows: Sequence[Mapping[str, Any]], out_png: str | Path, *, original: int, title: str, unit: str = "token"
) -> Path | None:
    """Perplexity vs length (log y), one line per method, factor and fine-tuning; returns ``out_png``, or None and
    writes nothing when no perplexity was measured (task passkey: accuracy is in ``plot_passkey``'s heatmaps).

    Colour per method (black: the unpatched model), line style per factor, a marker per line (hollow: fine-tuned);
    a line identical to an earlier one is dotted with large hollow markers and its label says "= ...". The original
    length is a dotted vertical line. ``unit`` names what a length counts ("byte" for lab models).
    """
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    from posenc.lab.common.plots import MARKERS, PALETTE, log_axis, new_figure, same_points, save_png

    groups = {u: by for u, by in _lines(rows, "ppl").items() if any(by.values())}
    if not groups:
        return None
    fig = new_figure(9.0, 5.2)
    ax = fig.add_subplot()
    colours = [c for c in PALETTE if c != "#000000"]  # black is the unpatched model's
    methods = [m for m in dict.fromkeys(u[0] for u in groups) if m != "none"]
    factors = sorted({u[1] for u in groups if u[0] != "none"})
    drawn: dict[tuple, list[tuple[int, float]]] = {}
    for i, (unit_, by_length) in enumerate(groups.items()):
        points = sorted((n, _mean(v)) for n, v in by_length.items() if v)
        method, factor, steps = unit_
        twin = next((label(*u) for u, p in drawn.items() if same_points(points, p)), None)
        drawn[unit_] = points
        style = "-" if method == "none" else FACTOR_STYLES[factors.index(factor) % len(FACTOR_STYLES)]
        colour = "black" if method == "none" else colours[methods.index(method) % len(colours)]
        xs, ys = zip(*points, strict=True)
        ax.plot(
            xs, ys, marker=MARKERS[i % len(MARKERS)], color=colour, linestyle=":" if twin else style,
            linewidth=2.2 if method == "none" else 1.5, markersize=9 if twin else 6,
            markerfacecolor="white" if steps and not twin else "none" if twin else colour,
            label=label(*unit_) + (f" (= {twin})" if twin else ""),
        )  # fmt: skip
    lengths = sorted({n for by in groups.values() for n, v in by.items() if v})
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(lengths))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(min(lengths[0], original) / 1.3, lengths[-1] * 1.3)
    ax.axvline(original, color="0.35", linestyle=":", linewidth=1.5, zorder=1)
    box = {"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1.0}
    ax.text(original * 1.03, 0.98, f"original length {original}", transform=ax.get_xaxis_transform(), fontsize=9,
            color="0.25", va="top", bbox=box)  # fmt: skip
    ax.set_yscale("log")
    values = [y for p in drawn.values() for _, y in p]
    low, high = min(values) / 1.08, max(values) * 1.08
    ax.set_ylim(low, high)
    log_axis(ax.yaxis, low, high)
    ax.set_ylabel(f"held-out perplexity per {unit} (log scale; lower is better)")
    ax.set_xlabel(f"evaluation length in {unit}s (log2 scale)")
    ax.set_title(title, fontsize=11)
    ax.grid(True, color="0.88", linewidth=0.8)
    ax.set_axisbelow(True)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5, frameon=False, borderaxespad=0.0)
    return save_png(fig, out_png)


def plot_passkey(
    rows: Sequence[Mapping[str, Any]], out_png: str | Path, *, original: int, unit: str = "token"
) -> Path | None:
    """Passkey accuracy heatmaps, depth (rows) x length (columns), one panel per method and factor; returns
    ``out_png``, or None and writes nothing when no passkey cell was measured.

    Colours from cividis (sequential, readable with any colour vision and in grey), each cell's number in black or
    white, whichever contrasts more with it (``posenc.lab.common.plots.text_colour_on``); grey cells are n/a.
    """
    from matplotlib import colormaps
    from matplotlib import patheffects as pe

    from posenc.lab.common.plots import HEATMAP, new_figure, save_png, text_colour_on

    groups = [(u, by) for u, by in _lines(rows, "passkey").items()]
    if not groups:
        return None
    cells = {
        (r["method"], r["factor"], r["finetune_steps"] or 0, r["length"], r["depth"]): r
        for r in rows
        if r["metric"] == "passkey"
    }
    lengths = sorted({r["length"] for r in rows if r["metric"] == "passkey"})
    depths = sorted({r["depth"] for r in rows if r["metric"] == "passkey"})
    cols = min(4, max(1, len(groups)))
    nrows = max(1, math.ceil(len(groups) / cols))
    fig = new_figure(2.2 + 0.55 * len(lengths) * cols, 0.9 + (0.45 * len(depths) + 0.8) * nrows)
    axes = fig.subplots(nrows, cols, squeeze=False)
    cmap = colormaps[HEATMAP].with_extremes(bad="0.85")
    image = None
    for k, ax in enumerate(axes.flat):
        if k >= len(groups):
            ax.axis("off")
            continue
        unit_ = groups[k][0]
        grid = torch.full((len(depths), len(lengths)), float("nan"))
        for i, d in enumerate(depths):
            for j, n in enumerate(lengths):
                r = cells.get((*unit_, n, d))
                if r is not None and r["status"] == "ok" and r["accuracy"] is not None:
                    grid[i, j] = r["accuracy"]
        image = ax.imshow(grid.numpy(), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
        for i in range(len(depths)):
            for j in range(len(lengths)):
                value = float(grid[i, j])
                text = "n/a" if math.isnan(value) else f"{100 * value:.0f}"
                colour = text_colour_on(cmap(float("nan") if math.isnan(value) else value))
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color=colour)
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], fontsize=7, rotation=45)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=7)
        past = [j for j, n in enumerate(lengths) if n > original]
        if past and past[0] > 0:  # left of it: up to the original length; white on a black edge shows on any cell
            ax.axvline(past[0] - 0.5, color="white", linewidth=1.6,
                       path_effects=[pe.Stroke(linewidth=3.2, foreground="black"), pe.Normal()])  # fmt: skip
        ax.set_title(label(*unit_), fontsize=9)
        ax.set_xlabel(f"length ({unit}s)", fontsize=8)
        ax.set_ylabel("depth of the key (0: first)", fontsize=8)
    if image is not None:
        colorbar = fig.colorbar(image, ax=axes, shrink=0.8, label="keys retrieved (%)")
        colorbar.set_ticks([0, 0.25, 0.5, 0.75, 1.0], labels=["0", "25", "50", "75", "100"])
    fig.suptitle(
        f"Passkey retrieval, % of keys found per cell (edged line: past the original {original} {unit}s; "
        "grey: n/a, shorter than the prompt)",
        fontsize=10,
    )
    return save_png(fig, out_png)


def write_report(
    out: Path,
    rows: Sequence[Mapping[str, Any]],
    cfg: ExtendConfig,
    target: LabTarget | HFTarget,
    described: Mapping[str, Any],
    findings: Sequence[str],
    seconds: float,
) -> Path:
    env = environment(target.device)
    original = target.original_len
    unit = unit_of(target)
    lines = [
        "# posenc extend: context extension",
        "",
        f"Model: {target.name} in {precision_text(cfg.dtype, target.kind)}, original context {original} {unit}s. "
        "Each method patched at factors "
        f"{', '.join(f'{f:g}' for f in cfg.factors)} and measured at "
        f"{', '.join(map(str, sorted({r['length'] for r in rows})))} {unit}s; `none` is the model as trained. "
        f"Time taken: {duration(seconds)}.",
        "",
        f"Layers changed by each patch: {target.layers_note}.",
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
        lines += [
            "## Passkey retrieval",
            "",
            f"Exact-match accuracy over {cfg.trials} keys per cell, averaged over depths "
            f"{', '.join(f'{d:g}' for d in cfg.depths)} (Mohtashami & Jaggi 2023). `n/a`: the length is shorter than "
            f"the prompt ({target.min_passkey} {unit}s). The heatmaps give every depth.",
            "",
            format_table(rows, "passkey"),
        ]
        if (out / "passkey.png").is_file():
            lines += ["![passkey accuracy by length and depth](passkey.png)", ""]
    lines += ["## Findings", "", *findings, "", "## Patches applied", ""]
    lines += [f"- `{label}`: `{json.dumps(d, default=str)}`" for label, d in described.items()] or ["- (none this run)"]
    lines += ["", *config_and_environment({**cfg.to_dict(), "original_len": original}, env, seconds)]
    return write_text_atomic(out / "report.md", "\n".join(lines))


def precision_text(dtype: str | None, kind: str) -> str:
    """How the model computes: ``float32``, or ``bfloat16 (RoPE tables and rotation in float32)``."""
    dtype = dtype or "float32"
    return dtype if dtype == "float32" or kind == "lab" else f"{dtype} (RoPE tables and rotation in float32)"


def unit_of(target: LabTarget | HFTarget) -> str:
    """What a length counts: bytes for the byte-level lab models, tokens for a transformers model."""
    return "byte" if target.kind == "lab" else "token"


def finish(out: Path, cfg: ExtendConfig, target, rows, described, seconds: float, progress: bool) -> None:  # noqa: ANN001
    """Draw the figures (only those with something to show), write the report, print the tables and findings."""
    original = target.original_len
    unit = unit_of(target)
    title = f"{target.name}: original context {original} {unit}s"
    figures = [
        path.name
        for path in (
            plot_extend(rows, out / "extend.png", original=original, title=title, unit=unit),
            plot_passkey(rows, out / "passkey.png", original=original, unit=unit),
        )
        if path is not None
    ]
    findings = findings_for(rows, original, cfg, kind=target.kind)
    write_report(out, rows, cfg, target, described, findings, seconds)
    if progress:
        for metric in ("ppl", "ppl_past", "passkey"):
            if any(r["metric"] == metric for r in rows):
                print_table(rows, metric)
        for line in findings:
            print(line)
        print(f"\nWrote {out / 'results.csv'}, {', '.join([*figures, 'report.md'])} in {seconds:.0f} s")
