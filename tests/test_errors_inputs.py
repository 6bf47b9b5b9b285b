"""Inputs that used to give silent wrong answers (or crashes) now raise ``ValueError`` naming the parameter.

Positions that cannot be exact (float16/bfloat16) or are not finite, encodings built for another head count,
positions on another device than the tensors they place, and non-finite or out-of-range scalars.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

import posenc
from encoding_cases import MODEL, build, positions
from posenc import _checks
from posenc import functional as F
from posenc.encodings._base import Encoding
from posenc.kernels import cpu as cpu_kernel
from posenc.kernels import native

NAMES = posenc.available()
B, S = 2, 6
#: A positions parameter of any hook or function: positions, k_positions, q_positions, q_pos, k_pos.
POSITIONS_NAME = r"^(q_|k_)?pos(itions)?"


def _hooks(enc: Encoding) -> list[str]:
    """The hooks ``enc`` overrides, i.e. the ones that read positions."""
    cls = type(enc)
    return [h for h in ("embed", "rotate", "bias", "score_mod") if getattr(cls, h) is not getattr(Encoding, h)]


def _qk(heads: int = MODEL["num_heads"]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(B, heads, S, MODEL["head_dim"]), torch.randn(B, heads, S, MODEL["head_dim"])


def _call_hooks(enc: Encoding, pos: torch.Tensor) -> None:
    """Run every position-reading hook of ``enc`` with ``pos`` as the query positions and good key positions."""
    good = positions(enc, S)
    q, k = _qk()
    for hook in _hooks(enc):
        if hook == "embed":
            enc.embed(torch.randn(B, S, MODEL["dim"]), pos)
        elif hook == "rotate":
            enc.rotate(q, k, pos, good)
        else:
            getattr(enc, hook)(pos, good, q=q, scale=0.25)


def _spoiled(enc: Encoding, value: float) -> torch.Tensor:
    """Float32 positions of the kind ``enc`` takes, with one entry replaced by ``value``."""
    pos = positions(enc, S).to(torch.float32).clone()
    pos.view(-1)[3] = value
    return pos


# --------------------------------------------------------------------------------------------------------------
# float16 / bfloat16 positions


def test_half_precision_cannot_hold_positions():
    """Why they are refused: past 2048 (float16) or 256 (bfloat16) neighbouring tokens share a position."""
    assert torch.arange(5000, 5004).half().tolist() == [5000.0, 5000.0, 5000.0, 5004.0]
    assert torch.arange(256, 260).bfloat16().tolist() == [256.0, 256.0, 258.0, 260.0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", NAMES)
def test_low_precision_positions_refused_by_every_hook(name, dtype):
    enc = build(name)
    hooks = _hooks(enc)
    if not hooks:
        pytest.skip(f"{name} reads no positions (attention checks them: see the next test)")
    with pytest.raises(ValueError, match=POSITIONS_NAME + rf"\.dtype={re.escape(str(dtype))} is invalid: .*integer"):
        _call_hooks(enc, positions(enc, S).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("which", ["q_positions", "k_positions"])
def test_low_precision_positions_refused_by_attention(name, dtype, which):
    enc = build(name)
    q, k = _qk()
    pos = positions(enc, S)
    kwargs = {"q_positions": pos, "k_positions": pos, which: pos.to(dtype)}
    with pytest.raises(ValueError, match=rf"^{which}\.dtype={re.escape(str(dtype))} is invalid: expected an integer"):
        posenc.attention(q, k, k, encoding=enc, **kwargs)


def test_low_precision_message_says_why_and_what_is_allowed():
    with pytest.raises(ValueError) as error:
        posenc.rope_cos_sin(torch.arange(4).half(), posenc.default_inv_freq(8))
    message = str(error.value)
    assert message.startswith("positions.dtype=torch.float16 is invalid: ")
    assert "an integer dtype, torch.float32 or torch.float64" in message
    assert "2048" in message and "256" in message  # why


@pytest.mark.parametrize(
    "call",
    [
        lambda p: posenc.rope_cos_sin(p, posenc.default_inv_freq(8)),
        lambda p: posenc.rope_angles(p, posenc.default_inv_freq(8)),
        lambda p: F.xpos_scale(p, dim=8),
        lambda p: F.xpos_cos_sin(p, posenc.default_inv_freq(8)),
        lambda p: F.sinusoidal_encoding(p, 8),
        lambda p: F.mrope_cos_sin(torch.stack([p] * 3), posenc.default_inv_freq(8), mrope_section=(2, 1, 1)),
        lambda p: F.mrope_angles(torch.stack([p] * 3), posenc.default_inv_freq(8), mrope_section=(2, 1, 1)),
        lambda p: F.axial_cos_sin(p.view(-1, 2), F.axial_inv_freq(8)),
        lambda p: F.axial_angles(p.view(-1, 2), F.axial_inv_freq(8)),
        lambda p: F.sinusoidal_2d_encoding(p.view(-1, 2), 8),
        lambda p: F.mixed_cos_sin(p.view(-1, 2), F.init_mixed_freqs(8, 2)),
        lambda p: F.mixed_angles(p.view(-1, 2), F.init_mixed_freqs(8, 2)),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_positions_refused_by_functions(call, dtype):
    with pytest.raises(ValueError, match=rf"^positions\.dtype={re.escape(str(dtype))} "):
        call(torch.arange(6).to(dtype))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.float32, torch.float64])
def test_exact_dtypes_are_accepted_and_agree(dtype):
    inv_freq = posenc.default_inv_freq(8)
    cos, sin = posenc.rope_cos_sin(torch.arange(6).to(dtype), inv_freq)
    want_cos, want_sin = posenc.rope_cos_sin(torch.arange(6), inv_freq)
    torch.testing.assert_close((cos, sin), (want_cos, want_sin), rtol=0, atol=0)


# --------------------------------------------------------------------------------------------------------------
# NaN / inf positions

BAD_VALUES = [math.nan, math.inf, -math.inf]
#: Learned relative tables take integer positions only: a float tensor is refused before its values matter.
INTEGER_ONLY = {"t5", "shaw"}


@pytest.mark.parametrize("value", BAD_VALUES)
@pytest.mark.parametrize("name", NAMES)
def test_non_finite_positions_refused_by_every_hook(name, value):
    enc = build(name)
    if not _hooks(enc):
        pytest.skip(f"{name} reads no positions")
    if name in INTEGER_ONLY:
        pytest.skip(f"{name} refuses floating positions whatever their values (tests/encodings/test_{name}.py)")
    with pytest.raises(ValueError, match=POSITIONS_NAME + r"\[[\d, ]+\]=-?(nan|inf) is invalid"):
        _call_hooks(enc, _spoiled(enc, value))


@pytest.mark.parametrize("value", BAD_VALUES)
@pytest.mark.parametrize("name", sorted(set(NAMES) - INTEGER_ONLY))
def test_non_finite_positions_refused_by_attention(name, value):
    enc = build(name)
    q, k = _qk()
    with pytest.raises(ValueError, match=r"^q_positions\[[\d, ]+\]=-?(nan|inf) is invalid: expected a finite"):
        posenc.attention(q, k, k, encoding=enc, q_positions=_spoiled(enc, value))


@pytest.mark.parametrize("value", BAD_VALUES)
def test_non_finite_key_positions_are_named(value):
    emb = posenc.RotaryEmbedding(16)
    q, k = _qk()
    bad = torch.arange(S, dtype=torch.float64)
    bad[4] = value
    with pytest.raises(ValueError, match=r"^k_positions\[4\]=-?(nan|inf) is invalid"):
        emb(q, k, torch.arange(S), bad)
    with pytest.raises(ValueError, match=r"^k_pos\[0, 4\]=-?(nan|inf) is invalid"):
        F.alibi_bias(torch.arange(S), bad[None], F.alibi_slopes(4))


def test_changed_positions_are_checked_again():
    """A tensor found finite is not read again (one host sync per model forward, not per layer) unless it changed."""
    emb = posenc.RotaryEmbedding(16)
    q, k = _qk()
    pos = torch.arange(S, dtype=torch.float32)
    emb(q, k, pos)
    pos[2] = math.nan  # in place: a new version of the same tensor
    with pytest.raises(ValueError, match=r"^positions\[2\]=nan"):
        emb(q, k, pos)


def test_one_finiteness_check_per_tensor_through_attention_and_layers(monkeypatch):
    calls = []
    isfinite = torch.isfinite
    monkeypatch.setattr(torch, "isfinite", lambda t: calls.append(t) or isfinite(t))
    enc = posenc.RotaryEmbedding(16)
    q, k = _qk()
    pos = torch.arange(S, dtype=torch.float32) + 0.5
    for _ in range(3):  # three layers sharing the positions
        posenc.attention(q, k, k, encoding=enc, q_positions=pos)
    assert len(calls) == 1 and calls[0] is pos
    posenc.attention(q, k, k, encoding=enc, q_positions=torch.arange(S))  # integers: never read
    assert len(calls) == 1


def test_finiteness_check_skipped_under_compile_and_vmap():
    """No host sync where values cannot be read: fullgraph compilation has no graph break, vmap works."""
    enc = posenc.RotaryEmbedding(16)
    q, k = _qk()
    pos = torch.arange(S, dtype=torch.float32)
    compiled = torch.compile(lambda q, k, p: enc(q, k, p), backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(q, k, pos), enc(q, k, pos))
    alibi = posenc.ALiBi(4)
    compiled_bias = torch.compile(lambda p: alibi.bias(p, p), backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled_bias(pos), alibi.bias(pos, pos))
    rows = torch.stack([pos, pos + 3])  # (2, S)
    inv_freq = posenc.default_inv_freq(8)
    cos = torch.vmap(lambda p: posenc.rope_cos_sin(p, inv_freq)[0])(rows)
    torch.testing.assert_close(cos, posenc.rope_cos_sin(rows, inv_freq)[0])


# --------------------------------------------------------------------------------------------------------------
# head count


def _per_head(name: str) -> bool:
    return getattr(getattr(build(name), "config", None), "num_heads", None) is not None


@pytest.mark.parametrize("name", [n for n in NAMES if _per_head(n)])
def test_head_count_mismatch_names_num_heads(name):
    enc = build(name)  # num_heads=4
    q, k = _qk(heads=3)
    with pytest.raises(ValueError, match=r"num_heads") as error:
        posenc.attention(q, k, k, encoding=enc, q_positions=positions(enc, S))
    assert "4" in str(error.value) and "3" in str(error.value)  # the encoding's value and q's head count


@pytest.mark.parametrize("name", ["alibi", "alibi_2d", "t5"])
@pytest.mark.parametrize("hook", ["bias", "score_mod"])
def test_head_count_mismatch_in_bias_hooks(name, hook):
    """Without the check, ``bias`` failed to broadcast and ``score_mod`` silently used the first heads' slopes."""
    enc = build(name, num_heads=8)
    pos = positions(enc, S)
    with pytest.raises(ValueError, match=r"^num_heads=8 is invalid: expected the number of heads of q, 4 "):
        getattr(enc, hook)(pos, pos, q=torch.randn(B, 4, S, 16))
    assert getattr(enc, hook)(pos, pos) is not None  # without q there is nothing to compare


def test_flex_with_wrong_head_count_is_refused():
    q, k = _qk(heads=4)
    with torch.no_grad(), pytest.raises(ValueError, match=r"^num_heads=8 .*heads of q, 4"):
        posenc.attention(q, k, k, encoding=posenc.ALiBi(8), backend="flex")


# --------------------------------------------------------------------------------------------------------------
# devices: meta stands in for "another device" (CUDA is not needed to see the mismatch)


def test_positions_on_another_device_than_q():
    q, k = _qk()
    meta = torch.arange(S, device="meta")
    for which in ("q_positions", "k_positions"):
        with pytest.raises(ValueError, match=rf"^{which}\.device=.*meta.* q's device, cpu"):
            posenc.attention(q, k, k, encoding=posenc.ALiBi(4), **{which: meta})
    with pytest.raises(ValueError, match=r"^positions\.device=.*meta.* q's device, cpu"):
        posenc.RotaryEmbedding(16)(q, k, meta)  # used to crash the process (the C kernel read a null pointer)
    with pytest.raises(ValueError, match=r"^k_positions\.device=.*meta.* k's device, cpu"):
        posenc.XPos(16)(q, k, torch.arange(S), meta)
    with pytest.raises(ValueError, match=r"^positions\.device=.*meta.* x's device, cpu"):
        posenc.RotaryEmbedding(16).rotate_one(q, meta)


@pytest.mark.parametrize("name", ["sinusoidal", "learned", "sinusoidal_2d", "learned_2d"])
def test_embed_positions_on_another_device(name):
    """``learned`` used to index its table with meta positions and return garbage."""
    enc = build(name)
    with pytest.raises(ValueError, match=r"^positions\.device=.*meta.* x's device, cpu"):
        enc.embed(torch.randn(B, S, MODEL["dim"]), positions(enc, S).to("meta"))


def test_tables_on_another_device_than_x():
    x = torch.randn(S, 8)
    with pytest.raises(ValueError, match=r"^cos\.device=.*meta.* x's device, cpu"):
        posenc.apply_rotary(x, torch.ones(S, 4, device="meta"), torch.ones(S, 4, device="meta"))
    with pytest.raises(ValueError, match=r"^sin\.device="):
        posenc.apply_rotary(x, torch.ones(S, 4), torch.ones(S, 4, device="meta"))
    meta = torch.ones(S, 4, device="meta")
    with pytest.raises(ValueError, match=r"^cos\.device=.*meta.* x's device, cpu"):
        cpu_kernel.rotary(x, meta, meta)  # used to crash the process
    assert not native.rotary_into(x, torch.empty_like(x), meta, meta, layout="half")  # C code takes host memory only


def test_alibi_key_positions_on_another_device():
    with pytest.raises(ValueError, match=r"^k_pos\.device=.*meta.* q_pos's device, cpu"):
        F.alibi_bias(torch.arange(S), torch.arange(S, device="meta"), F.alibi_slopes(4))


# --------------------------------------------------------------------------------------------------------------
# scalars


@pytest.mark.parametrize("scale", [math.nan, math.inf, 0.0, -1.0, "0.5", True])
def test_attention_scale(scale):
    """NaN was ignored and 0 or a negative scale gave NaN outputs (SDPA scales q and k by sqrt(scale))."""
    q, k = _qk()
    with pytest.raises(ValueError, match=r"^scale="):
        posenc.attention(q, k, k, scale=scale)


@pytest.mark.parametrize("causal", ["yes", 1, None])
def test_attention_causal_must_be_bool(causal):
    q, k = _qk()
    with pytest.raises(ValueError, match=r"^causal="):
        posenc.attention(q, k, k, causal=causal)


@pytest.mark.parametrize("scale", [math.nan, math.inf, "1"])
def test_shaw_scale(scale):
    q, pos = torch.randn(1, 2, S, 16), torch.arange(S)
    with pytest.raises(ValueError, match=r"^scale="):
        posenc.ShawRelative(16).bias(pos, pos, q=q, scale=scale)
    with pytest.raises(ValueError, match=r"^scale="):
        F.shaw_bias(q, pos, pos, torch.randn(5, 16), scale=scale)


@pytest.mark.parametrize("base", [math.nan, math.inf, 1.0, 0.5, -2.0])
def test_frequency_base(base):
    with pytest.raises(ValueError, match=r"^base="):
        posenc.default_inv_freq(8, base=base)
    with pytest.raises(ValueError, match=r"^base="):
        F.axial_inv_freq(8, base=base)


@pytest.mark.parametrize("factor", [math.nan, math.inf, 0.0, -1.0])
def test_rope_cos_sin_attention_factor(factor):
    with pytest.raises(ValueError, match=r"^attention_factor="):
        posenc.rope_cos_sin(torch.arange(4), posenc.default_inv_freq(8), attention_factor=factor)


def test_inv_freq_must_be_one_dimensional():
    """A 2-D table used to broadcast against (S, 1) positions into a wrong-shaped result."""
    for call in (posenc.rope_cos_sin, posenc.rope_angles):
        with pytest.raises(ValueError, match=r"^inv_freq\.shape=\(4, 4\)"):
            call(torch.arange(4), torch.ones(4, 4))


DYNAMIC = {"base": 1e4, "factor": 2.0, "max_position_embeddings": 8}
YARN = {"base": 1e4, "factor": 2.0, "original_max_position_embeddings": 8}
LONGROPE = {**YARN, "short_factor": [1.0] * 4, "long_factor": [1.0] * 4}
LLAMA3 = {**YARN, "low_freq_factor": 1.0, "high_freq_factor": 4.0}


@pytest.mark.parametrize(
    "function,kwargs,name",
    [
        (F.default_frequencies, {"base": math.nan}, "base"),
        (F.linear_frequencies, {"base": 1e4, "factor": math.inf}, "factor"),
        (F.linear_frequencies, {"base": 1e4, "factor": 0.0}, "factor"),
        (F.ntk_frequencies, {"base": 1e4, "factor": math.nan}, "factor"),
        (F.dynamic_ntk_frequencies, {**DYNAMIC, "max_position_embeddings": 0}, "max_position_embeddings"),
        (F.dynamic_ntk_frequencies, {**DYNAMIC, "seq_len": math.nan}, "seq_len"),
        (F.yarn_frequencies, {**YARN, "factor": math.nan}, "factor"),
        (F.yarn_frequencies, {**YARN, "mscale": math.inf}, "mscale"),
        (F.yarn_frequencies, {**YARN, "beta_fast": math.nan}, "beta_fast"),
        (F.longrope_frequencies, {**LONGROPE, "factor": math.inf}, "factor"),
        (F.llama3_frequencies, {**LLAMA3, "low_freq_factor": math.nan}, "low_freq_factor"),
    ],
)
def test_scaling_function_scalars(function, kwargs, name):
    """The functional transforms returned NaN frequencies for NaN/inf scalars (the configs validated, they did not)."""
    with pytest.raises(ValueError, match=rf"^{name}="):
        function(8, **kwargs)
    defaults = DYNAMIC | LLAMA3 | {"base": 1e4, "seq_len": None, "mscale": 1.0, "beta_fast": 32.0}
    good = {**kwargs, name: defaults[name]}
    assert function(8, **good)[0].isfinite().all()


def test_dynamic_rope_seq_len():
    emb = posenc.RotaryEmbedding(8, scaling={"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 4})
    with pytest.raises(ValueError, match=r"^seq_len=nan"):
        emb.cos_sin(torch.arange(4), seq_len=math.nan)
    with pytest.raises(ValueError, match=r"^seq_len=inf"):
        posenc.rope_frequencies(8, scaling=emb.config.scaling, seq_len=math.inf)


@pytest.mark.parametrize("lengths", [[True, True], torch.tensor([1 + 0j, 2]), [2.0, 3.0]])
def test_packed_positions_lengths_are_integers(lengths):
    with pytest.raises(ValueError, match=r"^lengths=.*positive integer document lengths"):
        posenc.packed_positions(lengths)


# --------------------------------------------------------------------------------------------------------------
# shapes


def test_unbatched_x_with_batched_positions_message():
    """The message used to offer "(None, 5)" as an allowed shape."""
    for call in (
        lambda: posenc.RotaryEmbedding(16).rotate_one(torch.randn(5, 16), torch.zeros(2, 5, dtype=torch.long)),
        lambda: posenc.AxialRoPE(16).rotate_one(torch.randn(5, 16), torch.zeros(2, 5, 2)),
        lambda: posenc.MRoPE(16).rotate_one(torch.randn(5, 16), torch.zeros(3, 2, 5, dtype=torch.long)),
    ):
        with pytest.raises(ValueError, match=r"^positions\.shape=") as error:
            call()
        assert "None" not in str(error.value)


def test_checks_helper_contract():
    """``check_positions`` returns its argument and refuses non-tensors, bool and complex with the name."""
    pos = torch.arange(3)
    assert _checks.check_positions(pos, "p") is pos
    with pytest.raises(ValueError, match=r"^p='list' is invalid: expected a torch\.Tensor"):
        _checks.check_positions([0, 1], "p")
    for dtype in (torch.bool, torch.complex64):
        with pytest.raises(ValueError, match=rf"^p\.dtype={re.escape(str(dtype))} is invalid: expected an integer"):
            _checks.check_positions(torch.zeros(2, dtype=dtype), "p")
    nan = torch.tensor(math.nan)
    with pytest.raises(ValueError, match=r"^p=nan is invalid"):  # 0-d: no index
        _checks.check_positions(nan, "p")
    _checks.check_positions(torch.tensor([math.nan]), "p", finite=False)  # the caller reads the values itself
