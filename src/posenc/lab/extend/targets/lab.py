"""``LabTarget``: a byte-level lab ``GPT`` as ``posenc extend`` measures it (``base.Target``).

A ``posenc lab`` run folder (``posenc.lab.common.train.load_model``) or a fresh ``GPT`` (``new``); patched by swapping
its encoding (``posenc.lab.common.scaling.scaled_encoding``), measured with ``posenc.lab.common.evaluate`` (perplexity
through ``base.window_scores``), fine-tuned with ``posenc.lab.common.train.train``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import posenc
from posenc._checks import fail
from posenc.lab.common import evaluate as ev
from posenc.lab.common.corpus import Corpus, load_corpus, train_batch
from posenc.lab.common.gpt import GPT, ModelConfig
from posenc.lab.common.scaling import EXTEND_METHODS, scaled_encoding
from posenc.lab.common.train import TrainConfig, load_model, step_generator, train
from posenc.lab.extend.needles import passkey as pk
from posenc.lab.extend.settings.config import ExtendConfig, drops, filled, token_lengths, tokens
from posenc.lab.extend.targets import cost
from posenc.lab.extend.targets.base import Tick, finetune_text, window_batches, window_scores


class LabTarget:
    """A byte-level lab ``GPT``: patched by swapping its encoding, measured with ``posenc.lab.common.evaluate``."""

    kind = "lab"

    def legacy_dtype(self) -> torch.dtype:
        return torch.float32

    def __init__(self, cfg: ExtendConfig, out: Path, device: str, progress: bool) -> None:
        self.cfg, self.out, self.device, self.progress = cfg, out, device, progress
        if cfg.layer_type is not None:
            fail("layer_type", cfg.layer_type, "None for a posenc lab model (one encoding serves all its layers)")
        if cfg.dtype not in (None, "float32"):
            fail("dtype", cfg.dtype, "float32 or auto for a posenc lab model (lab models run in float32)")
        if cfg.task == "ruler":
            fail(
                "task",
                cfg.task,
                "'lm' or 'passkey' for a posenc lab model: RULER runs through lm-eval on a pretrained model (a GGUF "
                "file, a transformers folder, smollm2) with a tokenizer; lab models read bytes",
            )
        self.dtype = torch.float32
        if cfg.is_new:
            encoding = cfg.model.partition(":")[2] or "rope"
            config = ModelConfig(dim=64, n_layers=2, n_heads=4, max_len=cfg.train_len, encoding=encoding)
            self.model = GPT(config, seed=cfg.seed).to(device)
            self.name = f"a fresh lab GPT ({encoding}, {cfg.train_len} bytes)"
        else:
            self.model = load_model(cfg.model, device=device)
            self.name = f"lab GPT {cfg.model}"
        self.encoding = self.model.config.encoding
        if self.encoding not in EXTEND_METHODS:
            fail(
                "model",
                cfg.model,
                f"a model with positional parameters posenc extend knows; its encoding is {self.encoding!r}, and only "
                f"{sorted(EXTEND_METHODS)} lab models can be extended",
            )
        self.original_len = cfg.original_len or self.model.config.max_len
        self.default_methods = EXTEND_METHODS[self.encoding]
        self.min_passkey = pk.MIN_CHARS + pk.DIGITS
        self.corpus: Corpus | None = None  # task lm: read by ``use``
        config = self.model.config
        params = sum(p.numel() for p in self.model.parameters())
        self.l0 = cost.ModelDims(
            params=params, layers=config.n_layers, hidden=config.dim, intermediate=4 * config.dim,
            heads=config.n_heads, kv_heads=config.n_heads, head_dim=config.dim // config.n_heads, vocab=256,
        ).l0
        self.layers_note = f"all {config.n_layers} layers (the model's one {self.encoding} encoding)"
        if cfg.task == "passkey" and self.original_len < self.min_passkey:
            fail(
                "model",
                cfg.model,
                f"a lab model trained at >= {self.min_passkey} bytes for --task passkey (the prompt and key need "
                f"that many); this one has {self.original_len}. Use MODEL 'new' (--train-len) instead",
            )

    def use(self, cfg: ExtendConfig) -> None:
        """Take the study's settings with every default filled in, and read the corpus they need."""
        self.cfg = cfg
        if cfg.task == "lm":
            factors = filled(cfg.factors, "factors")
            window = tokens(cfg.finetune_window, "finetune_window") if cfg.finetune_window else None
            window_bytes = window or self.original_len * max(factors)
            longest = max(*token_lengths(cfg), window_bytes if cfg.finetune_corpus is None else 1)
            self.corpus = load_corpus(cfg.corpus, max_bytes=cfg.corpus_bytes, min_bytes=int(longest) + 1)
            self.train_tokens = 0
            if cfg.finetune_steps:
                self.finetune_tokens = finetune_text(cfg, self.corpus.train)
                self.train_tokens = self.finetune_tokens.numel()

    def load(self) -> None:
        return  # loaded in __init__ (small)

    def _text(self) -> Corpus:
        """The corpus ``use`` read (task ``lm``); read before it (or on task ``passkey``) is a bug, refused."""
        if self.corpus is None:
            raise RuntimeError(f"{self.name}: its corpus is read before use() read it (task lm only)")
        return self.corpus

    def calibrate(self, lengths: Sequence[int]) -> None:
        return None  # tiny models: no time estimate worth a forward

    def forward_cost(self, length: int) -> float:
        return cost.forward_cost(length, self.l0)

    def windows(self, length: int) -> int:
        return cost.windows(self._text().val.numel(), length, tokens(self.cfg.eval_tokens, "eval_tokens"))

    def prepare(self) -> None:
        """Task passkey: train the retrieval task at the original length first (resumable, skipped once done)."""
        if self.cfg.task != "passkey":
            return
        tcfg = TrainConfig(
            steps=self.cfg.train_steps, batch_size=32, length=self.original_len, lr=3e-3, seed=self.cfg.seed
        )
        if self.progress:
            print(f"[passkey] training {self.name} on the passkey task at {self.original_len} bytes")
        train(
            self.model, self._batches(self.original_len, 32, self.cfg.seed), tcfg, self.out / "runs" / "passkey",
            progress=self.progress, description="passkey",
        )

    def _batches(self, length: int, batch: int, seed: int):  # noqa: ANN202
        def batch_fn(step: int, rank: int, world: int):  # noqa: ANN202
            generator = step_generator(seed, step)
            if self.cfg.task == "passkey":
                x, y, mask = pk.passkey_batch(batch, length, generator=generator)
            else:
                (x, y), mask = train_batch(self._text().train, length=length, batch=batch, generator=generator), None
            rows = slice(rank, batch, world)
            return x[rows], y[rows], None if mask is None else mask[rows]

        return batch_fn

    def copy(self):  # noqa: ANN201
        return copy.deepcopy(self.model)

    def check_patch(self, method: str, factor: float) -> dict:
        """Patch a copy, to refuse a method before anything is measured; returns what changed."""
        if drops(method) and (self.model.config.encoding != "rope"):
            fail("methods", method, "a method of this lab model: DroPE (drope) drops RoPE from a model that has one "
                 f"in every layer, and this one was trained with {self.model.config.encoding!r} (train one with "
                 "--encodings rope)")
        return self.patched(method, factor)[1]

    def patched(self, method: str, factor: float) -> tuple[Any, dict]:
        """A copy with ``method``'s encoding; ``drope`` (DroPE in miniature, SakanaAI/DroPE): RoPE dropped from every
        layer, the model then a NoPE one (``nope``) until ``finetune`` recalibrates it at the original context."""
        model = self.copy()
        before = model.encoding
        if drops(method):
            model.set_encoding(posenc.build("nope"))
            return model, {"method": method, "factor": factor, "encoding": {"name": "nope"}}
        model.set_encoding(scaled_encoding(model, method, factor=factor, original_len=self.original_len))
        after = model.encoding
        if after is before or after.config == before.config:  # never measure an unpatched model as if patched
            fail("method", method, f"a patch that changes the encoding; {after.config} is still the trained one")
        return model, {"method": method, "factor": factor, "encoding": after.config.to_dict()}

    def perplexity(self, model, length: int, tick: Tick | None = None) -> tuple[ev.Score, ev.Score | None]:  # noqa: ANN001
        """Whole-window and past-the-original scores (as ``ev.perplexity``: windows of 8, float64 sums)."""
        limit = ev.max_length(model)
        if limit is not None and length > limit:
            na = ev.Score(loss=None, tokens=0, status="n/a")
            return na, (na if length > self.original_len else None)

        def losses_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            logits = model(x)  # (n, length, 256)
            return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="none").view(y.shape)

        was_training = model.training
        model.eval()
        cost = self.forward_cost(length)
        try:
            return window_scores(
                losses_of, self._text().val, length=length, max_tokens=tokens(self.cfg.eval_tokens, "eval_tokens"),
                original=self.original_len, batch=8, device=self.device,
                tick=None if tick is None else lambda n: tick(n * cost, n),
            )
        finally:
            model.train(was_training)

    def passkey(self, model, length: int, depth: float, seed: int, tick: Tick | None = None) -> float:  # noqa: ANN001
        trials = filled(self.cfg.trials, "trials")
        accuracy = pk.lab_accuracy(model, length=length, depth=depth, trials=trials, seed=seed)
        if tick is not None:
            tick(trials * self.forward_cost(length), trials)
        return accuracy

    def finetune(self, model, label: str, target: int, positions: str = "plain") -> Path:  # noqa: ANN001
        """Fine-tune ``model`` for a ``target`` context in windows of ``cfg.finetune_window`` (default the target)
        read at ``positions``; returns its run folder (resumable, ``OUT/runs/finetune-<label>``)."""
        from posenc.lab.extend.targets.finetune import run_folder

        window = self.cfg.finetune_window_for(target)
        batch = max(1, 32 * self.original_len // window)  # the tokens per step of pre-training
        lr = self.cfg.finetune_lr or 3e-4
        tcfg = TrainConfig(
            steps=self.cfg.finetune_steps, batch_size=batch, length=window, lr=lr, seed=self.cfg.seed + 1, warmup=0
        )
        if self.cfg.task == "passkey":
            batches = self._batches(window, batch, self.cfg.seed + 1)
        else:
            batches = window_batches(self.finetune_tokens, window, target, positions, batch, self.cfg.seed + 1)
        run_dir = run_folder(self.out, label)
        where = f"@{target}" + (f" in {window}-byte windows" if window != target else "")
        train(model, batches, tcfg, run_dir, progress=self.progress, description=f"fine-tune {label} {where}")
        return run_dir
