"""Which target a model is: ``load_target`` reads ``ExtendConfig.model`` (a ``posenc lab`` run folder, ``new``, a
GGUF file, a transformers folder, ``smollm2``) and returns a ``LabTarget`` (small: loaded at once) or an ``HFTarget``
(no weight read before ``HFTarget.load``); ``original_len_of`` reads the original context from a config alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posenc.deploy.source import is_hf_folder, is_lab_run, is_name, model_error, study_runs
from posenc.lab.extend.settings.config import ExtendConfig
from posenc.lab.extend.targets.base import Target
from posenc.lab.extend.targets.hf import HFTarget
from posenc.lab.extend.targets.lab import LabTarget

if TYPE_CHECKING:  # mypy checks that each target has the interface its users rely on (``base``)
    from posenc.lab.extend.targets.base import PretrainedTarget

    _LAB: type[Target] = LabTarget
    _HF: type[PretrainedTarget] = HFTarget


def _hf_original_len(config: Any) -> int | None:
    """The context a transformers model was trained for: its scaling's original length, else its maximum.

    ``config`` is a ``PretrainedConfig`` or the dict of its ``config.json`` (read before loading any weights)."""
    get = config.get if isinstance(config, Mapping) else lambda name: getattr(config, name, None)
    for params in (get("rope_parameters"), get("rope_scaling")):
        if isinstance(params, Mapping) and params.get("original_max_position_embeddings"):
            return int(params["original_max_position_embeddings"])
    for name in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = get(name)
        if isinstance(value, int) and value > 0:
            return value
    return None


def load_target(cfg: ExtendConfig, out: Path, *, device: str, progress: bool) -> Target:
    """The model ``cfg.model`` names, behind the interface ``run_extend`` measures through. A pretrained model is
    not loaded here (``HFTarget.load``): its config, tokenizer and GGUF header are enough for every check."""
    if cfg.is_new:
        return LabTarget(cfg, out, device, progress)
    path = Path(cfg.model).expanduser()
    if path.is_dir():
        if is_lab_run(path):  # a lab run's config.json has no model_type: the lab's, checked first
            return LabTarget(cfg, out, device, progress)
        runs = ", ".join(map(str, study_runs(path)))
        if runs:
            model_error(cfg.model, f"this is a posenc lab study folder; pass one of its runs: {runs}")
        if not is_hf_folder(path) and not any(p.suffix.lower() == ".gguf" for p in path.iterdir()):
            model_error(cfg.model, "this folder holds none of them")
    elif not path.exists() and not is_name(cfg.model):
        model_error(cfg.model, "no such file or folder")
    return HFTarget(cfg, out, device, progress)


def original_len_of(cfg: ExtendConfig) -> int | None:
    """The model's original context read from its config alone (no weights loaded); None where that does not say
    (``load_target`` then loads the model, or explains what the folder lacks)."""
    if cfg.original_len is not None:
        return cfg.original_len
    if cfg.is_new:
        return cfg.train_len
    try:
        config = json.loads((Path(cfg.model) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    if isinstance(config.get("model"), dict):  # a posenc lab run: ModelConfig.max_len
        length = config["model"].get("max_len")
        return length if isinstance(length, int) and not isinstance(length, bool) and length > 0 else None
    return _hf_original_len(config) if "model_type" in config else None
