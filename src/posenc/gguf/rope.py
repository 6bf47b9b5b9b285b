"""A transformers RoPE config as the GGUF metadata llama.cpp runs it, and back; and the frequencies each side computes.

llama.cpp reads a Llama GGUF's RoPE from ``llama.context_length``, ``llama.rope.freq_base``, ``llama.rope.scaling.*``
keys and per-frequency divisors in the tensors ``rope_freqs.weight`` (Llama 3.1's scaling) or
``rope_factors_long/short.weight`` (LongRoPE) (``GGUFRope``). ``to_gguf`` translates and then checks the
translation: the frequencies and attention factor llama.cpp would compute (``llamacpp_frequencies``, which writes
out its formula) must equal transformers' own for the config (``hf_frequencies``) up to float32 rounding, or the
export is refused. ``from_gguf`` reads the keys back as a transformers config; the exact config is also recorded in
the file as JSON (``posenc.rope``), which posenc's loader prefers when it still describes the same RoPE as the
llama.cpp keys, so a reload is bit-equal.

Reference: llama.cpp ``src/llama-model.cpp`` (``load_hparams``, ``get_rope_factors``), ``src/llama-context.cpp``
(``yarn_attn_factor``), ``ggml/src/ggml.c`` (``ggml_rope_yarn_corr_dims``), ``convert_hf_to_gguf.py``
(``LlamaModel.generate_extra_tensors``: Llama 3.1's ``rope_freqs``); transformers ``modeling_rope_utils``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch

if TYPE_CHECKING:
    import numpy as np

from posenc._checks import fail

#: The metadata key holding posenc's own record of the config (JSON), read back by posenc's loader.
POSENC_KEY = "posenc.rope"
#: The tensors llama.cpp reads RoPE factors from, by role.
FREQS, LONG, SHORT = "rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"
ROPE_TENSORS = (FREQS, LONG, SHORT)
#: ``rope_type`` values llama.cpp can run (``default`` includes posenc's ``ntk``, a plain new base).
EXPRESSIBLE = ("default", "linear", "yarn", "llama3", "longrope")
#: The GGUF architectures posenc writes RoPE keys for, and the ``rope_type`` values llama.cpp runs from each one's
#: keys: only Llama's graph passes per-frequency factor tensors (``rope_freqs``, LongRoPE's ``rope_factors_*``;
#: ``src/models/qwen2.cpp`` and ``gemma3.cpp`` pass none, and a file holding one fails their load).
WRITES = {"llama": EXPRESSIBLE, "qwen2": ("default", "linear", "yarn"), "gemma3": ("default", "linear", "yarn")}
#: Per-layer-type RoPE: ``(the layer type the architecture's rope.* keys describe, the sliding type)``. llama.cpp's
#: Gemma 3 rotates its sliding layers at ``rope.freq_base_swa`` (default 10000) with ``freq_scale`` 1 whatever the
#: scaling keys say (``load_arch_hparams``: ``rope_freq_scale_train_swa = 1``; llama.cpp #14367), and passes them the
#: same ``ext_factor`` and ``attn_factor`` as the full layers (``src/models/gemma3.cpp``).
LAYER_TYPES = {"gemma3": ("full_attention", "sliding_attention")}
#: llama.cpp's Gemma 3 default base for its sliding layers (``rope_freq_base_train_swa``).
GEMMA3_BASE_SWA = 10000.0
_YARN_BETAS = (32.0, 1.0)  # llama.cpp's yarn_beta_fast / yarn_beta_slow defaults (llama-hparams.h)
_RTOL = 1e-5  # float32 keys (base, factor) and float32 arithmetic on either side; a wrong mapping is off by >1e-3


@dataclass(frozen=True)
class GGUFRope:
    """What llama.cpp reads about a Llama model's RoPE.

    The keys: ``llama.context_length``, ``llama.rope.freq_base``, ``llama.rope.scaling.type`` (``none``, ``linear``,
    ``yarn``, ``longrope``), ``llama.rope.scaling.factor``, ``llama.rope.scaling.original_context_length``,
    ``llama.rope.scaling.attn_factor``, and the tensors ``rope_freqs.weight`` or ``rope_factors_long/short.weight``,
    each of ``head_dim / 2`` float32 values (``llama_model::load_hparams``, ``src/models/llama.cpp``).

    Attributes:
        context_length: ``llama.context_length``, the context the file declares (llama.cpp's default ``n_ctx``).
        freq_base: ``llama.rope.freq_base``.
        head_dim: ``llama.rope.dimension_count`` (rotating dims; every head dim for Llama).
        scaling_type: ``"linear"``, ``"yarn"``, ``"longrope"``, or None (no scaling key written).
        factor: ``rope.scaling.factor`` (linear, yarn); None otherwise.
        original_context_length: ``rope.scaling.original_context_length`` (yarn, longrope); None otherwise.
        attn_factor: ``rope.scaling.attn_factor``; None when 1.
        freqs: ``rope_freqs`` divisors (Llama 3.1), ``head_dim / 2`` values; None otherwise.
        long_factors, short_factors: LongRoPE's divisors; None otherwise.
    """

    context_length: int
    freq_base: float
    head_dim: int
    scaling_type: str | None = None
    factor: float | None = None
    original_context_length: int | None = None
    attn_factor: float | None = None
    freqs: tuple[float, ...] | None = None
    long_factors: tuple[float, ...] | None = None
    short_factors: tuple[float, ...] | None = None

    def metadata(self, arch: str = "llama") -> dict[str, tuple[Any, str]]:
        """``{key: (value, gguf value type name)}`` for the writer; keys with no value are left out."""
        out: dict[str, tuple[Any, str]] = {
            f"{arch}.context_length": (self.context_length, "UINT32"),
            f"{arch}.rope.freq_base": (self.freq_base, "FLOAT32"),
        }
        if self.scaling_type is not None:
            out[f"{arch}.rope.scaling.type"] = (self.scaling_type, "STRING")
        if self.factor is not None:
            out[f"{arch}.rope.scaling.factor"] = (self.factor, "FLOAT32")
        if self.original_context_length is not None:
            out[f"{arch}.rope.scaling.original_context_length"] = (self.original_context_length, "UINT32")
        if self.attn_factor is not None:
            out[f"{arch}.rope.scaling.attn_factor"] = (self.attn_factor, "FLOAT32")
        return {k: (_f32(v) if kind == "FLOAT32" else v, kind) for k, (v, kind) in out.items()}

    def tensors(self) -> dict[str, np.ndarray]:
        """The per-frequency factor tensors, float32 ``(head_dim / 2,)`` each."""
        import numpy as np  # only here: `import posenc` needs torch alone
        named = {FREQS: self.freqs, LONG: self.long_factors, SHORT: self.short_factors}
        return {name: np.asarray(values, dtype=np.float32) for name, values in named.items() if values is not None}


def _f32(x: float) -> float:
    """``x`` as llama.cpp holds it: a float32 key."""
    import numpy as np  # only here: `import posenc` needs torch alone
    return float(np.float32(x))


def ggml_rope_frequencies(
    n_dims: int,
    freq_base: float,
    freq_scale: float,
    *,
    n_ctx_orig: int,
    freq_factors: Any = None,
    ext_factor: float = 0.0,
    attn_factor: float = 1.0,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
) -> tuple[np.ndarray, float]:
    """What ``ggml_rope_ext`` rotates pair ``i`` by per position, and the scale it gives cos and sin, from its
    arguments (``ggml_rope_cache_init`` / ``rope_yarn`` in ``ggml/src/ggml-cpu/ops.cpp``, the correction dims of
    ``ggml_rope_yarn_corr_dims`` in ``ggml/src/ggml.c``), in float64::

        extrap = freq_base ** (-2 i / n_dims) / freq_factors[i],  interp = freq_scale * extrap
        ext_factor != 0:  mix = ramp(i) * ext_factor, theta = interp (1 - mix) + extrap mix,
                          mscale = attn_factor * (1 + 0.1 ln(1 / freq_scale))
        else:             theta = interp, mscale = attn_factor

    with ``ramp(i) = 1 - clamp((i - low) / max(0.001, high - low), 0, 1)``, ``low = max(0, floor(corr(beta_fast)))``,
    ``high = min(n_dims - 1, ceil(corr(beta_slow)))``, ``corr(r) = n_dims ln(n_ctx_orig / (2 pi r)) / (2 ln base)``.

    Args:
        n_dims: the rotated channels (``n_rot``); ``n_dims / 2`` pairs.
        freq_factors: ``n_dims / 2`` divisors (``rope_freqs``, LongRoPE's factors), or None (all 1).

    Returns:
        ``(theta, mscale)``: theta ``(n_dims / 2,)`` radians per position.
    """
    import numpy as np  # only here: `import posenc` needs torch alone
    i = np.arange(n_dims // 2, dtype=np.float64)
    extrap = float(freq_base) ** (-2.0 * i / n_dims)
    if freq_factors is not None:
        extrap = extrap / np.asarray(freq_factors, dtype=np.float64)
    interp = float(freq_scale) * extrap
    if ext_factor == 0.0:
        return interp, float(attn_factor)

    def corr(rotations: float) -> float:
        return n_dims * math.log(n_ctx_orig / (rotations * 2 * math.pi)) / (2 * math.log(freq_base))

    low = max(0.0, math.floor(corr(beta_fast)))
    high = min(n_dims - 1.0, math.ceil(corr(beta_slow)))
    mix = (1.0 - np.clip((i - low) / max(0.001, high - low), 0.0, 1.0)) * ext_factor
    return interp * (1 - mix) + extrap * mix, float(attn_factor) * (1.0 + 0.1 * math.log(1.0 / freq_scale))


def llamacpp_attn_factor(
    freq_scale: float, *, ext_factor: float, rope_attn_factor: float = 1.0, yarn_attn_factor: float = 1.0,
    yarn_log_mul: float = 0.0, mscale: float = 1.0,
) -> float:
    """The ``attn_factor`` llama.cpp's context passes to ``ggml_rope_ext`` (``llama_context::llama_context``,
    ``src/llama-context.cpp``): with YaRN on (``ext_factor != 0``), ``get_mscale(s, mscale) / get_mscale(s,
    yarn_log_mul)`` when the model has a ``yarn_log_multiplier`` else ``get_mscale(s, 1)``, divided by the ``1 + 0.1
    ln s`` the kernel multiplies back (``s = 1 / freq_scale``, ``get_mscale(s, m) = 1 + 0.1 m ln s``, 1 for ``s <=
    1``); otherwise the model's ``yarn_attn_factor`` (1 unless its architecture reads the key). Then times
    ``rope.scaling.attn_factor``."""
    if ext_factor != 0.0:
        s = 1.0 / freq_scale

        def get_mscale(m: float) -> float:
            return 1.0 if s <= 1.0 else 0.1 * m * math.log(s) + 1.0

        factor = get_mscale(mscale) / get_mscale(yarn_log_mul) if yarn_log_mul != 0.0 else get_mscale(1.0)
        factor /= 1.0 + 0.1 * math.log(s)
    else:
        factor = yarn_attn_factor
    return factor * rope_attn_factor


def llamacpp_frequencies(
    rope: GGUFRope, *, n_ctx: int | None = None, sliding_base: float | None = None
) -> tuple[np.ndarray, float]:
    """The per-pair frequencies and the cos/sin scale llama.cpp computes from ``rope`` for a Llama file (the formula
    below: ``llamacpp_attn_factor`` then ``ggml_rope_frequencies``, in float64 from the float32 keys).

    Per rotating pair ``i`` of ``d = head_dim`` dimensions (``ggml_rope_cache_init`` / ``rope_yarn`` in
    ``ggml-cpu/ops.cpp``, ``llama_context``'s YaRN attention factor in ``llama-context.cpp``):

        theta_extrap = base ** (-2 i / d) / ff[i]        ff: rope_freqs, or LongRoPE's long (n_ctx > original) / short
        theta_interp = theta_extrap / factor             factor: rope.scaling.factor (1 when absent or type none)
        yarn:  ramp  = 1 - clamp((i - low) / max(0.001, high - low), 0, 1)
               low   = max(0, floor(corr(32))), high = min(d - 1, ceil(corr(1))),
               corr(r) = d * ln(original / (2 pi r)) / (2 ln base)
               theta = theta_interp * (1 - ramp) + theta_extrap * ramp,  mscale = attn_factor * (1 + 0.1 ln factor)
        else:  theta = theta_interp,                                      mscale = attn_factor

    and rotates by ``position * theta`` with ``cos`` and ``sin`` multiplied by ``mscale``.

    Args:
        rope: the file's RoPE keys and tensors.
        n_ctx: llama.cpp's context size; it picks LongRoPE's long factors when it exceeds the original context.
            Default the file's ``context_length``.
        sliding_base: for a Gemma 3 sliding layer, its base (``rope.freq_base_swa``): rotated with ``freq_scale`` 1
            and no factor tensor, but the context's ``ext_factor`` and ``attn_factor`` of the file's scaling.

    Returns:
        ``(theta, mscale)``: theta ``(head_dim / 2,)`` radians per position.
    """
    ff = None
    if rope.freqs is not None:
        ff = rope.freqs
    elif rope.scaling_type == "longrope":
        original = rope.original_context_length or rope.context_length
        use_long = (n_ctx or rope.context_length) > original
        ff = rope.long_factors if use_long else rope.short_factors
    factors = None if ff is None else [_f32(x) for x in ff]
    scaled = rope.scaling_type in ("linear", "yarn") and rope.factor not in (None, 0.0)
    freq_scale = 1.0 / _f32(cast(float, rope.factor)) if scaled else 1.0
    ext = 1.0 if rope.scaling_type == "yarn" else 0.0
    attn = llamacpp_attn_factor(freq_scale, ext_factor=ext, rope_attn_factor=_f32(rope.attn_factor or 1.0))
    base = _f32(rope.freq_base)
    if sliding_base is not None:  # get_rope_freq_base / _scale of a sliding layer; the context's ext and attn
        base, freq_scale, factors = _f32(sliding_base), 1.0, None
    return ggml_rope_frequencies(
        rope.head_dim, base, freq_scale, n_ctx_orig=rope.original_context_length or rope.context_length,
        freq_factors=factors, ext_factor=ext, attn_factor=attn, beta_fast=_YARN_BETAS[0], beta_slow=_YARN_BETAS[1],
    )


def _params(config: Any, layer_type: str | None = None) -> dict[str, Any]:
    """The config's ``rope_parameters`` (one dict for every layer), or one layer type's entry."""
    params = getattr(config, "rope_parameters", None)
    if layer_type is not None:
        entry = params.get(layer_type) if isinstance(params, Mapping) else None
        if not isinstance(entry, Mapping):
            fail("model", type(config).__name__, f"a config whose rope_parameters has a {layer_type!r} entry")
        return dict(entry)
    if not isinstance(params, Mapping) or any(isinstance(v, Mapping) for v in params.values()):
        fail("model", type(config).__name__, "a Llama config with one rope_parameters dict")
    return dict(params)


def nested(config: Any) -> bool:
    """Whether the config's ``rope_parameters`` is per layer type (``{"full_attention": {...}, ...}``)."""
    params = getattr(config, "rope_parameters", None)
    return isinstance(params, Mapping) and any(isinstance(v, Mapping) for v in params.values())


def _head_dim(config: Any) -> int:
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def hf_frequencies(
    config: Any, *, seq_len: int | None = None, layer_type: str | None = None
) -> tuple[np.ndarray, float]:
    """transformers' own ``(inv_freq, attention_scaling)`` for ``config`` (``ROPE_INIT_FUNCTIONS``; ``default``:
    ``base ** (-2 i / d)``), float64; ``layer_type``: one entry of a per-layer-type config (Gemma 3), as its
    rotary module computes it. ``seq_len`` picks LongRoPE's long or short factors as transformers does."""
    params = _params(config, layer_type)
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        d = _head_dim(config)
        exponent = torch.arange(0, d, 2, dtype=torch.int64).float() / d
        inv_freq, scale = 1.0 / (params["rope_theta"] ** exponent), 1.0
    else:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        kwargs = {} if layer_type is None else {"layer_type": layer_type}
        inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=seq_len, **kwargs)
    return inv_freq.double().numpy(), float(scale)


def _refuse(config: Any, reason: str) -> None:
    fail("model", f"RoPE {dict(getattr(config, 'rope_parameters', None) or {})}",
         f"a RoPE llama.cpp can run from GGUF metadata: {reason}")


def to_gguf(config: Any, *, arch: str = "llama", sliding_base: float = GEMMA3_BASE_SWA) -> GGUFRope:
    """The GGUF RoPE that makes llama.cpp run ``config``'s RoPE, checked against transformers' frequencies.

    ``arch``: the file's architecture, one of ``WRITES`` (Qwen2 and Gemma 3 run no factor tensor: no ``llama3``,
    ``longrope``). For Gemma 3 the keys describe the ``full_attention`` layers; its ``sliding_attention`` layers must
    be what llama.cpp runs for them: the default RoPE at ``sliding_base`` (the source file's ``rope.freq_base_swa``,
    10000 when absent) -- a model extended on its sliding layers is refused, llama.cpp would leave them unscaled --
    and their frequencies and cos/sin scale under the full layers' ``ext_factor`` / ``attn_factor`` are checked too.

    llama.cpp's formula (``llamacpp_frequencies``) is transformers' ``linear`` (Position Interpolation), ``yarn`` (with
    the default ``beta_fast=32``, ``beta_slow=1``, ``truncate``), ``llama3`` (as ``rope_freqs``) and ``longrope`` term
    by term, and posenc's ``ntk`` is a plain new base. Dynamic NTK is not expressible (its frequencies change with the
    sequence length), nor are YaRN's other betas (llama.cpp reads them from its command line only: ``--yarn-beta-fast``,
    ``--yarn-beta-slow``) or the remapping methods.

    Raises:
        ValueError: naming the model's ``rope_parameters`` and what llama.cpp would need instead, for dynamic NTK,
            YaRN with other betas or without truncation, partial rotary, per-layer-type RoPE on an architecture
            without it, Gemma 3's sliding layers extended; or when llama.cpp's frequencies would differ from
            transformers' (the check below).
    """
    if arch not in WRITES:
        fail("arch", arch, f"one of {sorted(WRITES)} (the GGUF architectures posenc writes RoPE keys for)")
    main, sliding = LAYER_TYPES.get(arch, (None, None))
    if nested(config) and main is None:
        _refuse(config, f"per-layer-type rope_parameters: llama.cpp's {arch} runs one RoPE for every layer")
    if main is not None and not nested(config):
        _refuse(config, f"{arch}'s per-layer-type rope_parameters ({main!r} and {sliding!r} entries)")
    params = _params(config, main)
    rope_type = params.get("rope_type", "default")
    d = _head_dim(config)
    base, context = float(params["rope_theta"]), int(config.max_position_embeddings)
    if rope_type == "dynamic":
        _refuse(
            config,
            "dynamic NTK changes its frequencies with the sequence length, which no GGUF key records; write a static "
            "method instead (ntk or yarn), or run the unscaled file with llama.cpp's --rope-freq-base",
        )
    if rope_type not in EXPRESSIBLE:
        _refuse(config, f"rope_type {rope_type!r} has no GGUF form (llama.cpp runs {list(EXPRESSIBLE)})")
    if rope_type not in WRITES[arch]:
        _refuse(config, f"rope_type {rope_type!r} needs per-frequency factor tensors (rope_freqs, rope_factors_long/"
                f"short), which llama.cpp's {arch} graph does not pass (src/models/{arch}.cpp; its load fails on "
                f"them): {arch} runs {list(WRITES[arch])} (ntk as a new base)")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        _refuse(config, "llama.cpp rotates every dimension of a Llama head (no partial rotary)")
    original = params.get("original_max_position_embeddings")
    if rope_type == "default":
        rope = GGUFRope(context_length=context, freq_base=base, head_dim=d)
    elif rope_type == "linear":
        rope = GGUFRope(context_length=context, freq_base=base, head_dim=d, scaling_type="linear",
                        factor=float(params["factor"]), original_context_length=original)
    elif rope_type == "yarn":
        if (params.get("beta_fast", 32.0), params.get("beta_slow", 1.0)) != _YARN_BETAS:
            _refuse(
                config,
                f"YaRN with beta_fast={params.get('beta_fast')}, beta_slow={params.get('beta_slow')}: llama.cpp reads "
                "its betas only from the command line (--yarn-beta-fast, --yarn-beta-slow; defaults 32 and 1)",
            )
        if not params.get("truncate", True):
            _refuse(config, "YaRN with truncate=False: llama.cpp always rounds the correction range to whole dims")
        factor = float(params["factor"])
        _, scale = hf_frequencies(config, layer_type=main)
        attn = scale / (1.0 + 0.1 * math.log(factor))  # llama.cpp multiplies its own 1 + 0.1 ln(factor) back
        rope = GGUFRope(context_length=context, freq_base=base, head_dim=d, scaling_type="yarn", factor=factor,
                        original_context_length=int(original or context),
                        attn_factor=None if abs(attn - 1.0) < 1e-7 else attn)
    elif rope_type == "llama3":
        rope = GGUFRope(context_length=context, freq_base=base, head_dim=d, freqs=_llama3_divisors(params, d))
    else:  # longrope
        original = int(original or context)
        _, scale = hf_frequencies(config, seq_len=original + 1, layer_type=main)
        rope = GGUFRope(context_length=context, freq_base=base, head_dim=d, scaling_type="longrope",
                        original_context_length=original, attn_factor=None if scale == 1.0 else scale,
                        long_factors=tuple(float(x) for x in params["long_factor"]),
                        short_factors=tuple(float(x) for x in params["short_factor"]))
    check_same(config, rope, layer_type=main)
    if sliding is not None:
        _check_sliding(config, rope, sliding, sliding_base)
    return rope


def _check_sliding(config: Any, rope: GGUFRope, layer_type: str, base: float) -> None:
    """Refuse a Gemma 3 model whose ``layer_type`` (sliding) layers llama.cpp would run otherwise than transformers:
    extended (llama.cpp leaves them unscaled), at another base than ``base``, or with another cos/sin scale."""
    import numpy as np  # only here: `import posenc` needs torch alone

    params = _params(config, layer_type)
    kind = params.get("rope_type", "default")
    instead = ("extend the full_attention layers only (posenc export's default --layer-type; Google's long-context "
               "Gemma 3 configs scale the global layers only), or save a transformers folder (--save DIR), which "
               "transformers and vLLM run per layer type")
    if kind != "default":
        _refuse(config, f"llama.cpp's gemma3 rotates the {layer_type} layers at rope.freq_base_swa ({base:g}) "
                f"unscaled (freq_scale 1 whatever the rope.scaling keys say: src/llama-model.cpp, llama.cpp #14367), "
                f"so a model extended there (rope_type {kind!r}) would run them unscaled: {instead}")
    theta = float(params.get("rope_theta", base))
    if _f32(theta) != _f32(base):
        _refuse(config, f"llama.cpp's gemma3 rotates the {layer_type} layers at base {base:g} (the source's "
                f"rope.freq_base_swa, 10000 when absent; releases before it read the key hard-code 10000), not "
                f"{theta:g} (a new base there, ntk, is not carried): {instead}")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        _refuse(config, f"llama.cpp rotates every dimension of Gemma 3's {layer_type} heads (no partial rotary)")
    ours, ours_scale = llamacpp_frequencies(rope, sliding_base=base)
    theirs, their_scale = hf_frequencies(config, layer_type=layer_type)
    if not (np.allclose(ours, theirs, rtol=_RTOL, atol=0) and math.isclose(ours_scale, their_scale, rel_tol=_RTOL)):
        _refuse(config, f"llama.cpp passes Gemma 3's {layer_type} layers the full layers' ext_factor and "
                f"attn_factor: it would scale their cos/sin by {ours_scale:.6g} where transformers does by "
                f"{their_scale:.6g} (a YaRN attention_factor of the full layers reaches them in llama.cpp)")


def _llama3_divisors(params: Mapping[str, Any], d: int) -> tuple[float, ...]:
    """Llama 3.1's scaling as ``rope_freqs``, the divisor of each plain frequency (llama.cpp's converter writes the
    same): plain over ``posenc.functional.llama3_frequencies``, both in that function's float32 (1 where it leaves a
    frequency as it is, ``factor`` where it divides, the blend between)."""
    from posenc.functional.rope_scaling import llama3_frequencies

    base = float(params["rope_theta"])
    scaled, _ = llama3_frequencies(
        d, base=base, factor=float(params["factor"]), low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]),
    )
    plain = 1.0 / (base ** (torch.arange(0, d, 2).float() / d))  # (d/2,) the same float32 pow as llama3_frequencies
    return tuple((plain.double() / scaled.double()).tolist())


def check_same(config: Any, rope: GGUFRope, *, layer_type: str | None = None) -> None:
    """Refuse ``rope`` unless llama.cpp's frequencies and cos/sin scale from it equal transformers' for ``config``
    (its ``layer_type`` entry), past the original context and (LongRoPE) within it."""
    import numpy as np  # only here: `import posenc` needs torch alone
    lengths = [rope.context_length]
    if rope.scaling_type == "longrope":  # llama.cpp picks the factors by n_ctx, transformers by the sequence length
        lengths.append(cast(int, rope.original_context_length))  # a LongRoPE file has one
    for n in lengths:
        ours, ours_scale = llamacpp_frequencies(rope, n_ctx=n)
        theirs, their_scale = hf_frequencies(config, seq_len=n, layer_type=layer_type)
        if not (np.allclose(ours, theirs, rtol=_RTOL, atol=0) and math.isclose(ours_scale, their_scale, rel_tol=_RTOL)):
            worst = int(np.argmax(np.abs(ours / theirs - 1)))
            _refuse(
                config,
                f"llama.cpp would rotate pair {worst} at {ours[worst]:.6g} rad/position with cos/sin scaled by "
                f"{ours_scale:.6g}, transformers at {theirs[worst]:.6g} and {their_scale:.6g} (n_ctx={n})",
            )


def record(config: Any) -> str:
    """The JSON ``posenc.rope`` value: the config's exact ``rope_parameters`` and ``max_position_embeddings``, and
    for per-layer-type RoPE (Gemma 3) its ``layer_types``."""
    if nested(config):
        params = {k: dict(v) for k, v in config.rope_parameters.items() if isinstance(v, Mapping)}
        return json.dumps({"rope_parameters": params, "max_position_embeddings": int(config.max_position_embeddings),
                           "layer_types": list(config.layer_types)})
    params = _params(config)
    return json.dumps({"rope_parameters": params, "max_position_embeddings": int(config.max_position_embeddings)})


def _floats(values: Any, name: str, d: int, path: str) -> tuple[float, ...]:
    if values is None or len(values) != d // 2:
        fail(name, None if values is None else len(values), f"{d // 2} float32 values (head_dim / 2) in {path}")
    return tuple(float(v) for v in values)


def read_gguf(meta: Mapping[str, Any], tensors: Mapping[str, Any], *, arch: str, path: str) -> GGUFRope:
    """The RoPE keys of a file's metadata and its RoPE factor tensors (``{name: float values}``).

    Raises:
        ValueError: naming the key, for a scaling type llama.cpp does not define, a LongRoPE file without its
            factors, or factors of the wrong length.
    """
    d = int(meta.get(f"{arch}.rope.dimension_count") or meta.get(f"{arch}.attention.key_length") or
            meta[f"{arch}.embedding_length"] // meta[f"{arch}.attention.head_count"])
    scaling = meta.get(f"{arch}.rope.scaling.type")
    allowed = ("none", "linear", "yarn", "longrope")
    if scaling is not None and scaling not in allowed:
        fail(f"{arch}.rope.scaling.type", scaling, f"one of {list(allowed)} (what llama.cpp reads) in {path}")
    factor = meta.get(f"{arch}.rope.scaling.factor", meta.get(f"{arch}.rope.scale_linear"))
    if scaling is None and factor not in (None, 0.0, 1.0):
        scaling = "linear"  # llama.cpp's default type when a factor is present
    if scaling in (None, "none"):
        scaling, factor = None, None
    freqs = tensors.get(FREQS)
    long, short = tensors.get(LONG), tensors.get(SHORT)
    if scaling == "longrope" and long is None:
        fail("tensors", sorted(tensors), f"LongRoPE's {LONG} (rope.scaling.type is longrope) in {path}")
    attn = meta.get(f"{arch}.rope.scaling.attn_factor")
    return GGUFRope(
        context_length=int(meta[f"{arch}.context_length"]),
        freq_base=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        head_dim=d,
        scaling_type=scaling,
        factor=None if factor in (None, 0.0) or scaling not in ("linear", "yarn") else float(factor),
        original_context_length=meta.get(f"{arch}.rope.scaling.original_context_length"),
        attn_factor=None if attn in (None, 1.0) else float(attn),
        freqs=None if freqs is None else _floats(freqs, FREQS, d, path),
        long_factors=None if scaling != "longrope" else _floats(long, LONG, d, path),
        short_factors=None if scaling != "longrope" or short is None else _floats(short, SHORT, d, path),
    )


def to_hf(rope: GGUFRope) -> tuple[dict[str, Any], int]:
    """``(rope_parameters, max_position_embeddings)``: the transformers config that computes the frequencies llama.cpp
    computes from ``rope`` (past the original context; LongRoPE inside it too).

    Per-frequency divisors without a LongRoPE type (Llama 3.1's ``rope_freqs``) become ``longrope`` with equal long
    and short factors and ``attention_factor`` 1, which is the same rotation: the llama3 parameters they came from
    are not recoverable from the divisors."""
    params: dict[str, Any] = {"rope_theta": rope.freq_base}
    context = rope.context_length
    if rope.freqs is not None:
        if rope.scaling_type is not None:
            fail("tensors", [FREQS], f"rope_freqs without a rope.scaling.type (found {rope.scaling_type!r})")
        params.update(rope_type="longrope", long_factor=list(rope.freqs), short_factor=list(rope.freqs),
                      original_max_position_embeddings=context, attention_factor=rope.attn_factor or 1.0)
    elif rope.scaling_type is None:
        params["rope_type"] = "default"
    elif rope.scaling_type == "linear":
        params.update(rope_type="linear", factor=rope.factor)
    elif rope.scaling_type == "yarn":
        factor = rope.factor or 1.0
        params.update(rope_type="yarn", factor=factor, original_max_position_embeddings=
                      rope.original_context_length or context)
        if rope.attn_factor is not None:
            params["attention_factor"] = rope.attn_factor * (1.0 + 0.1 * math.log(factor))
    else:  # longrope
        original = rope.original_context_length or context
        long = cast("tuple[float, ...]", rope.long_factors)  # a LongRoPE file has them
        short = rope.short_factors or tuple(1.0 for _ in long)
        params.update(rope_type="longrope", long_factor=list(long), short_factor=list(short),
                      original_max_position_embeddings=original, attention_factor=rope.attn_factor or 1.0)
    return params, context


def from_gguf(
    meta: Mapping[str, Any], tensors: Mapping[str, Any], *, arch: str, path: str
) -> tuple[dict[str, Any], int, bool]:
    """``(rope_parameters, max_position_embeddings, exact)`` for a file: posenc's own record when the file has one and
    the llama.cpp keys still say the same (``exact`` True), else the translation of the keys (``to_hf``)."""
    rope = read_gguf(meta, tensors, arch=arch, path=path)
    saved = recorded(meta)
    if saved is not None and _same_rope(rope, saved[0], saved[1], d=rope.head_dim):
        return saved[0], saved[1], True
    params, context = to_hf(rope)
    return params, context, False


def recorded_layer_types(meta: Mapping[str, Any]) -> list[str] | None:
    """The ``layer_types`` of the file's ``posenc.rope`` record (per-layer-type RoPE); None without them."""
    try:
        types = json.loads(meta[POSENC_KEY])["layer_types"]
    except (ValueError, KeyError, TypeError):
        return None
    return list(types) if isinstance(types, list) and all(isinstance(t, str) for t in types) else None


def recorded(meta: Mapping[str, Any]) -> tuple[dict[str, Any], int] | None:
    """``(rope_parameters, max_position_embeddings)`` of the file's ``posenc.rope`` record: what posenc measured,
    whatever the llama.cpp keys say now; None without a readable record."""
    value = meta.get(POSENC_KEY)
    if not isinstance(value, str):
        return None
    try:
        saved = json.loads(value)
        return dict(saved["rope_parameters"]), int(saved["max_position_embeddings"])
    except (ValueError, KeyError, TypeError):
        return None


def sliding_layers(meta: Mapping[str, Any], arch: str, n_layer: int) -> list[bool]:
    """Which layers llama.cpp runs as sliding for a file of ``arch`` (Gemma 3: every 6th layer full, or the file's
    ``attention.sliding_window_pattern``, a number or a per-layer array; none without ``attention.sliding_window``;
    ``load_arch_hparams``, ``llama_hparams::set_swa_pattern``); all False for an architecture without sliding layers
    posenc writes."""
    if arch not in LAYER_TYPES or not meta.get(f"{arch}.attention.sliding_window"):
        return [False] * n_layer
    value = meta.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(value, tuple):  # load_hparams zero-fills the rest: missing layers are full
        return [bool(v) for v in value[:n_layer]] + [False] * (n_layer - len(value))
    n = 6 if value is None else int(value)
    return [n == 0 or il % n < n - 1 for il in range(n_layer)]


def _record_rope(params: Mapping[str, Any], context: int, *, d: int, arch: str) -> tuple[GGUFRope, float | None]:
    """The keys ``to_gguf`` writes for a record's ``rope_parameters`` (Gemma 3: its full layers'), and the base its
    sliding layers rotate at (None without them).

    Raises:
        ValueError, KeyError, TypeError: a record no GGUF of ``arch`` carries.
    """
    from transformers import LlamaConfig

    flat, slide = dict(params), None
    if arch in LAYER_TYPES:
        main, sliding = LAYER_TYPES[arch]
        if not isinstance(params.get(main), Mapping) or not isinstance(params.get(sliding), Mapping):
            raise ValueError(f"no {main!r} and {sliding!r} entries")
        flat, other = dict(params[main]), params[sliding]
        if other.get("rope_type", "default") != "default" or other.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError(f"{sliding!r} extended")
        slide = _f32(float(other.get("rope_theta", GEMMA3_BASE_SWA)))
    rope = to_gguf(LlamaConfig(rope_parameters=flat, max_position_embeddings=context, head_dim=d, hidden_size=d,
                               num_attention_heads=1))  # the keys' translation is the same for every architecture
    if flat.get("rope_type", "default") not in WRITES.get(arch, ()):
        raise ValueError(f"rope_type {flat.get('rope_type')!r} has no {arch} form")
    if slide is not None and not math.isclose(llamacpp_frequencies(rope, sliding_base=slide)[1], 1.0, rel_tol=_RTOL):
        raise ValueError("the full layers' attention factor reaches the sliding ones")
    return rope, slide


def key_fixes(meta: Mapping[str, Any], tensors: Mapping[str, Any], params: Mapping[str, Any], context: int, *,
              head_dim: int, arch: str = "llama") -> list[str]:
    """What to change in a file's llama.cpp RoPE keys and factor tensors so that they say ``params`` and ``context``
    again (``to_gguf``): ``"llama.rope.scaling.factor = 2 (the file: 4)"``, ``"remove llama.rope.scaling.attn_factor
    (the file: 0.9)"``; empty where they do, or where ``params`` has no GGUF form."""
    try:
        want, slide = _record_rope(params, context, d=head_dim, arch=arch)
    except (ValueError, KeyError, TypeError):
        return []
    keys = {k: v for k, (v, _) in want.metadata(arch).items()}
    if slide is not None and _f32(meta.get(f"{arch}.rope.freq_base_swa", GEMMA3_BASE_SWA)) != slide:
        keys[f"{arch}.rope.freq_base_swa"] = slide

    def shown(value: Any) -> str:
        return f"{value:.7g}" if isinstance(value, float) else repr(value)  # a float32 key to its 7 digits

    out = []
    for key, value in keys.items():
        if key not in meta:
            out.append(f"{key} = {shown(value)} (the file: absent)")
        elif meta[key] != value:
            out.append(f"{key} = {shown(value)} (the file: {shown(meta[key])})")
    scaling = [f"{arch}.rope.scaling.{k}" for k in ("type", "factor", "original_context_length", "attn_factor")]
    for key in (*scaling, f"{arch}.rope.scale_linear"):
        if key in meta and key not in keys:
            out.append(f"remove {key} (the file: {shown(meta[key])})")
    written = want.tensors()
    for name in ROPE_TENSORS:
        if name in written and name not in tensors:
            out.append(f"write the tensor {name} ({len(written[name])} float32 divisors; the file has none)")
        elif name in tensors and name not in written:
            out.append(f"remove the tensor {name}")
        elif name in written and [_f32(x) for x in written[name]] != [_f32(x) for x in tensors[name]]:
            out.append(f"the tensor {name} holds other divisors than posenc measured")
    return out


def _same_rope(rope: GGUFRope, params: dict[str, Any], context: int, *, d: int, arch: str = "llama",
               sliding_base: float = GEMMA3_BASE_SWA) -> bool:
    """Whether posenc's record, translated again, gives exactly the keys and tensors the file holds (``rope``;
    ``sliding_base``: its Gemma 3 sliding layers' base)."""
    import numpy as np  # only here: `import posenc` needs torch alone

    try:
        again, slide = _record_rope(params, context, d=d, arch=arch)
    except (ValueError, KeyError, TypeError):
        return False
    if slide is not None and slide != _f32(sliding_base):
        return False
    return again.metadata() == rope.metadata() and all(
        np.array_equal(a, cast(Any, rope.tensors().get(name))) for name, a in again.tensors().items()  # None: False
    ) and again.tensors().keys() == rope.tensors().keys()


def agrees(meta: Mapping[str, Any], tensors: Mapping[str, Any], *, arch: str, path: str) -> bool:
    """Whether the file's llama.cpp RoPE keys and factor tensors still say what its ``posenc.rope`` record says (its
    Gemma 3 layer types included: the record's ``layer_types`` are llama.cpp's sliding pattern for the file); False
    without a record."""
    saved = recorded(meta)
    if saved is None or arch not in WRITES:
        return False
    try:
        rope = read_gguf(meta, tensors, arch=arch, path=path)
    except (ValueError, KeyError, TypeError):
        return False
    if not _same_rope(rope, saved[0], saved[1], d=rope.head_dim, arch=arch,
                      sliding_base=float(meta.get(f"{arch}.rope.freq_base_swa", GEMMA3_BASE_SWA))):
        return False
    if arch in LAYER_TYPES:
        types = recorded_layer_types(meta)
        n = int(meta.get(f"{arch}.block_count", -1))
        if types is None or len(types) != n:
            return False
        return [t == LAYER_TYPES[arch][1] for t in types] == sliding_layers(meta, arch, n)
    return True
