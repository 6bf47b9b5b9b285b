"""Base for modules whose ``inv_freq`` buffer is a pure function of their config."""

from __future__ import annotations

import torch
from torch import nn


class FrequencyModule(nn.Module):
    """Keeps ``inv_freq`` float32 and exact through ``.to(dtype)``, ``.half()``, device moves and ``to_empty()``.

    ``model.to(torch.bfloat16)`` would otherwise round the frequencies to bf16 and rotate long positions by wrong
    angles; ``to_empty()`` after a meta-device build would leave them uninitialised. Instead of casting, the buffer
    is rebuilt from the config on the new device.
    """

    inv_freq: torch.Tensor

    def build_inv_freq(self) -> torch.Tensor:
        """The float32 frequencies for this module's config (on CPU)."""
        raise NotImplementedError

    def _apply(self, fn, recurse=True):  # noqa: ANN001, D401 - nn.Module's hook for .to/.cuda/.half/to_empty
        super()._apply(fn, recurse)
        self.inv_freq = self.build_inv_freq().to(self.inv_freq.device)
        return self
