"""``NoPE``: no positional information at all -- a real baseline, not a placeholder.

Paper: Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length Generalization in Transformers"
(NeurIPS 2023, arXiv:2305.19466): a causal decoder without positional encoding recovers positions from the causal
mask and often extrapolates better than absolute encodings. Without a causal mask it is permutation invariant.

Shapes:
    every hook is the identity: ``embed`` returns x, ``rotate`` returns (q, k), ``bias`` and ``score_mod`` None.
"""

from __future__ import annotations

from posenc.encodings._base import Encoding
from posenc.registry import register


@register("nope")
class NoPE(Encoding):
    """No positional encoding: attention sees positions only through its mask (causal or document)."""
