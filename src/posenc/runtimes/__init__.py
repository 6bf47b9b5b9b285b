"""What each runtime will run for a model: its RoPE per layer as that runtime reads the model's config or GGUF.

The bugs people hit with long context are between tools: a model extended and measured in one place is served by
another that reads its config differently (``rope_scaling`` vs ``rope_parameters``, per-layer-type RoPE, YaRN's
parameters read three ways, GGUF keys dropped by a converter, ``"ntk"`` meaning two things). Each module here reads a
model the way one runtime does, from that runtime's code (the file and version named in the module), and returns a
``RuntimeView``: per layer, the inverse frequencies in float64, the attention factor, the rotary dims and layout, the
context the runtime allows, and what it ignores or refuses. ``posenc.runtimes.check`` compares them with what posenc
measured; ``posenc check PATH`` prints the table.

No weights are read: a transformers folder's ``config.json``, or a GGUF file's header.

Shapes:
    ``LayerRope.inv_freq`` (F,) float64, F = rotary dims / 2; None for a layer without RoPE (NoPE).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from posenc._checks import check_choice, fail

#: The runtimes posenc reads models as, in the order ``posenc check`` prints them.
RUNTIMES = ("transformers", "vllm", "sglang", "llamacpp")


@dataclasses.dataclass(frozen=True)
class LayerRope:
    """One layer's rotary embedding as a runtime computes it."""

    inv_freq: torch.Tensor | None  # (F,) float64; None: the layer has no RoPE (NoPE)
    attention_factor: float  # what cos and sin (or the scores) are multiplied by (YaRN's mscale ...)
    rotary_dim: int  # channels rotated (2F); the rest pass through
    layout: str  # "half" (GPT-NeoX / HF) or "interleaved" (GPT-J / Meta)
    method: str  # the rope type as the runtime reads it ("default", "yarn", "dynamic", ...)
    params: Mapping[str, Any]  # the parameters as the runtime reads them (factor, original length, betas ...)
    length_dependent: bool = False  # frequencies change with the sequence length (dynamic, longrope)
    #: For a length-dependent layer, ``(inv_freq (F,) float64, attention_factor)`` the runtime uses for a sequence of
    #: ``n`` tokens; ``inv_freq`` above is then the one for sequences up to the original context. None: not given
    #: (``posenc.runtimes.check`` then verifies such a layer at that one length only, and says so).
    at_length: Callable[[int], tuple[torch.Tensor, float]] | None = dataclasses.field(default=None, compare=False)


@dataclasses.dataclass(frozen=True)
class RuntimeView:
    """What one runtime will run for a model (``RUNTIMES``)."""

    runtime: str
    follows: str  # the code this reading follows: file, version or commit
    layers: tuple[LayerRope, ...]  # one per decoder layer, in order
    context: int | None  # the longest sequence the runtime allows (None: unknown)
    ignored: tuple[str, ...] = ()  # keys of the model's config that change what posenc measured but this runtime
    #                                does not read
    refused: str | None = None  # why this runtime cannot run the model at all (None: it runs)
    notes: tuple[str, ...] = ()  # anything else a user must know, e.g. "not verified: ..."
    version: str = ""  # the release this reading follows, as ``posenc check`` names it ("vLLM 0.33.0")
    variants: tuple[Variant, ...] = ()  # what the runtime runs instead where its environment differs


@dataclasses.dataclass(frozen=True)
class Variant:
    """Another reading of one runtime that depends on its environment, e.g. llama.cpp's converter run under
    transformers 5 rather than 4: ``layers`` then replace the view's, which hold ``otherwise``'s reading."""

    when: str  # the environment of this reading: "convert_hf_to_gguf.py run under transformers 5"
    otherwise: str  # the environment of the view's own layers
    layers: tuple[LayerRope, ...]
    fix: str | None = None  # the config change that makes both readings agree


Reader = Callable[["Source"], RuntimeView]


@dataclasses.dataclass(frozen=True)
class Source:
    """A model as a runtime finds it: a transformers folder (its ``config.json``), a ``config.json`` alone, or a GGUF
    file (its header: metadata, no tensor data)."""

    path: Path
    kind: str  # "folder", "config" or "gguf"
    config: Mapping[str, Any] | None  # the config.json dict (folder, config)
    gguf: Any = None  # the GGUF header (posenc.gguf.header.GGUFHeader) for kind "gguf"

    @classmethod
    def open(cls, path: str | os.PathLike) -> Source:
        """``path`` read without weights: a folder with ``config.json``, a ``config.json`` file, or a ``.gguf``.

        Raises:
            ValueError: naming ``path`` and what is allowed.
        """
        p = Path(path).expanduser()
        if p.is_dir():
            if not (p / "config.json").is_file():
                fail("path", str(path), "a transformers folder with a config.json, a config.json, or a .gguf file")
            return cls(p, "folder", _read_json(p / "config.json"))
        if p.is_file() and p.suffix.lower() == ".gguf":
            from posenc.gguf.header import read_gguf_header

            return cls(p, "gguf", None, read_gguf_header(p))
        if p.is_file() and p.suffix.lower() == ".json":
            return cls(p, "config", _read_json(p))
        fail("path", str(path), "a transformers folder with a config.json, a config.json, or a .gguf file")


def _read_json(path: Path) -> Mapping[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        fail("path", str(path), f"a readable JSON config ({err})")
    if not isinstance(value, dict):
        fail("path", str(path), "a JSON object (a model config)")
    return value


_READERS: dict[str, Reader] = {}


def register(runtime: str) -> Callable[[Reader], Reader]:
    """Decorator: the reader of ``runtime`` (one module per runtime)."""
    check_choice("runtime", runtime, RUNTIMES)

    def add(reader: Reader) -> Reader:
        _READERS[runtime] = reader
        return reader

    return add


def read(path: str | os.PathLike | Source, runtime: str) -> RuntimeView:
    """What ``runtime`` will run for the model at ``path`` (``Source.open``)."""
    check_choice("runtime", runtime, RUNTIMES)
    source = path if isinstance(path, Source) else Source.open(path)
    _load_reader(runtime)
    if runtime not in _READERS:
        return RuntimeView(runtime, "not implemented", (), None, refused=None,
                           notes=(f"not verified: posenc has no {runtime} reader yet",))
    view = _READERS[runtime](source)
    return view if view.version else dataclasses.replace(view, version=release(runtime))


def release(runtime: str) -> str:
    """The release of ``runtime`` its reader follows, as ``posenc check`` names it in every row: the module's
    ``RELEASE`` ("vLLM 0.33.0"); for transformers, the version installed here (posenc reads with it)."""
    import importlib

    if runtime == "transformers":  # its distribution's metadata: the version, without importing transformers
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"transformers {version('transformers')} (installed)"
        except PackageNotFoundError:
            return "transformers (not installed)"
    try:
        return str(getattr(importlib.import_module(f"posenc.runtimes.{runtime}"), "RELEASE", ""))
    except ModuleNotFoundError:
        return ""


def _load_reader(runtime: str) -> None:
    """Import ``runtime``'s reader module (it registers itself), and only it: a check of llama.cpp alone never
    imports transformers. A missing module leaves the runtime unread."""
    import importlib

    if runtime not in _READERS:
        try:
            importlib.import_module(f"posenc.runtimes.{runtime}")
        except ModuleNotFoundError as err:
            if err.name != f"posenc.runtimes.{runtime}":
                raise
