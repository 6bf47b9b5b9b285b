"""Training positions for context extension in a short window: PoSE and randomized positional encodings.

A model extended to a target context ``T`` normally has to be fine-tuned on ``T``-token sequences. These samplers
let it train on ``W``-token windows (``W < T``) whose position ids are spread over ``[0, T)``, so that over the steps
it sees every relative distance up to ``T - 1`` at the cost of ``W``-token forwards.

PoSE, Positional Skip-wisE training (Zhu et al., ICLR 2024, arXiv:2309.10400; reference ``dwzhu-pku/PoSE``,
``train_preprocess_function_pose``): two chunks, the second's positions skipping ahead (its draws: ``PoseDraws``).
Randomized positional encodings (Ruoss et al., ACL 2023, arXiv:2305.16843): a sorted uniform subset of ``[0, T)``
(``randomized_positions``). Both are pure functions of their sizes and a ``torch.Generator``: the same generator
state gives the same sample. ``pose_layout`` is the deterministic part of PoSE (the layout for given draws), which
the tests compare with the reference's slicing written out.

Shapes:
    PoseSample.text_index, PoseSample.positions    (L,) int64, L = min(document_length, window)
    randomized_positions                           (length,) int64
"""

from __future__ import annotations

from typing import NamedTuple, cast

import torch

from posenc._checks import check_positive_int, fail


class PoseSample(NamedTuple):
    """One PoSE training window: which tokens of the document (``text_index``), at which positions."""

    text_index: torch.Tensor  # (L,) int64, indices into the document
    positions: torch.Tensor  # (L,) int64, position ids in [0, target)


class PoseDraws(NamedTuple):
    """The three random draws of one PoSE sample (their ranges below).

    The window is cut into two chunks; the second chunk's positions skip ahead by ``skip``, and its text is read from
    farther in the document. With ``L = min(N, W)`` for a document of ``N`` tokens, the reference draws (``randint``
    bounds inclusive)

        first_length ~ U{1, ..., (L + 1) // 2}  the first chunk: text [0, first_length), positions 0, 1, ...
        text_end     ~ U{L, ..., N}             the second chunk's text: [text_end - (L - first_length), text_end)
        skip         ~ U{0, ..., T - L}         its positions: first_length + skip, ..., L - 1 + skip

    so positions are strictly increasing and contiguous within each chunk, the largest is ``L - 1 + skip <= T - 1``,
    and the distance ``T - 1`` is reached (``skip = T - L``). The first chunk starts at position 0 (the reference's
    revision ``lt = 0``: "makes the coverage possibility more uniform for large relative positions"). Two chunks, as
    the reference trains.
    """

    first_length: int
    text_end: int
    skip: int


def _check_sizes(document_length: int, window: int, target: int) -> int:
    """``L = min(document_length, window)``, after checking the sizes; ``target`` must hold ``L`` positions."""
    check_positive_int("document_length", document_length)
    check_positive_int("window", window)
    check_positive_int("target", target)
    length = min(document_length, window)
    if target < length:
        fail("target", target, f"a target context of at least the window's {length} tokens (window={window})")
    return length


def pose_draw_ranges(*, document_length: int, window: int, target: int) -> PoseDraws:
    """The inclusive ``(low, high)`` range of each draw, as a ``PoseDraws`` of pairs."""
    length = _check_sizes(document_length, window, target)
    return PoseDraws(
        first_length=(1, (length + 1) // 2),  # type: ignore[arg-type]
        text_end=(length, document_length),  # type: ignore[arg-type]
        skip=(0, target - length),  # type: ignore[arg-type]
    )


def _pairs(ranges: PoseDraws) -> tuple[tuple[int, int], ...]:
    """``pose_draw_ranges``' result as what it holds: a ``(low, high)`` pair per draw."""
    return cast("tuple[tuple[int, int], ...]", ranges)


def pose_layout(*, document_length: int, window: int, target: int, draws: PoseDraws) -> PoseSample:
    """The PoSE window for given draws: text indices and position ids of the two chunks, concatenated.

    Raises ``ValueError`` for a draw outside its range (``pose_draw_ranges``)."""
    ranges = _pairs(pose_draw_ranges(document_length=document_length, window=window, target=target))
    for name, value, (low, high) in zip(PoseDraws._fields, draws, ranges, strict=True):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            fail(f"draws.{name}", value, f"an integer in [{low}, {high}]")
    length = min(document_length, window)
    first, end, skip = draws
    second = length - first  # the second chunk's length (0 when the window holds a single token)
    text_index = torch.cat([torch.arange(first), torch.arange(end - second, end)])  # (L,)
    positions = torch.arange(length)  # (L,)
    positions[first:] += skip
    return PoseSample(text_index, positions)


def _randint(low: int, high: int, generator: torch.Generator) -> int:
    """One integer uniform in ``[low, high]`` (inclusive, as Python's ``random.randint``)."""
    return int(torch.randint(low, high + 1, (), generator=generator))


def _check_generator(generator: object) -> None:
    if not isinstance(generator, torch.Generator):
        fail("generator", generator, "a torch.Generator, e.g. torch.Generator().manual_seed(0)")


def pose_sample(*, document_length: int, window: int, target: int, generator: torch.Generator) -> PoseSample:
    """Draw one PoSE window for a document of ``document_length`` tokens, trained in ``window`` tokens for a
    ``target`` context (Zhu et al. 2024; the draws: ``PoseDraws``).

    Args:
        document_length: tokens available in the document (``N``); the text is read from ``[0, N)``.
        window: the training window ``W``; the sample has ``min(N, W)`` tokens.
        target: the context to extend to, ``T >= min(N, W)``; positions lie in ``[0, T)``.
        generator: the source of the three draws (first chunk length, text end, position skip).

    Returns:
        ``PoseSample(text_index, positions)``: for a token stream ``doc``, train on ``doc[text_index]`` at
        ``positions``; the next-token target of ``doc[i]`` is ``doc[i + 1]``.

    Shapes:
        text_index, positions (min(N, W),) int64.
    """
    ranges = _pairs(pose_draw_ranges(document_length=document_length, window=window, target=target))
    _check_generator(generator)
    draws = PoseDraws(*(_randint(low, high, generator) for low, high in ranges))
    return pose_layout(document_length=document_length, window=window, target=target, draws=draws)


def randomized_positions(*, length: int, target: int, generator: torch.Generator) -> torch.Tensor:
    """``length`` distinct positions drawn uniformly from ``[0, target)``, sorted (Ruoss et al. 2023).

    The ``length`` positions of a contiguous window, as the PoSE reference's ``train_preprocess_function_randomized``
    draws them: ``sorted(random.sample(range(T), W))``.

    Shapes:
        -> (length,) int64, strictly increasing, in [0, target).
    """
    check_positive_int("length", length)
    check_positive_int("target", target)
    if target < length:
        fail("target", target, f"at least length={length} positions to draw {length} distinct ones from")
    _check_generator(generator)
    return torch.randperm(target, generator=generator)[:length].sort().values  # (length,)
