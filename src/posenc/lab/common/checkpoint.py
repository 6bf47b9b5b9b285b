"""Training checkpoints as safetensors: model weights, optimizer state, step and RNG states, written atomically.

safetensors holds only named tensors plus a ``str -> str`` metadata map, so ``optimizer.state_dict()`` is flattened:
each state tensor becomes ``optim.state.<param index>.<key>`` and everything else (hyperparameters, non-tensor
state) goes into one JSON string under the metadata key ``"posenc"``. RNG states are stored as tensors
(``rng.torch`` and ``rng.cuda.<i>`` uint8, ``rng.python`` int64), so resuming continues every random stream.

Every file is written to a temporary name in the same folder and moved into place with ``os.replace``: a crash
leaves the previous file or the new one, never half of either.

Shapes:
    model tensors as in ``model.state_dict()`` (prefixed ``model.``); ``step`` () int64.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from posenc._checks import fail
from posenc.lab.common.files import write_atomic

FORMAT = "posenc.lab.checkpoint/1"
MODEL_PREFIX = "model."
OPTIM_PREFIX = "optim.state."
RNG_PREFIX = "rng."


# ---------------------------------------------------------------------------------------------------------------
# Optimizer state <-> named tensors + JSON


def flatten_optimizer_state(state_dict: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``optimizer.state_dict()`` -> (named tensors, JSON-able rest). Inverse of ``unflatten_optimizer_state``."""
    tensors: dict[str, torch.Tensor] = {}
    plain_state: dict[str, dict[str, Any]] = {}
    for index, entries in state_dict["state"].items():
        plain = {}
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{OPTIM_PREFIX}{index}.{key}"] = value.detach().contiguous()
            else:
                plain[key] = value
        plain_state[str(index)] = plain
    groups = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in state_dict["param_groups"]]
    tuples = sorted({k for g in state_dict["param_groups"] for k, v in g.items() if isinstance(v, tuple)})
    return tensors, {"state": plain_state, "param_groups": groups, "tuple_keys": tuples}


def unflatten_optimizer_state(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> dict[str, Any]:
    """Named tensors + JSON rest -> a dict for ``optimizer.load_state_dict``."""
    state: dict[int, dict[str, Any]] = {int(i): dict(plain) for i, plain in meta["state"].items()}
    for name, value in tensors.items():
        if not name.startswith(OPTIM_PREFIX):
            continue
        index, key = name[len(OPTIM_PREFIX) :].split(".", 1)
        state.setdefault(int(index), {})[key] = value
    tuples = set(meta.get("tuple_keys", ()))
    groups = [{k: tuple(v) if k in tuples else v for k, v in g.items()} for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


# ---------------------------------------------------------------------------------------------------------------
# RNG states <-> tensors


def rng_state() -> dict[str, torch.Tensor]:
    """Every RNG a training step could draw from (torch CPU, each CUDA device, Python's ``random``) as tensors."""
    out = {f"{RNG_PREFIX}torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            out[f"{RNG_PREFIX}cuda.{i}"] = s
    version, words, gauss = random.getstate()
    out[f"{RNG_PREFIX}python"] = torch.tensor([version, *words], dtype=torch.int64)
    out[f"{RNG_PREFIX}python_gauss"] = torch.tensor([float("nan") if gauss is None else gauss], dtype=torch.float64)
    return out


def set_rng_state(tensors: Mapping[str, torch.Tensor]) -> None:
    """Restore the states ``rng_state`` saved (CUDA ones only where the device exists)."""
    if f"{RNG_PREFIX}torch" in tensors:
        torch.set_rng_state(tensors[f"{RNG_PREFIX}torch"])
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            if f"{RNG_PREFIX}cuda.{i}" in tensors:
                torch.cuda.set_rng_state(tensors[f"{RNG_PREFIX}cuda.{i}"], i)
    if f"{RNG_PREFIX}python" in tensors:
        version, *words = tensors[f"{RNG_PREFIX}python"].tolist()
        gauss = float(tensors[f"{RNG_PREFIX}python_gauss"][0])
        random.setstate((version, tuple(words), None if gauss != gauss else gauss))


# ---------------------------------------------------------------------------------------------------------------
# Whole checkpoints


def save_checkpoint(
    path: str | Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    step: int,
    meta: Mapping[str, Any] | None = None,
) -> None:
    """Write ``model`` (and ``optimizer``) at ``step`` completed steps to ``path`` atomically, with RNG states.

    ``meta`` (JSON-able) is stored alongside and returned by ``load_checkpoint``.
    """
    from safetensors.torch import save_file

    tensors, seen = {}, set()
    for name, value in model.state_dict().items():
        value = value.detach().contiguous()
        storage = (value.device, value.untyped_storage().data_ptr())
        # safetensors refuses tensors that share memory: a tied weight (a transformers model's output head) is
        # stored once per name, and loading fills both names with the same values
        tensors[f"{MODEL_PREFIX}{name}"] = value.clone() if storage in seen else value
        seen.add(storage)
    optim_meta = None
    if optimizer is not None:
        optim_tensors, optim_meta = flatten_optimizer_state(optimizer.state_dict())
        tensors.update(optim_tensors)
    tensors.update(rng_state())
    tensors["step"] = torch.tensor(step, dtype=torch.int64)
    tensors = {k: v.cpu() for k, v in tensors.items()}
    header = {"format": FORMAT, "step": step, "optimizer": optim_meta, "meta": dict(meta or {})}
    metadata = {"posenc": json.dumps(header)}
    write_atomic(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))


def _corrupt(path: Path, why: str) -> None:
    fail("checkpoint", str(path), f"a posenc lab checkpoint matching this run ({why}); delete it or pass a fresh --out")


def read_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """All tensors and the JSON header of the checkpoint at ``path`` (on CPU)."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        _corrupt(path, "no such file")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
        header = json.loads(metadata["posenc"])
    except Exception as e:  # safetensors raises its own error types for truncated/garbled files
        _corrupt(path, f"unreadable: {type(e).__name__}: {e}")
    if not isinstance(header, dict) or header.get("format") != FORMAT or "step" not in tensors:
        _corrupt(path, f"not in the {FORMAT} format")
    return tensors, header


def load_checkpoint(
    path: str | Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Load ``path`` into ``model`` (and ``optimizer``), restore RNG states; returns ``{"step", "meta"}``.

    A missing, corrupt or mismatching file (other parameter names or shapes) is a ``ValueError`` naming it.
    """
    path = Path(path)
    tensors, header = read_checkpoint(path)
    weights = {k[len(MODEL_PREFIX) :]: v for k, v in tensors.items() if k.startswith(MODEL_PREFIX)}
    if hasattr(model, "upgrade_state_dict"):  # a lab GPT's weights from before per-layer SSMax
        weights = model.upgrade_state_dict(weights)
    own = model.state_dict()
    if set(weights) != set(own):
        diff = sorted(set(weights) ^ set(own))
        _corrupt(path, f"parameters differ from the model's: {diff[:3]}")
    for name, value in own.items():
        if weights[name].shape != value.shape or weights[name].dtype != value.dtype:
            _corrupt(
                path,
                f"{name} is {tuple(weights[name].shape)} {weights[name].dtype}, the model's "
                f"{tuple(value.shape)} {value.dtype}",
            )
    model.load_state_dict(weights)
    if optimizer is not None:
        if header.get("optimizer") is None:
            _corrupt(path, "no optimizer state")
        try:
            optimizer.load_state_dict(unflatten_optimizer_state(tensors, header["optimizer"]))
        except (KeyError, ValueError, RuntimeError) as e:
            _corrupt(path, f"optimizer state does not fit: {e}")
    if restore_rng:
        set_rng_state(tensors)
    return {"step": int(tensors["step"]), "meta": header.get("meta", {})}
