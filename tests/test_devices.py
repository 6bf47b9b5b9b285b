"""``resolve_device``: every --device is checked against this machine before any work, with the devices it allows.

CUDA and MPS availability are patched, so every branch runs on any machine.
"""

import pytest
import torch

from posenc._devices import available_devices, resolve_device


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


@pytest.fixture
def one_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


def test_cpu_only_machine(no_gpu):
    assert available_devices(allow_auto=True) == ["auto", "cpu"]
    assert available_devices(allow_auto=False) == ["cpu"]
    assert resolve_device("cpu", allow_auto=False) == "cpu"
    assert resolve_device("cpu:0", allow_auto=False) == "cpu:0"
    assert resolve_device("auto", allow_auto=True) == "cpu"
    for name in ("cuda", "cuda:0"):
        with pytest.raises(ValueError, match=rf"^--device='{name}' is invalid: expected one of \['cpu'\]: this "
                                             r"machine has no CUDA device"):
            resolve_device(name, allow_auto=False)
    with pytest.raises(ValueError, match=r"--device='mps' is invalid: .*MPS is not available here"):
        resolve_device("mps", allow_auto=True)


def test_one_gpu_machine(one_gpu):
    assert available_devices(allow_auto=False) == ["cpu", "cuda", "cuda:0"]
    assert resolve_device("cuda", allow_auto=False) == "cuda"
    assert resolve_device("cuda:0", allow_auto=False) == "cuda:0"
    assert resolve_device("auto", allow_auto=True) == "cuda"
    with pytest.raises(ValueError, match=r"--device='cuda:1' is invalid: .*this machine has 1 CUDA device"):
        resolve_device("cuda:1", allow_auto=False)


@pytest.mark.parametrize("name", ["banana", "CPU", "cuda:x", "cuda:-1", "", "auto"])
def test_names_torch_cannot_parse_and_auto_where_not_allowed(no_gpu, name):
    with pytest.raises(ValueError, match=rf"^--device='{name}' is invalid: expected one of \['cpu'\]$"):
        resolve_device(name, allow_auto=False)


@pytest.mark.parametrize("name", ["meta", "xpu", "hpu"])
def test_device_types_the_lab_does_not_run_on(no_gpu, name):
    with pytest.raises(ValueError, match=rf"--device='{name}' is invalid: .*\(the lab runs on cpu, cuda, mps\)"):
        resolve_device(name, allow_auto=True)


def test_not_a_string(no_gpu):
    with pytest.raises(ValueError, match=r"--device=0 is invalid"):
        resolve_device(0, allow_auto=True)
