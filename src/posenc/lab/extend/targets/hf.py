"""``HFTarget``: a pretrained transformers causal LM as ``posenc extend`` measures it (``base.PretrainedTarget``).

A pretrained model ``posenc.hf.resolve_model`` finds (a GGUF file, dequantized in memory; a transformers folder;
``smollm2``), loaded offline; patched by ``posenc.hf.extend_context`` on a deep copy (for per-layer-type RoPE, the
chosen layer types only), measured on the corpus tokenized with its own tokenizer, fine-tuned by a plain AdamW loop.
Everything ``run_extend`` checks comes from its config, tokenizer and a weight-free (meta-device) copy, patched there
too, before ``load`` reads a weight.

It measures perplexity through ``base.window_scores``: one pass over ``posenc.lab.common.corpus.eval_windows``, the
per-position losses of each window giving the whole-window score and the score past the original context together. A
pretrained model's forward is the fast one (``token_losses``): SDPA attention, float32 on CPU, inference mode, the
hidden states through the output head in ``HEAD_CHUNK``-row chunks (never the full (S, vocab) logits: 2.4 GB at 12k
tokens for
SmolLM2), checked against the model's own logits on real text when loaded.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from posenc._checks import check_choice, fail
from posenc.deploy.formats import save
from posenc.deploy.methods import parse, rebuild
from posenc.deploy.patch import apply
from posenc.deploy.source import load_tokenizer, meta_model, model_error, no_transformers_bars, patch_layer_types
from posenc.lab.common import evaluate as ev
from posenc.lab.common.corpus import load_corpus
from posenc.lab.common.train import TrainConfig, train
from posenc.lab.extend.needles import blind
from posenc.lab.extend.needles import keys as kd
from posenc.lab.extend.needles import passkey as pk
from posenc.lab.extend.settings import labels
from posenc.lab.extend.settings.config import ExtendConfig, filled, tokens
from posenc.lab.extend.targets import cost
from posenc.lab.extend.targets.base import Tick, finetune_text, window_batches, window_scores

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from posenc.lab.extend.needles.ruler import Score, Suite

#: Every method a transformers RoPE model takes without extra options (LongRoPE needs searched factors).
HF_ROPE_METHODS = ("linear", "ntk", "dynamic", "yarn", "llama3")
#: Methods of a pretrained RoPE model's default study: the two that need no fine-tuning (Peng et al. 2023).
HF_DEFAULT_METHODS = ("yarn", "dynamic")


class _Logits(torch.nn.Module):
    """A transformers causal LM as ``tokens (B, S) -> logits (B, S, V)``, the form ``ev.perplexity`` takes."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.encoding = None  # no posenc encoding: no length limit for evaluate.max_length

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=tokens).logits  # (B, S, V)


def _is_alibi(model_type: str) -> bool:
    from posenc.hf import ALIBI_MODEL_TYPES

    return model_type in ALIBI_MODEL_TYPES


def token_losses(model: PreTrainedModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Next-token losses of a transformers causal LM without its full logits: the decoder's last hidden states
    through the output head ``cost.HEAD_CHUNK`` rows at a time (with Gemma's final logit soft-capping).

    Shapes:
        x, y (B, S) int64 -> (B, S) float32.
    """
    hidden = model.base_model(input_ids=x, use_cache=False).last_hidden_state.flatten(0, 1)  # (B*S, Dm)
    head = model.get_output_embeddings()
    cap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    targets = y.flatten()  # (B*S,)
    out = torch.empty(targets.shape, dtype=torch.float32, device=x.device)
    for i in range(0, hidden.shape[0], cost.HEAD_CHUNK):
        logits = head(hidden[i : i + cost.HEAD_CHUNK])  # (chunk, V)
        if cap:  # as the model's own forward: in its dtype, before the loss's float32
            logits = torch.tanh(logits / cap) * cap
        rows = slice(i, i + cost.HEAD_CHUNK)
        out[rows] = F.cross_entropy(logits.float(), targets[rows], reduction="none")
    return out.view(y.shape)


def logits_losses(model: PreTrainedModel, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The reference for ``token_losses``: the model's own forward, full logits. Shapes: x, y (B, S) -> (B, S)."""
    logits = model(input_ids=x, use_cache=False).logits  # (B, S, V)
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="none").view(y.shape)


class HFTarget:
    """A pretrained causal LM: checked from its config, tokenizer and a meta-device copy, then loaded (``load``),
    patched by ``posenc.hf.extend_context`` on a copy, and measured on tokenized text."""

    kind = "hf"
    original_len: int  # for mypy (``base.Target``): ``__init__`` sets it from the settings or the config, else fails

    def __init__(self, cfg: ExtendConfig, out: Path, device: str, progress: bool) -> None:
        from posenc.hf import load_config, original_context, resolve_model

        if cfg.task == "passkey":
            fail(
                "task",
                cfg.task,
                "'lm' for a pretrained model (it is tested on passkey zero-shot); --task passkey trains lab models",
            )
        self.cfg, self.out, self.device, self.progress = cfg, out, device, progress
        self.source = resolve_model(cfg.model)  # GGUF header checks: format, truncation, architecture
        self.config = load_config(self.source)
        self.model_type = self.config.model_type
        label = self.source.label
        self.patch_types = patch_layer_types(cfg.layer_type, self.config, label)
        try:
            self.tokenizer = load_tokenizer(self.source)
        except (OSError, ValueError) as err:
            model_error(cfg.model, f"its tokenizer could not be loaded: {err}")
        meta = meta_model(self.config)
        self.class_name = type(meta).__name__
        self.dims = cost.ModelDims.of(self.config, sum(p.numel() for p in meta.parameters()))
        self.l0 = self.dims.l0  # the cost model's crossover length; calibrate() fits this machine's
        self.attn = "sdpa" if getattr(type(meta), "_supports_sdpa", False) else None
        self.name = f"{self.class_name} ({self.model_type}) from {label}"
        self.encoding = self.model_type
        original = cfg.original_len
        if original is None:
            try:
                original = original_context(self.source, layer_type=self.patch_types[0])
            except ValueError:
                fail("original_len", None, f"the context {label} was trained for (its config has none): --original-len")
        self.original_len = original
        params = getattr(self.config, "rope_parameters", None) or {}
        params = params.get(self.patch_types[0], params) if self.patch_types[0] else params
        proportional = isinstance(params, Mapping) and params.get("rope_type") == "proportional"
        self.default_methods = ("linear",) if _is_alibi(self.model_type) or proportional else HF_DEFAULT_METHODS
        self.min_passkey = pk.min_length(self.tokenizer)
        self.dtype = self._dtype()
        self.weight_bytes = self.act_bytes = torch.empty((), dtype=self.dtype).element_size()
        self.layers_note = ""
        self.remap_notes: dict[str, str] = {}  # remapping method -> its parameters, for the report
        self.model: PreTrainedModel | None = None  # ``load`` reads it
        self.val: torch.Tensor | None = None  # held-out tokens, read by ``use``
        self.train: torch.Tensor | None = None  # fine-tuning tokens, read by ``use`` where the study fine-tunes
        self._losses = token_losses
        self._prompts: dict = {}
        self._documents: dict[tuple[int, int, int], kd.KeyDocument] = {}  # (length, k, seed): built once, every method
        self.suite: Suite | None = None  # task ruler: the RULER documents (``build_ruler``)

    def _heldout(self) -> torch.Tensor:
        """The held-out tokens ``use`` read; read before it is a bug, refused."""
        if self.val is None:
            raise RuntimeError(f"{self.name}: its held-out tokens are read before use() read them")
        return self.val

    def _loaded(self) -> PreTrainedModel:
        """The unpatched model ``load`` read; read before it is a bug, refused."""
        if self.model is None:
            raise RuntimeError(f"{self.name}: its weights are read before load() read them")
        return self.model

    def _dtype(self) -> torch.dtype:
        """``cfg.dtype``, refused where the device cannot run it fast; None (auto): ``posenc.hf.dtypes.auto_dtype``
        (bfloat16 on a CPU with bfloat16 units, else float32; on CUDA the checkpoint's own half dtype)."""
        from posenc.hf.dtypes import auto_dtype, check_runs_fast

        if self.cfg.dtype is not None:
            dtype = getattr(torch, self.cfg.dtype)
            check_runs_fast("dtype", dtype, self.device)
            return dtype
        if self.cfg.finetune_steps:
            return torch.float32  # AdamW's updates need float32 weights (ExtendConfig refuses half ones)
        own = getattr(self.config, "dtype", None)
        if isinstance(own, str):
            own = getattr(torch, own, None)
        return auto_dtype(self.device, own if isinstance(own, torch.dtype) else None)

    def legacy_dtype(self) -> torch.dtype:
        """The dtype studies ran in before ``dtype`` was a setting (float32 on CPU): a resumed older study keeps it."""
        from posenc.hf.dtypes import auto_dtype

        return auto_dtype(self.device, None) if self.device.startswith("cuda") else torch.float32

    def use(self, cfg: ExtendConfig) -> None:
        """Take the study's settings with every default filled in; tokenize the corpus (no weights yet)."""
        self.cfg = cfg
        corpus = load_corpus(cfg.corpus, max_bytes=cfg.corpus_bytes)
        self.val = val = self._tokens(corpus.val)
        self.train = self._tokens(finetune_text(cfg, corpus.train)) if cfg.finetune_steps else None
        self.heldout_tokens = val.numel()
        self.train_tokens = 0 if self.train is None else self.train.numel()
        self.corpus_name = f"{cfg.corpus or 'the Python standard library'} (first {cfg.corpus_bytes} bytes)"

    def _tokens(self, data: torch.Tensor) -> torch.Tensor:
        text = bytes(data.tolist()).decode("utf-8", errors="replace").replace("\0", "\n\n")
        return torch.tensor(self.tokenizer(text, verbose=False)["input_ids"], dtype=torch.long)  # (N,)

    def forward_cost(self, length: int) -> float:
        return cost.forward_cost(length, self.l0)

    def windows(self, length: int) -> int:
        return cost.windows(self.heldout_tokens, length, tokens(self.cfg.eval_tokens, "eval_tokens"))

    def _extend(self, model: torch.nn.Module, method: str, factor: float) -> dict:
        """Patch ``model`` itself (``posenc.deploy.patch.apply``, every layer type the study patches); the report's
        notes kept (a remapping method's or DroPE's layers note does not replace one already shown)."""
        applied = apply(model, parse(method), factor, original=self.original_len, layer_types=self.patch_types,
                        config=self.config, layers=self.dims.layers)
        if applied.remap_note is not None:
            self.remap_notes[method] = applied.remap_note
        self.layers_note = (self.layers_note or applied.layers_note) if applied.keeps_note else applied.layers_note
        return applied.description

    def calls(self, method: str, factor: float) -> str:
        """The Python that rebuilds the model ``patched(method, factor)`` measures, from the model as given: loaded
        as ``load`` loads it, then patched by the calls ``_extend`` makes."""
        dtype = str(self.dtype).removeprefix("torch.")
        return rebuild(self.cfg.model, method, factor, dtype=dtype, original=self.original_len,
                       layer_types=self.patch_types)

    def check_patch(self, method: str, factor: float) -> dict:
        """The patch applied to a weight-free (meta) copy of the model: a method the model cannot take is refused
        before any weight is read. Returns what changed (``extend_context``'s description)."""
        if "longrope" in parse(method).parts:
            fail("methods", "longrope", "methods whose parameters follow from the factor: LongRoPE's per-frequency "
                 "long_factor comes from a search (no option of posenc extend sets it); in Python, "
                 "posenc.hf.extend_context(model, 'longrope', F, long_factor=[...]) applies a searched one",
                 )
        return self._extend(meta_model(self.config), method, factor)

    def load(self) -> None:
        """Read the weights (a GGUF dequantized in memory), and check the fast loss path against the model's logits
        on the first held-out tokens (else measure through the full logits)."""
        from posenc.hf import keep_rope_float32, load_causal_lm

        with no_transformers_bars():
            self.model = model = load_causal_lm(  # the tokenizer: the target's own (Pretrained.tokenizer)
                self.source, device=self.device, dtype=self.dtype, attn_implementation=self.attn, tokenizer=False
            )[0]
        keep_rope_float32(model)  # the unpatched model too: bfloat16 weights, RoPE in float32
        n = min(64, self.heldout_tokens - 1)
        val = self._heldout()
        x, y = val[None, :n].to(self.device), val[None, 1 : n + 1].to(self.device)  # (1, n) each
        with torch.inference_mode():
            fast, full = token_losses(model, x, y), logits_losses(model, x, y)
        tolerance = 1e-3 if self.dtype == torch.float32 else 5e-2
        if not torch.allclose(fast, full, rtol=tolerance, atol=tolerance):
            self._losses = logits_losses
            if self.progress:
                print(f"{self.class_name}: its head is not the plain output layer; measuring through full logits")

    def calibrate(self, lengths: Sequence[int], report: Callable[[str], None] | None = None
                  ) -> tuple[float, int, float]:
        """Seconds per ``forward_cost`` unit, and the cost model's crossover length ``l0``, from timed forwards on
        this machine (after a warm-up: the first forward pays kernel set-up and page faults).

        Forwards of up to 1024, 4096 and 8192 tokens (``cost.calibration_lengths``: as far as the study goes) fit
        ``t(n) = c + a*n + b*n**2`` (``cost.fit_forward_times``), whose crossover length ``a / b`` is this machine's
        ratio of attention to the weights' work (on SmolLM2, 12288 tokens took 5.3x a 4096-token forward on an Intel
        Xeon, 5.9x on an AMD EPYC) where it lies within 2x of the model's own (``cost.fitted_l0``: single timed
        forwards are noisy, and a noisy fit's crossover is far off); the seconds per unit come from the longest
        timed forward. One forward only (a study up to 2047 tokens): the model's own ``l0``. ``report`` gets a line
        per timed forward as it ends. Returns (seconds per unit, tokens of the longest timed forward, its seconds)."""
        sizes = cost.calibration_lengths(min(max(lengths), self.heldout_tokens - 1))
        times = []
        for i, n in enumerate(sizes):
            times.append(self._timed_forward(n, warm_up=i == 0))
            if report is not None:
                report(f"  timed forward {i + 1} of {len(sizes)}: {n} tokens in {times[-1]:.3g} s")
        fit = cost.fit_forward_times(list(zip(sizes, times, strict=True)))  # None from one forward
        self.l0 = cost.fitted_l0(fit, self.dims.l0)  # a fit that timing noise put far off: the model's own
        self.timed = (sizes, times)
        return times[-1] / self.forward_cost(sizes[-1]), sizes[-1], times[-1]

    def remap_cost(self, method: str, factor: float, length: int, report: Callable[[str], None] | None = None
                   ) -> tuple[float, str] | None:
        """A remapping method's forward time over the plain one, and how it was measured: one forward with
        ``method`` patched at the longest length ``calibrate`` timed (8192 tokens for a target beyond it), against
        the plain one there, not extrapolated to ``length``: the ratio levels off as attention comes to dominate both
        (Self-Extend x4 on SmolLM2, idle 2-core Xeon: 1.51x at 4,096, 1.96x at 8,192, 2.01x measured at 20,480),
        while extrapolating it through fits of single timed forwards gave 2.0x-8.35x for the same 20-32k on
        different calibrations. At least 1. None before ``calibrate`` timed two lengths (a study up to 2047
        tokens). ``report`` gets a line once the forward is timed."""
        timed = getattr(self, "timed", None)
        if timed is None or len(timed[0]) < 2:
            return None
        sizes, plain = timed
        n = sizes[-1]
        model, _ = self.patched(method, factor)
        seconds = self._timed_forward(n, warm_up=True, model=model)
        del model
        name = labels.label(method, factor, 0)
        if report is not None:
            report(f"  timed forward of {name}: {n} tokens in {seconds:.3g} s")
        return max(1.0, seconds / plain[-1]), (
            f"{name}: a {n}-token forward took {seconds:.3g} s against {plain[-1]:.3g} s plain, on this machine"
        )

    def _timed_forward(self, n: int, *, warm_up: bool, model: torch.nn.Module | None = None) -> float:
        """Seconds of one loss forward of ``n`` held-out tokens through ``model`` (default: the unpatched one);
        ``warm_up``: a 128-token forward first, untimed."""
        model = self._loaded() if model is None else model
        val = self._heldout()
        x, y = val[None, :n].to(self.device), val[None, 1 : n + 1].to(self.device)  # (1, n) each
        with torch.inference_mode():
            if warm_up:
                self._losses(model, x[:, :128], y[:, :128])
                _sync(self.device)
            start = time.perf_counter()
            self._losses(model, x, y)
            _sync(self.device)
        return time.perf_counter() - start

    def prepare(self) -> None:
        return

    def copy(self):  # noqa: ANN201
        return copy.deepcopy(self.model)

    def patched(self, method: str, factor: float) -> tuple[Any, dict]:
        model = self.copy()
        return model, self._extend(model, method, factor)

    def save(
        self, model: torch.nn.Module, folder: Path, *, tensor_type: str = "source", dtype: torch.dtype | None = None,
        check: bool = True,
    ) -> Path:
        """The patched model as a transformers folder (weights in ``dtype``; default the checkpoint's dtype, a
        GGUF's: the loaded one), or as a GGUF file when ``folder`` ends in ``.gguf`` (``posenc.hf.save_gguf`` from
        the source file). ``check``: print ``posenc check``'s table of what was written."""
        return save(model, folder, source=self.source, tokenizer=self.tokenizer, config=self.config,
                    tensor_type=tensor_type, dtype=dtype, check=check)

    def perplexity(self, model, length: int, tick: Tick | None = None,  # noqa: ANN001
                   max_tokens: int | None = None) -> tuple[ev.Score, ev.Score | None]:
        """Perplexity over ``max_tokens`` held-out tokens (default ``cfg.eval_tokens``) in windows of ``length``."""
        cost = self.forward_cost(length)
        return window_scores(
            lambda x, y: self._losses(model, x, y), self._heldout(), length=length,
            max_tokens=max_tokens if max_tokens is not None else tokens(self.cfg.eval_tokens, "eval_tokens"),
            original=self.original_len, batch=1, device=self.device,
            tick=None if tick is None else lambda n: tick(n * cost, n),
        )

    def passkey(self, model, length: int, depth: float, seed: int, tick: Tick | None = None,  # noqa: ANN001
                outcomes: list[float] | None = None) -> float:
        """Passkey accuracy over ``cfg.trials`` keys; ``outcomes`` gets each key's score (1.0 or 0.0)."""
        cost = self.forward_cost(length)
        return pk.hf_accuracy(
            model, self.tokenizer, length=length, depth=depth, trials=filled(self.cfg.trials, "trials"), seed=seed,
            prompts=self._prompts, on_trial=None if tick is None else lambda: tick(cost, 1), outcomes=outcomes,
        )

    def keys(self, model, length: int, k: int, seed: int, tick: Tick | None = None,  # noqa: ANN001
             how: str = "document") -> kd.KeyScores:
        """``model``'s answers to the ``k``-key document of ``length`` tokens drawn from ``seed``
        (``needles.keys``); the document is built once with the tokenizer and reused by every method. ``how``:
        "document" (every question after the document, one forward: ``keys.score_document``), "split" (each key in
        a blind branch, a causal prefill of the filler and one suffix: ``blind.score_blind``) or "branches" (the
        same branches in one forward with the T x T mask: ``keys.score_branches``)."""
        scorers: dict[str, Callable[..., kd.KeyScores]] = {
            "document": kd.score_document, "split": blind.score_blind,
            "branches": lambda m, d, tick: kd.score_branches(m, d, filler_sees_needles=False, tick=tick),
        }
        check_choice("how", how, tuple(scorers))
        slot = (length, k, seed)
        if slot not in self._documents:
            self._documents[slot] = kd.key_document(self.tokenizer, length, k, seed)
        cost = self.forward_cost(length)
        return scorers[how](model, self._documents[slot], tick=None if tick is None else lambda: tick(cost, 1))

    def build_ruler(self, lengths: Sequence[int]) -> Suite:
        """Task ruler: lm-eval builds its documents with this model's tokenizer (no weights needed)."""
        from posenc.lab.extend.needles import ruler

        tasks, samples = filled(self.cfg.ruler_tasks, "ruler_tasks"), filled(self.cfg.ruler_samples, "ruler_samples")
        self.suite = suite = ruler.build(tasks, self.tokenizer, lengths, samples)
        return suite

    def ruler(self, model, task: str, length: int, tick: Tick | None = None) -> Score:  # noqa: ANN001
        """``task``'s documents at ``length`` through lm-eval (``posenc.lab.extend.needles.ruler.evaluate``)."""
        from posenc.lab.extend.needles import ruler

        if self.suite is None:
            raise RuntimeError(f"{self.name}: RULER measured before build_ruler() built its documents")
        cost = self.forward_cost(length)
        return ruler.evaluate(
            self.suite, model, self.tokenizer, task, length, device=self.device,
            on_answer=None if tick is None else lambda: tick(cost, 1),
        )

    def finetune(self, model, label: str, target: int, positions: str = "plain") -> Path:  # noqa: ANN001
        """AdamW (no weight decay, warmup over ``finetune.warmup_steps``, then constant; gradients clipped at 1) on one
        window of ``cfg.finetune_window`` tokens per step (default the target) read at ``positions``, through the
        lab's resumable loop: checkpoints in ``OUT/runs/finetune-<label>`` at Ctrl-C / SIGTERM and every 5 minutes, the
        loss in its ``metrics.jsonl``. Returns that folder. ``pose`` and ``random`` positions are refused for an ALiBi
        model (BLOOM, MPT: no position ids; ``finetune.check_positions_reach``)."""
        from posenc.lab.extend.targets.finetune import CausalLMTrainer, check_positions_reach, run_folder, warmup_steps

        check_positions_reach((positions,), self.model_type)  # BLOOM and MPT drop position ids
        window = self.cfg.finetune_window_for(target)
        steps = self.cfg.finetune_steps
        tcfg = TrainConfig(
            steps=steps, batch_size=1, length=window, lr=self.cfg.finetune_lr or 2e-5, min_lr_ratio=1.0,
            warmup=warmup_steps(steps), weight_decay=0.0, seed=self.cfg.seed + 1, log_every=1, checkpoint_every=0,
            checkpoint_seconds=300.0,
        )
        description = {"model": self.name, "fine-tune": label, "target": target, "window": window,
                       "positions": positions, "dtype": str(self.dtype)}
        trainer = CausalLMTrainer(model, description)
        run_dir = run_folder(self.out, label)
        where = f"@{target}" + (f" in {window}-token windows" if window != target else "")
        if self.train is None:
            raise RuntimeError(f"{self.name}: fine-tuned without a text to fine-tune on (use() reads one)")
        batches = window_batches(self.train, window, target, positions, 1, self.cfg.seed + 1)
        with torch.inference_mode(False):
            train(trainer, batches, tcfg, run_dir, progress=self.progress, description=f"fine-tune {label} {where}")
        model.eval()
        return run_dir


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
