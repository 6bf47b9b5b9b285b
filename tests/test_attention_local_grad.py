"""Sinks, sliding windows, chunks and documents together, forward and backward: every backend that can train with them
equals ``eager`` -- ``sdpa`` on CPU here, ``flex`` on CUDA (FlexAttention has no CPU backward; skipped without CUDA).

The inputs span more than one 128-token FlexAttention tile with a window narrower than a tile, so the block mask skips
tiles, keeps partial ones and the sink's tile. Tolerances: ``tolerances.attention_atol`` for outputs (the sink is the
largest logit a bias adds) and ``tolerances.grad_atols`` for the gradients of ``(w * out).sum()`` in q, k, v and the
sinks, from the float64 Jacobian of the eager reference.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import posenc
from tolerances import attention_atol, grad_atols

B, H, HKV, S, D = 1, 2, 1, 160, 16
CASES = {
    "sinks+window": {"window": 48},
    "sinks+window+chunks": {"window": 48, "chunk_size": 64},
    "sinks+window+documents": {"window": 48, "document_ids": torch.tensor([0] * 100 + [1] * 60)},
}
DEVICES = [("cpu", "sdpa"), pytest.param("cuda", "flex", marks=pytest.mark.gpu)]


@pytest.mark.flex_compiled
@pytest.mark.parametrize(("device", "backend"), DEVICES)
@pytest.mark.parametrize("case", CASES)
def test_forward_and_backward_match_eager(device, backend, case):
    torch.manual_seed(0)
    options = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in CASES[case].items()}
    positions = torch.arange(S, device=device)
    if "document_ids" in options:  # positions restart per document, as a packed row's do
        positions = torch.cat([torch.arange(100), torch.arange(60)]).to(device)
    q = torch.randn(B, H, S, D, device=device)
    k = torch.randn(B, HKV, S, D, device=device)
    v = torch.randn(B, HKV, S, D, device=device)
    sinks = torch.randn(H, device=device)
    w = torch.randn(B, H, S, D, device=device)

    def run(q, k, v, sinks, backend):  # noqa: ANN001, ANN202
        return posenc.attention(q, k, v, q_positions=positions, sinks=sinks, backend=backend, **options)

    results = {}
    for name in ("eager", backend):
        params = [x.detach().clone().requires_grad_() for x in (q, k, v, sinks)]
        out = run(*params, name)
        results[name] = (out.detach(), torch.autograd.grad((w * out).sum(), params))
    atol = attention_atol(q, k, v, bias_max=float(sinks.abs().max()))
    assert_close(results[backend][0], results["eager"][0], rtol=0, atol=atol)
    atols = grad_atols(lambda *ps: run(*ps, "eager"), [q, k, v, sinks], w)
    grads = zip(("q", "k", "v", "sinks"), results[backend][1], results["eager"][1], atols, strict=True)
    for name, got, want, tol in grads:
        assert_close(got, want, rtol=0, atol=tol, msg=lambda m, name=name: f"d/d{name}: {m}")
    # the options matter: without the window the output moves
    plain = posenc.attention(q, k, v, q_positions=positions, sinks=sinks, backend="eager",
                             **{k_: v_ for k_, v_ in options.items() if k_ != "window"})
    assert (plain - results["eager"][0]).abs().max() > 100 * atol
