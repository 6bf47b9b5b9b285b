"""Granite-SWA's rotary modules: one per distinct non-zero RoPE base, each built from a copy of the model's config.

transformers' ``GraniteSWAModel`` (and ``GraniteMoeSWAModel``) builds, for every distinct non-zero entry of
``config.layer_rope_theta``, a rotary module from ``deepcopy(config)`` whose ``rope_parameters`` carry that base, and
looks each layer's cos/sin up by ``rotary_emb.config.rope_parameters["rope_theta"]``; layers whose base is 0 get no
position embeddings (NoPE). The parent's ``rotary_emb``, at the global base, stays in the model unused.

``extend_context`` rebuilds each such module the same way from the updated config, so the patched model is the one
transformers builds from that config (and what ``save_pretrained`` writes reloads as it): the scaling reaches every
RoPE layer at its own base, and NoPE layers stay without RoPE.

Reference: transformers 5.24 ``models/granite_swa/modular_granite_swa.py`` (``GraniteSWAModel.__init__`` and
``forward``) and ``models/granitemoe_swa/modular_granitemoe_swa.py``; checked in ``tests/hf/test_granite_swa.py``.
"""

from __future__ import annotations

import copy
from typing import Any

from posenc.hf._common import model_type
from posenc.hf.layers import LAYER_THETA_MODEL_TYPES


def theta_config(config: Any, theta: float) -> Any:
    """The config transformers builds a rotary module of base ``theta`` from: a deep copy with that
    ``rope_parameters["rope_theta"]``."""
    out = copy.deepcopy(config)
    out.rope_parameters = {**config.rope_parameters, "rope_theta": theta}
    return out


def module_theta(config: Any, module: Any) -> float | None:
    """The base of a rotary ``module`` that transformers built from a per-layer-base copy of ``config`` (a Granite-SWA
    ``rotary_embs`` entry, before ``config`` changes); None for any other module."""
    own = getattr(module, "config", None)
    if own is None or own is config or model_type(config) not in LAYER_THETA_MODEL_TYPES:
        return None
    params = getattr(own, "rope_parameters", None)
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    thetas = getattr(config, "layer_rope_theta", None) or ()
    if not theta or theta not in thetas or params != {**config.rope_parameters, "rope_theta": theta}:
        return None
    return theta
