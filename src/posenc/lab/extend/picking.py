"""``posenc extend MODEL --target T --pick``: measure every candidate method cheaply, race the best at T, name the pick.

One folder (``--out``) holds the whole pick and resumes like every study (``--resume``; Ctrl-C or SIGTERM keeps each
finished measurement):

    pick.json       the settings, the candidates and the per-cell cap the budget bought (checked on resume)
    screen-ppl/     a ``posenc extend`` study: every candidate and the unpatched model, perplexity at T
    screen-passkey/ a ``posenc extend`` study: the candidates whose perplexity is not broken (``pick.broken``) and the
                    unpatched model, one round of passkeys at a shorter length (``pick.screen_length``)
    final/          a ``posenc extend`` study: the survivors (``pick.survivors``), the unpatched model and, with
                    ``finetune_steps``, a fine-tuned YaRN at T: perplexity at T and needle cells at T sampled in rounds
                    until each is decided (``posenc.lab.extend.sampling``), at most the cap
    pick.md         the ranked table with intervals, the pick and why, and the commands that run it elsewhere

The rules are ``posenc.lab.extend.pick``. The plan, with an estimate, is printed before any weight is loaded; the
estimate comes from a short matrix-multiply probe of this machine (``plan.probe_seconds_per_unit``) and the model's
dimensions, and ``budget`` turns it into the most samples a cell may get (``pick.caps``).
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posenc._checks import fail
from posenc.lab.common.devices import resolve_device
from posenc.lab.common.files import write_text_atomic
from posenc.lab.common.runfiles import check_out, check_settings
from posenc.lab.extend import composed, plan, sampling
from posenc.lab.extend import pick as rules
from posenc.lab.extend.config import ExtendConfig
from posenc.lab.extend.rates import RULER_PREFIX, UNPATCHED
from posenc.lab.extend.report import label
from posenc.lab.extend.targets import load_target

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
    final_seconds: float
    finetune_seconds: float
    budget: float | None

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
    """Pick the method that makes ``cfg.model`` work at ``target`` tokens (or ``"4x"``); returns the outcome.

    ``cfg``: the model and the study settings that apply to every stage (``corpus``, ``depths``, ``task`` --
    ``ruler`` adds ``ruler_tasks`` at T --, ``finetune_*`` to add a fine-tuned YaRN, ``dtype``, ``device``,
    ``seed``, ``stop_width``); ``methods`` limits the candidates; ``trials`` / ``ruler_samples`` / ``lengths`` /
    ``factors`` are set by the pick and refused. ``budget``: seconds or ``"90m"``; caps the samples per cell so the
    whole pick fits it on this machine's estimated speed (none: ``pick.DEFAULT_CAP``). ``save``: a new folder (or
    ``.gguf`` file) the pick is written to; with it only candidates that format can carry compete. ``plan_only``:
    print the plan and its estimate, write nothing.

    Returns a dict: ``pick`` (its label), ``unit``, ``reason``, ``standings`` (rows of the ranked table),
    ``saved`` (the path or None), ``plan`` (``PickPlan``).

    Raises:
        ValueError: bad settings (a target not beyond the original context, a budget too small for one round, a
            lab model, settings the pick sets itself), a folder that holds something else, or a ``--resume`` with
            other settings -- all before any weight is loaded.
    """
    start = time.perf_counter()
    out = Path(out)
    for name in ("lengths", "factors"):
        if getattr(cfg, name) is not None:
            fail(name, getattr(cfg, name), f"left out with --pick (it sets {name} itself from --target)")
    if budget is not None and (cfg.trials is not None or cfg.ruler_samples is not None):
        fail("budget", budget, "left out when --trials / --ruler-samples set the samples per cell themselves")
    before = check_out(out, "pick")
    if resume and budget is None and before:
        budget = before.get("budget")  # a resumed pick keeps its budget (and the cap it bought)
    device = resolve_device(cfg.device, allow_auto=True)
    if cfg.task == "ruler":
        from posenc.lab.extend.ruler import require

        require()  # lm-eval missing: the pip command now, not after screening
    model = load_target(cfg, out / "final", device=device, progress=progress)  # config and tokenizer only
    if model.kind == "lab":
        fail("model", cfg.model, "a pretrained model for --pick (a lab model cannot follow a passkey prompt)")
    stored = (before or {}) if resume else {}  # a resumed pick keeps its candidates and its cap
    decided = make_plan(cfg, model, target, device=device, budget=budget, save=save, save_type=save_type, out=out,
                        stored=stored.get("candidates"), cap=stored.get("cap"))  # fmt: skip
    settings = {k: v for k, v in cfg.to_dict().items() if k != "out"}
    settings.update(decided.settings(), budget=budget)
    stages = stage_configs(cfg, decided, decided.cap)
    resolved = [plan.resolve(stage, kind=model.kind, original=model.original_len,
                             default_methods=model.default_methods, device=device) for stage in stages]  # fmt: skip
    model.use(resolved[-1])  # the corpus once: every stage reads the same text; the race's adds its fine-tuning text
    for stage in resolved:  # every stage's settings against the model and the machine, before anything is written
        plan.check(stage, model, device=device)
    if progress or plan_only:
        print(plan_text(decided, model, cfg))
    if plan_only and resume and before:
        print(left_text(out, decided, model))
    if plan_only:
        return {"plan": decided}
    check_settings(out, {**settings, "cap": decided.cap}, resume, command="pick", what="pick")
    cap = decided.cap
    from posenc.lab.extend.study import run_extend

    ppl_cfg, keys_cfg, final_cfg = stages
    units = [c.unit for c in decided.candidates]
    ppl_rows = run_extend(ppl_cfg, out / "screen-ppl", resume=True, progress=progress, units=units,
                          measurements=[("ppl", decided.target, None)])  # fmt: skip
    broken = rules.broken(ppl_rows, units, target=decided.target)
    whole = [u for u in units if u not in broken]
    key_rows = run_extend(keys_cfg, out / "screen-passkey", resume=True, progress=progress, units=whole,
                          measurements=[("passkey", decided.screen, d) for d in decided.depths])  # fmt: skip
    screen_rows = ppl_rows + [r for r in key_rows if r["metric"] == "passkey"]
    verdicts = rules.survivors(screen_rows, units, target=decided.target, screen=decided.screen)
    kept = [v.unit for v in verdicts if v.kept] + decided.tuned
    if progress:
        print(f"Screening: {', '.join(label(*u) for u in kept)} go on to {decided.target} tokens")
    final_rows = run_extend(final_cfg, out / "final", resume=True, progress=progress, units=kept,
                            measurements=_final_measurements(final_cfg, decided))  # fmt: skip
    ranked = rules.standings(final_rows, [UNPATCHED, *kept], target=decided.target, model_type=model.model_type)
    why_not = _savable(model, save, save_type, cfg, out, decided.target) if save is not None else None
    outcome = rules.choose(ranked, lambda u: label(*u), savable=why_not)
    saved = _save(final_cfg, out, outcome.pick.unit, save, save_type, device, progress) if save else None
    reference = rules.survivors(screen_rows, [UNPATCHED], target=decided.target, screen=decided.screen)
    reference = [dataclasses.replace(r, kept=False, why="the model as trained (reference)") for r in reference]
    text = report(cfg, model, decided, cap, verdicts, ranked, outcome, saved, time.perf_counter() - start, reference)
    write_text_atomic(out / "pick.md", text)
    if progress:
        print(summary(ranked, outcome, saved))
    return {
        "pick": label(*outcome.pick.unit), "unit": outcome.pick.unit, "reason": outcome.reason, "saved": saved,
        "standings": [_standing_row(s) for s in ranked], "plan": decided, "cap": cap,
    }  # fmt: skip


def make_plan(cfg: ExtendConfig, model: Any, target: str | int, *, device: str, budget: str | float | None,
              save: str | Path | None, save_type: str, out: Path, stored: list | None = None,
              cap: int | None = None) -> PickPlan:  # fmt: skip
    """The candidates, the lengths, the cap and the time estimate, from the model's config alone. ``stored``: the
    candidates of the pick being resumed (a ``--save`` added on resume then chooses among those it can write);
    ``cap``: its cap (not bought again from today's estimate)."""
    from posenc.hf._remap_patch import REMAP_MODEL_TYPES

    original = model.original_len
    length = rules.parse_target(target, original)
    seconds = rules.parse_budget(budget)
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
    depths = cfg.depths if cfg.depths is not None else plan.PLANS[plan.plan_name(model.kind, device)]["depths"]
    factor = length / original
    tuned = (
        [(FINETUNED_METHOD, factor, cfg.finetune_steps, p) for p in cfg.finetune_positions]
        if cfg.finetune_steps
        else []
    )
    spu = plan.probe_seconds_per_unit(model.dims, model.dtype, device)
    cost_t, cost_s = model.forward_cost(length), model.forward_cost(screen)
    weights = sorted((rules.cost_factor(c.method) for c in candidates), reverse=True)  # remapping ones cost more
    screen_seconds = (1 + sum(weights)) * (cost_t + len(depths) * screen_keys(tuple(depths)) * cost_s) * spu
    window = cfg.finetune_window or length
    finetune_seconds = len(tuned) * cfg.finetune_steps * 3 * model.forward_cost(window) * spu
    cells = len(depths) + (len(_ruler_tasks(cfg)) if cfg.task == "ruler" else 0)
    models = 1 + sum(weights[: rules.KEEP]) + len(tuned)  # the race's models in plain-forward units, at most
    cap = cap or cfg.trials or cfg.ruler_samples or rules.caps(
        seconds, fixed=screen_seconds + finetune_seconds, per_model=cost_t * spu, models=models, cells=cells,
        sample=cost_t * spu, floor=sampling.ROUND,
    )  # fmt: skip
    final_seconds = models * (1 + cells * cap) * cost_t * spu
    return PickPlan(length, screen, candidates, left_out, tuple(depths), tuned, cap, spu, screen_seconds,
                    final_seconds, finetune_seconds, seconds)  # fmt: skip


def _savable(model: Any, save: str | Path, save_type: str, cfg: ExtendConfig, out: Path, length: int) -> Any:
    """``--save``'s path checked now (with a method it takes), and the rule that leaves out what it cannot carry."""
    from posenc.hf.save import remap_save_problem
    from posenc.lab.extend.study import GGUF_METHODS, check_save

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
    (``screen_keys`` per depth, a fixed count) and the race at T."""
    methods = tuple(dict.fromkeys(c.method for c in decided.candidates))
    factors = tuple(sorted({c.factor for c in decided.candidates}))
    common = dict(methods=methods, factors=factors, depths=decided.depths, eval_tokens=decided.target, out=None)
    zero_shot = dict(
        task="lm", finetune_steps=0, finetune_positions=("plain",), finetune_window=None, finetune_lr=None,
        finetune_corpus=None, ruler_tasks=None, ruler_samples=None, stop_width=0.0,
    )  # fmt: skip
    ppl = dataclasses.replace(cfg, **common, **zero_shot, lengths=(decided.target,), trials=1)
    keys = dataclasses.replace(cfg, **common, **zero_shot, lengths=(decided.screen,),
                               trials=screen_keys(decided.depths))  # fmt: skip
    if decided.tuned and FINETUNED_METHOD not in methods:
        common["methods"] = (*methods, FINETUNED_METHOD)
    final = dataclasses.replace(cfg, **common, lengths=(decided.target,), trials=cfg.trials or cap,
                                ruler_samples=(cfg.ruler_samples or cap) if cfg.task == "ruler" else None,
                                stop_width=cfg.stop_width)  # fmt: skip
    return ppl, keys, final


def screen_keys(depths: tuple[float, ...]) -> int:
    """Screening's passkeys per depth: one round (``sampling.ROUND`` keys) spread over the depths, at least one each."""
    return max(1, sampling.ROUND // len(depths))


def _final_measurements(cfg: ExtendConfig, decided: PickPlan) -> list[tuple]:
    ruler = [(RULER_PREFIX + t, decided.target, None) for t in _ruler_tasks(cfg)] if cfg.task == "ruler" else []
    return [("ppl", decided.target, None)] + [("passkey", decided.target, d) for d in decided.depths] + ruler


def _ruler_tasks(cfg: ExtendConfig) -> tuple[str, ...]:
    from posenc.lab.extend.ruler import DEFAULT_TASKS

    return tuple(cfg.ruler_tasks or DEFAULT_TASKS)


def _save(cfg: ExtendConfig, out: Path, unit: tuple, save: str | Path, save_type: str, device: str,
          progress: bool) -> Path:  # fmt: skip
    """Write the pick: the race's model reloaded and patched again (a fine-tuned one from its finished run)."""
    from posenc.lab.extend.study import _model_for, check_save

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
    model_target.save(patched, path, tensor_type=save_type)
    if progress:
        print(f"Saved the pick, {label(*unit)}, to {path}")
    return path


# ---------------------------------------------------------------------------------------------------------------------
# Text


def plan_text(decided: PickPlan, model: Any, cfg: ExtendConfig) -> str:
    cap = decided.cap
    names = ", ".join(label(c.method, c.factor, 0) for c in decided.candidates)
    lines = [
        f"Pick for {model.name} at {decided.target} tokens (trained for {model.original_len}): "
        f"{len(decided.candidates)} candidates ({names})"
    ]
    if decided.left_out:
        lines.append("Left out: " + "; ".join(f"{m}: {why}" for m, why in decided.left_out.items()))
    final_models = min(rules.KEEP, len(decided.candidates)) + 1 + len(decided.tuned)
    race = f"passkey at {len(decided.depths)} depth{'s' if len(decided.depths) > 1 else ''}" + (
        f" and RULER {', '.join(_ruler_tasks(cfg))}" if cfg.task == "ruler" else ""
    )
    keys = screen_keys(decided.depths)
    lines.append(
        f"1. Screening, each candidate and the unpatched model: perplexity at {decided.target} tokens (a candidate "
        f"above {rules.PPL_BREAK:g}x the best is out), then {keys} passkey{'s' if keys > 1 else ''} per depth "
        f"({', '.join(f'{d:g}' for d in decided.depths)}) at {decided.screen} tokens: at most "
        f"{plan.duration_text(decided.screen_seconds)}"
    )
    if decided.tuned:
        lines.append(f"   fine-tuning {', '.join(label(*u) for u in decided.tuned)}: about "
                     f"{plan.duration_text(decided.finetune_seconds)}")  # fmt: skip
    lines.append(
        f"2. Race at {decided.target} tokens, up to {final_models} models (the best {rules.KEEP} of screening, the "
        f"unpatched model{', the fine-tuned' if decided.tuned else ''}): {race}, up to {cap} samples per cell in "
        f"rounds of {sampling.ROUND}, each cell stopped once decided: at most "
        f"{plan.duration_text(decided.final_seconds)}"
    )
    budget = f" (budget {plan.duration_text(decided.budget)})" if decided.budget else ""
    lines.append(
        f"At most {plan.duration_text(decided.screen_seconds + decided.finetune_seconds + decided.final_seconds)} "
        f"in all{budget}: an estimate from this machine's matrix-multiply speed and the model's size "
        f"({decided.seconds_per_unit * 1e3:.3g} ms per token-equivalent), before any weight is loaded; rounds that "
        "stop early finish sooner"
    )
    return "\n".join(lines)


def left_text(out: Path, decided: PickPlan, model: Any) -> str:
    """A resumed pick's ``--plan``: what its three studies hold already and, at most, the time left (the plan's
    estimate less the forwards and samples already measured)."""
    from posenc.lab.extend.rates import is_rate_metric, model_of
    from posenc.lab.extend.study import read_results

    def rows(stage: str) -> list[dict]:
        path = out / stage / "results.csv"
        return read_results(path) if path.exists() else []

    spu = decided.seconds_per_unit
    cost_t, cost_s = model.forward_cost(decided.target), model.forward_cost(decided.screen)
    weight = {c.unit: rules.cost_factor(c.method) for c in decided.candidates} | {UNPATCHED: 1.0}
    ppl = {model_of(r) for r in rows("screen-ppl") if r["metric"] == "ppl" and r["length"] == decided.target}
    keys: dict[tuple, int] = {}
    for r in rows("screen-passkey"):
        if r["metric"] == "passkey" and r["length"] == decided.screen:
            keys[model_of(r)] = keys.get(model_of(r), 0) + int(r["n"] or 0)
    planned_keys = len(decided.depths) * screen_keys(decided.depths)
    screen_done = sum(weight.get(u, 1.0) * cost_t for u in ppl) + sum(
        weight.get(u, 1.0) * min(n, planned_keys) * cost_s for u, n in keys.items())  # fmt: skip
    race = [r for r in rows("final") if r["metric"] == "ppl" or is_rate_metric(r["metric"])]
    counts = [(weight.get(model_of(r), 1.0), 1 if r["metric"] == "ppl" else int(r["n"] or 0)) for r in race]
    samples = sum(n for (_, n), r in zip(counts, race, strict=True) if r["metric"] != "ppl")
    forwards = len(race) - sum(1 for r in race if r["metric"] != "ppl")
    tuned_done = {model_of(r) for r in race} & set(decided.tuned)
    left = (
        max(0.0, decided.screen_seconds - screen_done * spu)
        + max(0.0, decided.final_seconds - sum(w * n for w, n in counts) * cost_t * spu)
        + decided.finetune_seconds * (1 - len(tuned_done) / max(1, len(decided.tuned)))
    )
    return (
        f"Resumed from {out}: screening has perplexity for {len(ppl)} of {len(weight)} models and "
        f"{sum(min(n, planned_keys) for n in keys.values())} of {len(weight) * planned_keys} passkeys; the race has "
        f"{samples} samples and {forwards} perplexity forwards. Left: at most {plan.duration_text(left)}"
    )


def stale_cache_note(units: Sequence[tuple]) -> list[str]:
    """Said once in ``pick.md`` where a raced model scales its frequencies with the length (dynamic NTK): its needles
    come from generation with the KV cache (``posenc.hf.CacheStaleWarning``, kept quiet while the pick runs)."""
    dynamic = [label(*u) for u in units if composed.parts(u[0])[0] == "dynamic"]
    if not dynamic:
        return []
    return [f"{', '.join(dynamic)}: answers generated with the KV cache, whose cached keys posenc re-rotates to each "
            "step's frequencies while earlier tokens' hidden states keep their step's (dynamic scaling with a cache, "
            "YaRN section 3.3; `posenc.hf.CacheStaleWarning`). The rates stand as what a server with a KV cache "
            "runs, not as the full forward at each length."]  # fmt: skip


def _standing_row(s: rules.Standing) -> dict[str, Any]:
    return {
        "model": label(*s.unit), "needles": s.needles.text() if s.needles else "n/a",
        **{m: (r.text() if r else "n/a") for m, r in s.by_metric.items()},
        "ppl_past": s.ppl_past, "serving": s.serving,
    }  # fmt: skip


def _ranked_table(ranked: list[rules.Standing], outcome: rules.Pick) -> list[str]:
    metrics = list(dict.fromkeys(m for s in ranked for m in s.by_metric))
    head = ["", "model", "needles at T (pooled)", *metrics, "ppl past L", "served as"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, s in enumerate(ranked, 1):
        mark = "**pick**" if s is outcome.pick else "runner-up" if s is outcome.runner_up else str(i)
        cells = [mark, label(*s.unit), s.needles.text() if s.needles else "n/a",
                 *[(s.by_metric.get(m).text() if s.by_metric.get(m) else "n/a") for m in metrics],
                 "n/a" if s.ppl_past is None else f"{s.ppl_past:.3g}",
                 "unpatched" if s.unit[0] == "none" else s.serving]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def summary(ranked: list[rules.Standing], outcome: rules.Pick, saved: Path | None) -> str:
    text = "\n".join(_ranked_table(ranked, outcome)) + f"\n\nPick: {label(*outcome.pick.unit)}. {outcome.reason}."
    if saved is not None:
        text += f"\nSaved to {saved}"
    return text


def commands(model: Any, decided: PickPlan, outcome: rules.Pick, saved: Path | None, cfg: ExtendConfig) -> list[str]:
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
           ranked: list[rules.Standing], outcome: rules.Pick, saved: Path | None, seconds: float,
           reference: Sequence[rules.Screened] = ()) -> str:  # fmt: skip
    lines = [
        f"# Which method for {model.name} at {decided.target} tokens?",
        "",
        plan_text(decided, model, cfg),
        "",
        f"## The pick: {label(*outcome.pick.unit)}",
        "",
        outcome.reason + ".",
    ]
    if outcome.runner_up is not None:
        r = outcome.runner_up
        lines.append(f"Runner-up: {label(*r.unit)}, {r.needles.text() if r.needles else 'n/a'}.")
    lines += ["", "## At the target", "", *_ranked_table(ranked, outcome), ""]
    final_cfg = stage_configs(cfg, decided, cap)[-1]
    if note := stale_cache_note([s.unit for s in ranked]):
        lines += [*note, ""]
    lines += [
        "Needles: " + sampling.rule_text(final_cfg, "samples", cap) + ". A row's pooled rate weighs each cell (depth, "
        "task) the same (Kish's effective n where cells stopped at different n). Two rates differ beyond noise when "
        "their 95% Wilson intervals are disjoint. Served as: "
        + "; ".join(f"{k}: {where}" for k, (_, where) in rules.SERVING.items()),
        "",
        "## Screening",
        "",
        f"| candidate | ppl past L at {decided.target} | passkey at {decided.screen} | verdict |",
        "|---|---|---|---|",
    ]
    for v in [*reference, *verdicts]:
        ppl = "n/a" if v.ppl_past is None else f"{v.ppl_past:.3g}"
        lines.append(f"| {label(*v.unit)} | {ppl} | {v.passkey.text() if v.passkey else 'n/a'} | {v.why} |")
    stages = "`screen-ppl/report.md`, `screen-passkey/report.md`, `final/report.md`"
    lines += ["", "## Run it elsewhere", "", *commands(model, decided, outcome, saved, cfg), "",
              f"The stages' own reports: {stages}. Took {plan.duration_text(seconds)} this run."]  # fmt: skip
    return "\n".join(lines) + "\n"
