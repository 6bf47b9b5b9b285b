"""What a method costs inside the original context L: perplexity at L/4 and at L, and keys at L, against the unpatched
model on the same text and the same documents.

Dynamic NTK is exact inside L (it scales only past it); a static YaRN x4 or Llama 3 rescales every frequency from
position 0, and users pay that on short prompts (vLLM #18728: static YaRN costs Qwen3 15-20% on agentic tasks). The
pick measures it for every candidate whose perplexity at the target is not broken, and names a candidate worse than
the unpatched model beyond ``PPL_MARGIN`` in perplexity, or shown below it on keys at L (the paired clustered
interval of ``posenc.lab.extend.stats.paired``), as *costing short prompts*; with ``keep_short`` such a candidate is
not picked.

Perplexity inside L is the mean next-token loss over ``L`` held-out tokens at each length (``L/4``: four windows;
``L``: one), the same windows for every model, so a ratio to the unpatched model's is paired; ``inside.csv`` keeps
one row per model and length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posenc.lab.common.runfiles import KeyedCSV

#: A candidate whose perplexity inside L exceeds the unpatched model's by more than this share costs short prompts.
PPL_MARGIN = 0.02
#: Documents of keys at L per model (each a forward of L tokens).
DOCUMENTS = 2
INSIDE_FILE = "inside.csv"
INSIDE = KeyedCSV(
    columns=("method", "factor", "finetune_steps", "finetune_positions", "length", "ppl", "tokens"),
    key=("method", "factor", "finetune_steps", "finetune_positions", "length"),
    ints=frozenset({"finetune_steps", "length", "tokens"}),
    floats=frozenset({"factor", "ppl"}),
    command="posenc extend --pick",
)


def lengths(original: int) -> tuple[int, int]:
    """The two lengths inside the context: L/4 and L."""
    return original // 4, original


def read(path: Path) -> list[dict[str, Any]]:
    return INSIDE.read(path) if path.is_file() else []


def ppl_of(rows: Sequence[dict[str, Any]], unit: tuple, length: int) -> float | None:
    for r in rows:
        if (r["method"], float(r["factor"]), int(r["finetune_steps"]), r["finetune_positions"]) == tuple(unit) and \
                r["length"] == length:
            return None if r["ppl"] is None or math.isnan(r["ppl"]) else float(r["ppl"])
    return None


@dataclass(frozen=True)
class Cost:
    """One model inside L: perplexity ratios to the unpatched model at L/4 and L, and keys at L against it."""

    unit: tuple
    ratios: tuple[float | None, float | None]  # ppl / unpatched ppl at L/4, L
    found: float | None  # keys found at L (share)
    difference: tuple[float, float, float] | None  # found - unpatched found at L: estimate, low, high
    n_keys: int

    @property
    def worse(self) -> str | None:
        """Why this model costs short prompts, or None."""
        why = [f"perplexity {100 * (r - 1):+.1f}% at {'L/4' if i == 0 else 'L'}"
               for i, r in enumerate(self.ratios) if r is not None and r > 1 + PPL_MARGIN]
        if self.difference is not None and self.difference[2] < 0:
            why.append(f"keys at L {100 * self.difference[0]:+.0f} points [{100 * self.difference[1]:+.0f} to "
                       f"{100 * self.difference[2]:+.0f}], shown below the unpatched model")
        return "; ".join(why) or None

    def text(self) -> str:
        parts = [f"{'n/a' if r is None else f'{100 * (r - 1):+.1f}%'}" for r in self.ratios]
        keys = "n/a" if self.found is None else f"{100 * self.found:.0f}% of {self.n_keys}"
        return f"ppl {parts[0]} at L/4, {parts[1]} at L; keys at L {keys}"

    def sentence(self) -> str:
        """What was measured inside L, then whether it costs short prompts (the report's and the summary's line)."""
        return f"{self.text()}; " + (f"costs short prompts ({self.worse})" if self.worse else
                                     "no cost shown beyond the margin")
