"""RULER through EleutherAI's lm-evaluation-harness, in process: the field's long-context benchmark on a patched model.

RULER (Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context Language Models?",
https://arxiv.org/abs/2404.06654) as ``lm-eval`` 0.4.13 implements it (``pip install "lm-eval[ruler]==0.4.13"``):
lm-eval's own task code builds each document from the model's tokenizer at each length and scores the answers
(``string_match_all``: the share of the expected strings found in the output). posenc writes no second RULER; it

- checks the tasks (:data:`OFFLINE_TASKS` build their data here; the others download a haystack or a QA set) and
  the lengths before any weight is loaded: documents are built first, with lm-eval's own seeds (``random`` 0,
  ``numpy`` 1234, ``torch`` 1234, as ``lm_eval.simple_evaluate``), so the ``lm_eval`` command line rebuilds them;
- selects the first ``samples`` documents *of each length* (lm-eval generates 500 per length, stacked by length,
  so its ``--limit`` only ever tests the first length);
- evaluates an in-memory (patched) model through lm-eval's ``HFLM`` with ``max_length`` = the longest prompt,
  generation prefix included, + the generation bound, and closes HFLM's silent left truncation: a prompt longer
  than ``max_length - max_gen_toks`` is a ``ValueError`` (:func:`evaluate`), not a log line;
- bounds generation per task (:data:`GEN_TOKENS`) and prints the ``lm_eval`` command that gives the same numbers for
  a saved model folder (:func:`lm_eval_command`).

Scores are means over samples of values in [0, 1] (0/1 for single-needle tasks); their 95% interval is Wilson's with
``hits = sum of scores``, which is conservative for fractional scores (a [0, 1] variable of mean p has variance at
most p (1 - p)).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import os
import random
import shlex
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from posenc._checks import fail

LM_EVAL_VERSION = "0.4.13"
PIP = f'pip install "lm-eval[ruler]=={LM_EVAL_VERSION}"'
#: RULER tasks whose documents lm-eval builds offline from the tokenizer (synthetic haystacks).
OFFLINE_TASKS = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "ruler_vt", "ruler_cwe", "ruler_fwe")
_ESSAYS = "Paul Graham's essays from the Hugging Face hub"
#: RULER tasks that download their data (not reachable offline), and what they download.
NETWORK_TASKS = {
    "niah_single_2": _ESSAYS, "niah_single_3": _ESSAYS, "niah_multikey_1": _ESSAYS, "niah_multiquery": _ESSAYS,
    "niah_multivalue": _ESSAYS, "ruler_qa_squad": "SQuAD from its URL", "ruler_qa_hotpot": "HotpotQA from its URL",
    "ruler": "the whole suite, whose essay and QA tasks download data",
}
#: Tokens generated per answer. lm-eval's own bound for vt (30), cwe (120) and fwe (50); for the needle tasks 32
#: (one 7-digit number) and 64 (one UUID) instead of lm-eval's 128: the answer is at most ~12 / ~40 tokens in common
#: tokenizers and the task's generation prefix makes the model say it first, so the extra decode steps only cost time.
GEN_TOKENS = {
    "niah_single_1": 32, "niah_multikey_2": 32, "niah_multikey_3": 64, "ruler_vt": 30, "ruler_cwe": 120,
    "ruler_fwe": 50,
}
DEFAULT_TASKS = ("niah_single_1",)
#: Documents lm-eval generates per task and length (fewer where a sample cannot be fitted).
DOCUMENTS_PER_LENGTH = 500
#: lm-eval's ``simple_evaluate`` seeds, set before its documents are built (so the CLI builds the same ones).
SEEDS = {"random": 0, "numpy": 1234, "torch": 1234}


def check_tasks(tasks: Sequence[str]) -> tuple[str, ...]:
    """The tasks, each once, each one lm-eval builds offline; else a ValueError naming the task and the offline ones."""
    if isinstance(tasks, (str, bytes)) or not isinstance(tasks, Sequence) or not tasks:
        fail("ruler_tasks", tasks, f"a non-empty list of RULER tasks from {list(OFFLINE_TASKS)}")
    for task in tasks:
        if task in NETWORK_TASKS:
            fail(
                "ruler_tasks",
                task,
                f"a RULER task that builds its data offline, one of {list(OFFLINE_TASKS)} ({task} downloads "
                f"{NETWORK_TASKS[task]})",
            )
        if task not in OFFLINE_TASKS:
            fail("ruler_tasks", task, f"a RULER task of lm-eval {LM_EVAL_VERSION}, one of {list(OFFLINE_TASKS)}")
    if len(set(tasks)) != len(tasks):
        fail("ruler_tasks", list(tasks), "each task once")
    return tuple(tasks)


def require() -> None:
    """lm-eval with its RULER extras importable, else a ValueError with the pip command."""
    try:
        with _quiet():  # nltk binds its download-error stream at import: lm-eval's offline punkt_tab retry stays quiet
            import lm_eval  # noqa: F401
            import nltk  # noqa: F401
            import wonderwords  # noqa: F401
            from lm_eval.models.huggingface import HFLM  # noqa: F401
    except ImportError as err:
        fail("task", "ruler", f"lm-evaluation-harness with its RULER extras installed ({err.name} is missing): {PIP}")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """lm-eval's tqdm bars, prints and INFO/WARNING logs off (the study prints its own progress); errors still raise."""
    loggers = [logging.getLogger(n) for n in ("lm_eval", "lm-eval", "nltk", "datasets")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)


@contextlib.contextmanager
def _seeded() -> Iterator[None]:
    """lm-eval's seeds inside, the caller's random states restored after."""
    import numpy as np

    states = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    random.seed(SEEDS["random"])
    np.random.seed(SEEDS["numpy"])
    torch.manual_seed(SEEDS["torch"])
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.set_rng_state(states[2])


@functools.cache
def _cwe_rng_state() -> object:
    """ruler_cwe draws from a module-level ``random.Random(42)``: its state at import, restored before each build so
    that every build in a process gives the documents a fresh ``lm_eval`` process gives."""
    with _quiet():
        from lm_eval.tasks.ruler import cwe_utils
    return cwe_utils.RNG.getstate()


def _ruler_dir() -> str:
    import lm_eval

    return os.path.join(os.path.dirname(lm_eval.__file__), "tasks", "ruler")


def shortest_length(task: str, tokenizer: Any, length: int) -> int:
    """The shortest ``max_seq_length`` at which lm-eval can build ``task``'s documents with this tokenizer (vt and cwe
    only; 0 for the others, whose builders fail cleanly). Their sample loops retry forever, inside a bare ``except``,
    when the smallest haystack does not fit; this measures that smallest sample with their own generators."""
    if task not in ("ruler_vt", "ruler_cwe"):
        return 0
    state = random.getstate()
    try:
        with _quiet():
            if task == "ruler_vt":
                from lm_eval.tasks.ruler import vt_utils as vt

                example, answer = vt.generate_input_output(5, 1, 4, is_icl=True)  # the in-context example
                shown = example + " " + " ".join(answer) + "\n\n"
                sample, _ = vt.generate_input_output(10, 1, 4)  # the fewest noises the sample loop tries
                return len(tokenizer(shown).input_ids) + len(tokenizer(sample).input_ids) + 30 + 16
            from lm_eval.tasks.ruler import cwe_utils as cwe

            rng = cwe.RNG.getstate()
            try:
                _, sample, _ = cwe.generate_input_output(10, length)
            finally:
                cwe.RNG.setstate(rng)
            return len(tokenizer(sample).input_ids) + 120 + 16
    finally:
        random.setstate(state)


@dataclass
class Suite:
    """The built RULER documents of a study: lm-eval task objects and which documents each length tests.

    Attributes:
        tasks: task name -> lm-eval ``ConfigurableTask`` (documents built, generation bound set).
        samples: task -> length -> document indices in lm-eval's test split (the first ``n`` of that length).
        prompt_tokens: task -> length -> tokens of the longest selected prompt (generation prefix included).
        lengths: the lengths, ascending (lm-eval's ``max_seq_lengths``).
    """

    tasks: dict[str, Any]
    samples: dict[str, dict[int, list[int]]]
    prompt_tokens: dict[str, dict[int, int]]
    lengths: tuple[int, ...]

    def max_length(self, task: str, length: int) -> int:
        """``max_length`` for lm-eval's HFLM: the longest prompt whole plus the generation bound."""
        return self.prompt_tokens[task][length] + GEN_TOKENS[task]

    def longest(self) -> int:
        return max(self.max_length(t, n) for t in self.tasks for n in self.lengths)


def build(tasks: Sequence[str], tokenizer: Any, lengths: Sequence[int], samples: int) -> Suite:
    """Build ``tasks``' documents at ``lengths`` with lm-eval and select ``samples`` per length; no model needed.

    The tokenizer is saved to a temporary folder, which lm-eval's builders load by name (as the ``lm_eval`` CLI loads
    ``pretrained=FOLDER``'s). Raises ValueError: a length too short for a task's prompt, more samples than lm-eval
    generated at a length.
    """
    tasks = check_tasks(tasks)
    require()
    lengths = tuple(sorted(set(lengths)))
    for task in tasks:
        for length in lengths:
            need = shortest_length(task, tokenizer, length)
            if length < need:
                fail(
                    "lengths",
                    length,
                    f"lengths of at least {need} tokens for RULER {task} with this tokenizer (its shortest prompt "
                    "and answer); drop the shorter lengths or this task",
                )
    from lm_eval.tasks import TaskManager

    _cwe_rng_state()
    with tempfile.TemporaryDirectory(prefix="posenc-ruler-tokenizer-") as folder:
        tokenizer.save_pretrained(folder)
        built = {}
        for task in tasks:  # one at a time, each from lm-eval's seeds: as the CLI builds a task of its own
            manager = TaskManager(
                include_path=_ruler_dir(), include_defaults=False,
                metadata={"max_seq_lengths": list(lengths), "tokenizer": folder},
            )
            if task == "ruler_cwe":
                from lm_eval.tasks.ruler import cwe_utils

                cwe_utils.RNG.setstate(_cwe_rng_state())
            try:
                with _quiet(), _seeded():
                    built[task] = manager.load([task])["tasks"][task]
            except ValueError as err:  # lm-eval: "Could not generate any sample ... at max_seq_length=N"
                fail("lengths", list(lengths), f"lengths at which lm-eval can build RULER {task}: {err}")
    selected: dict[str, dict[int, list[int]]] = {}
    prompt_tokens: dict[str, dict[int, int]] = {}
    for task, obj in built.items():
        obj.set_config(key="generation_kwargs", value={"max_gen_toks": GEN_TOKENS[task]}, update=True)
        selected[task] = select([int(n) for n in obj.test_docs()["max_length"]], lengths, samples, task)
        with _quiet():
            obj.build_all_requests(samples=[i for n in lengths for i in selected[task][n]])
        tokens: dict[int, int] = {}  # length -> tokens of its longest prompt (instances carry their document)
        for inst in obj.instances:
            n = int(inst.doc["max_length"])
            tokens[n] = max(tokens.get(n, 0), len(tokenizer(inst.args[0]).input_ids))
        prompt_tokens[task] = tokens
    return Suite(tasks=built, samples=selected, prompt_tokens=prompt_tokens, lengths=lengths)


def select(doc_lengths: Sequence[int], lengths: Sequence[int], samples: int, task: str) -> dict[int, list[int]]:
    """length -> the indices of the first ``samples`` documents of that length, from each document's
    ``max_length`` in lm-eval's order (its lengths stacked one after another); ValueError where there are fewer."""
    selected = {}
    for length in lengths:
        indices = [i for i, n in enumerate(doc_lengths) if n == length]
        if len(indices) < samples:
            fail(
                "ruler_samples",
                samples,
                f"at most {len(indices)}: lm-eval generated {len(indices)} documents of {task} at {length} tokens",
            )
        selected[length] = indices[:samples]
    return selected


@functools.cache
def _whole_prompt_lm() -> type:
    """lm-eval's HFLM that refuses to truncate a prompt, and reports each generated answer."""
    from lm_eval.models.huggingface import HFLM

    from posenc.lab.extend.needles.shared_prefix import SharedPrefix, cache_name, split_cached_attention

    class WholePromptHFLM(HFLM):
        on_answer: Callable[[], None] | None = None
        #: Answer the documents of one ``generate_until`` on copies of their shared prefix's KV cache, where exact
        #: (``posenc.lab.extend.needles.shared_prefix``); lm-eval still builds, stops and scores every answer. Off by
        #: default.
        share_prefix: bool = False
        shared: SharedPrefix | None = None

        def tok_batch_encode(self, strings, padding_side="left", left_truncate_len=None, truncation=False):  # noqa: ANN001, ANN202
            ids, mask = super().tok_batch_encode(strings, padding_side=padding_side, truncation=truncation)
            if left_truncate_len is not None and ids.shape[1] > left_truncate_len:
                fail(
                    "max_length",
                    self.max_length,
                    f"room for the whole prompt: it has {ids.shape[1]} tokens and max_length - max_gen_toks leaves "
                    f"{left_truncate_len}; lm-eval would cut its first {ids.shape[1] - left_truncate_len} tokens",
                )
            return ids, mask

        def generate_until(self, requests, disable_tqdm: bool = True):  # noqa: ANN001, ANN201
            self.shared = None
            if self.share_prefix and len(requests) > 1:  # the contexts as HFLM encodes them (batch 1: no padding)
                self.shared = SharedPrefix(self.model, [self.tok_batch_encode([r.args[0]])[0] for r in requests])
            try:
                return super().generate_until(requests, disable_tqdm=True)
            finally:
                self.shared = None  # its cache is dropped with the requests

        def _model_generate(self, context, max_length, stop, **kwargs):  # noqa: ANN001, ANN003, ANN202
            cache = None if self.shared is None else self.shared.cache_for(context)
            if cache is None:
                out = super()._model_generate(context, max_length, stop, **kwargs)
            else:
                with split_cached_attention():
                    out = super()._model_generate(
                        context, max_length, stop, **{cache_name(self.model): cache, **kwargs}
                    )
            if self.on_answer is not None:
                self.on_answer()
            return out

    return WholePromptHFLM


def language_model(model: torch.nn.Module, tokenizer: Any, max_length: int, device: str) -> Any:
    """``model`` (already built, possibly patched) as lm-eval's HFLM with the truncation guard, batch size 1."""
    require()
    with _quiet():
        return _whole_prompt_lm()(pretrained=model, tokenizer=tokenizer, max_length=max_length, batch_size=1,
                                  device=device)


@dataclass(frozen=True)
class Score:
    """One task at one length: ``hits`` (sum of per-sample scores in [0, 1]) over ``n`` samples."""

    hits: float
    n: int
    answers: tuple[str, ...]
    scores: tuple[float, ...] = ()  # each document's score, in the selected order

    @property
    def accuracy(self) -> float:
        return self.hits / self.n


def parse(results: dict, task: str, length: int, expected: Sequence[int]) -> Score:
    """The score of ``task`` at ``length`` from ``lm_eval.evaluator.evaluate``'s output (``log_samples=True``): each
    logged sample's metric named by its length (lm-eval's ``process_results``), in ``expected`` document order."""
    logged = {s["doc_id"]: s for s in results.get("samples", {}).get(task, [])}
    if sorted(logged) != sorted(expected):
        fail("results", sorted(logged), f"lm-eval's samples {sorted(expected)} of {task} at {length} tokens")
    scores = []
    for i in expected:
        value = logged[i].get(str(length))
        if not isinstance(value, (int, float)) or not 0 <= value <= 1:
            fail("results", value, f"a score in [0, 1] for {task} document {i} at {length} tokens")
        scores.append(float(value))
    answers = tuple(str(logged[i]["filtered_resps"][0]) for i in expected)
    return Score(hits=sum(scores), n=len(scores), answers=answers, scores=tuple(scores))


def evaluate(
    suite: Suite, model: torch.nn.Module, tokenizer: Any, task: str, length: int, *, device: str,
    on_answer: Callable[[], None] | None = None, share_prefix: bool = False,
) -> Score:
    """``task``'s selected documents at ``length`` on ``model``, greedy, batch size 1, each prompt whole.

    ``share_prefix``: the documents' common haystack (each one's tokens up to its needle) goes through the model
    once and each answer is generated on a copy of its KV cache, where that gives the same answers
    (``posenc.lab.extend.needles.shared_prefix``: not for dynamic, longrope, dca, dca_vllm). Off by default (False:
    lm-eval's own generation): see ``passkey.hf_accuracy``.
    """
    from lm_eval import evaluator

    from posenc.lab.extend.needles.passkey import past_max_length_allowed

    lm = language_model(model, tokenizer, suite.max_length(task, length), device)
    lm.on_answer = on_answer
    lm.share_prefix = share_prefix
    indices = suite.samples[task][length]
    with _quiet(), past_max_length_allowed():
        results = evaluator.evaluate(lm, {task: suite.tasks[task]}, samples={task: indices}, log_samples=True)
    return parse(results, task, length, indices)


def lm_eval_command(folder: str | Path, suite: Suite, task: str, *, device: str = "cpu", dtype: str = "float32") -> str:
    """The ``lm_eval`` command line that evaluates a saved model folder (``posenc extend --save``) on the same
    documents with the same bounds, so its numbers can be compared with the study's."""
    samples = json.dumps({task: [i for n in suite.lengths for i in suite.samples[task][n]]}, separators=(",", ":"))
    lengths = json.dumps({"max_seq_lengths": list(suite.lengths)}, separators=(",", ":"))
    longest = max(suite.max_length(task, n) for n in suite.lengths)
    model_args = shlex.quote(f"pretrained={folder},dtype={dtype},max_length={longest}")  # a folder with spaces
    return (
        f"lm_eval --model hf --model_args {model_args} --device {device} "
        f"--batch_size 1 --tasks {task} --metadata '{lengths}' --gen_kwargs max_gen_toks={GEN_TOKENS[task]} "
        f"--samples '{samples}' --log_samples --output_path lm_eval_results"
    )
