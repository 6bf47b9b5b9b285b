"""The lengths ``posenc extend`` reads (``--lengths``, ``--eval-tokens``, ``--finetune-window``, ``--target``): tokens,
thousands of tokens or a multiple of the model's original context, as given. Imports no torch: the command line parses
them before the library loads."""

from __future__ import annotations

import re
from typing import TypeGuard

from posenc._fail import fail

#: What ``lengths``, ``eval_tokens`` and ``finetune_window`` accept: tokens, or a multiple of the original context.
LENGTH_FORMS = (
    "a length in tokens (4096, or 16k for 16 x 1024) or a positive multiple of the model's original context (0.5x, 2x)"
)
_MULTIPLE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)x", re.ASCII)
_KILO = re.compile(r"(\d+(?:\.\d*)?|\.\d+)k", re.ASCII)  # 16k = 16 * 1024 tokens, as the field writes lengths


def is_count(value: object) -> TypeGuard[int]:
    """A count of tokens: a positive ``int`` (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def length_form(name: str, value: object) -> int | str:
    """One length as given: a positive integer (``4096``, ``"4096"``), thousands of 1,024 tokens (``"16k"`` = 16384,
    ``"1.5k"`` = 1536; a whole number of tokens), or a multiple of the original context (``"1.5x"``, ``"2X"``) kept as
    its canonical text (``"1.5x"``) until the original is known. Refused: anything else (``"x2"``, ``"-1x"``,
    ``"0x"``, ``"2xx"``, ``"0.1k"``, ``0``, ``True``), naming ``name``."""
    if is_count(value):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if re.fullmatch(r"[0-9]+", text) and int(text) > 0:
            return int(text)
        kilo = _KILO.fullmatch(text)
        if kilo and (tokens := float(kilo.group(1)) * 1024) > 0 and tokens == int(tokens):
            return int(tokens)
        multiple = _MULTIPLE.fullmatch(text)
        if multiple and float(multiple.group(1)) > 0:
            return f"{float(multiple.group(1)):.15g}x"  # 1000001x stays 1000001x (:g would write 1e+06x)
    fail(name, value, LENGTH_FORMS)
