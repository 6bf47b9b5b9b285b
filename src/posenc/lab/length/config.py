"""The settings of ``posenc lab``: ``StudyConfig`` (stored as ``OUT/study.json``, checked on ``--resume``), the
default encodings and the per-task defaults the command line fills in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import posenc
from posenc._checks import check_choice, check_positive_int, fail
from posenc.lab.common.gpt import GLOBAL_ENCODINGS, check_layer_part, check_layer_spec, split_local

#: The default study: the classic families plus the two later ones the all-encodings comparison found most telling
#: (Sandwich: flat and best past L; FoPE: the rotary encoding that degrades least); xPos tells the same story as RoPE.
#: experiments/length-extrapolation/all-encodings has every encoding.
DEFAULT_ENCODINGS = ("nope", "sinusoidal", "learned", "rope", "alibi", "t5", "sandwich", "fope")

TASKS = ("lm", "copy", "recall")

#: ``--encodings all``: every registered sequence encoding (``sequence_encodings``), in the registry's order.
ALL = "all"

#: Per task: the defaults of ``posenc lab --task`` for the flags not given (``batch_size``/``n_heads`` absent:
#: StudyConfig's 32 / 4). Copy and recall train on rows whose content varies from 1 symbol / pair up to L
#: (``_task_batches``) and are evaluated with full-size content at L..16L. Measured on the 2-core CPU with these
#: mixed-length batches (uncontended: ~90k tokens/s, so 3000 steps x 64 x 16 tokens is ~35 s per encoding, about
#: 4-5 min for the 7 default encodings with evaluation; several times longer when the machine is shared):
#:   recall, L=16, 2000 steps, batch 64, 8 heads: exact match at L: alibi 100% (98% at 2L), nope 40%, learned 46%,
#:     rope 22%, sinusoidal 11%; with 4 heads rope 100% (93% at 2L) but alibi 12%. The phase change that learns the
#:     lookup comes between ~1500 and ~3000 steps, hence 3000 steps. With these defaults (a partial run): nope 61%
#:     at L, 2% at 2L, 0% beyond; the other encodings not yet measured at 3000 steps.
#:   copy, L=16 (vocab 16), 3000 steps, batch 32, 4 heads: rope 100% at L, 0% at 2L; alibi 0%. ALiBi with 8 heads,
#:     batch 64, 2000 steps: 1%. Copy with repeated symbols needs positions (which copy of a symbol is meant), and
#:     ALiBi / NoPE did not learn it in these budgets; ``_task_findings`` flags that in the report.
TASK_DEFAULTS = {
    "lm": {"train_len": 64, "steps": 1000},
    "copy": {"train_len": 16, "steps": 3000, "batch_size": 64, "n_heads": 8},
    "recall": {"train_len": 16, "steps": 3000, "batch_size": 64, "n_heads": 8},
}


@dataclass(frozen=True, kw_only=True)
class StudyConfig:
    """Everything that defines a study; stored as ``OUT/study.json`` and checked on ``--resume``.

    ``encodings`` holds names from ``posenc.available()`` (an encoding in every layer) or per-layer hybrids
    ``BASE/OTHER:N``: OTHER in every N-th layer (layers N, 2N, ... counting from 1, as transformers'
    ``no_rope_layer_interval``), BASE in the others, with ``2 <= N <= n_layers``; e.g. ``rope/nope:4`` (Yang et al.
    2025; SmolLM3) and ``rope/nope_temperature:4`` (Llama 4, whose NoPE layers scale their queries: the lab sets
    ``floor_scale`` to ``train_len`` so the temperature changes within the evaluated lengths). Absolute encodings
    (sinusoidal, learned) cannot be chosen per layer. A hybrid's RoPE scalings apply to its BASE layers; it trains
    in ``OUT/runs/BASE-OTHER-everyN`` and keeps its spec as the ``encoding`` of its CSV rows. A suffix ``@C`` (e.g.
    ``rope/nope_temperature:4@16``, Llama 4's iRoPE) makes the non-NoPE layers attend within chunks of C tokens
    (``ModelConfig.attention_chunk_size``), the NoPE layers globally; its run folder ends in ``-chunkC``. A last
    suffix ``~W`` (e.g. ``rope~16``, Mistral's sliding window; ``rope/nope:4~16``, RNoPE-SWA) makes the non-NoPE layers
    attend over the W most recent positions (``ModelConfig.sliding_window``); its run folder ends in ``-windowW``.
    A last ``+sinks`` (e.g. ``rope+sinks``, ``rope~16+sinks``: GPT-OSS's) gives every layer learned attention sinks
    (``ModelConfig.sinks``); its run folder ends in ``-sinks``. The numbers N, C and W are written in the digits 0-9
    without a leading zero (``rope@016`` is refused, not read as ``rope@16``: one spelling, one CSV label, one run
    folder), and C and W are at most the longest length the study runs (``lengths``): past it they mask nothing.
    SSMax layers under ``@C`` or ``~W`` count the keys left to each query as their ``n`` (``ssmax~8``: ``min(p + 1,
    8)``).
    """

    task: str = "lm"
    encodings: tuple[str, ...] = DEFAULT_ENCODINGS
    train_len: int = 64
    eval_lens: tuple[int, ...] | None = None  # None: L, 2L, 4L, 8L, 16L
    steps: int = 1000
    batch_size: int = 32
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    lr: float = 3e-3
    seed: int = 0
    stride: int | None = None
    finetune_steps: int = 0
    eval_tokens: int = 16384
    corpus: str | None = None
    corpus_bytes: int = 4_000_000
    device: str = "cpu"
    extensions: bool = True

    def __post_init__(self) -> None:
        check_choice("task", self.task, TASKS)
        check_positive_int("train_len", self.train_len)
        for n in ("steps", "batch_size", "dim", "n_layers", "n_heads", "eval_tokens"):
            check_positive_int(n, getattr(self, n))
        if self.dim % self.n_heads or (self.dim // self.n_heads) % 2:
            fail("dim", self.dim, f"a multiple of 2 * n_heads = {2 * self.n_heads} (an even head size for RoPE)")
        if not self.encodings:
            fail("encodings", self.encodings, f"at least one of {posenc.available()}")
        if ALL in self.encodings:  # stored expanded, so a resumed study runs the same list whatever is registered later
            expanded = [e for spec in self.encodings for e in (sequence_encodings() if spec == ALL else (spec,))]
            object.__setattr__(self, "encodings", tuple(dict.fromkeys(expanded)))
        for length in self.lengths:  # first: the longest one bounds a spec's chunk size and window
            check_positive_int("eval_lens", length)
        longest = max(self.lengths)
        for spec in self.encodings:
            layers, chunk, window, _ = split_local(spec, "encodings")
            base, other, _ = check_layer_spec(layers, n_layers=self.n_layers, name="encodings")
            all_global = all(name in GLOBAL_ENCODINGS for name in (base, other) if name is not None)
            for given, what in ((chunk, "a chunk size @C"), (window, "a window ~W")):
                if given is not None and all_global:
                    fail("encodings", spec, f"{what} on a spec with non-NoPE layers (NoPE layers attend globally)")
                if given is not None and given > longest:
                    # past every length the study runs, a window or chunk masks nothing: global attention renamed
                    fail("encodings", spec, f"{what} from 1 to {longest}, the longest length this study runs "
                         "(--eval-lens, default 16 x --train-len): a larger one masks nothing")
            for name in (base,) if other is None else (base, other):
                if name not in posenc.available():
                    fail("encodings", name, f"names from {posenc.available()}")
                hd = self.dim // self.n_heads
                encoding = posenc.build(name, dim=self.dim, num_heads=self.n_heads, head_dim=hd, max_len=self.train_len)
                if encoding.position_kind != "sequence":
                    fail("encodings", spec, "encodings of token sequences (grid encodings belong to `posenc vision`)")
                if other is not None:
                    check_layer_part(encoding, name, spec, "encodings")
        if self.stride is not None and not 0 < self.stride <= min(self.lengths):
            fail(
                "stride",
                self.stride,
                f"a positive number of tokens up to the shortest eval length, {min(self.lengths)}",
            )
        if self.finetune_steps < 0:
            fail("finetune_steps", self.finetune_steps, "0 (no fine-tuning) or a positive number of steps")

    @property
    def lengths(self) -> tuple[int, ...]:
        return self.eval_lens or tuple(self.train_len * m for m in (1, 2, 4, 8, 16))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def sequence_encodings() -> tuple[str, ...]:
    """Every registered encoding of token sequences (``--encodings all``): grid and M-RoPE encodings belong to
    ``posenc vision``."""
    facts = {"dim": 64, "num_heads": 4, "head_dim": 16, "max_len": 64, "grid_size": (4, 4)}
    return tuple(name for name in posenc.available() if posenc.build(name, **facts).position_kind == "sequence")
