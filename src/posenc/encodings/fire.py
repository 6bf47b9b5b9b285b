"""``FIRE``: a small MLP of the log-scaled, position-normalised query-key distance, added to the attention scores.

Paper: Li et al. 2024, "Functional Interpolation for Relative Positions Improves Long Context Transformers"
(ICLR 2024, arXiv:2310.04418): ``b(i, j) = f_theta(psi(i - j) / psi(max(L, i)))``, ``psi(x) = log(|c x| + 1)``,
``f_theta`` a ReLU MLP ``1 -> 32 -> H``, ``c`` and ``L`` learned. Parametrisation, initial values and names follow
the paper's PyTorch listing (appendix); checked against the equations written out in ``tests/reference/fire.py``.
See ``posenc.functional.fire`` for the numerics.

Not translation invariant: the bias depends on the query's position once it passes the threshold ``L``, which
is the point (distances are interpolated into ``[0, 1]``). Positions are therefore the tokens' absolute positions
(or per-document positions for packed sequences), exactly as the other encodings take them.

Shapes:
    positions (S,) or (B|1, S), integer or float; bias (B|1, H, S, T) float32;
    score_mod(score, b, h, q_idx, kv_idx) -> score + bias[b, h, q_idx, kv_idx].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from posenc._checks import check_number, check_positive_int
from posenc._config import DictConfig
from posenc.encodings._base import ConfiguredModule, ScoreMod, position_reader
from posenc.functional.alibi import check_alibi_positions
from posenc.functional.fire import fire_bias, fire_mlp, fire_normalized_distance, fire_threshold, threshold_of
from posenc.registry import register


@dataclass(frozen=True, kw_only=True, slots=True)
class FIREConfig(DictConfig):
    """Everything that defines a FIRE: validated on construction, round-trips through ``to_dict``/``from_dict``.

    ``init_L`` is the fixed part of the threshold ``L = |L_multiplier * init_L|`` (the listing's ``init_L``);
    ``init_c`` the initial ``c``; ``eps`` keeps the normaliser away from 0.
    """

    num_heads: int
    mlp_width: int = 32
    init_c: float = 0.1
    init_L: float = 512.0  # the paper's threshold L
    eps: float = 1e-6

    def __post_init__(self) -> None:
        check_positive_int("num_heads", self.num_heads)
        check_positive_int("mlp_width", self.mlp_width)
        check_number("init_c", self.init_c, above=0.0)
        check_number("init_L", self.init_L, above=0.0)
        check_number("eps", self.eps, above=0.0)


@register("fire")
class FIRE(ConfiguredModule):
    """FIRE: head ``h`` adds ``f_theta(log(|c (q - k)| + 1) / (log(|c max(L, q)| + 1) + eps))[h]``.

    Args:
        num_heads: query heads ``H``, the MLP's outputs.
        mlp_width: hidden units of the MLP (32 in the paper).
        init_c: initial ``c`` of ``psi(x) = log(|c x| + 1)`` (0.1 in the listing).
        init_L: fixed part of the threshold ``L = |L_multiplier * init_L|`` (512 in the listing); queries at
            positions up to ``L`` see a bias of the distance alone, later ones an interpolated one.
        eps: added to the normaliser ``psi(max(L, q))`` (1e-6 in the listing).

    Parameters, named as in the listing (its state dict loads once its fixed ``init_L`` entry is dropped): ``c``
    and ``L_multiplier`` (scalars, init ``init_c`` and 1), ``mlp`` = ``Sequential(Linear(1, W), ReLU(),
    Linear(W, H))`` with ``nn.Linear``'s default initialisation. Made for causal attention; keys after the query
    get the bias of ``|q - k|``.

    Shapes:
        q_pos (S,) or (B|1, S), k_pos (T,) or (B|1, T) -> bias (B|1, H, S, T) float32.
    """

    has_bias = True
    config_class = FIREConfig

    def __init__(
        self,
        num_heads: int,
        *,
        mlp_width: int = 32,
        init_c: float = 0.1,
        init_L: float = 512.0,  # the paper's threshold L
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.config = FIREConfig(num_heads=num_heads, mlp_width=mlp_width, init_c=init_c, init_L=init_L, eps=eps)
        self.mlp = nn.Sequential(nn.Linear(1, mlp_width), nn.ReLU(), nn.Linear(mlp_width, num_heads))
        self.c = nn.Parameter(torch.full((), float(init_c)))
        self.L_multiplier = nn.Parameter(torch.ones(()))
        self._init_constants(self.c.device)

    _eps: torch.Tensor
    _init_L: torch.Tensor

    def _init_constants(self, device: torch.device) -> None:
        """``eps`` and ``init_L`` as float32 0-d buffers (not saved) for the score_mod to capture: never a Python
        float there (torch 2.15's compiled FlexAttention traces a captured float as a SymFloat, which it refuses
        among a score_mod's captured values), and never a tensor made in the caller's graph (CPU inductor cannot
        lower those)."""
        f32: dict[str, Any] = {"dtype": torch.float32, "device": device}
        self.register_buffer("_eps", torch.tensor(self.config.eps, **f32), persistent=False)
        self.register_buffer("_init_L", torch.tensor(self.config.init_L, **f32), persistent=False)

    def _apply(self, fn, recurse=True):  # noqa: ANN001 - nn.Module's hook for .to/.cuda/.half/to_empty
        super()._apply(fn, recurse)
        self._init_constants(self._eps.device)  # float32 whatever the module's dtype; rebuilt after to_empty
        return self

    def threshold(self) -> torch.Tensor:
        """The threshold ``L = |L_multiplier * init_L|`` in use, a float32 scalar (differentiable)."""
        return fire_threshold(self.L_multiplier, init_L=self.config.init_L)

    def _parameters32(self) -> tuple[torch.Tensor, ...]:
        """``c, L, w1 (W,), b1 (W,), w2 (H, W), b2 (H,)`` in float32 (a bf16 model keeps float32 math)."""
        first, second = cast(nn.Linear, self.mlp[0]), cast(nn.Linear, self.mlp[2])
        return (
            self.c.float(),
            self.threshold(),
            first.weight[:, 0].float(),
            first.bias.float(),
            second.weight.float(),
            second.bias.float(),
        )

    def bias(
        self, q_pos: torch.Tensor, k_pos: torch.Tensor, *, q: torch.Tensor | None = None, scale: float | None = None
    ) -> torch.Tensor:
        """The materialised bias ``(B|1, H, S, T)`` float32; ``q`` (if given) must have ``num_heads`` heads,
        ``scale`` is unused."""
        self.check_heads(q)
        return fire_bias(q_pos, k_pos, *self._parameters32(), eps=self.config.eps)

    def score_mod(
        self, q_pos: torch.Tensor, k_pos: torch.Tensor, *, q: torch.Tensor | None = None, scale: float | None = None
    ) -> ScoreMod:
        """FlexAttention ``score_mod`` adding ``bias(q_pos, k_pos)[b, h, q_idx, kv_idx]`` (bit for bit eagerly);
        captures the MLP's weights (``O(H W)``) and the positions, evaluating the MLP per score."""
        self.check_heads(q)
        check_alibi_positions(q_pos, k_pos)
        eps, init_l = self._eps.to(q_pos.device), self._init_L.to(q_pos.device)  # tensors: see _init_constants
        # The parameters themselves, cast and combined per score inside the closure: under torch.compile a
        # score_mod that captures a tensor computed in the same graph fails to lower on CPU (torch 2.13), one that
        # captures a parameter works.
        first, second = cast(nn.Linear, self.mlp[0]), cast(nn.Linear, self.mlp[2])
        c, multiplier, w1, b1, w2, b2 = (
            p.to(q_pos.device)
            for p in (self.c, self.L_multiplier, first.weight, first.bias, second.weight, second.bias)
        )
        q_at, k_at = position_reader(q_pos), position_reader(k_pos)

        def fire_mod(score, b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202 - FlexAttention's signature
            threshold = threshold_of(multiplier, init_l)
            x = fire_normalized_distance(q_at(b, q_idx), k_at(b, kv_idx), c.float(), threshold, eps=eps)
            return score + fire_mlp(x, w1[:, 0].float(), b1.float(), w2[h].float(), b2[h].float()).to(score.dtype)

        return fire_mod

    def forward(self, positions: torch.Tensor, k_positions: torch.Tensor | None = None) -> torch.Tensor:
        """The bias ``(B|1, H, S, T)``; keys use ``k_positions`` if given, else ``positions``."""
        return self.bias(positions, positions if k_positions is None else k_positions)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.config.to_dict().items())
