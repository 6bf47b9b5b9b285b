"""A lab ``GPT``'s positions patched for a longer context: the Hugging Face ``rope_scaling`` dict of each method,
and a RoPE or ALiBi like the model's own with it.

Shared by ``posenc lab`` (the RoPE scalings it runs zero-shot past the training length, ``ROPE_SCALINGS``) and
``posenc extend`` (a lab model patched once for ``factor`` times its context, ``scaled_encoding``); the demo
command prints the same dicts.
"""

from __future__ import annotations

import posenc
from posenc._checks import check_choice, check_number, check_positive_int, fail
from posenc.extension_methods import rope_scaling_config

#: RoPE context-extension methods applied zero-shot at an evaluation length ``L'`` past the training length ``L``,
#: with factor ``L' / L`` (Chen et al. 2023 PI; bloc97 NTK-aware; emozilla dynamic NTK; Peng et al. 2023 YaRN).
ROPE_SCALINGS = ("linear", "ntk", "dynamic", "yarn")

#: ``posenc extend``'s methods for a lab model, by its encoding: the RoPE scalings (plus Llama 3.1's, whose defaults
#: ``posenc.extension_methods.LLAMA3_DEFAULTS`` need nothing searched; LongRoPE's per-frequency factors do, so it is not
#: offered here), and for ALiBi ``linear``: slope interpolation (Al-Khateeb et al. 2023), which is Position
#: Interpolation for ALiBi (positions divided by the factor = slopes divided by it); ``posenc.hf.extend_context``
#: uses the same name.
EXTEND_METHODS = {"rope": (*ROPE_SCALINGS, "llama3"), "alibi": ("linear",)}


def scaled_encoding(model, method: str, *, factor: float, original_len: int) -> posenc.Encoding:  # noqa: ANN001
    """A new encoding for ``model`` (a lab ``GPT``) extending its context ``factor`` times past ``original_len``.

    Unlike ``posenc lab``'s ``extended_encoding`` (factor = evaluation length / training length, rebuilt per
    length), the factor is fixed, as when a deployed model is patched once for a target context
    ``factor * original_len`` and then run at every length. ``model`` is not modified; swap the result in with
    ``model.set_encoding`` (for a per-layer ``"BASE/OTHER:N"`` model, the result is BASE's, as in
    ``extended_encoding``).

    Raises:
            ValueError: an encoding without positional parameters we extend, a method it does not offer, a factor < 1.
    """
    encoding = model.config.base_encoding
    if encoding not in EXTEND_METHODS:
        fail(
            "encoding",
            encoding,
            f"one with positional parameters posenc extend knows how to scale: {sorted(EXTEND_METHODS)}",
        )
    check_choice("method", method, EXTEND_METHODS[encoding])
    check_number("factor", factor, minimum=1.0)
    check_positive_int("original_len", original_len)
    if encoding == "alibi":
        eval_len = max(original_len, round(original_len * factor))  # slopes times original_len / eval_len
        return alibi_like(model, train_len=original_len, eval_len=eval_len)
    return rope_like(model, rope_scaling(method, factor=factor, original_len=original_len))


def rope_scaling(method: str, *, factor: float, original_len: int) -> dict:
    """The Hugging Face ``rope_scaling`` dict of ``method`` at ``factor`` for a model trained at ``original_len``
    (``posenc.extension_methods``)."""
    return rope_scaling_config(method, factor=factor, original=original_len)


def rope_like(model, scaling: dict) -> posenc.RotaryEmbedding:  # noqa: ANN001
    """A RoPE like ``model``'s own (head dim, base, layout, partial rotary), with ``scaling``, on its device."""
    c = model.encoding.config
    return posenc.RotaryEmbedding(
        c.head_dim, base=c.base, scaling=scaling, layout=c.layout, partial_rotary_factor=c.partial_rotary_factor
    ).to(model.encoding.inv_freq.device)


def alibi_like(model, *, train_len: int, eval_len: int) -> posenc.ALiBi:  # noqa: ANN001
    """``model``'s ALiBi with its slopes interpolated from ``train_len`` to ``eval_len``, on its device."""
    c = model.encoding.config
    return posenc.ALiBi(c.num_heads, symmetric=c.symmetric, train_len=train_len, eval_len=eval_len).to(
        model.encoding.slopes.device
    )
