"""STRING (An et al. 2025, "Why Does the Effective Context Length of LLMs Fall Short?", ICLR 2025,
arXiv:2410.18745).

Large relative distances are rarely trained, so STRING replaces them with well-trained ones, *inside* the training
length ``L``: pairs closer than the ``shifted_offset`` ``S`` keep their positions; a farther pair's distance
``d = i - j >= S`` is shifted down to ``d - S + W`` (the query rotated at ``i - S + W``, the key at ``j``), ``W`` the
``local_window``. Both branches' queries and keys are multiplied by ``mscale = 0.1 ln 2 + 1``. Unlike Self-Extend
and ReRoPE, which *compress* the far distances, STRING *shifts* them by a constant (every far distance distinct and
in order); past ``L`` it reaches ``L + S - W`` tokens, at most ``2L - W``. Details, where posenc differs from the
reference, and why it is not saved: ``String``.

Reference implementation: ``HKUNLP/STRING`` (read in its copy ``justHungryMan/STRING`` at commit ``9594e5b``):
``string_for_llama.py``, ``string_for_qwen2.py`` and the vLLM fork ``vllm_string`` (``ShiftedRotaryEmbedding``).
Checked in ``tests/reference/remapping.py`` (``string``) against the decoding path, pair by pair.

Shapes:
    position maps (..., N) -> (..., N) integer; regions i (..., S, 1), j (..., 1, T) -> bool (..., S, T);
    query_scale i (..., S) -> float64 (..., S).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from posenc._checks import check_number, check_positive_int, fail
from posenc.remapping._branch import Branch, KeyInterval, RemapMethod, identity

#: The reference's ``attention_factor``: YaRN's ``0.1 ln(s) + 1`` at ``s = 2``, on the cos/sin tables.
STRING_MSCALE = 0.1 * math.log(2) + 1
#: The reference's ``small_local_value`` (README: 128, 256 or 512).
LOCAL_WINDOW = 128
#: The reference's ``shifted_ratio`` (``shifted_offset = int(0.33 * length)``; the README suggests 0.25 to 0.4).
SHIFTED_RATIO = 0.33


@dataclass(frozen=True, kw_only=True, slots=True)
class String(RemapMethod):
    """STRING with ``shifted_offset`` (``S``), ``local_window`` (``W < S``) and ``mscale`` on queries and keys.

    Pretraining trains a distance less often the closer it is to the training length ``L``, so STRING overwrites the
    least-trained last ``S - W`` distances: the far pairs reuse the distances ``W, W + 1, ...``, and the nearest
    ``W`` stay with the diagonal band alone. It is meant to run at (and within) the training length, where nothing
    needs compressing; a needle's tokens keep consecutive positions. ``mscale`` scales the logits by ``mscale**2``,
    as the reference's cos/sin tables do ("STRING will make the attention map smooth, we use the attention_factor
    to recover it, similar with Yarn"); ``mscale=1`` leaves it out.

    The reference, ``string_for_llama.py`` (``replace_with_string(max_test_length, shifted_offset,
    small_local_value=128)``): the diagonal ``flash_attn_func(..., window_size=[diag_size, 0])`` with queries at
    their positions, the shifted triangle ``q[-(T - S):]`` against ``k[:T - S]`` with queries at ``position_ids -
    diag_size + local_window``, merged by their log-sum-exps; the flash-decoding path splits the cache into its last
    ``S`` keys and the rest; ``attention_factor = 0.1 * log(2) + 1`` on the cos/sin tables. ``string_for_qwen2.py``:
    the same attention, with Qwen2's YaRN. The vLLM fork ``vllm_string``: ``query_shifted`` at ``positions -
    shifted_offset + local_value``, ``mscale = 0.1 * log(2) + 1`` on q and k.

    Where posenc differs from the reference: its prefill flash call's window ``[diag_size, 0]`` includes the key at
    distance exactly ``S`` (flash-attention windows are inclusive) and the shifted call scores that key too, so in a
    prefill that one key per query is counted twice (once at distance ``S``, once at ``W``); its decoding path, the
    paper's definition (``i - j >= S`` shifted) and posenc count it once, shifted, so decoding equals the full
    forward. The vLLM fork's paged decoding rounds the shifted part down to a multiple of the block size (the
    diagonal then holds up to ``block_size - 1`` more keys); posenc does not.

    Saving: no serving format records STRING. The ``string_config`` block (``shifted_offset``, ``local_value``) the
    authors document is read only by their vLLM fork (``vllm_string``, vLLM 0.5.0); vLLM's own ``LlamaAttention``
    passes no such key to its rotary embedding or attention, so ``posenc.hf.save_pretrained`` refuses STRING rather
    than write a key that serving engines ignore.
    """

    shifted_offset: int
    local_window: int = LOCAL_WINDOW
    mscale: float = STRING_MSCALE
    name = "string"

    def __post_init__(self) -> None:
        check_positive_int("shifted_offset", self.shifted_offset)
        check_positive_int("local_window", self.local_window)
        if self.local_window >= self.shifted_offset:
            fail(
                "local_window",
                self.local_window,
                f"less than shifted_offset = {self.shifted_offset} (the shift S - W moves far distances down)",
            )
        object.__setattr__(self, "mscale", check_number("mscale", self.mscale, above=0.0))

    @staticmethod
    def default_local_window(original: int) -> int:
        """The reference's 128, at most ``original // 8`` so that it stays well below the offset on short models."""
        return max(1, min(LOCAL_WINDOW, original // 8))

    @classmethod
    def longest_target(cls, original: int, local_window: int | None = None) -> int:
        """The longest sequence any offset keeps below ``original`` (``S = L``): ``2L - W``."""
        w = cls.default_local_window(original) if local_window is None else local_window
        return 2 * original - w

    @classmethod
    def for_target(
        cls,
        original: int,
        target: int,
        *,
        shifted_offset: int | None = None,
        local_window: int | None = None,
        mscale: float | None = None,
    ) -> String:
        """The reference's rule: ``S = int(0.33 * target)`` (its scripts: ``shifted_ratio`` times the test length;
        its README: ``0.33 * max_position_embeddings``, the same at the training length), raised to ``target - L +
        W`` where a target past ``L`` needs it to keep every distance below ``L``; ``W = 128`` (at most ``L // 8``);
        ``mscale`` the reference's. Works at, within and past the training length, up to ``2L - W``."""
        w = cls.default_local_window(original) if local_window is None else local_window
        check_positive_int("local_window", w)
        if shifted_offset is None:
            shifted_offset = max(int(SHIFTED_RATIO * target), target - original + w)
            if shifted_offset > original:
                fail(
                    "target",
                    target,
                    f"at most {2 * original - w} tokens for STRING from a pretraining length of {original}: the "
                    f"offset S would have to exceed {original} (S <= L keeps the diagonal band inside the training "
                    f"length, and with local_window {w} the far distances reach L + S - W)",
                )
        method = cls(shifted_offset=shifted_offset, local_window=w, mscale=STRING_MSCALE if mscale is None else mscale)
        method.check_target(original, target)
        return method

    def reach(self, original: int) -> float:
        if self.shifted_offset > original:
            return 0
        return original + self.shifted_offset - self.local_window

    def limiting_parameter(self) -> tuple[str, object]:
        return "shifted_offset", self.shifted_offset

    def branches(self) -> tuple[Branch, ...]:
        s, w = self.shifted_offset, self.local_window
        scale = None if self.mscale == 1.0 else _constant(self.mscale**2)
        return (
            Branch(  # j > i - s
                name="diagonal",
                query=identity,
                key=identity,
                region=KeyInterval(first=lambda i: i - s + 1),
                query_scale=scale,
            ),
            Branch(
                # Only queries i >= S score this branch (at i - S + W >= W); the clamp keeps the others' unused
                # rotations at valid positions.
                name="shifted",
                query=lambda i: torch.clamp(i - s + w, min=0),
                key=identity,
                region=KeyInterval(end=lambda i: i - s + 1),  # j <= i - s
                query_scale=scale,
            ),
        )


def _constant(value: float):  # noqa: ANN202
    return lambda i: torch.full(i.shape, value, dtype=torch.float64, device=i.device)
