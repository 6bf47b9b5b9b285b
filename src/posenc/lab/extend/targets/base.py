"""The interface every ``posenc extend`` target has, and what the two targets share.

A *target* is one model behind the few members the study (``study.run``), its plan and report (``study.plan``,
``study.report``) and the pick (``pick.run``) use: it loads its model, knows
its original context, patches a fresh copy for a method and factor (and checks the patch took: a model is never
measured unpatched as if patched), and measures perplexity, passkey accuracy and fine-tunes at a target length.
Those members are written down here, checked by mypy against both targets (``load``):

- ``Target``: what every target has -- ``targets.lab.LabTarget`` (a byte-level lab ``GPT``) and
  ``targets.hf.HFTarget`` (a transformers causal LM).
- ``PretrainedTarget``: what ``HFTarget`` adds, used only where ``kind != "lab"`` (the study and the plan branch on
  ``kind``; the pick refuses a lab model): its source files, size, RULER, the Python of a patch, saving.

``load.load_target`` picks the target for a model. Both targets measure perplexity through ``window_scores`` (one pass
over ``posenc.lab.common.corpus.eval_windows``, the per-position losses of each window giving the whole-window score
and the score past the original context together) and fine-tune on ``finetune_text`` in ``window_batches``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch

from posenc._checks import fail
from posenc.lab.common import evaluate as ev
from posenc.lab.common.corpus import eval_windows, load_corpus
from posenc.lab.common.train import step_generator
from posenc.lab.extend.settings.config import ExtendConfig

if TYPE_CHECKING:
    from posenc.hf.load import ModelSource
    from posenc.lab.extend.needles.keys import KeyScores
    from posenc.lab.extend.needles.ruler import Score as RulerScore
    from posenc.lab.extend.needles.ruler import Suite
    from posenc.lab.extend.targets.cost import ModelDims

Tick = Callable[..., None]  # tick(cost, forwards=1): one measured forward, for the study's progress


class Target(Protocol):
    """What the study, its plan and report and the pick use of any target (``LabTarget``, ``HFTarget``).

    The life of a target in a study (``study.run.run_extend``): built by ``load.load_target`` from the settings (a
    pretrained model: config and tokenizer only, no weights); ``use`` takes the settings with every default filled in
    (``study.plan.resolve``, from ``kind``, ``original_len`` and ``default_methods``) and reads the held-out text;
    ``check_patch`` refuses a method before anything is measured; ``load`` reads the weights; ``prepare`` trains what
    the task needs first; then, per method and factor, ``patched`` (or ``copy`` for the unpatched model, fine-tuned)
    gives the model that ``perplexity`` and ``passkey`` measure and ``finetune`` trains.

    Attributes (read by the study, the plan, the report and the pick; ``cfg`` is also set):
        cfg: the study's settings (``use`` sets it; the study swaps in a copy with ``trials`` set for one round).
        dtype: the dtype the model is measured in.
        model: the loaded model, unpatched (method ``none`` is measured on it); None before ``load`` (pretrained).
        train_tokens: tokens of the fine-tuning text ``use`` read (``study.plan.check_finetune``; a lab model sets it
            for task ``lm`` only, the one where a lab model is fine-tuned on text).
    """

    cfg: ExtendConfig
    dtype: torch.dtype
    model: Any
    train_tokens: int

    @property
    def kind(self) -> str:
        """``"lab"`` or ``"hf"``: the study, its plan and report and the pick branch on it."""

    @property
    def name(self) -> str:
        """The model in words, for messages and the report (``lab GPT runs/rope``, ``LlamaForCausalLM (llama) from
        ...``)."""

    @property
    def device(self) -> str:
        """The device it runs on (``cuda:0``, ``cpu``), as resolved from ``cfg.device``; the report's environment."""

    @property
    def original_len(self) -> int:
        """The context the model was trained for (``cfg.original_len`` if given): lengths and factors are multiples
        of it, and ``ppl_past`` scores the positions at and past it."""

    @property
    def default_methods(self) -> Sequence[str]:
        """The methods a study measures when ``cfg.methods`` is left out (``study.plan.resolve``)."""

    @property
    def min_passkey(self) -> int:
        """The shortest length a passkey prompt fits in (bytes or tokens); shorter lengths are reported n/a."""

    @property
    def layers_note(self) -> str:
        """Which layers a patch changes, in words, for the report (set by the patches; "" before one, pretrained)."""

    def legacy_dtype(self) -> torch.dtype:
        """The dtype studies ran in before ``dtype`` was a setting: a resumed older study keeps it."""

    def use(self, cfg: ExtendConfig) -> None:
        """Take the study's settings with every default filled in (``cfg``), and read the text they need."""

    def load(self) -> None:
        """Read the weights (a pretrained model; a lab model was loaded when built)."""

    def calibrate(self, lengths: Sequence[int]) -> tuple[float, int, float] | None:
        """Time forwards on this machine for the study's estimate: (seconds per ``forward_cost`` unit, tokens of the
        longest timed forward, its seconds); None where no forward is timed (a lab model)."""

    def forward_cost(self, length: int) -> float:
        """One forward of ``length`` tokens in the cost model's units (``cost.forward_cost``)."""

    def windows(self, length: int) -> int:
        """The forwards perplexity at ``length`` makes over the held-out text (``cost.windows``)."""

    def prepare(self) -> None:
        """What the task needs before any method is measured (a lab model on ``--task passkey``: train it)."""

    def copy(self) -> Any:
        """A deep copy of the unpatched model (the study fine-tunes method ``none`` on one)."""

    def check_patch(self, method: str, factor: float) -> dict:
        """Patch a copy (a pretrained model: a weight-free one), to refuse a method before anything is measured;
        returns what changed."""

    def patched(self, method: str, factor: float) -> tuple[Any, dict]:
        """A fresh copy of the model patched with ``method`` at ``factor`` (``yarn+string`` names included), and
        what changed; a patch that changes nothing is refused."""

    def perplexity(self, model: Any, length: int, tick: Tick | None = None) -> tuple[ev.Score, ev.Score | None]:
        """``model``'s scores at ``length`` over whole windows and past ``original_len`` (None when ``length`` is not
        past it), through ``window_scores``; ``tick(cost, forwards)`` after each batch."""

    def passkey(self, model: Any, length: int, depth: float, seed: int, tick: Tick | None = None) -> float:
        """The share of ``cfg.trials`` passkeys ``model`` retrieves at ``length`` and ``depth``, keys drawn from
        ``seed``."""

    def finetune(self, model: Any, label: str, target: int, positions: str = "plain") -> Path:
        """Fine-tune ``model`` (in place) for a ``target`` context, windows read at ``positions``
        (``targets.finetune``); returns its resumable run folder, ``OUT/runs/finetune-<label>``."""


class PretrainedTarget(Target, Protocol):
    """What ``HFTarget`` adds to ``Target``, used where ``kind != "lab"``: by the study (RULER, ``--save``, its
    plan's time estimate), the plan's checks (held-out tokens, memory), the report and the pick (all of it: a lab model
    is refused).

    Attributes:
        source: where the model is (``posenc.hf.ModelSource``: a GGUF file or a transformers folder); ``--save`` to a
            ``.gguf`` needs a GGUF source.
        model_type: the config's ``model_type`` (``llama``, ``qwen2``, ``bloom``): what ALiBi, the remapping patches
            and the formats that save them support.
        dims: the sizes the memory and time estimates use (``cost.ModelDims``).
        weight_bytes: bytes per weight in ``dtype`` (the plan's memory check).
        act_bytes: bytes per activation in ``dtype`` (the plan's memory check).
        heldout_tokens: tokens of held-out text ``use`` tokenized: the longest length is at most this minus one.
        corpus_name: that text, in words, for messages.
        attn: the attention implementation the weights are loaded with (``sdpa``; None: the model's default).
        suite: task ruler: the RULER documents (``needles.ruler.Suite``) ``build_ruler`` built; None before. The
            study swaps in one round's documents around each ``ruler`` call.
        remap_notes: remapping method -> its parameters in words, for the report.
        tokenizer: the model's tokenizer (transformers'): passkey prompts, RULER's documents, ``--save``.
        config: the model's ``PretrainedConfig``: ``--save`` writes it.
    """

    source: ModelSource
    model_type: str
    dims: ModelDims
    weight_bytes: int
    act_bytes: int
    heldout_tokens: int
    corpus_name: str
    attn: str | None
    suite: Suite | None
    remap_notes: dict[str, str]
    tokenizer: Any
    config: Any

    def calibrate(self, lengths: Sequence[int], report: Callable[[str], None] | None = None
                  ) -> tuple[float, int, float]:
        """Seconds per ``forward_cost`` unit, tokens of the longest timed forward and its seconds, from timed
        forwards on this machine (the pick's estimate; ``load`` first); ``report`` gets a line per timed forward."""

    def remap_cost(self, method: str, factor: float, length: int, report: Callable[[str], None] | None = None
                   ) -> tuple[float, str] | None:
        """A remapping method's forward time over the plain one at ``length`` tokens, and how it was measured (the
        pick's estimate); None before ``calibrate`` timed a long enough forward; ``report`` gets a line for it."""

    def perplexity(self, model: Any, length: int, tick: Tick | None = None, max_tokens: int | None = None
                   ) -> tuple[ev.Score, ev.Score | None]:
        """As ``Target.perplexity``, over ``max_tokens`` held-out tokens where given (the pick's cost inside the
        context: L tokens at L/4 and at L) instead of ``cfg.eval_tokens``."""

    def passkey(
        self, model: Any, length: int, depth: float, seed: int, tick: Tick | None = None,
        outcomes: list[float] | None = None,
    ) -> float:
        """As ``Target.passkey``; ``outcomes`` gets each key's score (1.0 or 0.0): ``samples.csv``, which the pick's
        rounds replay."""

    def keys(self, model: Any, length: int, k: int, seed: int, tick: Tick | None = None,
             how: str = "document") -> KeyScores:
        """``model``'s answers to the document of ``k`` keys at ``length`` tokens drawn from ``seed``
        (``needles.keys.key_document``, the same for every method), scored in one forward
        (``needles.keys.score_document``) or, by ``how``, each key in a blind branch ("split":
        ``needles.blind.score_blind``; "branches": ``needles.keys.score_branches``); ``tick(cost, 1)`` after it."""

    def build_ruler(self, lengths: Sequence[int]) -> Suite:
        """Task ruler: build lm-eval's documents at ``lengths`` with the tokenizer (no weights), kept in ``suite``."""

    def ruler(self, model: Any, task: str, length: int, tick: Tick | None = None) -> RulerScore:
        """``task``'s documents of ``suite`` at ``length``, answered by ``model`` through lm-eval."""

    def calls(self, method: str, factor: float) -> str:
        """The Python that rebuilds the model ``patched(method, factor)`` measures, from the model as given (the
        study's and the pick's advice where a format cannot save a patch)."""

    def save(
        self, model: Any, folder: Path, *, tensor_type: str = "source", dtype: torch.dtype | None = None,
        check: bool = True,
    ) -> Path:
        """Write ``model`` as a transformers folder (weights in ``dtype``, default the checkpoint's), or a GGUF file
        when ``folder`` ends in ``.gguf``; returns the path written (``--save``, the pick's save)."""


def as_pretrained(target: Target) -> PretrainedTarget:
    """``target`` as the pretrained target it is where the caller has branched on ``kind`` (``kind != "lab"``: the
    study, the plan and the report read ``PretrainedTarget``'s members there); a lab target is refused (a bug)."""
    if target.kind == "lab":
        raise TypeError(f"{target.name}: a pretrained target's members read from a lab model")
    return cast("PretrainedTarget", target)


@torch.inference_mode()
def window_scores(
    losses_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    data: torch.Tensor,
    *,
    length: int,
    max_tokens: int,
    original: int,
    batch: int,
    device: str,
    tick: Callable[[int], None] | None = None,
) -> tuple[ev.Score, ev.Score | None]:
    """Mean next-token loss over ``eval_windows(data, length, max_tokens)`` (non-overlapping windows, every target
    scored once), and over the targets predicted at positions ``>= original`` (None when ``length <= original``).

    A target ``y[:, t]`` is predicted at query position ``t``; the model was trained on positions ``0 ..
    original - 1``, so ``t >= original`` is where it has never been. Both scores come from the same losses.

    Shapes:
        data (N,) token ids; ``losses_of(x, y)``: x, y (n, length) int64 -> (n, length) float32 per-position losses.
    """
    total, count = torch.zeros((), dtype=torch.float64), 0
    past_total, past_count = torch.zeros((), dtype=torch.float64), 0
    beyond = torch.arange(length, device=device) >= original  # (length,)
    for x, y, mask in eval_windows(data, length=length, max_tokens=max_tokens, batch=batch):
        x, y, mask = x.to(device), y.to(device), mask.to(device)
        losses = losses_of(x, y)  # (n, length)
        total += losses[mask].double().sum().cpu()
        count += int(mask.sum())
        past = mask & beyond  # (n, length)
        past_total += losses[past].double().sum().cpu()
        past_count += int(past.sum())
        if tick is not None:
            tick(x.shape[0])
    if count == 0:
        fail("data", data.numel(), f"enough held-out tokens for one window of {length}")
    whole = ev.Score(loss=float(total / count), tokens=count)
    if length <= original:
        return whole, None
    if past_count == 0:  # the last window was moved back and rescored only targets before the original length
        return whole, ev.Score(loss=None, tokens=0, status="n/a")
    return whole, ev.Score(loss=float(past_total / past_count), tokens=past_count)


def finetune_text(cfg: ExtendConfig, train_split: torch.Tensor) -> torch.Tensor:
    """The bytes a study fine-tunes on: all of ``cfg.finetune_corpus``, or else ``train_split``, the training split
    of the evaluation corpus (either way disjoint from the held-out text)."""
    if cfg.finetune_corpus is None:
        return train_split
    source = Path(cfg.finetune_corpus).expanduser()
    if cfg.corpus is not None and source.resolve() == Path(cfg.corpus).expanduser().resolve():
        fail("finetune_corpus", cfg.finetune_corpus, "a text other than --corpus (perplexity reads its held-out part)")
    text = load_corpus(source, max_bytes=cfg.corpus_bytes, min_bytes=1)
    return torch.cat([text.train, text.val])  # (N,) uint8: all of it


def window_batches(tokens: torch.Tensor, window: int, target: int, positions: str, batch: int, seed: int):  # noqa: ANN202
    """The fine-tuning batches of ``tokens``: ``batch_fn(step, rank, world)`` -> this rank's rows of step ``step``'s
    windows (``finetune.finetune_batch``), each step drawn from its own generator (resumable, any world size)."""
    from posenc.lab.extend.targets.finetune import finetune_batch

    def batch_fn(step: int, rank: int, world: int):  # noqa: ANN202
        generator = step_generator(seed, step)
        x, y, mask, pos = finetune_batch(
            tokens, window=window, target=target, positions=positions, batch=batch, generator=generator
        )
        rows = slice(rank, batch, world)
        return x[rows], y[rows], mask, pos[rows]

    return batch_fn
