"""The remapping attention on CUDA: the same numbers as its written-out float64 reference and as the CPU.

Every method (``tests/remapping/test_methods.py``'s cases) through ``remap_attention`` on CUDA in float64 equals the
reference within the float64 bound, and in float32 within the float32 bound; a patched tiny Llama (every method by
name through ``extend_context``) gives on CUDA the logits it gives on the CPU -- within the float32 rounding the
unpatched model already shows between the two devices --, with and without the KV cache.
Marked ``gpu``: skipped without CUDA (CI), run by a GPU session with ``pytest -m gpu``.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from hf.tiny import tiny_model
from posenc.hf import extend_context
from posenc.remapping import METHODS, remap_attention
from remapping.test_methods import CASES, logit_factor, qkv, reference, rope
from tolerances import rotated_softmax_atol

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("method", CASES, ids=repr)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_each_method_on_cuda_matches_the_reference(method, dtype):
    b, h, hkv, s, d = 2, 4, 2, 40, 16
    q, k, v = qkv(b, h, hkv, s, d, dv=2)
    enc = rope(d, "interleaved")
    expected = reference(method, q, k, v, enc, "interleaved")
    q32, k32, v32 = (x.to(dtype) for x in (q, k, v))
    out = remap_attention(q32.cuda(), k32.cuda(), v32.cuda(), method=method, encoding=enc.cuda(), block=16)
    assert out.device.type == "cuda" and out.dtype == dtype
    tol = rotated_softmax_atol(q32, k32, v32, dtype, max_position=s, logit_factor=logit_factor(method, s))
    assert_close(out.cpu().double(), expected, atol=tol, rtol=0)


def _float64_llama(seed: int = 0):
    torch.manual_seed(seed)
    return tiny_model("llama").double()


@pytest.mark.parametrize("name", sorted(METHODS))
def test_a_patched_model_on_cuda_equals_the_cpu(name):
    """Logits of a float64 tiny Llama patched with ``name``: CUDA == CPU, without the cache (one 60-token forward,
    past the tiny model's context) and through greedy generation with it.

    transformers' Llama runs its RMSNorm (and its own rotary tables) in float32 whatever the model's dtype, and CUDA's
    float32 ``rsqrt``, ``cos`` and reductions round differently from the CPU's: the *unpatched* model already differs
    between the devices at float32 level (~5e-8 here, seen on an H200). The patch must add nothing beyond that: the
    bound is 8x the unpatched model's own CUDA-CPU difference on the same input, plus a few hundred float64
    roundings. A wrong position, mask or scale on CUDA moves logits by 1e-3 and more.
    """
    factor = 1.5 if name == "string" else 2.0
    x = torch.randint(3, 64, (1, 60), generator=torch.Generator().manual_seed(1))
    cpu, gpu = _float64_llama(), _float64_llama()
    with torch.no_grad():
        plain = cpu(input_ids=x, use_cache=False).logits
        plain_gap = float((gpu.cuda()(input_ids=x.cuda(), use_cache=False).logits.cpu() - plain).abs().max())
    cpu, gpu = _float64_llama(), _float64_llama()
    extend_context(cpu, name, factor)
    extend_context(gpu, name, factor)
    gpu = gpu.cuda()
    with torch.no_grad():
        expected = cpu(input_ids=x, use_cache=False).logits
        got = gpu(input_ids=x.cuda(), use_cache=False).logits.cpu()
        assert not torch.equal(expected, plain)  # past the tiny model's context: the patch changes the logits
        tol = 8 * plain_gap + 512 * torch.finfo(torch.float64).eps * float(expected.abs().max())
        assert_close(got, expected, atol=tol, rtol=0)
        steps = [m.generate(x[:, :40].to(dev), max_new_tokens=8, do_sample=False, pad_token_id=0)
                 for m, dev in ((cpu, "cpu"), (gpu, "cuda"))]
    assert torch.equal(steps[0], steps[1].cpu())
