"""The models ``posenc extend`` measures, behind one small interface: a lab ``GPT`` or a transformers causal LM.

Each target loads its model, knows its original context, patches a fresh copy for a method and factor (and checks
the patch took: a model is never measured unpatched as if patched), and measures perplexity, passkey accuracy and
fine-tunes at a target length:

- ``LabTarget``: a ``posenc lab`` run folder (``posenc.lab.train.load_model``) or a fresh ``GPT`` (``new``); patched
  by swapping its encoding (``posenc.lab.evaluate.scaled_encoding``), fine-tuned with ``posenc.lab.train.train``.
- ``HFTarget``: a transformers folder loaded offline (``local_files_only``); patched by ``posenc.hf.extend_context``
  on a deep copy, measured on the corpus tokenized with its own tokenizer, fine-tuned by a plain AdamW loop.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from posenc._checks import fail
from posenc.lab import evaluate as ev
from posenc.lab import passkey as pk
from posenc.lab.progress import progress_bar

if TYPE_CHECKING:
    from posenc.lab.extend import ExtendConfig

#: Methods tried on a transformers RoPE model when none are named (LongRoPE needs searched factors as options).
HF_ROPE_METHODS = ("linear", "ntk", "dynamic", "yarn", "llama3")


def _is_lab_run(folder: Path) -> bool:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "model" in config and (folder / "checkpoint.safetensors").is_file()


def _is_hf_folder(folder: Path) -> bool:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "model_type" in config


def _model_error(model: str, why: str) -> None:
    fail(
        "model",
        model,
        f"a model folder ({why}): a `posenc lab` run (config.json with a 'model' section and "
        "checkpoint.safetensors), a transformers model (config.json with a 'model_type', its weights and tokenizer), "
        "or 'new' / 'new:alibi' with --task passkey",
    )


class LabTarget:
    """A byte-level lab ``GPT``: patched by swapping its encoding, measured with ``posenc.lab.evaluate``."""

    kind = "lab"

    def __init__(self, cfg: ExtendConfig, out: Path, device: str, progress: bool) -> None:
        from posenc.lab.data import load_corpus
        from posenc.lab.model import GPT, ModelConfig
        from posenc.lab.train import load_model

        self.cfg, self.out, self.device, self.progress = cfg, out, device, progress
        if cfg.is_new:
            encoding = cfg.model.partition(":")[2] or "rope"
            config = ModelConfig(dim=64, n_layers=2, n_heads=4, max_len=cfg.train_len, encoding=encoding)
            self.model = GPT(config, seed=cfg.seed).to(device)
            self.name = f"a fresh lab GPT ({encoding}, {cfg.train_len} bytes)"
        else:
            self.model = load_model(cfg.model, device=device)
            self.name = f"lab GPT {cfg.model}"
        self.encoding = self.model.config.encoding
        if self.encoding not in ev.EXTEND_METHODS:
            fail(
                "model",
                cfg.model,
                f"a model with positional parameters posenc extend knows; its encoding is {self.encoding!r}, and only "
                f"{sorted(ev.EXTEND_METHODS)} lab models can be extended",
            )
        self.original_len = cfg.original_len or self.model.config.max_len
        self.default_methods = ev.EXTEND_METHODS[self.encoding]
        self.min_passkey = pk.MIN_CHARS + pk.DIGITS
        self.corpus = None
        if cfg.task == "passkey" and self.original_len < self.min_passkey:
            fail(
                "model",
                cfg.model,
                f"a lab model trained at >= {self.min_passkey} bytes for --task passkey (the prompt and key need "
                f"that many); this one has {self.original_len}. Use MODEL 'new' (--train-len) instead",
            )
        if cfg.task == "lm":
            longest = max(*(cfg.lengths or (8 * self.original_len,)), self.original_len * max(cfg.factors))
            self.corpus = load_corpus(cfg.corpus, max_bytes=cfg.corpus_bytes, min_bytes=int(longest) + 1)

    def prepare(self) -> None:
        """Task passkey: train the retrieval task at the original length first (resumable, skipped once done)."""
        if self.cfg.task != "passkey":
            return
        from posenc.lab.train import TrainConfig, train

        tcfg = TrainConfig(
            steps=self.cfg.train_steps, batch_size=32, length=self.original_len, lr=3e-3, seed=self.cfg.seed
        )
        if self.progress:
            print(f"[passkey] training {self.name} on the passkey task at {self.original_len} bytes")
        train(
            self.model, self._batches(self.original_len, 32, self.cfg.seed), tcfg, self.out / "runs" / "passkey",
            progress=self.progress, description="passkey",
        )  # fmt: skip

    def _batches(self, length: int, batch: int, seed: int):  # noqa: ANN202
        from posenc.lab.data import train_batch
        from posenc.lab.train import step_generator

        def batch_fn(step: int, rank: int, world: int):  # noqa: ANN202
            generator = step_generator(seed, step)
            if self.cfg.task == "passkey":
                x, y, mask = pk.passkey_batch(batch, length, generator=generator)
            else:
                (x, y), mask = train_batch(self.corpus.train, length=length, batch=batch, generator=generator), None
            rows = slice(rank, batch, world)
            return x[rows], y[rows], None if mask is None else mask[rows]

        return batch_fn

    def copy(self):  # noqa: ANN201
        return copy.deepcopy(self.model)

    def patched(self, method: str, factor: float) -> tuple[Any, dict]:
        model = self.copy()
        before = model.encoding
        model.set_encoding(ev.scaled_encoding(model, method, factor=factor, original_len=self.original_len))
        after = model.encoding
        if after is before or after.config == before.config:  # never measure an unpatched model as if patched
            fail("method", method, f"a patch that changes the encoding; {after.config} is still the trained one")
        return model, {"method": method, "factor": factor, "encoding": after.config.to_dict()}

    def perplexity(self, model, length: int) -> ev.Score:  # noqa: ANN001
        return ev.perplexity(model, self.corpus.val, length=length, max_tokens=self.cfg.eval_tokens)

    def passkey(self, model, length: int, depth: float, seed: int) -> float:  # noqa: ANN001
        return pk.lab_accuracy(model, length=length, depth=depth, trials=self.cfg.trials, seed=seed)

    def finetune(self, model, label: str, target: int) -> None:  # noqa: ANN001
        from posenc.lab.train import TrainConfig, train

        batch = max(1, 32 * self.original_len // target)  # the tokens per step of pre-training
        lr = self.cfg.finetune_lr or 3e-4
        tcfg = TrainConfig(
            steps=self.cfg.finetune_steps, batch_size=batch, length=target, lr=lr, seed=self.cfg.seed + 1, warmup=0
        )
        train(
            model, self._batches(target, batch, self.cfg.seed + 1), tcfg, self.out / "runs" / f"finetune-{label}",
            progress=self.progress, description=f"fine-tune {label} @{target}",
        )  # fmt: skip


class _Logits(torch.nn.Module):
    """A transformers causal LM as ``tokens (B, S) -> logits (B, S, V)``, the form ``evaluate.perplexity`` takes."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.encoding = None  # no posenc encoding: no length limit for evaluate.max_length

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=tokens).logits  # (B, S, V)


def _hf_original_len(config: Any) -> int | None:
    """The context a transformers model was trained for: its scaling's original length, else its maximum.

    ``config`` is a ``PretrainedConfig`` or the dict of its ``config.json`` (read before loading any weights)."""
    get = config.get if isinstance(config, Mapping) else lambda name: getattr(config, name, None)
    for params in (get("rope_parameters"), get("rope_scaling")):
        if isinstance(params, Mapping) and params.get("original_max_position_embeddings"):
            return int(params["original_max_position_embeddings"])
    for name in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = get(name)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _is_alibi(model_type: str) -> bool:
    try:
        from posenc.hf import ALIBI_MODEL_TYPES
    except ImportError:
        return False
    return model_type in ALIBI_MODEL_TYPES


def _patched_count(description: Mapping[str, Any]) -> int:
    """How many modules ``extend_context`` says it patched (keys like ``modules_patched``), 0 if it does not say."""
    total = 0
    for key, value in description.items():
        if "patched" in str(key).lower():
            if isinstance(value, int) and not isinstance(value, bool):
                total += value
            elif isinstance(value, (list, tuple, set)):
                total += len(value)
    return total


class HFTarget:
    """A transformers causal LM: patched by ``posenc.hf.extend_context`` on a copy, measured on tokenized text."""

    kind = "hf"

    def __init__(self, cfg: ExtendConfig, out: Path, device: str, progress: bool) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from posenc.lab.data import load_corpus

        if cfg.task == "passkey":
            fail(
                "task",
                cfg.task,
                "'lm' for a transformers model (it is tested on passkey zero-shot); --task passkey trains lab models",
            )
        self.cfg, self.out, self.device, self.progress = cfg, out, device, progress
        dtype = "auto" if device.startswith("cuda") else torch.float32
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(cfg.model, local_files_only=True)
        except (OSError, ValueError) as err:
            _model_error(cfg.model, f"its tokenizer could not be loaded: {err}")
        try:
            self.model = AutoModelForCausalLM.from_pretrained(cfg.model, local_files_only=True, dtype=dtype)
        except (OSError, ValueError) as err:
            _model_error(cfg.model, f"transformers could not load it as a causal LM: {err}")
        self.model.to(device)
        self.model.eval()
        config = self.model.config
        self.name = f"{type(self.model).__name__} ({config.model_type}) from {cfg.model}"
        self.encoding = config.model_type
        self.original_len = cfg.original_len or _hf_original_len(config)
        if self.original_len is None:
            fail(
                "original_len",
                None,
                f"the context {config.model_type} was trained for: its config names none, pass --original-len",
            )
        self.default_methods = ("linear",) if _is_alibi(config.model_type) else HF_ROPE_METHODS
        self.min_passkey = pk.min_length(self.tokenizer)
        corpus = load_corpus(cfg.corpus, max_bytes=cfg.corpus_bytes)
        self.val = self._tokens(corpus.val)
        self.train = self._tokens(corpus.train) if cfg.finetune_steps else None

    def _tokens(self, data: torch.Tensor) -> torch.Tensor:
        text = bytes(data.tolist()).decode("utf-8", errors="replace").replace("\0", "\n\n")
        return torch.tensor(self.tokenizer(text, verbose=False)["input_ids"], dtype=torch.long)  # (N,)

    def prepare(self) -> None:
        return

    def copy(self):  # noqa: ANN201
        return copy.deepcopy(self.model)

    def patched(self, method: str, factor: float) -> tuple[Any, dict]:
        try:
            from posenc.hf import extend_context
        except ImportError:
            fail("model", self.cfg.model, "a lab model: posenc.hf.extend_context is not available in this posenc")
        model = self.copy()
        description = extend_context(model, method, factor, original_max_position_embeddings=self.original_len)
        if not isinstance(description, Mapping) or _patched_count(description) < 1:
            fail(
                "method",
                method,
                f"a patch that changes {self.encoding}'s positions; extend_context reported {description!r}, so the "
                "model would be measured unpatched",
            )
        return model, dict(description)

    def perplexity(self, model, length: int) -> ev.Score:  # noqa: ANN001
        if self.val.numel() < length + 1:
            return ev.Score(loss=None, tokens=0, status="n/a")
        return ev.perplexity(_Logits(model), self.val, length=length, max_tokens=self.cfg.eval_tokens, batch_size=1)

    def passkey(self, model, length: int, depth: float, seed: int) -> float:  # noqa: ANN001
        return pk.hf_accuracy(model, self.tokenizer, length=length, depth=depth, trials=self.cfg.trials, seed=seed)

    def finetune(self, model, label: str, target: int) -> None:  # noqa: ANN001
        """A plain AdamW loop on random windows of ``target`` tokens (no checkpoint: the unit reruns if cut)."""
        from posenc.lab.data import train_batch
        from posenc.lab.train import step_generator

        if self.train.numel() < target + 1:
            fail("corpus", self.cfg.corpus, f"at least {target + 1} training tokens to fine-tune at {target}")
        optimizer = torch.optim.AdamW(model.parameters(), lr=self.cfg.finetune_lr or 2e-5, weight_decay=0.0)
        model.train()
        with progress_bar(self.progress, self.cfg.finetune_steps, f"fine-tune {label} @{target}") as advance:
            for step in range(self.cfg.finetune_steps):
                generator = step_generator(self.cfg.seed + 1, step)
                x, y = train_batch(self.train, length=target, batch=1, generator=generator)  # (1, target) each
                logits = model(input_ids=x.to(self.device)).logits  # (1, target, V)
                loss = F.cross_entropy(logits.flatten(0, 1).float(), y.to(self.device).flatten())
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                advance()
        model.eval()


def load_target(cfg: ExtendConfig, out: Path, *, device: str, progress: bool) -> LabTarget | HFTarget:
    """The model ``cfg.model`` names, behind the interface ``run_extend`` measures through."""
    if cfg.is_new:
        return LabTarget(cfg, out, device, progress)
    folder = Path(cfg.model)
    if not folder.is_dir():
        _model_error(cfg.model, "no such folder")
    if _is_lab_run(folder):
        return LabTarget(cfg, out, device, progress)
    if _is_hf_folder(folder):
        return HFTarget(cfg, out, device, progress)
    runs = ", ".join(map(str, _study_runs(folder)))
    if runs:
        _model_error(cfg.model, f"this is a posenc lab study folder; pass one of its runs: {runs}")
    _model_error(cfg.model, "this folder is neither")


def _study_runs(folder: Path) -> list[Path]:
    """The lab runs of a ``posenc lab`` study folder (``study.json`` and ``runs/<encoding>/``); [] for any other."""
    if not (folder / "study.json").is_file() or not (folder / "runs").is_dir():
        return []
    return sorted(run for run in (folder / "runs").iterdir() if _is_lab_run(run))


def original_len_of(cfg: ExtendConfig) -> int | None:
    """The model's original context read from its config alone (no weights loaded); None where that does not say
    (``load_target`` then loads the model, or explains what the folder lacks)."""
    if cfg.original_len is not None:
        return cfg.original_len
    if cfg.is_new:
        return cfg.train_len
    try:
        config = json.loads((Path(cfg.model) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    if isinstance(config.get("model"), dict):  # a posenc lab run: ModelConfig.max_len
        length = config["model"].get("max_len")
        return length if isinstance(length, int) and not isinstance(length, bool) and length > 0 else None
    return _hf_original_len(config) if "model_type" in config else None
