"""Simulated needle documents with known true rates, for the paired race's tests (``tests/lab/extend/stats/
test_paired.py``).

A document holds ``K`` keys; every model reads the same documents. Each key of model ``m`` in document ``t`` is found
when a latent ``sqrt(icc) a + sqrt(tau) c + sqrt(1 - icc - tau) e`` is below ``Phi^-1(rate_m)``: ``a`` the
document's effect (how hard it is), ``c`` the key's (its depth), ``e`` the model's own noise, all standard normal.
``a`` and ``c`` are shared between models in proportion ``shared`` (a document hard for one model is hard for the
others; ``shared = 0``: independent models), so models are paired; ``icc`` is the latent correlation of two keys of one
document (0: keys independent; 0.8: a document is found or lost almost whole). ``prob`` is the chance of finding the
key given the document and the key, ``Phi((Phi^-1(rate) - sqrt(icc) a - sqrt(tau) c) / sqrt(1 - icc - tau))``, and
``found`` is a draw of it: both have mean ``rate`` exactly, so the truth of either score is the rate (a probit-normal
law around it, where the issue suggested a Beta: the probit gives exact means and shares effects between models
simply). ``cells``: documents of different kinds (passkey, RULER tasks, lengths), each drawn with its weight, a
model's rate depending on the kind; the truth is the weighted mean.
"""

from __future__ import annotations

import torch


def documents(
    rates, *, races: int, docs: int, keys: int, icc: float, seed: int, shared: float = 0.7, key_share: float = 0.5,
    weights=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(found, prob, truth)``: found and prob (races, M, docs, keys) in float64 and the true rates (M,).

    ``rates``: (M,) or (M, C) per cell, with ``weights`` (C,) (default equal)."""
    rates = torch.as_tensor(rates, dtype=torch.float64)
    rates = rates[:, None] if rates.dim() == 1 else rates
    m, cells = rates.shape
    weights = torch.full((cells,), 1 / cells, dtype=torch.float64) if weights is None else torch.as_tensor(
        weights, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    kind = torch.multinomial(weights, races * docs, replacement=True, generator=g).reshape(races, 1, docs, 1)
    threshold = torch.special.ndtri(rates)[:, None, :].expand(m, docs, cells)  # (M, D, C)
    threshold = torch.gather(threshold.expand(races, m, docs, cells), -1, kind.expand(races, m, docs, 1))
    tau = key_share * (1 - icc)
    rest = 1 - icc - tau

    def effect(shape_own):  # noqa: ANN001, ANN202
        common = torch.randn(races, 1, *shape_own, generator=g, dtype=torch.float64)
        own = torch.randn(races, m, *shape_own, generator=g, dtype=torch.float64)
        return shared**0.5 * common + (1 - shared) ** 0.5 * own

    doc = effect((docs, 1))
    key = effect((docs, keys))
    shift = icc**0.5 * doc + tau**0.5 * key
    prob = torch.special.ndtr((threshold - shift) / rest**0.5)
    found = (torch.rand(prob.shape, generator=g, dtype=torch.float64) < prob).to(torch.float64)
    return found, prob, (rates * weights).sum(-1)
