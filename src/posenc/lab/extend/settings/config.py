"""The settings of ``posenc extend``: ``ExtendConfig`` (stored as ``OUT/extend.json``, checked on ``--resume``),
validated on its own; the model-dependent ones are filled in later by ``posenc.lab.extend.study.plan.resolve``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from posenc._checks import check_choice, check_number, check_positive_int, fail
from posenc._config import DictConfig
from posenc.deploy.methods import drops
from posenc.hf.dtypes import DTYPE_CHOICES
from posenc.lab.common.scaling import EXTEND_METHODS
from posenc.lab.extend.settings import composed
from posenc.lab.extend.settings.lengths import is_count, length_form
from posenc.lab.extend.settings.options import config_field

TASKS = ("lm", "passkey", "ruler")
#: ``finetune_positions`` kinds (``posenc.lab.extend.targets.finetune``).
FINETUNE_POSITIONS = ("plain", "pose", "random")
#: ``model`` keyword for a fresh lab model (``new`` is RoPE; ``new:alibi`` picks the encoding).
NEW = "new"
T = TypeVar("T")

#: ``stop_width``'s default: a rate is clear once its 95% interval is at most this wide (``lab.extend.sampling``).
STOP_WIDTH = 0.3


def filled(value: T | None, name: str) -> T:
    """A setting the plan fills in (``study.plan.resolve``: ``methods``, ``trials``...) read after it: ``value``.
    None there is a bug (a setting read before the plan), refused."""
    if value is None:
        raise RuntimeError(f"setting {name!r} read before study.plan.resolve filled it in")
    return value


def tokens(value: int | str | None, name: str) -> int:
    """A length setting read once its multiples are resolved (``resolve_lengths``; ``study.plan.resolve``): tokens.
    A multiple (``"2x"``) or None there is a bug, refused."""
    if not isinstance(value, int):
        raise RuntimeError(f"setting {name!r} is {value!r}, not yet tokens: read before its multiples were resolved")
    return value


def token_lengths(cfg: ExtendConfig) -> tuple[int, ...]:
    """``cfg.lengths`` in tokens, as the plan filled them in (``filled``, ``tokens``)."""
    return tuple(tokens(n, "lengths") for n in filled(cfg.lengths, "lengths"))


def unit_factors(cfg: ExtendConfig, method: str) -> tuple[float, ...]:
    """The factors ``method`` is measured at: ``cfg.factors``, or ``(1.0,)`` for ``drope`` (no factor: one model,
    labelled ``drope``, whatever ``--factors`` says; its fine-tune target is the original context)."""
    return (1.0,) if drops(method) else tuple(cfg.factors or ())


#: Why a ``drope`` study is not the authors' DroPE without ``--finetune-steps``, said by the plan and the report.
DROPE_ZERO_SHOT = (
    "zero-shot drope is RoPE dropped without recalibration (an ablation), not DroPE as its authors run it: they "
    "recalibrate every parameter with the plain LM loss at the original context (SakanaAI/DroPE); --finetune-steps N "
    "does that here"
)


@dataclass(frozen=True, kw_only=True)
class ExtendConfig(DictConfig):
    """Everything that defines an extension study; stored as ``OUT/extend.json`` and checked on resume.

    Settings marked "None: the plan's" are filled in by ``posenc.lab.extend.study.plan.resolve`` for the model's kind
    and device before anything runs (``extend.json`` holds the filled-in values).

    Args:
        model: a lab run folder, a ``.gguf`` file or a folder holding one, a transformers model folder,
            ``smollm2``, or ``new`` / ``new:<encoding>`` (task passkey).
        methods: extension methods; None: every method for a lab model's encoding, ``yarn`` and ``dynamic`` for a
            pretrained RoPE model (``linear`` for ALiBi and p-RoPE ones). ``FREQUENCY+REMAP`` (``yarn+string``)
            composes a frequency method at the factor with STRING within the stretched context
            (``settings.composed``; pretrained RoPE models). ``drope`` (DroPE, transformers or lab RoPE
            models) takes no factor: measured once at factor 1 (``unit_factors``, label ``drope``) beside the
            others' factors; zero-shot it is RoPE dropped without recalibration (an ablation), fine-tuned it is
            recalibrated at the original context (``finetune_window`` at most that, ``plain`` positions only).
        factors: context factors, each ``>= 1`` (``posenc.hf.extend.FACTOR_RULE``: target context = factor *
            original length; 1 only for STRING, every other method being the unpatched model there); None: the
            plan's.
        lengths: evaluation lengths in tokens (bytes for lab models), at least one beyond the original length
            (shorter ones are in-context references); None: the plan's (lab: 1x, 2x, 4x, 8x the original). Each may
            be a multiple of the original context, ``"1.5x"`` (``LENGTH_FORMS``), resolved to tokens as soon as the
            original context is known (``resolve_lengths``; ``round(m * original)``), before any weight is loaded:
            ``extend.json`` holds the integers.
        depths: passkey depths in [0, 1]; None: the plan's.
        trials: passkey keys per (length, depth) cell, at most (``stop_width``); None: the plan's.
        finetune_steps: 0, or steps of fine-tuning at the target length after patching (also measured zero-shot).
        finetune_lr: learning rate of that fine-tuning; None: 3e-4 (lab), 2e-5 (transformers).
        finetune_window: tokens per fine-tuning sequence, or a multiple of the original context (``"1x"``); None:
            the target length (Position Interpolation's recipe; ``drope``'s target is the original context). A
            shorter window makes a fine-tune to a long target affordable; ``finetune_positions`` then decides which
            positions it sees.
        finetune_positions: position ids of the fine-tuning windows, one fine-tuned model each: ``plain`` (0..W-1,
            never beyond the window), ``pose`` (PoSE's two chunks with a skip, Zhu et al. 2024), ``random`` (a
            sorted random subset of the target's positions, Ruoss et al. 2023). ``pose`` and ``random`` need a
            window shorter than every target (``posenc.functional.position_sampling``) and a model that reads
            position ids: refused for a transformers ALiBi model (BLOOM, MPT), allowed for a lab ALiBi one.
        finetune_corpus: text file or folder to fine-tune on (all of it); None: the training split of ``corpus``.
            Either way disjoint from the held-out text that perplexity and passkey read.
        corpus: text file or folder for perplexity and fine-tuning; None: the Python standard library.
        corpus_bytes: cap on corpus bytes read.
        eval_tokens: tokens scored per perplexity length (or a multiple of the original context, ``"4x"``), at
            least the longest length; None: the longest length
            (pretrained models: the same tokens at every length), ``max(16384, longest)`` (lab models).
        task: ``lm`` (perplexity and passkey, zero-shot), ``ruler`` (the same plus RULER through lm-evaluation-harness;
            pretrained models) or ``passkey`` (lab models: train the task, then test).
        ruler_tasks: task ``ruler``: lm-eval's RULER tasks to run (``posenc.lab.extend.needles.ruler.OFFLINE_TASKS``);
            None: ``niah_single_1``.
        ruler_samples: task ``ruler``: documents per task and length, at most (``stop_width``); None: the plan's (2 on
            CPU, 10 on CUDA).
        stop_width: sample until the answer is clear (``posenc.lab.extend.stats.sampling``): passkey keys and RULER
            documents are measured in rounds of ``min(4, cap)`` per cell, and a cell stops once its Wilson 95%
            interval is disjoint from the best cell's at the same length (and depth / task) or at most this wide;
            ``trials`` and ``ruler_samples`` are then caps. 0 or None: every cell gets exactly ``trials`` /
            ``ruler_samples`` (fixed counts, as studies made before this setting).
        original_len: the model's original context; None: read from the model (required when its config has none).
        layer_type: for per-layer-type RoPE (Gemma 3): the layer type to extend, or ``all``; None: the
            ``full_attention`` layers. Refused for models with one RoPE for all layers.
        train_len: training length of a ``new`` model (bytes; 128 by default: a 2-layer width-64 GPT learns retrieval
            there in ~800 steps, measured on CPU, while at 256 it had not after 700).
        train_steps: passkey training steps (task passkey).
        device: ``auto`` (CUDA when present), ``cpu``, ``cuda``, ``cuda:1``...
        dtype: a pretrained model's weights and activations (RoPE always in float32): ``float32``, ``bfloat16``,
            ``float16``; None (``auto``): bfloat16 on a CPU with bfloat16 units (AVX512-BF16, AMX), float32 on other
            CPUs, the checkpoint's own on CUDA (``posenc.hf.dtypes``). Lab models are float32.
        seed: seed of every random draw (keys, depths, batches).
        baseline: measure the unpatched model (method ``none``) too, as the reference every method is read against;
            False leaves it out (a user measuring one method pays for it once, in an earlier study).
        out: default output folder (``run_extend``'s ``out`` argument wins); not compared on resume.
    """

    # each field's default, and the option of `posenc extend` that sets it: posenc.lab.extend.settings.options
    model: str = config_field("model")
    methods: tuple[str, ...] | None = config_field("methods")
    factors: tuple[float, ...] | None = config_field("factors")
    lengths: tuple[int | str, ...] | None = config_field("lengths")
    depths: tuple[float, ...] | None = config_field("depths")
    trials: int | None = config_field("trials")
    finetune_steps: int = config_field("finetune_steps")
    finetune_lr: float | None = config_field("finetune_lr")
    finetune_window: int | str | None = config_field("finetune_window")
    finetune_positions: tuple[str, ...] = config_field("finetune_positions")
    finetune_corpus: str | None = config_field("finetune_corpus")
    corpus: str | None = config_field("corpus")
    corpus_bytes: int = 4_000_000
    eval_tokens: int | str | None = config_field("eval_tokens")
    task: str = config_field("task")
    ruler_tasks: tuple[str, ...] | None = config_field("ruler_tasks")
    ruler_samples: int | None = config_field("ruler_samples")
    stop_width: float | None = config_field("stop_width", default=STOP_WIDTH)
    original_len: int | None = config_field("original_len")
    layer_type: str | None = config_field("layer_type")
    train_len: int = config_field("train_len")
    train_steps: int = config_field("train_steps")
    device: str = config_field("device")
    dtype: str | None = config_field("dtype")
    seed: int = config_field("seed")
    baseline: bool = config_field("baseline")
    out: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            fail("model", self.model, "a model (a lab run, a .gguf file, a transformers folder, 'smollm2', "
                 "'gemma3-270m', 'qwen2.5-coder-0.5b') or 'new'")
        for name in ("methods", "factors", "lengths", "depths"):
            value = getattr(self, name)
            if value is not None:
                if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
                    fail(name, value, "a non-empty list")
                object.__setattr__(self, name, tuple(value))
        if self.methods is not None:
            for method in self.methods:
                if not isinstance(method, str) or not method or method == "none":
                    fail("methods", method, "method names (the unpatched model, 'none', is always measured)")
            if len(set(self.methods)) != len(self.methods):
                fail("methods", self.methods, "each method once")
            for method in self.methods:
                composed.check(method)
        if self.factors is not None:
            from posenc.hf.extend import check_factor

            scaled: list[str | None] = [m for m in self.methods or () if not drops(m)] or [None]  # drope: measured once
            # 1 measures the model as trained again (`none`, always measured) but STRING; in a study of drope alone
            # the factors only set the targets `none` is fine-tuned at, and 1 is the original context (the control
            # of a recalibration: RoPE trained as long on the same windows).
            only_drope = bool(self.methods) and scaled == [None]
            for factor in self.factors:
                for scaled_method in scaled:
                    check_factor(factor, scaled_method, name="factors", as_model=not only_drope)
            object.__setattr__(self, "factors", tuple(float(f) for f in self.factors))
            if len(set(self.factors)) != len(self.factors):
                fail("factors", self.factors, "each factor once")
        if self.lengths is not None:
            object.__setattr__(self, "lengths", tuple(length_form("lengths", n) for n in self.lengths))
        if self.eval_tokens is not None:
            object.__setattr__(self, "eval_tokens", length_form("eval_tokens", self.eval_tokens))
        if self.finetune_window is not None:
            object.__setattr__(self, "finetune_window", length_form("finetune_window", self.finetune_window))
        known = self.original_len if is_count(self.original_len) else None
        if known is None and self.is_new and is_count(self.train_len):
            known = self.train_len
        if known is not None and self.has_multiples:  # the original context is a setting: resolved at once
            for name, value in resolved_forms(self, known).items():
                object.__setattr__(self, name, value)
        if self.depths is not None:
            for depth in self.depths:
                if isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0 <= depth <= 1:
                    fail("depths", depth, "fractions in [0, 1] (0: needle first, 1: just before the question)")
            object.__setattr__(self, "depths", tuple(float(d) for d in self.depths))
        if self.trials is not None:
            check_positive_int("trials", self.trials)
        for name in ("corpus_bytes", "train_len", "train_steps"):
            check_positive_int(name, getattr(self, name))
        if self.layer_type is not None and (not isinstance(self.layer_type, str) or not self.layer_type):
            fail("layer_type", self.layer_type, "a layer type of the model's config (e.g. 'full_attention') or 'all'")
        dropping = [m for m in self.methods or () if drops(m)]
        if dropping and self.layer_type not in (None, "all"):
            fail(
                "layer_type",
                self.layer_type,
                f"None or 'all' with method {dropping[0]!r}: DroPE drops RoPE from every layer, as its authors do "
                "(run the other methods per layer type in a study without drope)",
            )
        if isinstance(self.finetune_steps, bool) or not isinstance(self.finetune_steps, int) or self.finetune_steps < 0:
            fail("finetune_steps", self.finetune_steps, "0 (zero-shot only) or a positive number of steps")
        if self.finetune_lr is not None:
            check_number("finetune_lr", self.finetune_lr, above=0.0)
        self._check_finetune()
        check_choice("task", self.task, TASKS)
        if self.ruler_tasks is not None:
            from posenc.lab.extend.needles.ruler import check_tasks

            object.__setattr__(self, "ruler_tasks", check_tasks(self.ruler_tasks))
        if self.ruler_samples is not None:
            from posenc.lab.extend.needles.ruler import DOCUMENTS_PER_LENGTH

            check_positive_int("ruler_samples", self.ruler_samples)
            if self.ruler_samples > DOCUMENTS_PER_LENGTH:
                fail("ruler_samples", self.ruler_samples, f"at most {DOCUMENTS_PER_LENGTH}, the documents lm-eval "
                     "generates per task and length")
        if self.stop_width is not None:
            check_number("stop_width", self.stop_width)
            if not 0 <= self.stop_width < 1:
                fail("stop_width", self.stop_width, "a Wilson interval width in [0, 1) (0 or None: fixed counts)")
            object.__setattr__(self, "stop_width", float(self.stop_width))
        if self.task != "ruler":
            for name in ("ruler_tasks", "ruler_samples"):
                if (value := getattr(self, name)) is not None:
                    fail(name, value, f"None unless task is 'ruler' (task is {self.task!r}; pass --task ruler)")
        if self.original_len is not None:
            check_positive_int("original_len", self.original_len)
        if self.is_new:
            check_choice("model", self.model, [NEW, *(f"{NEW}:{e}" for e in EXTEND_METHODS)])
            if self.task != "passkey":
                fail("model", self.model, "a model folder; a fresh model ('new') is only trained by --task passkey")
        if self.lengths is not None and not self.has_multiples:
            known = self.original_len or (self.train_len if self.is_new else None)
            lengths = token_lengths(self)
            if known is not None:
                check_lengths(lengths, known)
            if self.eval_tokens is not None and tokens(self.eval_tokens, "eval_tokens") < max(lengths):
                fail(
                    "eval_tokens",
                    self.eval_tokens,
                    f"at least the longest length, {max(lengths)} (--eval-tokens: one full window per length)",
                )
        if not isinstance(self.device, str) or not self.device:
            fail("device", self.device, "'auto', 'cpu', 'cuda' or 'cuda:<index>'")
        if self.dtype is not None:
            check_choice("dtype", self.dtype, [d for d in DTYPE_CHOICES if d != "auto"])
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            fail("seed", self.seed, "an integer >= 0")
        if not isinstance(self.baseline, bool):
            fail("baseline", self.baseline, "True (measure the unpatched model too) or False (leave it out)")

    def _check_finetune(self) -> None:
        positions = self.finetune_positions
        if isinstance(positions, (str, bytes)) or not isinstance(positions, Sequence) or not positions:
            fail("finetune_positions", positions, f"a non-empty list of {list(FINETUNE_POSITIONS)}")
        for kind in positions:
            check_choice("finetune_positions", kind, FINETUNE_POSITIONS)
        if len(set(positions)) != len(positions):
            fail("finetune_positions", positions, "each kind once")
        object.__setattr__(self, "finetune_positions", tuple(positions))
        if self.finetune_corpus is not None and (not isinstance(self.finetune_corpus, str) or not self.finetune_corpus):
            fail("finetune_corpus", self.finetune_corpus, "a text file or folder to fine-tune on")
        if not self.finetune_steps:
            for name, default in (("finetune_window", None), ("finetune_positions", ("plain",)),
                                  ("finetune_corpus", None), ("finetune_lr", None)):
                if getattr(self, name) != default:
                    fail(name, getattr(self, name), "left out unless finetune_steps > 0 (pass --finetune-steps N)")
            return
        sampled = [p for p in self.finetune_positions if p != "plain"]
        if sampled and self.finetune_window is None:
            fail(
                "finetune_positions",
                list(self.finetune_positions),
                f"'plain' only without a fine-tuning window: {sampled[0]!r} spreads a short window's positions over "
                "the target, so pass --finetune-window (e.g. a quarter of the target)",
            )
        dropping = [m for m in self.methods or () if drops(m)]
        if sampled and dropping:
            fail(
                "finetune_positions",
                list(self.finetune_positions),
                f"'plain' with method {dropping[0]!r}: DroPE's recalibration reads plain positions, as its authors "
                "train it, and without RoPE no position id reaches attention, so a pose or random fine-tune would "
                "be the plain one under another name (measure them for the other methods in a study without drope)",
            )
        if sampled and self.task == "passkey":
            fail("finetune_positions", list(self.finetune_positions), "'plain' with task passkey (pose and random "
                 "cut or spread running text; the passkey task's prompts are trained whole)")
        if self.dtype in ("bfloat16", "float16"):
            fail("dtype", self.dtype, "float32 (or left out) when fine-tuning: AdamW's small updates are lost in "
                 f"{self.dtype} weights")

    def to_dict(self) -> dict:
        """Every field by name, but ``baseline`` only when False: settings files written before it existed
        (``extend.json``, ``pick.json``) are still the same settings."""
        out = super().to_dict()
        if out.get("baseline") is True:
            del out["baseline"]
        return out

    @property
    def has_multiples(self) -> bool:
        """Whether a length is still a multiple of the original context (``"2x"``), not yet resolved to tokens."""
        values = (*(self.lengths or ()), self.eval_tokens, self.finetune_window)
        return any(isinstance(v, str) for v in values)

    def finetune_window_for(self, target: int) -> int:
        """Tokens per fine-tuning sequence for a ``target`` context: ``finetune_window``, or the target."""
        return target if self.finetune_window is None else tokens(self.finetune_window, "finetune_window")

    @property
    def adaptive(self) -> bool:
        """Whether rates are sampled in rounds until clear (``stop_width`` > 0) rather than at fixed counts."""
        return bool(self.stop_width)

    @property
    def is_new(self) -> bool:
        return self.model == NEW or self.model.startswith(NEW + ":")

    def resolved_device(self) -> str:
        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.device


def check_lengths(lengths: Sequence[int], original: int) -> None:
    """At least one evaluation length beyond the original context (what extension is for); shorter ones are
    allowed, as in-context references."""
    if max(lengths) <= original:
        fail(
            "lengths",
            list(lengths),
            f"lengths with at least one beyond the original context of {original} tokens (none beyond it)",
        )


def resolve_length(name: str, value: int | str, original: int) -> int:
    """``value`` in tokens: an integer as given; a multiple ``"mx"`` as ``round(m * original)`` (as the plans'
    default multiples), refused where that is under one token."""
    if not isinstance(value, str):
        return value
    tokens = round(float(value[:-1]) * original)
    if tokens < 1:
        fail(name, value, f"a multiple giving at least one token of the original context {original}")
    return tokens


def resolved_forms(cfg: ExtendConfig, original: int) -> dict[str, Any]:
    """The settings of ``cfg`` given as multiples, in tokens of ``original``."""
    out: dict[str, Any] = {}
    if cfg.lengths is not None:
        out["lengths"] = tuple(resolve_length("lengths", n, original) for n in cfg.lengths)
    for name in ("eval_tokens", "finetune_window"):
        if getattr(cfg, name) is not None:
            out[name] = resolve_length(name, getattr(cfg, name), original)
    return out


def resolve_lengths(cfg: ExtendConfig, original: int) -> ExtendConfig:
    """``cfg`` with every length given as a multiple of the original context (``"2x"``) in tokens of ``original``,
    checked again as integers (at least one length past the original, ``eval_tokens`` >= the longest)."""
    if not cfg.has_multiples:
        return cfg
    return dataclasses.replace(cfg, **resolved_forms(cfg, original))
