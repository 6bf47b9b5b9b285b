"""RoPE in float32 inside bfloat16 transformers models (``posenc.hf.keep_rope_float32``, applied by extend_context).

The reference is the rotation of the same bfloat16 q and k computed in float32 from float32 tables (transformers'
own float32 arithmetic), rounded once to bfloat16: with the patch the model's rotated q and k must equal it bit for
bit at every position; transformers' own bfloat16 path (tables cast to bfloat16, rotation in bfloat16) is shown to
be several roundings away from it at long positions.
"""

from __future__ import annotations

import copy
import sys

import pytest
import torch
from tests.hf.tiny import ROPE_KINDS, tiny_model

from posenc.hf import extend_context, keep_rope_float32

U_BF16 = 2.0**-8  # bfloat16's unit roundoff: 8 significand bits
LONG = torch.arange(0, 40_000, 625)[None]  # (1, 64) positions up to 39,375: far past the tiny models' 32


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    return torch.cat((-x[..., x.shape[-1] // 2 :], x[..., : x.shape[-1] // 2]), dim=-1)


def _recorded_rotations(model, monkeypatch, positions: torch.Tensor) -> list[tuple]:
    """Run ``model`` over ``positions`` and return, for every call of its modeling module's
    ``apply_rotary_pos_emb``: (q, k, cos, sin, q_out, k_out)."""
    calls = []
    modules = {sys.modules[type(m).__module__] for m in model.modules()}
    for module in [m for m in modules if hasattr(m, "apply_rotary_pos_emb")]:
        current = module.apply_rotary_pos_emb

        def recorder(q, k, cos, sin, *args, _apply=current, **kwargs):
            q_out, k_out = _apply(q, k, cos, sin, *args, **kwargs)
            calls.append((q, k, cos, sin, q_out, k_out))
            return q_out, k_out

        monkeypatch.setattr(module, "apply_rotary_pos_emb", recorder)
    ids = torch.randint(0, 64, positions.shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(input_ids=ids, position_ids=positions, use_cache=False)
    monkeypatch.undo()
    assert calls, "the model never called apply_rotary_pos_emb"
    return calls


def _float32_rotation(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` rotated in float32 with float32 tables (the rotary part is the first ``cos.shape[-1]`` channels).

    Shapes:
        x (B, H, S, D); cos, sin (B, S, Dr) -> (B, H, S, D) float32.
    """
    cos, sin = cos.float()[:, None], sin.float()[:, None]  # (B, 1, S, Dr)
    rot, rest = x.float()[..., : cos.shape[-1]], x.float()[..., cos.shape[-1] :]
    return torch.cat((rot * cos + _rotate_half(rot) * sin, rest), dim=-1)


def _bf16(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return tiny_model(kind).to(torch.bfloat16)


@pytest.mark.parametrize("kind", ROPE_KINDS)
def test_patched_rotation_is_the_float32_one_rounded_once(kind, monkeypatch):
    model = _bf16(kind)
    assert keep_rope_float32(model) >= 1
    for q, k, cos, sin, q_out, k_out in _recorded_rotations(model, monkeypatch, LONG):
        assert cos.dtype == sin.dtype == torch.float32, "the tables stay float32"
        assert q_out.dtype == q.dtype == torch.bfloat16 and k_out.dtype == k.dtype  # the cache sees the model's dtype
        assert torch.equal(q_out, _float32_rotation(q, cos, sin).to(torch.bfloat16))
        assert torch.equal(k_out, _float32_rotation(k, cos, sin).to(torch.bfloat16))


@pytest.mark.parametrize("kind", ["llama", "gpt_neox", "gemma3_text"])
def test_bfloat16_tables_are_further_from_float32_at_long_positions(kind, monkeypatch):
    """The gain: transformers' own bfloat16 path errs by more than one rounding; the patched path by at most one
    (checked against the float32 tables' rotation of the same inputs, both models having the same weights)."""
    plain = _bf16(kind)
    patched = copy.deepcopy(plain)
    keep_rope_float32(patched)
    for (q, _, _, _, q_plain, _), (q2, _, cos, sin, q_patched, _) in zip(
        _recorded_rotations(plain, monkeypatch, LONG), _recorded_rotations(patched, monkeypatch, LONG), strict=True
    ):
        assert torch.equal(q, q2)  # same weights, same inputs: only the rotation differs
        exact = _float32_rotation(q, cos, sin)  # (B, H, S, D) float32
        scale = exact.abs().clamp_min(torch.finfo(torch.bfloat16).tiny)
        err_plain = ((q_plain.float() - exact).abs() / scale).max()
        err_patched = ((q_patched.float() - exact).abs() / scale).max()
        assert err_patched <= U_BF16
        assert err_plain > 2 * U_BF16, f"transformers' bfloat16 rotation erred by only {float(err_plain):.2e}"


def test_no_change_for_float32_models_and_unhooked_bfloat16_ones():
    """The wrapped apply_rotary_pos_emb is a no-op where the tables already have q's dtype."""
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (1, 40))
    fresh = tiny_model("llama")
    state = fresh.state_dict()
    module = sys.modules[type(fresh).__module__]
    original = getattr(module.apply_rotary_pos_emb, "__wrapped__", module.apply_rotary_pos_emb)
    with torch.no_grad():
        keep_rope_float32(tiny_model("llama", state))  # installs the wrapper
        assert module.apply_rotary_pos_emb is not original
        for dtype in (torch.float32, torch.bfloat16):
            model = tiny_model("llama", state).to(dtype)
            wrapped = model(ids).logits
            saved, module.apply_rotary_pos_emb = module.apply_rotary_pos_emb, original
            try:
                plain = model(ids).logits
            finally:
                module.apply_rotary_pos_emb = saved
            assert torch.equal(wrapped, plain)


def test_idempotent_and_float32_unchanged(monkeypatch):
    model = tiny_model("llama")
    ids = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids).logits
        keep_rope_float32(model)
        keep_rope_float32(model)
        assert torch.equal(model(ids).logits, before)
    hooks = list(model.model.rotary_emb._forward_pre_hooks.values())
    assert len(hooks) == 1


def test_extend_context_keeps_a_bfloat16_models_rotation_in_float32(monkeypatch):
    model = _bf16("llama")
    extend_context(model, "yarn", 4.0)
    for q, _, cos, sin, q_out, _ in _recorded_rotations(model, monkeypatch, LONG):
        assert cos.dtype == torch.float32
        assert torch.equal(q_out, _float32_rotation(q, cos, sin).to(torch.bfloat16))


def test_autocast_is_left_as_transformers_has_it(monkeypatch):
    """Under autocast (float32 weights, bfloat16 matmuls) the rotation's result keeps the dtype transformers gives."""
    plain = tiny_model("llama")
    patched = copy.deepcopy(plain)
    keep_rope_float32(patched)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _recorded_rotations(patched, monkeypatch, LONG)
        want = _recorded_rotations(plain, monkeypatch, LONG)
    for a, b in zip(got, want, strict=True):
        for x, y in zip(a, b, strict=True):
            assert x.dtype == y.dtype and torch.equal(x, y)


def test_a_module_for_apply_rotary_pos_emb_is_wrapped_without_its_state():
    """transformers 5.25 with ``kernels`` makes ``apply_rotary_pos_emb`` a callable ``nn.Module`` (kernels' ``Func``):
    the cast-back wrapper calls it, casts its float32 results to q's dtype and copies none of its module state."""
    from posenc.hf.rope_float32 import _casting_back

    class Func(torch.nn.Module):
        def forward(self, q, k, cos, sin):  # noqa: ANN001, ANN202
            return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin

    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 5, 8, generator=g).to(torch.bfloat16) for _ in range(2))
    cos, sin = torch.randn(1, 1, 5, 8, generator=g), torch.randn(1, 1, 5, 8, generator=g)
    wrapped = _casting_back(Func())
    assert not hasattr(wrapped, "_parameters") and not hasattr(wrapped, "training")
    q_out, k_out = wrapped(q, k, cos, sin)
    assert q_out.dtype == k_out.dtype == torch.bfloat16
    assert torch.equal(q_out, (q.float() * cos + _rotate_half(q.float()) * sin).to(torch.bfloat16))
    assert torch.equal(k_out, (k.float() * cos + _rotate_half(k.float()) * sin).to(torch.bfloat16))
