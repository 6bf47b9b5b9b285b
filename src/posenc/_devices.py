"""One check of a ``device`` name for every command, before any work: a clear error instead of a traceback.

``torch.device`` accepts names this machine cannot run (``cuda`` without CUDA, ``cuda:3`` on a one-GPU machine,
``meta``); the failure then comes deep inside the first ``.to(device)``, after files were written. ``resolve_device``
refuses those up front with the devices this machine has (``posenc.deploy`` and the lab).
"""

from __future__ import annotations

import torch

from posenc._checks import fail

#: Device types the lab runs on.
KINDS = ("cpu", "cuda", "mps")


def available_devices(*, allow_auto: bool) -> list[str]:
    """The device names this machine runs: ``auto`` (when allowed), ``cpu``, ``cuda`` and ``cuda:<i>``, ``mps``."""
    names = ["auto"] if allow_auto else []
    names.append("cpu")
    if torch.cuda.is_available():
        names += ["cuda", *(f"cuda:{i}" for i in range(torch.cuda.device_count()))]
    if torch.backends.mps.is_available():
        names.append("mps")
    return names


def resolve_device(name: object, *, allow_auto: bool) -> str:
    """``name`` checked against this machine; ``auto`` becomes ``cuda`` when CUDA is available, else ``cpu``.

    Raises:
        ValueError: naming ``--device``, the value and the devices this machine allows, for a name torch cannot
            parse, a device type the lab does not run on, CUDA or MPS absent here, or a CUDA index past the last GPU.
    """
    allowed = available_devices(allow_auto=allow_auto)
    why = f"one of {allowed}"
    if not isinstance(name, str):
        fail("--device", name, why)
    if allow_auto and name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        fail("--device", name, why)
    if device.type not in KINDS:
        fail("--device", name, f"{why} (the lab runs on {', '.join(KINDS)})")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            fail("--device", name, f"{why}: this machine has no CUDA device (torch.cuda.is_available() is False)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            fail("--device", name, f"{why}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        fail("--device", name, f"{why}: MPS is not available here (torch.backends.mps.is_available() is False)")
    return name
