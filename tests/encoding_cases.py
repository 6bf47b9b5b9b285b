"""Every registered encoding built the same way, with positions of the kind it takes: for registry-wide tests."""

from __future__ import annotations

import torch

import posenc
from posenc.functional.axial_rope import grid_positions

#: One set of model facts for every encoding; ``posenc.build`` drops what an encoding does not use.
MODEL = {"dim": 32, "num_heads": 4, "head_dim": 16, "max_len": 512, "grid_size": (16, 16)}
GRID_SIDE = 16


#: RoPE with every scaling, at an original length (8) that the test sequences (9-24 tokens) cross, so the
#: length-dependent ones (dynamic, longrope) switch regime inside a test. Named ``rope+<rope_type>`` in the sweeps.
_F = MODEL["head_dim"] // 2
SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "ntk": {"rope_type": "ntk", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 8},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
    "longrope": {
        "rope_type": "longrope",
        "short_factor": [1.0 + 0.05 * i for i in range(_F)],
        "long_factor": [1.5 + 0.4 * i for i in range(_F)],
        "original_max_position_embeddings": 8,
        "factor": 4.0,
    },
    "llama3": {
        "rope_type": "llama3",
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8,
    },
    "proportional": {"rope_type": "proportional", "partial_rotary_factor": 0.5},
    "ntk_alpha": {"rope_type": "dynamic", "alpha": 4.0},  # Hunyuan's spelling
    "ntk_mixed": {"rope_type": "ntk", "factor": 4.0, "mixed_b": 0.625},  # vLLM's spelling
    "telechat3_yarn": {"rope_type": "telechat3-yarn", "factor": 4.0, "original_max_position_embeddings": 8},
    "yarn_log": {"rope_type": "yarn_log", "factor": 4.0, "original_max_position_embeddings": 8},
}
SCALED = [f"rope+{name}" for name in SCALINGS]


def build(name: str, **overrides) -> posenc.Encoding:
    if name.startswith("rope+"):
        overrides = {"scaling": SCALINGS[name.removeprefix("rope+")], **overrides}
        name = "rope"
    encoding = posenc.build(name, **{**MODEL, **overrides})
    _randomize(encoding)
    return encoding


@torch.no_grad()
def _randomize(encoding: torch.nn.Module) -> None:
    """Learned tables start at zeros or tiny values in some inits; make them large enough to matter in a test."""
    for p in encoding.parameters():
        if p.dim() >= 2 and p.abs().max() < 0.5:
            p.normal_(0.0, 1.0)
    if isinstance(encoding, posenc.SSMax):  # one s per head, all equal at init: make them differ, so heads matter
        encoding.s.copy_(torch.linspace(0.25, 1.0, encoding.s.numel()))
        if encoding.b is not None:  # ssmax_bias, rope_ssmax_bias: b starts at 0, where it would test nothing
            encoding.b.copy_(torch.linspace(-0.5, 0.75, encoding.b.numel()))


def positions(encoding: posenc.Encoding, length: int, *, start: int = 0, batch: int | None = None) -> torch.Tensor:
    """Positions ``start .. start + length - 1`` in the form ``encoding`` takes; ``batch`` adds a batch axis."""
    kind = encoding.position_kind
    if kind == "grid":
        n_axes = getattr(getattr(encoding, "config", None), "n_axes", 2)
        pos = grid_positions(*([GRID_SIDE] * n_axes))[start : start + length]  # (length, n_axes)
    elif kind == "mrope":
        t = torch.arange(start, start + length)
        rows = [t, t // 3, t % 5, t // 7]  # distinct position streams: (N, length), N = the encoding's streams
        pos = torch.stack(rows[: getattr(encoding, "num_streams", 3)])
    else:
        pos = torch.arange(start, start + length)
    if batch is None:
        return pos
    if kind == "mrope":
        return torch.stack([pos + 7 * r for r in range(batch)], dim=1)  # (N, B, length)
    return torch.stack([pos + 7 * r for r in range(batch)])  # (B, length, ...): rows differ by a shift


def content(encoding: posenc.Encoding, k: torch.Tensor) -> dict[str, torch.Tensor]:
    """``bias`` keywords beyond the positions: the keys, for encodings whose bias reads them (``needs_keys``: CoPE)."""
    return {"k": k} if encoding.needs_keys else {}


def shard(encoding: posenc.Encoding, pos: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Tokens ``start:stop`` of ``pos`` (the sequence axis depends on the position kind)."""
    if encoding.position_kind == "mrope":
        return pos[..., start:stop]
    if encoding.position_kind == "grid":
        return pos[..., start:stop, :]
    return pos[..., start:stop]


def score_error(encoding: posenc.Encoding, q: torch.Tensor, k: torch.Tensor, t: int, bias_max: float = 0.0) -> float:
    """How far two float32 computations of one attention score may be apart because of the encoding itself, beyond
    the q.k dot product and a few roundings of the bias (``tests/tolerances.attention_atol`` counts those): the
    encodings whose bias or rotation is itself a sum, summed in another order by another path (a chunk, a backend,
    a compiled graph). 0 for elementwise encodings. ``q``, ``k``: unrotated, as given to attention; ``t``: keys;
    ``bias_max``: max |bias|."""
    from tolerances import dot_magnitude, fope_rotation_atol, mlp_atol, sum_atol, unit_roundoff

    d = q.shape[-1]
    scale = d**-0.5
    u = unit_roundoff()
    name = type(encoding).__name__
    if name == "FIRE":  # bias = W2 relu(W1 x + b1) + b2 for x in [0, 1]: a sum over the MLP's hidden units
        mlp = encoding.mlp
        return mlp_atol(mlp[0].weight[:, 0], mlp[0].bias, mlp[2].weight, mlp[2].bias)
    if name == "Sandwich":  # the same terms in the same order on every path; SLEEF vs libm: 2 ulps of each sine,
        return 9 * u * bias_max  # 8 u relative on each (same-sign) term of the sum (tests/functional/test_sandwich)
    if name == "ShawRelative":  # bias = q . a_ij: a D-term dot product
        return sum_atol(d, dot_magnitude(q, encoding.relative_keys))
    if name == "CoPE":  # p_ij = sum of t gates sigmoid(scale q.k), then bias = scale q . e[p] interpolated
        table = encoding.embeddings.detach().reshape(-1, d)
        qe = dot_magnitude(q, table) * scale  # max |scale q . e_n|
        gate = sum_atol(d, dot_magnitude(q, k) * scale) / 4  # sigmoid' <= 1/4
        position = sum_atol(t, t) + t * gate
        return position * 2 * qe + sum_atol(d, qe)  # |scale q . (e[n + 1] - e[n])| <= 2 qe per unit of position
    if name == "FoPE":  # each table entry sums M products coef * cos/sin; a rotated channel mixes two entries
        cos_coef, sin_coef = encoding.cos_coef.detach(), encoding.sin_coef.detach()
        column = float(torch.maximum(cos_coef.abs().sum(1), sin_coef.abs().sum(1)).max())
        rotated = fope_rotation_atol(cos_coef, sin_coef, 1.0)  # per unit of |x|, per channel
        # ||dq|| <= 2 rotated ||q||, ||k'|| <= 2 column ||k||: q and k each moved, against the other's size
        q_norm, k_norm = float(q.detach().norm(dim=-1).max()), float(k.detach().norm(dim=-1).max())
        return scale * 2 * (2 * rotated * q_norm) * (2 * column * k_norm)
    return 0.0


def attention_tol(
    q, k, v, *, encoding=None, q_positions=None, k_positions=None, scale=None, bias=None, sinks=None
) -> dict:
    """``assert_close`` arguments bounding two float32 computations of this attention (``tests/tolerances.py``):
    from q and k as the encoding rotates them, the size of its bias and of the values, and the encoding's own
    sums (``encoding_cases.score_error``). Never a fixed number: blocking differs between CPUs and BLAS builds.
    ``sinks``: attention sinks, logits among the scores (their max subtraction rounds relative to ``|sink|``)."""
    from tolerances import attention_atol

    value_max = float(v.detach().abs().max())
    extra = 0.0
    with torch.no_grad():
        if encoding is not None:
            t, s = k.shape[-2], q.shape[-2]
            k_positions = positions(encoding, t) if k_positions is None else k_positions
            q_positions = shard(encoding, k_positions, t - s, t) if q_positions is None else q_positions
            if encoding.has_bias:
                bias = encoding.bias(q_positions, k_positions, q=q, **content(encoding, k))
        bias_max = 0.0 if bias is None else float(bias.abs().max())
        if encoding is not None:
            extra = score_error(encoding, q, k, k.shape[-2], bias_max)
            q, k = encoding.rotate(q, k, q_positions, k_positions)
            if encoding.has_value_term:
                value_max += float(encoding.relative_values.abs().max())
    logit_max = bias_max if sinks is None else max(bias_max, float(sinks.abs().max()))
    atol = attention_atol(q, k, v, scale=scale, bias_max=logit_max, extra_score_error=extra, value_max=value_max)
    return {"rtol": 0.0, "atol": atol}
