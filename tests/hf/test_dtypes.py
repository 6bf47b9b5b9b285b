"""Which dtype a pretrained model runs in (``posenc.hf.dtypes``): bfloat16 only where the CPU has the units."""

from __future__ import annotations

import pytest
import torch

from posenc.hf.dtypes import auto_dtype, check_runs_fast, cpu_units, slow_reason


@pytest.fixture
def caps(monkeypatch):
    def set_units(**units):
        base = {**torch.cpu.get_capabilities(), "avx512_bf16": False, "amx_bf16": False, "amx_fp16": False,
                "avx512_fp16": False, "cpu_name": "Test CPU", **units}
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: base)

    return set_units


@pytest.mark.parametrize(("units", "want"), [({}, torch.float32), ({"amx_bf16": True}, torch.bfloat16),
                                             ({"avx512_bf16": True}, torch.bfloat16),
                                             ({"amx_fp16": True}, torch.float32)])
def test_auto_on_cpu(caps, units, want):
    caps(**units)
    assert auto_dtype("cpu") == want
    assert auto_dtype("cpu", torch.float16) == want  # a checkpoint's own half dtype does not decide on CPU


def test_auto_on_cuda_is_the_checkpoints_own(caps):
    caps()
    assert auto_dtype("cuda", torch.float16) == torch.float16
    assert auto_dtype("cuda:1", torch.float32) == torch.float32
    assert auto_dtype("cuda", None) == torch.bfloat16  # a GGUF has none
    assert auto_dtype("mps") == torch.float32


def test_slow_dtypes_are_refused_naming_the_setting_and_the_reason(caps):
    caps()
    for dtype, units in ((torch.bfloat16, "AVX512-BF16 or AMX-BF16"), (torch.float16, "AVX512-FP16 or AMX-FP16")):
        assert cpu_units(dtype) == []
        with pytest.raises(ValueError, match=rf"dtype='{str(dtype)[6:]}' is invalid: expected float32 or auto on "
                                             rf"this machine \(Test CPU has no .* units \({units}\)"):
            check_runs_fast("dtype", dtype, "cpu")
    check_runs_fast("dtype", torch.float32, "cpu")
    check_runs_fast("dtype", torch.bfloat16, "cuda")  # not a CPU: not this module's call
    caps(amx_bf16=True)
    assert cpu_units(torch.bfloat16) == ["amx_bf16"] and slow_reason(torch.bfloat16, "cpu") is None
    check_runs_fast("dtype", torch.bfloat16, "cpu")


def test_load_causal_lm_warns_for_a_slow_dtype(caps, tmp_path):
    """The library loads what it is asked for, but says it will be slow (the lab refuses instead)."""
    pytest.importorskip("transformers")
    from hf.tiny import tiny_model
    from lab.extend.needles.test_passkey import byte_bpe_tokenizer
    from posenc.hf import load_causal_lm

    tokenizer = byte_bpe_tokenizer(tmp_path)
    tiny_model("llama", vocab_size=len(tokenizer)).save_pretrained(tmp_path)
    caps()
    with pytest.warns(UserWarning, match=r"load_causal_lm\(dtype=torch.bfloat16\): Test CPU has no bfloat16 units"):
        model, _ = load_causal_lm(tmp_path, dtype="bfloat16")
    assert model.dtype == torch.bfloat16
