"""SSMax (Scalable-Softmax) == axolotl's score_mod written out in float64 (``tests/reference/ssmax.py``), on full
attention outputs and gradients, over NoPE and RoPE, without and with the bias ``b``; the functional's formula; the
learned ``s`` and ``b``; one SSMax per layer in the lab. The registry-wide properties (decode == full, chunked ==
full, packed == alone, GQA, backends) cover ``ssmax``, ``rope_ssmax``, ``ssmax_bias`` and ``rope_ssmax_bias`` through
``posenc.available()`` in tests/test_attention.py and tests/test_registry.py."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

import posenc
from encoding_cases import attention_tol
from posenc.functional import apply_ssmax, apply_temperature, ssmax_key_count, ssmax_scale
from posenc.functional.ssmax import S_INIT
from reference.ssmax import ssmax_attention

B, H, HKV, D = 2, 4, 2, 8
S_VALUES = torch.tensor([0.25, 0.43, 0.7, 1.1])
B_VALUES = torch.tensor([0.5, -0.3, 0.0, 1.25])  # b per head, one of them 0 (the paper's recommended form)
BIASES = {"no_bias": None, "bias": B_VALUES}
ROPES = {
    "nope": None,
    "rope": {},
    "rope_interleaved_yarn": {
        "base": 500.0,
        "layout": "interleaved",
        "scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
    },
}


def _encoding(rope, dtype=torch.float64, s=S_VALUES, b=None, **kw):
    enc = posenc.build("ssmax", num_heads=H, head_dim=D, rope=rope, bias=b is not None, **kw).to(dtype)
    with torch.no_grad():
        enc.s.copy_(s)
        if b is not None:
            enc.b.copy_(b)
    return enc


def _b(enc):
    """The module's ``b`` for the reference: its parameter, or the number 0 without a bias."""
    return 0.0 if enc.b is None else enc.b.detach()


def _rope_reference(enc):
    if enc.rope is None:
        return None
    rope = enc.rope
    return {"inv_freq": rope.inv_freq, "layout": rope.config.layout, "attention_factor": rope.attention_factor}


def _qkv(s, t, dtype=torch.float64, requires_grad=False):
    g = torch.Generator().manual_seed(s * 100 + t)
    shapes = [(B, H, s, D), (B, HKV, t, D), (B, HKV, t, 6)]
    return [(torch.randn(*x, generator=g) * 2).to(dtype).requires_grad_(requires_grad) for x in shapes]


# ---------------------------------------------------------------------------------------------------------------
# The formula


def test_functional_is_s_log_n():
    pos = torch.tensor([[0, 1, 5, 99, 4095], [3, 0, 1, 2, 70000]])
    n = (pos.double() + 1).clamp(max=64)
    assert_close(ssmax_key_count(pos, window=64), n, rtol=0, atol=0)
    log_n = n.log().float()  # log in float64, rounded once; then the float32 product with s
    want = S_VALUES.float()[:, None] * log_n[:, None, :]  # (B, H, S)
    assert_close(ssmax_scale(pos, S_VALUES, window=64), want, rtol=0, atol=0)
    s = torch.tensor(0.43)
    assert_close(ssmax_scale(pos[0], 0.43), s * (pos[0].double() + 1).log().float(), rtol=0, atol=0)
    assert ssmax_key_count(torch.tensor([-3, -1])).tolist() == [1.0, 1.0]  # a padded query sees at least itself
    q = torch.randn(B, H, 5, D, dtype=torch.bfloat16)
    got = apply_ssmax(q, pos, S_VALUES, window=64)
    assert got.dtype == torch.bfloat16
    assert_close(got, (q.float() * want[..., None]).bfloat16(), rtol=0, atol=0)  # float32 product, one rounding


def test_functional_bias_is_s_log_n_plus_b():
    """``b``: ``s log n + b`` in float32 (the product rounded, then the sum), per head; the number 0 adds nothing."""
    pos = torch.tensor([[0, 1, 5, 99, 4095], [3, 0, 1, 2, 70000]])
    log_n = (pos.double() + 1).clamp(max=64).log().float()
    s_log_n = S_VALUES.float()[:, None] * log_n[:, None, :]  # (B, H, S)
    want = s_log_n + B_VALUES[:, None]
    assert_close(ssmax_scale(pos, S_VALUES, b=B_VALUES, window=64), want, rtol=0, atol=0)
    assert torch.equal(ssmax_scale(pos, S_VALUES, b=0.0, window=64), ssmax_scale(pos, S_VALUES, window=64))
    no_window = S_VALUES[:, None] * (pos.double() + 1).log().float()[:, None, :]  # (B, H, S)
    assert_close(ssmax_scale(pos, S_VALUES, b=0.7), no_window + 0.7, rtol=0, atol=0)
    # a scalar s with a per-head b, and a 0-d b, broadcast to the same (B, H, S) and (S,) forms
    per_head_b = ssmax_scale(pos, 0.43, b=B_VALUES)
    assert per_head_b.shape == (2, H, 5)
    assert_close(per_head_b, torch.tensor(0.43) * (pos.double() + 1).log().float()[:, None, :] + B_VALUES[:, None],
                 rtol=0, atol=0)
    assert_close(ssmax_scale(pos[0], torch.tensor(0.43), b=torch.tensor(-0.5)),
                 torch.tensor(0.43) * (pos[0].double() + 1).log().float() - 0.5, rtol=0, atol=0)
    q = torch.randn(B, H, 5, D, dtype=torch.bfloat16)
    got = apply_ssmax(q, pos, S_VALUES, b=B_VALUES, window=64)
    assert got.dtype == torch.bfloat16
    assert_close(got, (q.float() * want[..., None]).bfloat16(), rtol=0, atol=0)
    assert torch.equal(apply_ssmax(q, pos, S_VALUES, b=0.0), apply_ssmax(q, pos, S_VALUES))
    # a query seeing one key gets the factor b (log 1 = 0)
    assert_close(apply_ssmax(torch.ones(1, H, 1, 2), torch.tensor([0]), S_VALUES, b=B_VALUES)[0, :, 0, 0], B_VALUES)
    with pytest.raises(ValueError, match=r"b.shape=\(3,\).*H=4 of s.shape=\(4,\)"):
        ssmax_scale(pos, S_VALUES, b=torch.ones(3))
    with pytest.raises(ValueError, match=r"b.shape=\(3,\).*the heads of q"):
        apply_ssmax(torch.randn(1, 4, 5, 8), pos[0], 0.43, b=torch.ones(3))
    with pytest.raises(ValueError, match=r"b=\(2, 2\).*one bias per head"):
        ssmax_scale(pos, S_VALUES, b=torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"b=nan"):
        ssmax_scale(pos, S_VALUES, b=float("nan"))


def test_differs_from_llama4_temperature():
    """Llama 4's factor is 1 up to floor_scale - 1 and has no learned s; SSMax's is s log(p + 1) from the start."""
    q = torch.ones(1, 1, 4, 2)
    pos = torch.arange(4)
    llama4 = apply_temperature(q, pos, floor_scale=8192, attn_scale=0.1)
    assert (llama4 == 1).all()
    ssmax = apply_ssmax(q, pos, torch.tensor([S_INIT]))
    assert_close(ssmax[0, 0, :, 0], torch.tensor([S_INIT * math.log(n) for n in (1, 2, 3, 4)]))


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"head_dim=None.*RoPE under SSMax"):
        posenc.build("ssmax", num_heads=4, rope={})
    with pytest.raises(ValueError, match=r"config\['bas'\]"):
        posenc.build("ssmax", num_heads=4, head_dim=8, rope={"bas": 1.0})
    with pytest.raises(ValueError, match=r"window=0"):
        posenc.build("ssmax", num_heads=4, window=0)
    with pytest.raises(ValueError, match=r"bias=1 is invalid: expected True"):
        posenc.build("ssmax", num_heads=4, bias=1)
    with pytest.raises(ValueError, match=r"s.shape=\(3,\)"):
        apply_ssmax(torch.randn(1, 4, 2, 8), torch.arange(2), torch.ones(3))
    enc = posenc.build("ssmax", num_heads=4)
    q = torch.randn(1, 4, 3, 8)
    with pytest.raises(ValueError, match=r"causal=False.*SSMax"):
        posenc.attention(q, q[:, :2], q[:, :2], encoding=enc, causal=False)


# ---------------------------------------------------------------------------------------------------------------
# Against axolotl's form, on full tensors


@pytest.mark.parametrize("bias", list(BIASES))
@pytest.mark.parametrize("rope", list(ROPES))
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("batched", [False, True])
def test_equals_reference_float64(rope, backend, batched, bias):
    enc = _encoding(ROPES[rope], b=BIASES[bias])
    q, k, v = _qkv(5, 12)
    k_pos = torch.arange(3, 15) if not batched else torch.stack([torch.arange(3, 15), torch.arange(40, 52)])
    q_pos = k_pos[..., -5:]
    with torch.no_grad():
        got = posenc.attention(q, k, v, encoding=enc, q_positions=q_pos, k_positions=k_pos, backend=backend)
    want = ssmax_attention(
        q, k, v, S_VALUES, b=_b(enc), q_positions=q_pos, k_positions=k_pos, rope=_rope_reference(enc)
    )
    assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("bias", list(BIASES))
@pytest.mark.parametrize("rope", list(ROPES))
def test_packed_documents_equal_reference_float64(rope, bias):
    """Positions restart per document: n is the query's position within its document, as axolotl's packing."""
    enc = _encoding(ROPES[rope], b=BIASES[bias])
    q, k, v = _qkv(18, 18)
    pos, docs = posenc.packed_positions([1, 11, 6])  # a one-token document: n = 1, a single key
    with torch.no_grad():
        got = posenc.attention(q, k, v, encoding=enc, q_positions=pos, document_ids=docs, backend="sdpa")
    want = ssmax_attention(q, k, v, S_VALUES, b=_b(enc), q_positions=pos, document_ids=docs,
                           rope=_rope_reference(enc))
    assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("bias", list(BIASES))
@pytest.mark.parametrize("rope", ["nope", "rope"])
def test_gradients_equal_reference_float64(rope, bias):
    """Gradients in q, k, v and the learned s (and b), through posenc's SDPA path and through the written-out form."""
    enc = _encoding(ROPES[rope], b=BIASES[bias])
    q, k, v = _qkv(9, 9, requires_grad=True)
    pos = torch.arange(9)
    out = posenc.attention(q, k, v, encoding=enc, q_positions=pos, backend="sdpa")
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    params = [enc.s] if enc.b is None else [enc.s, enc.b]
    got = torch.autograd.grad((out * weight).sum(), [q, k, v, *params])
    s = enc.s.detach().clone().requires_grad_()
    b = None if enc.b is None else enc.b.detach().clone().requires_grad_()
    want_out = ssmax_attention(q, k, v, s, b=0.0 if b is None else b, q_positions=pos, rope=_rope_reference(enc))
    want = torch.autograd.grad((want_out * weight).sum(), [q, k, v, s] + ([] if b is None else [b]))
    assert got[3].abs().min() > 0  # every head's s learns
    if b is not None:
        assert got[4].abs().min() > 0  # and every head's b, the head whose b is 0 included
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, rtol=0, atol=1e-11)


@pytest.mark.parametrize("bias", list(BIASES))
@pytest.mark.parametrize("rope", list(ROPES))
def test_float32_near_reference(rope, bias):
    enc = _encoding(ROPES[rope], dtype=torch.float32, b=BIASES[bias])
    q, k, v = _qkv(12, 12, dtype=torch.float32)
    pos = torch.arange(20, 32)
    with torch.no_grad():
        got = posenc.attention(q, k, v, encoding=enc, q_positions=pos)
    want = ssmax_attention(q, k, v, S_VALUES, b=_b(enc), q_positions=pos, rope=_rope_reference(enc))
    assert_close(got.double(), want, **attention_tol(q, k, v, encoding=enc, q_positions=pos))


@settings(max_examples=25, deadline=None)
@given(
    rope=st.sampled_from(list(ROPES)),
    bias=st.sampled_from(list(BIASES)),
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    cut=st.integers(0, 8),
)
def test_explicit_positions_equal_implied_and_decode_equals_full(rope, bias, lengths, cut):
    """Default positions == explicit arange; packed == each document alone; a decode step against the cache of its
    document == its row of the full forward."""
    enc = _encoding(ROPES[rope], b=BIASES[bias])
    t = sum(lengths)
    q, k, v = _qkv(t, t)
    with torch.no_grad():
        implied = posenc.attention(q, k, v, encoding=enc, backend="eager")
        explicit = posenc.attention(q, k, v, encoding=enc, q_positions=torch.arange(t), backend="eager")
        assert_close(implied, explicit, rtol=0, atol=0)
        pos, docs = posenc.packed_positions(lengths)
        packed = posenc.attention(q, k, v, encoding=enc, q_positions=pos, document_ids=docs, backend="eager")
        start = 0
        for n in lengths:
            alone = posenc.attention(*(x[:, :, start : start + n] for x in (q, k, v)), encoding=enc, backend="eager")
            assert_close(packed[:, :, start : start + n], alone, rtol=0, atol=1e-12)
            start += n
        i = min(cut, t - 1)
        step = posenc.attention(
            q[:, :, i : i + 1], k[:, :, : i + 1], v[:, :, : i + 1], encoding=enc,
            q_positions=torch.tensor([i]), k_positions=torch.arange(i + 1), backend="eager",
        )
        assert_close(step, implied[:, :, i : i + 1], rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# The module: a trainable s per head, configs, composition


def test_s_is_a_trainable_parameter_per_head_initialised_as_the_paper():
    enc = posenc.build("rope_ssmax", dim=32, num_heads=H, head_dim=D, max_len=16)
    assert [name for name, _ in enc.named_parameters()] == ["s"]
    assert enc.s.requires_grad and enc.s.shape == (H,) and (enc.s == torch.tensor(S_INIT)).all()
    assert enc.s.dtype == torch.float32
    with torch.device("meta"):
        meta = posenc.build("ssmax", num_heads=H)
    meta.to_empty(device="cpu")
    meta.reset_parameters()
    assert (meta.s == torch.tensor(S_INIT)).all()
    assert "s" in enc.state_dict() and not any(k.startswith("rope.") for k in enc.state_dict())  # RoPE: buffers only


def test_bias_is_a_trainable_parameter_per_head_initialised_to_zero():
    """``bias=True`` (and the names ``ssmax_bias``, ``rope_ssmax_bias``) adds ``b`` (H,) at 0; without it there is
    no ``b`` parameter at all, and the module computes exactly what it computed before ``b`` existed."""
    plain = posenc.build("ssmax", num_heads=H)
    assert plain.b is None and [n for n, _ in plain.named_parameters()] == ["s"] and not plain.config.bias
    enc = posenc.build("ssmax", num_heads=H, bias=True)
    assert [n for n, _ in enc.named_parameters()] == ["s", "b"] and set(enc.state_dict()) == {"s", "b"}
    assert enc.b.requires_grad and enc.b.shape == (H,) and enc.b.dtype == torch.float32 and (enc.b == 0).all()
    assert "bias=True" in repr(enc)
    by_name = posenc.build("ssmax_bias", num_heads=H, head_dim=D, window=32)
    assert by_name.config == posenc.SSMax(num_heads=H, head_dim=D, window=32, bias=True).config
    rope = posenc.build("rope_ssmax_bias", num_heads=H, head_dim=D, base=500.0)
    assert rope.config == posenc.build("rope_ssmax", num_heads=H, head_dim=D, base=500.0, bias=True).config
    assert rope.config.bias and rope.rope is not None and rope.config.rope["base"] == 500.0
    for e in (enc, by_name, rope):
        assert type(e).from_config(e.config.to_dict()).config == e.config
    assert posenc.SSMaxConfig.from_dict({"num_heads": H}).bias is False  # configs saved before b existed load as before
    with torch.device("meta"):
        meta = posenc.build("ssmax_bias", num_heads=H)
    meta.to_empty(device="cpu")
    meta.reset_parameters()
    assert (meta.b == 0).all() and (meta.s == torch.tensor(S_INIT)).all()
    # b = 0 at the start: the bias variant starts out as plain SSMax, to the bit
    q, k, v = _qkv(7, 7, dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(posenc.attention(q, k, v, encoding=enc), posenc.attention(q, k, v, encoding=plain))
        enc.b.fill_(0.5)
        assert not torch.allclose(posenc.attention(q, k, v, encoding=enc), posenc.attention(q, k, v, encoding=plain))


def test_rope_ssmax_is_rope_then_ssmax():
    """``rope_ssmax`` == ``SSMax(rope={...})``; its rotation is RoPE's, its query factor SSMax's."""
    scaling = {"rope_type": "linear", "factor": 2.0}
    enc = posenc.build("rope_ssmax", num_heads=H, head_dim=D, base=500.0, scaling=scaling)
    same = posenc.SSMax(num_heads=H, head_dim=D, rope={"base": 500.0, "scaling": scaling})
    assert enc.config == same.config and type(enc).from_config(enc.config.to_dict()).config == enc.config
    rope = posenc.build("rope", head_dim=D, base=500.0, scaling=scaling)
    q, k, _ = _qkv(6, 6, dtype=torch.float32)
    pos = torch.arange(6)
    rq, rk = rope.rotate(q, k, pos, pos)
    sq, sk = enc.rotate(q, k, pos, pos)
    assert_close(sk, rk, rtol=0, atol=0)
    assert_close(sq, apply_ssmax(rq, pos, enc.s.detach()), rtol=0, atol=0)


def test_dynamic_rope_under_ssmax_takes_seq_len():
    enc = posenc.build("rope_ssmax", num_heads=H, head_dim=D, scaling={"rope_type": "dynamic", "factor": 2.0,
                                                                       "max_position_embeddings": 4})
    assert enc.depends_on_length and not posenc.build("ssmax", num_heads=H).depends_on_length
    q, k, v = _qkv(3, 10, dtype=torch.float32)
    with torch.no_grad():
        pos = {"q_positions": torch.arange(7, 10), "k_positions": torch.arange(10)}
        short = posenc.attention(q, k, v, encoding=enc, seq_len=10, **pos)
        long = posenc.attention(q, k, v, encoding=enc, seq_len=40, **pos)
    assert not torch.equal(short, long)


@pytest.mark.parametrize("name", ["ssmax", "rope_ssmax", "ssmax_bias", "rope_ssmax_bias"])
def test_compiles_without_graph_breaks(name):
    enc = posenc.build(name, num_heads=H, head_dim=D)
    q, k, v = _qkv(7, 7, dtype=torch.float32)
    pos = torch.arange(7)

    def f(q, k, v, pos):
        return posenc.attention(q, k, v, encoding=enc, q_positions=pos, backend="sdpa")

    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(f, fullgraph=True)(q, k, v, pos)
        assert_close(got, f(q, k, v, pos), **attention_tol(q, k, v, encoding=enc, q_positions=pos))


@pytest.mark.parametrize("spec", ["rope_ssmax/ssmax:2", "ssmax_bias/rope_ssmax_bias:3"])
def test_the_lab_gives_every_layer_its_own_s_and_b_and_trains_them(spec):
    """The paper's s (and b) per layer and head: in a lab GPT every SSMax layer owns its module, none is shared, and
    a few training steps move each layer's s (and b) differently; the loss falls; a copy keeps them."""
    from posenc.lab.common.gpt import GPT, ModelConfig

    torch.manual_seed(0)
    model = GPT(ModelConfig(dim=32, n_layers=3, n_heads=4, max_len=16, encoding=spec))
    encodings = model.layer_encodings()
    assert all(isinstance(e, posenc.SSMax) for e in encodings)
    assert len({id(e) for e in encodings}) == 3 and len({id(e.s) for e in encodings}) == 3  # nothing shared
    assert model.encoding is None and model.nth_encoding is None  # no module shared by a kind's layers
    bias = spec.startswith("ssmax_bias")
    names = [n for n, _ in model.named_parameters() if n.endswith((".s", ".b"))]
    assert names == [f"blocks.{i}.encoding.{p}" for i in range(3) for p in (("s", "b") if bias else ("s",))]
    assert [e.rope is not None for e in encodings] == ([False, False, True] if bias else [True, False, True])
    before = [(e.s.detach().clone(), None if e.b is None else e.b.detach().clone()) for e in encodings]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, 8, (4, 17))
    losses = []
    for _ in range(15):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]
    for (s, b), enc in zip(before, encodings, strict=True):
        assert not torch.equal(enc.s.detach(), s)
        assert (enc.b is None) == (not bias) and (b is None or not torch.equal(enc.b.detach(), b))
    for i in range(3):  # learned per layer: no two layers' s (or b) are equal after training
        for j in range(i):
            assert not torch.equal(encodings[i].s, encodings[j].s)
            assert not bias or not torch.equal(encodings[i].b, encodings[j].b)
    again = copy.deepcopy(model)
    for a, e in zip(again.layer_encodings(), encodings, strict=True):
        assert torch.equal(a.s, e.s)
