"""Byte-level text corpora for the lab: loading, random training windows, and evaluation windows.

The default corpus is the Python standard library's own source (``*.py`` under ``sysconfig``'s ``stdlib`` path),
so a study runs offline on any machine. Every byte is a token (vocab 256).

Sliding-window evaluation follows Press et al. 2022, "Train Short, Test Long" (ALiBi), sec. 4 / appendix B:
https://arxiv.org/abs/2108.12409
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from posenc._checks import check_positive_int, fail

#: Byte put between two files of a corpus (never inside one: files holding it are skipped as binary).
SEPARATOR = b"\0"

#: Folders never descended into: installed packages (stdlib) and caches / hidden folders (user folders).
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})

_HINT = "pass --corpus PATH to a UTF-8 text file or folder, or omit it for the Python standard library"


@dataclass(frozen=True, eq=False)
class Corpus:
    """A text corpus split into training and validation bytes.

    Attributes:
        name: ``"stdlib"`` for the default corpus, else the file or folder name.
        train: training bytes, files joined with :data:`SEPARATOR`.
        val: validation bytes, files joined with :data:`SEPARATOR`.
        n_train_files: files that contributed to ``train`` (at least partly).
        n_val_files: files that contributed to ``val`` (at least partly).

    Shapes:
        train (N_train,) uint8, val (N_val,) uint8.
    """

    name: str
    train: torch.Tensor
    val: torch.Tensor
    n_train_files: int
    n_val_files: int


def stdlib_files() -> list[Path]:
    """Every ``*.py`` file of the Python standard library, in a fixed order.

    Installed packages (``site-packages``, ``dist-packages``) and everything under them are skipped. The order is
    the path relative to the stdlib root (as a POSIX string), so it is the same on every machine.
    """
    return _walk(Path(sysconfig.get_paths()["stdlib"]), suffix=".py", skip_hidden=False)


def load_corpus(
    path: str | os.PathLike[str] | None = None,
    *,
    val_fraction: float = 0.1,
    max_bytes: int | None = None,
    min_bytes: int = 2,
) -> Corpus:
    """Read a byte corpus and split it into training and validation bytes, deterministically.

    Sources: ``None`` is the standard library (:func:`stdlib_files`); a folder is every regular file under it
    (sorted by relative path; hidden folders and ``__pycache__`` skipped) that decodes as UTF-8 and holds no NUL
    byte; a file is that file (it must be UTF-8 text).

    Split: several files are split by file: the ``i``-th text file goes to validation when
    ``i % round(1 / val_fraction) == 0``, else to training. A single file is split by bytes: its last
    ``val_fraction`` goes to validation. Files are joined with :data:`SEPARATOR`.

    ``max_bytes`` caps the total: validation keeps ``round(max_bytes * val_fraction)`` bytes (at least 1) and
    training the rest. Files are read in order and reading stops once both splits are full, so a small cap loads
    fast (the whole stdlib is ~30-40 MB).

    Args:
        path: a text file or folder; ``None`` for the standard library.
        val_fraction: share of files (or bytes, for one file) held out, in ``(0, 0.5]``.
        max_bytes: cap on training + validation bytes; ``None`` keeps everything.
        min_bytes: each split must hold at least this many bytes (pass the longest window you need + 1).

    Returns:
        The :class:`Corpus`.

    Raises:
        ValueError: a missing path, no text at all, a non-UTF-8 file, or a split smaller than ``min_bytes``.
    """
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float)) or not 0 < val_fraction <= 0.5:
        fail("val_fraction", val_fraction, "a number in (0, 0.5], the share of the corpus held out for validation")
    if max_bytes is not None:
        check_positive_int("max_bytes", max_bytes)
    check_positive_int("min_bytes", min_bytes)
    if max_bytes is None:
        val_cap = train_cap = None
    else:
        val_cap = max(1, round(max_bytes * val_fraction))
        train_cap = max_bytes - val_cap

    if path is None:
        name, files, single = "stdlib", stdlib_files(), None
    else:
        source = Path(path)
        if source.is_dir():
            name, files, single = source.name or str(source), _walk(source, suffix=None, skip_hidden=True), None
        elif source.is_file():
            name, files, single = source.name, [], source
        else:
            fail("path", str(path), f"an existing file or folder ({_HINT})")

    if single is not None:
        text = single.read_bytes()
        if not _is_text(text):
            fail("path", str(path), f"a UTF-8 text file without NUL bytes ({_HINT})")
        train, val, n_train, n_val = *_split_bytes(text, val_fraction, train_cap, val_cap), 1, 1
    else:
        train, val, n_train, n_val = _split_files(files, val_fraction, train_cap, val_cap)

    where = "the standard library" if path is None else repr(str(path))
    if len(train) == 0 and len(val) == 0:
        fail(
            "path",
            None if path is None else str(path),
            f"a source with some text, but {where} has no non-empty UTF-8 text file ({_HINT})",
        )
    if len(train) < min_bytes or len(val) < min_bytes:
        fail(
            "path",
            None if path is None else str(path),
            f"a corpus whose training and validation splits each hold at least {min_bytes} bytes, but {where} gave "
            f"train={len(train)}, val={len(val)} bytes (max_bytes={max_bytes}, val_fraction={val_fraction}); "
            "pass --corpus PATH to more text, or raise max_bytes",
        )
    return Corpus(name=name, train=_to_tensor(train), val=_to_tensor(val), n_train_files=n_train, n_val_files=n_val)


def train_batch(
    data: torch.Tensor, *, length: int, batch: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random training windows: ``batch`` starts drawn uniformly from ``generator``; ``y`` is ``x`` shifted by one.

    Shapes:
        data (N,) uint8 with N >= length + 1 -> x (batch, length) int64, y (batch, length) int64,
        y[:, t] == x[:, t + 1] and y[:, -1] is the byte after the window.
    """
    n = _check_data(data, length)
    check_positive_int("batch", batch)
    if not isinstance(generator, torch.Generator):
        fail("generator", generator, "a torch.Generator, e.g. torch.Generator().manual_seed(seed)")
    starts = torch.randint(0, n - length, (batch,), generator=generator, device=generator.device)  # (batch,)
    idx = starts.to(data.device)[:, None] + torch.arange(length + 1, device=data.device)  # (batch, length + 1)
    chunk = data[idx].long()  # (batch, length + 1)
    return chunk[:, :-1], chunk[:, 1:]


def eval_windows(
    data: torch.Tensor,
    *,
    length: int,
    stride: int | None = None,
    max_tokens: int | None = None,
    batch: int = 8,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Windows covering ``data`` so that every target byte is scored exactly once.

    The targets are ``data[1:]`` (the first byte has no context), or the first ``max_tokens`` of them.

    - ``stride=None``: non-overlapping windows starting at 0, length, 2 * length, ...; every target scored.
    - ``stride=s`` (``1 <= s <= length``): sliding windows starting every ``s`` tokens (Press et al. 2022,
      sec. 4); the first window scores all its targets, each later one only its last ``s``, so each scored
      target sees between ``length - s + 1`` and ``length`` tokens of context (``stride=length`` is the same as
      ``None``; ``stride=1`` gives every target ``min(position, length)`` tokens).

    In both modes, when the targets do not fill a last window it is moved back to end at the last target and
    scores only the targets not scored yet, so all windows have the same length. Up to ``batch`` windows are
    yielded at a time.

    Shapes:
        data (N,) uint8 with N >= length + 1 (after the ``max_tokens`` cap) ->
        yields x (n, length) int64, y (n, length) int64, score_mask (n, length) bool with 1 <= n <= batch;
        y[:, t] is the byte after x[:, t].
    """
    n = _check_data(data, length)
    if stride is not None:
        check_positive_int("stride", stride)
        if stride > length:
            fail("stride", stride, f"an integer in [1, length={length}] (or None for non-overlapping windows)")
    if max_tokens is not None:
        check_positive_int("max_tokens", max_tokens)
    check_positive_int("batch", batch)
    targets = n - 1 if max_tokens is None else min(n - 1, max_tokens)
    if targets < length:
        fail("max_tokens", max_tokens, f"at least length={length} so one full window fits (or None)")
    plan = _window_plan(targets, length, length if stride is None else stride)
    return _windows(data, plan, length, batch)  # a separate generator so bad arguments fail at the call


def _windows(
    data: torch.Tensor, plan: list[tuple[int, int]], length: int, batch: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    offsets = torch.arange(length + 1, device=data.device)
    positions = torch.arange(length, device=data.device)
    for i in range(0, len(plan), batch):
        group = plan[i : i + batch]
        starts = torch.tensor([s for s, _ in group], device=data.device)  # (n,)
        first = torch.tensor([f for _, f in group], device=data.device)  # (n,)
        chunk = data[starts[:, None] + offsets].long()  # (n, length + 1)
        mask = positions[None, :] >= first[:, None]  # (n, length)
        yield chunk[:, :-1], chunk[:, 1:], mask


def _window_plan(targets: int, length: int, stride: int) -> list[tuple[int, int]]:
    """``(start, first scored position)`` of each window over targets ``1..targets`` (data indices)."""
    plan = [(0, 0)]
    covered = length  # targets 1..covered are scored
    start = 0
    while covered < targets:
        start = min(start + stride, targets - length)
        plan.append((start, covered - start))  # target covered + 1 sits at window position covered - start
        covered = start + length
    return plan


def _check_data(data: object, length: int) -> int:
    if not isinstance(data, torch.Tensor) or data.dim() != 1:
        fail(
            "data",
            type(data).__name__ if not isinstance(data, torch.Tensor) else tuple(data.shape),
            "a 1-D tensor of token ids, e.g. Corpus.train",
        )
    check_positive_int("length", length)
    n = data.numel()
    if n < length + 1:
        fail(
            "length",
            length,
            f"at most {n - 1}: the data holds {n} tokens and a window needs length + 1; use a shorter length or "
            "more text (a larger max_bytes / --corpus)",
        )
    return n


def _walk(root: Path, *, suffix: str | None, skip_hidden: bool) -> list[Path]:
    found: list[tuple[str, Path]] = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not (skip_hidden and d.startswith("."))]
        for name in names:
            if (suffix is not None and not name.endswith(suffix)) or (skip_hidden and name.startswith(".")):
                continue
            file = Path(folder, name)
            if file.is_file():
                found.append((file.relative_to(root).as_posix(), file))
    found.sort(key=lambda pair: pair[0])
    return [file for _, file in found]


def _is_text(raw: bytes) -> bool:
    if SEPARATOR in raw:
        return False
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _split_bytes(text: bytes, val_fraction: float, train_cap: int | None, val_cap: int | None) -> tuple[bytes, bytes]:
    n_val = min(len(text), max(1, round(len(text) * val_fraction)))
    train, val = text[: len(text) - n_val], text[len(text) - n_val :]
    return train[:train_cap], val[:val_cap]


def _split_files(
    files: list[Path], val_fraction: float, train_cap: int | None, val_cap: int | None
) -> tuple[bytes, bytes, int, int]:
    every = round(1 / val_fraction)
    parts: dict[bool, list[bytes]] = {False: [], True: []}  # is_val -> file contents
    size = {False: 0, True: 0}
    cap = {False: train_cap, True: val_cap}
    texts: list[bytes] = []  # kept only to fall back to a byte split when there is a single text file
    index = 0
    for file in files:
        if all(cap[v] is not None and size[v] >= cap[v] for v in (False, True)):
            break
        try:
            raw = file.read_bytes()
        except OSError:
            continue
        if not raw or not _is_text(raw):
            continue
        if index < 2:
            texts.append(raw)
        is_val = index % every == 0
        index += 1
        if cap[is_val] is not None and size[is_val] >= cap[is_val]:
            continue
        size[is_val] += len(raw) + (len(SEPARATOR) if parts[is_val] else 0)
        parts[is_val].append(raw)
    if index == 1:
        return *_split_bytes(texts[0], val_fraction, train_cap, val_cap), 1, 1
    train = SEPARATOR.join(parts[False])[:train_cap]
    val = SEPARATOR.join(parts[True])[:val_cap]
    return train, val, len(parts[False]), len(parts[True])


def _to_tensor(raw: bytes) -> torch.Tensor:
    if not raw:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)
