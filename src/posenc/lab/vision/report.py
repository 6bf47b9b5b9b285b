"""What ``posenc vision`` writes from ``results.csv`` alone: the accuracy table, the findings (RoPE-ViT's ordering
checked against the noise of a finite test set), ``resolution.png`` and ``report.md`` (never by rerunning a model).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posenc.lab.common.files import write_text_atomic
from posenc.lab.common.report import config_and_environment, duration, environment, wide_console, wilson_interval

if TYPE_CHECKING:
    from posenc.lab.vision.config import VisionConfig

#: How each encoding meets a resolution it was not trained at (said in the table and the report).
HOW = {
    "learned": "resized table",
    "learned_2d": "resized table",
    "sinusoidal": "extrapolate",
    "sinusoidal_2d": "extrapolate",
    "nope": "no positions",
    "rope_axial": "extrapolate",
    "rope_mixed": "extrapolate",
    "alibi_2d": "extrapolate",
}

#: RoPE-ViT's ViT-S numbers (Table 2, 224 px -> 384 px), quoted in the report next to ours.
PAPER = {"learned": (80.4, 79.4), "rope_axial": (80.9, 80.0), "rope_mixed": (80.9, 81.8)}


def _lines(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], dict[int, Mapping[str, Any]]]:
    """Rows grouped by (encoding, scaling) in the order run, each as eval_res -> row (as trained first)."""
    groups: dict[tuple[str, str], dict[int, Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["encoding"], r.get("scaling") or "none"), {})[r["eval_res"]] = r
    order = {e: i for i, e in enumerate(dict.fromkeys(r["encoding"] for r in rows))}
    return dict(sorted(groups.items(), key=lambda item: (order[item[0][0]], item[0][1] != "none")))


def how(encoding: str, scaling: str) -> str:
    """How a line meets resolutions it was not trained at."""
    return "interpolate" if scaling == "interpolate" else HOW.get(encoding, "")


def table(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Headers and cells: one line per encoding and scaling, one accuracy column per evaluation resolution."""
    train = sorted({r["train_res"] for r in rows})
    res = sorted({r["eval_res"] for r in rows})
    one = train[0] if len(train) == 1 else None
    headers = ["encoding", "at new res."] + [
        f"{n} px (train)" if n == one else f"{n} px ({n / one:g}x)" if one else f"{n} px" for n in res
    ]
    cells = []
    for (e, scaling), by_res in _lines(rows).items():
        line = [e, how(e, scaling)]
        for n in res:
            row = by_res.get(n)
            line.append("-" if row is None or row["accuracy"] is None else f"{100 * row['accuracy']:.1f}%")
        cells.append(line)
    return headers, cells


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The accuracy table as markdown, the best of each column in bold."""
    headers, cells = table(rows)
    for j in range(2, len(headers)):
        values = [float(c[j][:-1]) for c in cells if c[j].endswith("%")]
        for c in cells:
            if values and c[j].endswith("%") and float(c[j][:-1]) == max(values) and len(values) > 1:
                c[j] = f"**{c[j]}**"
    rule = "|" + "|".join(":--" if j < 2 else "--:" for j in range(len(headers))) + "|"
    return "\n".join(["| " + " | ".join(headers) + " |", rule, *("| " + " | ".join(c) + " |" for c in cells)]) + "\n"


def print_table(rows: Sequence[Mapping[str, Any]]) -> None:
    from rich.table import Table

    headers, cells = table(rows)
    out = Table(title="Top-1 test accuracy by evaluation resolution (higher is better)")
    for j, h in enumerate(headers):
        out.add_column(h, justify="left" if j < 2 else "right", style="cyan" if j == 0 else None)
    for line in cells:
        out.add_row(*line)
    console = wide_console()
    console.width = max(console.width, 100)  # rows stay one line each in an 80-column pipe
    console.print(out)


def interval(row: Mapping[str, Any]) -> tuple[float, float] | None:
    """The 95% Wilson interval of a row's accuracy over its ``images`` test images; None without a count."""
    n = row.get("images")
    if row.get("accuracy") is None or isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        return None
    return wilson_interval(row["accuracy"], n)


def _accuracy_text(row: Mapping[str, Any]) -> str:
    """``46.2% [43.1, 49.3]``: the accuracy and its 95% interval (without the interval when there is no count)."""
    ci = interval(row)
    text = f"{100 * row['accuracy']:.1f}%"
    return text if ci is None else f"{text} [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def compare(high: Mapping[str, Any], low: Mapping[str, Any], *, strict: bool) -> str:
    """Whether ``high``'s accuracy is above ``low``'s (``>`` when ``strict``, else ``>=``), given the noise:
    "noise" when their 95% intervals overlap (the gap could be chance), else "held" or "broken"; without image
    counts the raw numbers decide."""
    a, b = high["accuracy"], low["accuracy"]
    ci_a, ci_b = interval(high), interval(low)
    if ci_a is not None and ci_b is not None and ci_a[0] <= ci_b[1] and ci_b[0] <= ci_a[1]:
        return "noise"
    return "held" if (a > b if strict else a >= b) else "broken"


def _paper_check(lines_by: Mapping[tuple[str, str], Mapping[int, Mapping[str, Any]]], far: int) -> list[str]:
    """RoPE-ViT's ordering at 2x: held, broken, or within noise, each gap judged by the 95% intervals."""
    row = {e: lines_by[(e, "none")][far] for e in ("rope_mixed", "rope_axial", "learned")}
    pairs = (("rope_mixed", "rope_axial", False), ("rope_axial", "learned", True))
    states = [compare(row[a], row[b], strict=strict) for a, b, strict in pairs]
    counted = all(interval(r) is not None for r in row.values())
    if "broken" in states:
        verdict = "did NOT hold"
    elif "noise" in states:
        verdict = "could not be told apart from noise"
    else:
        verdict = "HELD"
    outside = "outside the noise (the 95% intervals do not overlap)"
    meaning = {"held": outside, "broken": outside, "noise": "within noise (the 95% intervals overlap)"}
    gaps = []
    for (a, b, _), state in zip(pairs, states, strict=True):
        gap = f"{a} - {b} = {100 * (row[a]['accuracy'] - row[b]['accuracy']):+.1f} points"
        gaps.append(f"{gap}, {meaning[state]}" if counted else gap)
    here = ", ".join(f"{e} {_accuracy_text(r)}" for e, r in row.items())
    images = sorted({r["images"] for r in row.values()}) if counted else []
    noise = (
        f" (95% Wilson intervals over {' / '.join(map(str, images))} test images)"
        if counted
        else " (no image counts in the results: no noise estimate)"
    )
    return [
        f"Paper check at 2x the training resolution ({far} px): RoPE-ViT reports RoPE-Mixed >= RoPE-Axial > "
        f"learned APE. Here {here}{noise}: the ordering {verdict} ({'; '.join(gaps)}).",
        "",
    ]


def findings_for(rows: Sequence[Mapping[str, Any]], cfg: VisionConfig, n_classes: int = 10) -> list[str]:
    """Plain statements about the measured table: the paper's ordering at 2x (judged against the noise of a finite
    test set: 95% Wilson intervals), then each line's change, each accuracy with its interval."""
    lines_by = _lines(rows)
    acc = {
        (e, s, n): r["accuracy"] for (e, s), by in lines_by.items() for n, r in by.items() if r["accuracy"] is not None
    }
    base, far = cfg.train_res, 2 * cfg.train_res
    lines = []
    if all((n, "none", far) in acc for n in ("learned", "rope_axial", "rope_mixed")):
        lines += _paper_check(lines_by, far)
    else:
        lines.append(
            f"Paper check: needs learned, rope_axial and rope_mixed evaluated at {far} px (2x); not in this run."
        )
    gains = []
    for e, scaling in lines_by:
        if scaling == "interpolate" and (e, "none", far) in acc and (e, "interpolate", far) in acc:
            noise = compare(lines_by[(e, scaling)][far], lines_by[(e, "none")][far], strict=False) == "noise"
            gain = 100 * (acc[(e, scaling, far)] - acc[(e, "none", far)])
            gains.append(f"{e} {gain:+.1f}" + (" (within noise)" if noise else ""))
    if gains:
        lines.append(
            f"Interpolating patch coordinates into the trained range (instead of extrapolating them) at {far} px, "
            f"in accuracy points: {', '.join(gains)}."
        )
        lines.append("")
    counts = sorted({r["images"] for by in lines_by.values() for r in by.values() if interval(r) is not None})
    if counts:
        lines += [f"Each accuracy below with its 95% Wilson interval over {' / '.join(map(str, counts))} test images:"]
        lines.append("")
    for e, scaling in lines_by:
        if (e, scaling, base) not in acc:
            continue
        by = lines_by[(e, scaling)]
        a = 100 * acc[(e, scaling, base)]
        others = [n for n in cfg.resolutions if n != base and (e, scaling, n) in acc]
        parts = [f"{_accuracy_text(by[n])} at {n} px ({100 * acc[(e, scaling, n)] - a:+.1f})" for n in others]
        label = e if scaling == "none" else f"{e} + {scaling}d coordinates"
        text = f"- {label}: {_accuracy_text(by[base])} at {base} px (train)"
        if parts:
            text += "; " + ", ".join(parts)
        if e in PAPER and scaling == "none":
            text += f". Paper (ViT-S, ImageNet, 224 -> 384 px): {PAPER[e][0]} -> {PAPER[e][1]}"
        lines.append(text + ".")
        if scaling == "none" and a < 200 / n_classes:
            lines.append(f"  ({e} is under twice chance at the training resolution: raise --steps before reading it.)")
    return lines


def plot_resolution(rows: Sequence[Mapping[str, Any]], out_png: str | Path, *, data: str | None = None) -> Path:
    """Accuracy against evaluation resolution, one line per encoding, the training resolution dotted."""
    from matplotlib.ticker import FixedLocator, PercentFormatter

    from posenc.lab.common.plots import MARKERS, PALETTE, new_figure, save_png

    fig = new_figure(9.0, 5.2)
    ax = fig.add_subplot()
    groups = _lines(rows)
    colours = {e: i for i, e in enumerate(dict.fromkeys(e for e, _ in groups))}
    for (e, scaling), by_res in groups.items():
        points = sorted((n, r["accuracy"]) for n, r in by_res.items() if r["accuracy"] is not None)
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        i = colours[e]
        ax.plot(
            xs, ys, marker=MARKERS[i % len(MARKERS)], color=PALETTE[i % len(PALETTE)], label=f"{e} ({how(e, scaling)})",
            linestyle="-" if scaling == "none" else "--", linewidth=1.8 if scaling == "none" else 1.3,
        )
    res = sorted({r["eval_res"] for r in rows})
    if res:
        ax.xaxis.set_major_locator(FixedLocator(res))
        ax.set_xlim(res[0] - 2, res[-1] + 2)
    for t in sorted({r["train_res"] for r in rows}):
        ax.axvline(t, color="0.35", linestyle=":", linewidth=1.5, zorder=1)
        ax.text(t + 0.3, 0.02, "train resolution", transform=ax.get_xaxis_transform(), fontsize=9, color="0.25")
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    ax.set_xlabel("evaluation resolution in pixels (same patch size: more patches)")
    ax.set_ylabel("top-1 test accuracy (higher is better)")
    ax.set_title(f"Accuracy vs resolution{f' on {data}' if data else ''}", fontsize=11)
    ax.grid(True, color="0.88", linewidth=0.8)
    ax.set_axisbelow(True)
    if groups:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5, frameon=False, borderaxespad=0.0)
    return save_png(fig, out_png)


def write_report(
    out: Path,
    rows: Sequence[Mapping[str, Any]],
    cfg: VisionConfig,
    findings: Sequence[str],
    source: str,
    seconds: float,
) -> Path:
    env = environment(cfg.device)
    lines = [
        "# posenc vision: resolution extrapolation",
        "",
        f"Small ViTs ({cfg.n_layers} layers, width {cfg.dim}, {cfg.n_heads} heads, {cfg.patch_size} px patches, "
        f"{cfg.pool} pooling), one per encoding, trained for {cfg.steps} steps at {cfg.train_res} px and tested at "
        f"{', '.join(map(str, cfg.resolutions))} px. Data: {source}. Time taken: {duration(seconds)}.",
        "",
        "## Results",
        "",
        "Top-1 test accuracy by evaluation resolution (bold: best in its column). The second column says how each "
        "line meets a resolution it was not trained at: `resized table` (the learned table resized bicubically), "
        "`extrapolate` (patch coordinates past the trained grid), `interpolate` (coordinates multiplied by "
        "train/eval resolution, back into the trained range: Position Interpolation for images). All numbers: "
        "[results.csv](results.csv).",
        "",
        format_table(rows),
        "![accuracy by resolution](resolution.png)",
        "",
        "## Findings",
        "",
        *findings,
        "",
        *config_and_environment(cfg.to_dict(), env, seconds),
    ]
    return write_text_atomic(out / "report.md", "\n".join(lines))
