"""The encoding registry (``build``/``available``/``register``) and properties every registered encoding has."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

import posenc
from encoding_cases import MODEL, build, content, positions, score_error
from largest_tensor import LargestTensor
from posenc.registry import _ENCODINGS
from tolerances import unit_roundoff

BIAS = [n for n in posenc.available() if build(n).has_bias]
SEQUENCE_BIAS = [n for n in BIAS if build(n).position_kind == "sequence"]
#: FIRE normalises distances by the query's position past its threshold (progressive interpolation), by design;
#: tests/encodings/test_fire.py checks the invariance it has (queries below the threshold) and where it ends.
SHIFT_INVARIANT_BIAS = [n for n in SEQUENCE_BIAS if n != "fire"]
#: CoPE's bias reads every key (``needs_keys``), which no FlexAttention score_mod can: it has none, and attention
#: refuses backend="flex" for it (tests/encodings/test_cope.py).
SCORE_MOD_BIAS = [n for n in BIAS if not build(n).needs_keys]


def test_available_lists_every_family():
    assert posenc.available() == sorted(
        ["alibi", "alibi_2d", "cope", "fire", "fope", "kerple", "learned", "learned_2d", "mrope", "nope",
         "nope_temperature", "p_rope", "rope", "rope_3d", "rope_axial", "rope_mixed", "rope_ssmax", "rope_ssmax_bias",
         "sandwich", "shaw", "sinusoidal", "sinusoidal_2d", "ssmax", "ssmax_bias", "t5", "xdrope", "xpos"]
    )


@pytest.mark.parametrize("name", posenc.available())
def test_build_takes_the_model_facts_and_config(name):
    enc = posenc.build(name, **MODEL)
    assert isinstance(enc, posenc.Encoding)
    config = getattr(enc, "config", None)
    if config is not None:  # a config round-trips into an equal encoding
        again = type(enc).from_config(config.to_dict())
        assert again.config == config


def test_build_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"name='alibii'.*one of \['alibi', 'alibi_2d',.*posenc\.register"):
        posenc.build("alibii", num_heads=8)
    with pytest.raises(ValueError, match=r"alibi: slope=2.*only the keys \['eval_len', 'num_heads'"):
        posenc.build("alibi", num_heads=8, slope=2)
    with pytest.raises(ValueError, match=r"t5: num_heads=None.*needs \['num_heads'\]"):
        posenc.build("t5", dim=64)
    with pytest.raises(ValueError, match=r"num_heads=0 is invalid"):
        posenc.build("alibi", num_heads=0)


def test_register_a_third_party_encoding():
    class Window(posenc.Encoding):
        """Attend within a window: a bias of -inf beyond ``width`` tokens, 0 inside."""

        has_bias = True

        def __init__(self, num_heads: int, width: int = 2) -> None:
            super().__init__()
            self.num_heads, self.width = num_heads, width

        def bias(self, q_pos, k_pos, *, q=None, scale=None):
            far = (q_pos[:, None] - k_pos[None, :]).abs() > self.width
            return torch.zeros(far.shape).masked_fill(far, float("-inf")).expand(1, self.num_heads, -1, -1)

    try:
        posenc.register("window_test", Window)
        assert "window_test" in posenc.available()
        enc = posenc.build("window_test", num_heads=2, head_dim=8, dim=16)  # model facts it does not take: dropped
        assert (enc.num_heads, enc.width) == (2, 2)
        q, k, v = torch.randn(3, 1, 2, 6, 8).unbind(0)
        out = posenc.attention(q, k, v, encoding=enc, causal=False, backend="sdpa")
        ref = posenc.attention(q, k, v, encoding=enc, causal=False, backend="eager")
        assert_close(out, ref)
        with pytest.raises(ValueError, match=r"backend='flex'.*defines bias\(\) but no score_mod"):
            posenc.attention(q, k, v, encoding=enc, backend="flex")
        with pytest.raises(ValueError, match=r"name='window_test'.*not already registered"):
            posenc.register("window_test", lambda **kw: None)
        posenc.register("window_test", Window)  # the same factory again is fine
    finally:
        _ENCODINGS.pop("window_test", None)
    with pytest.raises(ValueError, match=r"name='no spaces'"):
        posenc.register("no spaces", Window)
    with pytest.raises(ValueError, match=r"factory=3"):
        posenc.register("three", 3)


def test_register_as_a_decorator():
    try:

        @posenc.register("decorated_test")
        class Plain(posenc.Encoding):
            pass

        assert isinstance(posenc.build("decorated_test", dim=8), Plain)
        with pytest.raises(ValueError, match=r"decorated_test: width=3.*only the keys \[\]"):
            posenc.build("decorated_test", width=3)
    finally:
        _ENCODINGS.pop("decorated_test", None)


# ---------------------------------------------------------------------------------------------------------------
# Properties of every registered encoding


def _indices(b, h, s, t):
    """Broadcasting index tensors: what FlexAttention feeds a score_mod, all at once."""
    return (
        torch.arange(b).view(b, 1, 1, 1),
        torch.arange(h).view(1, h, 1, 1),
        torch.arange(s).view(1, 1, s, 1),
        torch.arange(t).view(1, 1, 1, t),
    )


@pytest.mark.parametrize("name", SCORE_MOD_BIAS)
@pytest.mark.parametrize("batched", [False, True])
def test_score_mod_equals_bias(name, batched):
    enc = build(name)
    h = MODEL["num_heads"]
    k_pos = positions(enc, 11, start=3, batch=2 if batched else None)
    q_pos = k_pos[..., 6:] if enc.position_kind == "sequence" else k_pos[..., 6:, :]
    q = torch.randn(2, h, 5, MODEL["head_dim"])
    with torch.no_grad():
        bias = enc.bias(q_pos, k_pos, q=q, scale=0.3).expand(2, h, 5, 11)
        mod = enc.score_mod(q_pos, k_pos, q=q, scale=0.3)
        got = mod(torch.zeros(2, h, 5, 11), *_indices(2, h, 5, 11))
    # the same formula, but a sum of terms (FIRE, Sandwich) may be added in another order, and SLEEF and libm may
    # differ by an ulp or two of each elementwise result
    bias_max = float(bias.abs().max())
    atol = score_error(enc, q, q, 11, bias_max) + 4 * unit_roundoff() * bias_max
    assert_close(got, bias, rtol=0, atol=atol)


@pytest.mark.parametrize("name", SHIFT_INVARIANT_BIAS)
@given(shift=st.integers(-50, 5000), s=st.integers(1, 9), extra=st.integers(0, 9))
def test_bias_depends_only_on_distance(name, shift, s, extra):
    enc = build(name)
    k_pos = torch.arange(60, 60 + s + extra)
    q_pos = k_pos[extra:]
    q = torch.randn(1, MODEL["num_heads"], s, MODEL["head_dim"])
    kw = content(enc, torch.randn(1, MODEL["num_heads"], s + extra, MODEL["head_dim"]))  # CoPE: ignores positions
    with torch.no_grad():
        shifted = enc.bias(q_pos + shift, k_pos + shift, q=q, **kw)
        assert_close(shifted, enc.bias(q_pos, k_pos, q=q, **kw), rtol=0, atol=0)


@pytest.mark.parametrize("name", posenc.available())
def test_hooks_keep_shapes_and_dtypes(name):
    enc = build(name)
    x = torch.randn(2, 10, MODEL["dim"], dtype=torch.bfloat16)
    pos = positions(enc, 10)
    if enc.position_kind != "mrope":
        out = enc.to(torch.bfloat16).embed(x, pos)
        assert out.shape == x.shape and out.dtype == x.dtype
    hkv = MODEL["num_heads"] if enc.per_head_keys else 2
    q = torch.randn(2, MODEL["num_heads"], 10, MODEL["head_dim"], dtype=torch.bfloat16)
    k = torch.randn(2, hkv, 10, MODEL["head_dim"], dtype=torch.bfloat16)
    rq, rk = enc.rotate(q, k, pos, pos)
    assert (rq.shape, rq.dtype, rk.shape, rk.dtype) == (q.shape, q.dtype, k.shape, k.dtype)
    bias = enc.bias(pos, pos, q=q, scale=0.25, **content(enc, k))
    if enc.has_bias:
        assert bias.dtype == torch.float32 and bias.shape[1:] == (MODEL["num_heads"], 10, 10)
    else:
        assert bias is None and enc.score_mod(pos, pos) is None


@pytest.mark.parametrize("name", posenc.available())
def test_builds_on_the_meta_device(name):
    with torch.device("meta"):
        enc = posenc.build(name, **MODEL)
    assert all(t.is_meta for t in [*enc.parameters(), *enc.buffers()])


@pytest.mark.parametrize("name", posenc.available())
def test_low_precision_model_matches_float32(name):
    """``model.to(bfloat16)`` must not round the encoding's own tables (frequencies, slopes) to bf16."""
    enc = build(name)
    hkv = MODEL["num_heads"] if enc.per_head_keys else 2
    q = torch.randn(1, MODEL["num_heads"], 40, MODEL["head_dim"])
    k, v = torch.randn(2, 1, hkv, 40, MODEL["head_dim"]).unbind(0)
    pos = positions(enc, 40, start=900 if enc.position_kind == "sequence" else 0)
    with torch.no_grad():
        for p in enc.parameters():  # parameters exactly representable in bf16: compare like with like
            p.copy_(p.bfloat16().float())
        ref = posenc.attention(q, k, v, encoding=enc, q_positions=pos, backend="eager")
        low = copy.deepcopy(enc).to(torch.bfloat16)
        out = posenc.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), encoding=low, q_positions=pos)
    assert out.dtype == torch.bfloat16
    assert_close(out.float(), ref, atol=4e-2, rtol=4e-2)


@pytest.mark.parametrize("name", SCORE_MOD_BIAS)
def test_score_mod_builds_nothing_quadratic(name):
    """Preparing a score_mod (validation included) must stay linear in length: that is flex's whole point."""
    enc = build(name)
    n = 3000
    pos = positions(enc, n) if enc.position_kind == "sequence" else torch.rand(n, 2) * 100
    q = torch.randn(1, MODEL["num_heads"], n, MODEL["head_dim"])
    with torch.no_grad(), LargestTensor() as largest:
        enc.score_mod(pos, pos, q=q, scale=0.25)
    assert largest.numel < n * n // 4


def test_takes_says_which_keywords_build_reads():
    """``takes`` reads the factory's signature, as ``build`` does: RoPE-Mixed reads ``generator``, axial RoPE does not,
    a model key an encoding drops is not read; an unknown name is refused as ``build`` refuses it."""
    assert posenc.registry.takes("rope_mixed", "generator")
    assert not posenc.registry.takes("rope_axial", "generator")
    assert not posenc.registry.takes("alibi", "max_len")
    assert posenc.registry.takes("alibi", "num_heads")
    with pytest.raises(ValueError, match=r"name='no_such'"):
        posenc.registry.takes("no_such", "generator")


def test_the_registry_alone_sees_the_librarys_encodings_and_scalings():
    """``import posenc`` defers the library to first use (the CLI refuses bad input before torch loads): a program
    that reaches ``posenc.registry`` without a ``posenc.<name>`` first still finds every built-in name."""
    import subprocess
    import sys

    code = (
        "import posenc.registry as r; import sys\n"
        "assert 'posenc._api' not in sys.modules\n"
        "print(len(r.available()), len(r.available_scalings()), type(r.build('alibi', num_heads=4)).__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    import posenc

    assert out == [str(len(posenc.available())), str(len(posenc.available_scalings())), "ALiBi"]
