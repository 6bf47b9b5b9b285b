"""Data-parallel helpers: ``torchrun`` sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT``.

With ``WORLD_SIZE`` > 1 the process group is started on first use (``gloo`` on CPU, ``nccl`` on CUDA) and the model
is wrapped in ``DistributedDataParallel``; every rank trains on its share of each global batch and only rank 0
writes files. With no such environment everything here is a no-op for a single process.
"""

from __future__ import annotations

import inspect
import os

import torch
import torch.distributed as dist
from torch import nn

from posenc._checks import fail


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    if not value.strip().lstrip("-").isdigit():
        fail(name, value, "an integer (set by torchrun)")
    return int(value)


def rank_world() -> tuple[int, int]:
    """This process's rank and the number of processes (``(0, 1)`` without a distributed launch)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)


def local_rank() -> int:
    """This process's index on its machine (``LOCAL_RANK``, default 0)."""
    return _env_int("LOCAL_RANK", 0)


def device() -> torch.device:
    """The device this rank should use: ``cuda:LOCAL_RANK`` when CUDA is available, else the CPU."""
    return torch.device("cuda", local_rank()) if torch.cuda.is_available() else torch.device("cpu")


def init() -> tuple[int, int]:
    """Start the process group if ``WORLD_SIZE`` > 1 and none is running; returns ``(rank, world)``."""
    rank, world = rank_world()
    if world > 1 and not dist.is_initialized():
        if not dist.is_available():
            fail("WORLD_SIZE", world, "1: this torch build has no torch.distributed")
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank())
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
        rank, world = rank_world()
    return rank, world


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def is_main() -> bool:
    """True on rank 0 (the rank that writes files and shows progress)."""
    return rank_world()[0] == 0


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """``x`` summed over ranks, in place (``x`` itself for a single process)."""
    if is_distributed():
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def wrap(model: nn.Module) -> nn.Module:
    """``model`` in ``DistributedDataParallel`` when distributed, else unchanged.

    Buffers are not broadcast each step: the encodings' buffers (``inv_freq``, slopes) are fixed functions of the
    config, identical on every rank.
    """
    if not is_distributed():
        return model
    dev = next(model.parameters()).device
    ids = [dev.index] if dev.type == "cuda" else None
    ddp = nn.parallel.DistributedDataParallel
    # torch 2.13 renamed the flag (the old one warns); older releases only know broadcast_buffers
    no_sync = (
        "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(ddp).parameters else "broadcast_buffers"
    )
    return ddp(model, device_ids=ids, **{no_sync: False})


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a ``DistributedDataParallel`` wrapper (or ``model`` itself)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def cleanup() -> None:
    """Destroy the process group if one is running (call once, at the end of the program)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
