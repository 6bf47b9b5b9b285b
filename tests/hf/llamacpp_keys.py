"""llama.cpp's RoPE from a GGUF's keys (``tests/reference/llamacpp_rope.py``) against a transformers model's own rotary
module: shared by the tests of the keys (``tests/gguf/test_rope.py``) and of written files
(``tests/hf/test_gguf_export.py``)."""

from __future__ import annotations

import math

import numpy as np
import torch

from reference.llamacpp_rope import llamacpp_angles
from tolerances import ulps


def hf_frequencies(model, n: int) -> tuple[np.ndarray, float]:
    """The extended model's own rotary module after a forward over ``n`` positions (LongRoPE picks its factors by
    the sequence length there): its inverse frequencies and cos/sin scale."""
    rotary = model.model.rotary_emb
    x = torch.zeros(1, n, 1)
    rotary(x, torch.arange(n)[None])
    return rotary.inv_freq.double().numpy(), float(rotary.attention_scaling)


def assert_llamacpp_runs(model, meta: dict, tensors: dict) -> None:
    """llama.cpp's frequencies and scale from these keys (the reference) equal the model's rotary module's, at its
    full context and, for LongRoPE, within the original one (where both switch to the short factors)."""
    context = meta["llama.context_length"]
    params = model.config.rope_parameters
    contexts = [context]
    if params.get("rope_type") == "longrope":
        contexts.append(params["original_max_position_embeddings"])
    for n in contexts:
        angles, mscale = llamacpp_angles(meta, tensors, [1], n_ctx=n)
        inv_freq, scale = hf_frequencies(model, n)
        # float32 on both sides: transformers' float32 inv_freq (a pow and a few ops), the float32 keys and divisors
        torch.testing.assert_close(torch.tensor(angles[0], dtype=torch.float64), torch.from_numpy(inv_freq), **ulps(16))
        assert math.isclose(mscale, scale, rel_tol=4 * torch.finfo(torch.float32).eps), (n, mscale, scale)
