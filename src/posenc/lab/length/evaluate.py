"""What ``posenc lab`` runs past the training length: each encoding as trained (``none``) and each way of extending
it without retraining (RoPE scalings, a learned table or ALiBi's slopes interpolated), applied zero-shot at each
evaluation length ``L'`` with factor ``L' / L``.

The scoring itself (perplexity, task accuracy) is the lab's shared one, ``posenc.lab.common.evaluate``; the encodings
are built by ``posenc.lab.common.scaling``.
"""

from __future__ import annotations

import posenc
from posenc.lab.common.gpt import split_encoding, split_local
from posenc.lab.common.scaling import ROPE_SCALINGS, alibi_like, rope_like, rope_scaling

#: Ways to run an encoding past its training length that are not RoPE scalings: learned tables interpolated to the
#: new length (as ViT fine-tuning does for grids), ALiBi slopes interpolated (Al-Khateeb et al. 2023).
OTHER_EXTENSIONS = {"learned": ("interpolate",), "alibi": ("interpolate",)}


def extension_names(encoding: str) -> tuple[str, ...]:
    """The extensions ``posenc lab`` evaluates for ``encoding``, after ``"none"`` (the model as trained).

    For a per-layer ``"BASE/OTHER:N"``, BASE's: they act on BASE's layers (``rope/nope:4``: RoPE scalings of the
    RoPE layers, the NoPE layers unchanged).
    """
    encoding = split_encoding(split_local(encoding)[0])[0]
    if encoding == "rope":
        return ("none", *ROPE_SCALINGS)
    return ("none", *OTHER_EXTENSIONS.get(encoding, ()))


def extended_encoding(model, extension: str, *, train_len: int, eval_len: int) -> posenc.Encoding | None:  # noqa: ANN001
    """The encoding to swap into ``model`` to run ``extension`` at ``eval_len``; None keeps the trained one.

    ``model`` is a ``posenc.lab.common.gpt.GPT``; its own encoding is never modified. For a per-layer model the result
    replaces BASE's encoding (``GPT.set_encoding``), in every BASE layer.
    """
    encoding = model.config.base_encoding
    if extension == "none" or eval_len <= train_len:
        return None
    factor = eval_len / train_len
    if encoding == "rope":
        # dynamic NTK derives its factor from each call's length, so it is built unscaled (factor 1)
        return rope_like(model, rope_scaling(extension, factor=1.0 if extension == "dynamic" else factor,
                                             original_len=train_len))
    if encoding == "alibi" and extension == "interpolate":
        return alibi_like(model, train_len=train_len, eval_len=eval_len)
    if encoding == "learned" and extension == "interpolate":
        return model.encoding.resized(eval_len)
    raise ValueError(f"extension={extension!r} is invalid: expected one of {extension_names(encoding)}")
