"""What every design of ``--pick`` reads and writes the same way: a stage's stored rows, and the save of the pick."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from posenc.lab.extend.settings.config import ExtendConfig
from posenc.lab.extend.study import plan
from posenc.lab.extend.study.report import label
from posenc.lab.extend.targets.base import as_pretrained
from posenc.lab.extend.targets.load import load_target


def stage_rows(out: Path, stage: str) -> list[dict]:
    from posenc.lab.extend.study.run import read_results

    path = out / stage / "results.csv"
    return read_results(path) if path.is_file() else []


def save_pick(cfg: ExtendConfig, out: Path, unit: tuple, save: str | Path, save_type: str, device: str,
          progress: bool) -> Path:
    """Write the pick: the race's model reloaded and patched again (a fine-tuned one from its finished run)."""
    from posenc.lab.extend.study.run import check_save, model_for, write_saved

    method, factor, steps, positions = unit
    one = dataclasses.replace(cfg, methods=(method,), factors=(factor,), finetune_steps=steps,
                              finetune_positions=(positions,))
    final = out / "final"
    target = as_pretrained(load_target(one, final, device=device, progress=False))  # the pick refused a lab model
    resolved = plan.resolve(one, kind=target.kind, original=target.original_len,
                            default_methods=target.default_methods, device=device)
    resolved = dataclasses.replace(resolved, dtype=str(target.dtype).removeprefix("torch."))
    target.use(resolved)
    path = check_save(save, resolved, target, out, save_type)
    assert path is not None  # a save was asked for
    target.load()
    patched, _, _ = model_for(target, unit)
    write_saved(target, patched, path, save_type, progress)  # posenc.deploy's write path, as --save's
    if progress:
        print(f"Saved the pick, {label(*unit)}, to {path}")
    return path
