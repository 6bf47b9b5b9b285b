"""argparse ``type=`` functions shared by every ``posenc`` subcommand: one rule per kind of number (and one for
lists of names), one message.

Each raises ``argparse.ArgumentTypeError`` ("'0' is invalid: expected a positive integer"), which argparse reports
as ``argument --steps: ...``: zero, negatives, NaN and infinities are refused at the command line, never replaced by
a default and never passed on to fail later.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def integer(*, minimum: int, even: bool = False) -> Callable[[str], int]:
    """A parser of whole numbers ``>= minimum`` (and even, when asked)."""
    what = {1: "a positive integer", 0: "an integer >= 0"}.get(minimum, f"an integer >= {minimum}")
    if even:
        what = f"an even integer >= {minimum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum or (even and value % 2):
            raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected {what}")
        return value

    parse.__name__ = what  # argparse names the type by it in some messages
    parse.what = what  # type: ignore[attr-defined]
    return parse


def real(*, above: float | None = None, minimum: float | None = None, maximum: float | None = None):  # noqa: ANN201
    """A parser of finite numbers ``> above`` or ``>= minimum``, and ``<= maximum``."""
    if maximum is not None:
        low = f"({above:g}" if above is not None else f"[{minimum:g}"
        what = f"a number in {low}, {maximum:g}]"
    else:
        low = f" > {above:g}" if above is not None else f" >= {minimum:g}" if minimum is not None else ""
        what = f"a finite number{low}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if (
            not math.isfinite(value)
            or (above is not None and value <= above)
            or (minimum is not None and value < minimum)
            or (maximum is not None and value > maximum)
        ):
            raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected {what}")
        return value

    parse.__name__ = what
    parse.what = what  # type: ignore[attr-defined]
    return parse


def _parts(text: str, what: str) -> list[str]:
    """``text`` split at commas and/or spaces ("16,32", "16, 32" or "16 32"); refused when it is empty (``""``, ``","``)
    or has an empty item (``"16,"``, ``"16,,32"``)."""
    parts = re.split(r"\s*,\s*|\s+", text.strip())
    if "" in parts:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected {what}")
    return parts


def comma_list(item: Callable[[str], T], example: str) -> Callable[[str], tuple[T, ...]]:
    """A parser of a comma- (or space-) separated list of ``item`` values: at least one, no empty item."""
    what = f"comma-separated values, each {item.what}, e.g. {example}"  # type: ignore[attr-defined]

    def parse(text: str) -> tuple[T, ...]:
        values = []
        for part in _parts(text, what):
            try:
                values.append(item(part))
            except argparse.ArgumentTypeError:
                raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected {what} ({part!r} is not)") from None
        return tuple(values)

    parse.__name__ = what
    return parse


def names(text: str) -> tuple[str, ...]:
    """``"a,b c"`` -> ``("a", "b", "c")``: at least one name, none empty (which names exist is the command's check)."""
    return tuple(_parts(text, _NAMES))


_NAMES = "comma-separated names, at least one and none empty"
names.what = _NAMES  # type: ignore[attr-defined]


positive_int = integer(minimum=1)
nonnegative_int = integer(minimum=0)
even_head_dim = integer(minimum=4, even=True)  # NTK's exponent dim / (dim - 2) needs 4
context_length = integer(minimum=2)  # LongRoPE and Llama 3 scale from 2 tokens up
positive_float = real(above=0.0)
at_least_one = real(minimum=1.0)
above_one = real(above=1.0)
fraction = real(above=0.0, maximum=1.0)
unit_interval = real(minimum=0.0, maximum=1.0)
positive_ints = comma_list(positive_int, "64,128,256")
factors = comma_list(at_least_one, "2,4")  # posenc.hf.extend.FACTOR_RULE; which methods take 1 is the command's check
unit_intervals = comma_list(unit_interval, "0,0.5,1")
