"""The deciding pick's stages run and concluded (``deciding`` holds the rules, ``keys_report`` the words).

Called by ``pick.run.run_pick`` for a new pick (a folder made before the deciding race resumes as it began). Ctrl-C or
SIGTERM keeps every document measured and rewrites ``pick.md`` from them; ``--resume`` continues where it stood.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posenc.lab.extend.pick import deciding, evidence, inside, ledger, racing, rules
from posenc.lab.extend.pick import keys_report as text
from posenc.lab.extend.pick.asking import Asking
from posenc.lab.extend.pick.plan import PickPlan, stage_configs
from posenc.lab.extend.settings.config import ExtendConfig
from posenc.lab.extend.stats.rates import UNPATCHED
from posenc.lab.extend.study.report import label
from posenc.lab.extend.targets.base import PretrainedTarget

Unit = tuple[str, float, int, str]


@dataclasses.dataclass(frozen=True)
class Settings:
    """The deciding race's own settings (stored in ``pick.json``)."""

    keys: int = deciding.KEYS
    documents: int = deciding.DOCUMENTS
    delta: float = 0.05
    keep_short: bool = False
    ask: str = deciding.ASK

    @property
    def asking(self) -> Asking:
        return Asking(self.keys, self.ask)

    def stored(self) -> dict[str, Any]:
        """As ``pick.json`` holds them; ``ask`` only where it is not "document", as folders made before it have
        them (they resume as they began)."""
        fields = dataclasses.asdict(self)
        if self.ask == "document":
            del fields["ask"]
        return {"design": "keys", **fields}


def check(target: PretrainedTarget, settings: Settings, seed: int) -> None:
    """Before anything is written: the documents of ``settings.keys`` keys the cost inside the original context is
    measured on (the first ``inside.DOCUMENTS`` at L, drawn as they will be) fit in it."""
    from posenc._checks import fail
    from posenc.lab.extend.needles.keys import LABELS, min_length

    if settings.keys > len(LABELS):
        fail("keys", settings.keys, f"at most {len(LABELS)} keys per document (one label each)")
    whole = target.original_len
    need = max(min_length(target.tokenizer, settings.keys, evidence.document_seed(seed, whole, d))
               for d in range(inside.DOCUMENTS))
    if need > whole:
        fail("keys", settings.keys, f"fewer keys per document: {settings.keys} keys and their questions take "
             f"{need} tokens, more than the original context ({whole} tokens) the cost inside it is measured in")


def measure_and_pick(cfg: ExtendConfig, target: PretrainedTarget, pick_plan: PickPlan, settings: Settings, out: Path,
                     deadline: racing.Deadline, start: float, *, save: str | Path | None, save_type: str, device: str,
                     progress: bool) -> dict[str, Any]:
    """The stages in order, then the pick; an interrupt rewrites ``pick.md`` from what was measured and goes on."""
    try:
        _measure(cfg, target, pick_plan, settings, out, deadline, progress)
    except KeyboardInterrupt:
        try:
            conclude(cfg, target, pick_plan, settings, out, start, ended="interrupted", save=None, save_type=save_type,
                     device=device, progress=progress)
        except Exception as err:  # the interrupt comes first
            print(f"posenc: {out / 'pick.md'} was not rewritten after the interrupt ({type(err).__name__}: {err})",
                  file=sys.stderr)
        raise
    return conclude(cfg, target, pick_plan, settings, out, start, ended=None, save=save, save_type=save_type,
                    device=device, progress=progress)


def _say(line: str) -> None:
    print(line, flush=True)


def _whole(out: Path, pick_plan: PickPlan) -> list[Unit] | None:
    """The candidates whose perplexity at T is not broken; None while the perplexity screen is not over."""
    from posenc.lab.extend.pick.stages import stage_rows

    units = [c.unit for c in pick_plan.candidates]
    rows = stage_rows(out, "screen-ppl")
    if not {UNPATCHED, *units} <= rules.ppl_measured(rows, pick_plan.target):
        return None
    broken = rules.broken(rows, units, target=pick_plan.target)
    return [u for u in units if u not in broken] + [tuple(u) for u in pick_plan.tuned]


def _measure(cfg: ExtendConfig, target: PretrainedTarget, pick_plan: PickPlan, settings: Settings, out: Path,
             deadline: racing.Deadline, progress: bool) -> None:
    from posenc.lab.extend.study.run import model_for, run_extend

    say = _say if progress else None
    ppl_cfg = stage_configs(cfg, pick_plan, settings.documents)[0]
    units = [c.unit for c in pick_plan.candidates]
    run_extend(ppl_cfg, out / "screen-ppl", resume=True, progress=progress, units=units,
               measurements=[("ppl", pick_plan.target, None)], stop=deadline.passed)
    whole = _whole(out, pick_plan)
    if whole is None:
        return
    if not whole:
        return  # every candidate breaks the language model: the verdict says so
    if target.model is None:
        target.load()

    def model_of(unit: Unit) -> Any:  # noqa: ANN401
        if say is not None:
            say(f"{label(*unit)}: loading and patching")
        return model_for(target, unit)[0]

    if say is not None:
        say(f"Inside the context ({target.original_len} tokens): perplexity at L/4 and L, "
            f"{inside.DOCUMENTS} documents of {settings.asking.text()} at L, per model")
    done = deciding.measure_inside(out / inside.INSIDE_FILE, out / evidence.NEEDLES_FILE, target, whole, model_of,
                                   settings.asking, seed=cfg.seed, stop=deadline.passed, say=say)
    if not done:
        return
    costs = _costs(out, target, whole, settings)
    raced = deciding.race_units(whole, costs, settings.keep_short)
    if say is not None:
        say(f"The race at {pick_plan.target} tokens: {', '.join(label(*u) for u in raced)}; documents of "
            f"{settings.asking.text()}, looks at {', '.join(map(str, _looks(settings)))} documents")

    def scorer(unit: Unit) -> Any:  # noqa: ANN401
        return deciding.scoring(target, model_of(unit), unit, pick_plan.target, settings.asking, cfg.seed)

    deciding.run_race(out / evidence.NEEDLES_FILE, raced, pick_plan.target, settings.asking, settings.documents,
                      target.model_type, settings.delta, scorer, seed=cfg.seed, stop=deadline.passed, say=say)


def _looks(settings: Settings) -> list[int]:
    return list(deciding.plan_of(settings.documents).looks)


def _costs(out: Path, target: PretrainedTarget, whole: Sequence[Unit], settings: Settings) -> dict[Unit, inside.Cost]:
    return deciding.inside_costs(inside.read(out / inside.INSIDE_FILE), evidence.read(out / evidence.NEEDLES_FILE),
                                 whole, target.original_len, settings.asking)


def conclude(cfg: ExtendConfig, target: PretrainedTarget, pick_plan: PickPlan, settings: Settings, out: Path,
             start: float, *, ended: str | None, save: str | Path | None, save_type: str, device: str,
             progress: bool) -> dict[str, Any]:
    """The pick from what the folder holds (nothing measured): the race replayed, the verdict, the save, ``pick.md``.
    ``ended``: "interrupted", or None (the deadline or the race's end, read from the state)."""
    from posenc.lab.extend.pick.stages import save_pick, stage_rows

    took = ledger.total_text(ledger.read(out), time.perf_counter() - start)
    whole = _whole(out, pick_plan)
    ppl_rows = stage_rows(out, "screen-ppl")
    if whole is not None and not whole:
        body = text.nothing_whole(target, pick_plan, ppl_rows)
        text.write(out, body + took + "\n")
        return {"pick": None, "ended": "none", "verdict": "none", "reason": body}
    needles = evidence.read(out / evidence.NEEDLES_FILE)
    costs = _costs(out, target, whole, settings) if whole is not None else {}
    if whole is None or not all(evidence.documents_of(needles, u, target.original_len, settings.asking.keys_of(u))
                                >= inside.DOCUMENTS for u in [UNPATCHED, *whole]):
        stage = "the perplexity screen" if whole is None else "the cost inside the context"
        text.write(out, text.unfinished(out, stage, ended == "interrupted"))
        if progress:
            print(f"{'Interrupted' if ended == 'interrupted' else 'Deadline'}: {stage} is not over; continue with "
                  "--resume")
        return {"pick": None, "ended": ended or "deadline", "stage": stage}
    raced = deciding.race_units(whole, costs, settings.keep_short)
    state = deciding.replay(needles, raced, pick_plan.target, settings.asking, settings.documents, target.model_type,
                            settings.delta, cut=True)
    if state.decision is None:
        text.write(out, text.unfinished(out, "the race's first look", ended == "interrupted"))
        return {"pick": None, "ended": ended or "deadline", "stage": "the race's first look"}
    how = ended or ("decided" if state.decision.status != "open" else "cap" if state.over else "deadline")
    verdict = text.Verdict.of(state, how, target.model_type, settings.delta)
    saved = None
    if save is not None and verdict.pick is not None and how != "interrupted":
        saved = save_pick(stage_configs(cfg, pick_plan, settings.documents)[2], out, verdict.pick, save, save_type,
                      device, progress)
    if save is not None and verdict.pick is None and progress:
        print(f"Not saved to {save}: {verdict.reason}")
    body = text.pick_text(cfg, target, pick_plan, settings, state, verdict, costs, ppl_rows, saved, took)
    text.write(out, body)
    if progress:
        print(text.summary(verdict, state, costs))
    return {"pick": None if verdict.pick is None else label(*verdict.pick), "unit": verdict.pick,
            "verdict": verdict.status, "reason": verdict.reason, "ended": how, "saved": saved, "plan": pick_plan,
            "shown": verdict.status in ("better", "within")}

