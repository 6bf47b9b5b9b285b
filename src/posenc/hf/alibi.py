"""ALiBi configs in and out of Hugging Face: BLOOM and MPT.

Both build the paper's slopes ``2 ** (-8 (i + 1) / n)`` (with the paper's interleaving for head counts that are not
powers of two), which is what ``posenc.ALiBi`` builds; transformers' BLOOM and MPT add ``m_h * k`` (a per-row
constant away from ``-m_h (q - k)``), so under their causal mask the attention weights equal posenc's causal ALiBi.
MPT's config carries ``attn_config.alibi_bias_max`` (the 8 in the exponent); transformers' ``MptModel`` ignores it
and always uses 8, and ``ALiBiConfig`` has no such field, so any other value is refused rather than misread.
Reference: transformers ``modeling_bloom._get_alibi_slopes`` and ``modeling_mpt.build_mpt_alibi_tensor``.
"""

from __future__ import annotations

from typing import Any, cast

from posenc._checks import check_choice, fail
from posenc.encodings.alibi import ALiBiConfig
from posenc.hf._common import as_dict

#: model_type -> the config key holding the number of attention heads.
ALIBI_MODEL_TYPES = {"bloom": "n_head", "mpt": "n_heads"}
_PAPER_BIAS_MAX = 8


def alibi_config_from_hf(config: Any) -> ALiBiConfig:
    """The ``ALiBiConfig`` equal to the ALiBi transformers builds for a BLOOM or MPT ``config``.

    Args:
        config: a ``BloomConfig`` / ``MptConfig``, its ``config.json`` dict, or a model holding one.

    Raises:
        ValueError: for another ``model_type``, an MPT config with ``attn_config.alibi`` false, or an
            ``alibi_bias_max`` other than the paper's 8 (see the module docstring).
    """
    cfg = as_dict(config)
    kind = cfg.get("model_type")
    kind = check_choice("config.model_type", kind, list(ALIBI_MODEL_TYPES))
    key = ALIBI_MODEL_TYPES[kind]
    heads = cfg.get(key) or cfg.get("num_attention_heads")
    if not heads:
        fail(f"config.{key}", heads, "the number of attention heads (a positive integer)")
    if kind == "mpt":
        attn = cfg.get("attn_config") or {}
        if attn.get("alibi", True) is not True:
            fail("config.attn_config['alibi']", attn.get("alibi"), "True: an MPT config without ALiBi is not handled")
        bias_max = attn.get("alibi_bias_max", _PAPER_BIAS_MAX)
        if bias_max != _PAPER_BIAS_MAX:
            fail(
                "config.attn_config['alibi_bias_max']",
                bias_max,
                f"{_PAPER_BIAS_MAX}, the paper's slopes (transformers' MptModel ignores this key and uses 8; "
                "posenc's ALiBiConfig has no field for another value)",
            )
    return ALiBiConfig(num_heads=int(heads))


def alibi_config_to_hf(config: ALiBiConfig, *, model_type: str) -> dict[str, Any]:
    """The HF config keys for this ALiBi in a ``"bloom"`` or ``"mpt"`` config.

    Only the causal ALiBi without slope interpolation exists in those configs: for a longer context use
    ``posenc.hf.extend_context(model, "linear", factor)`` on the loaded model.
    """
    check_choice("model_type", model_type, list(ALIBI_MODEL_TYPES))
    if not isinstance(config, ALiBiConfig):
        fail("config", type(config).__name__, "a posenc ALiBiConfig")
    if config.symmetric:
        fail("symmetric", True, f"False: {model_type} uses the causal ALiBi")
    if config.eval_len is not None and config.eval_len > cast(int, config.train_len):  # set with eval_len
        fail(
            "eval_len",
            config.eval_len,
            f"None or <= train_len: {model_type} configs cannot hold interpolated slopes (use extend_context)",
        )
    if model_type == "bloom":
        return {"n_head": config.num_heads}
    return {"n_heads": config.num_heads, "attn_config": {"alibi": True, "alibi_bias_max": _PAPER_BIAS_MAX}}
