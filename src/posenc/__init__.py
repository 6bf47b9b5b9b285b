"""posenc: positional encodings for PyTorch transformers, each verified against its reference implementation.

``import posenc`` loads nothing heavy: the names below are imported on first use (PEP 562 ``__getattr__``), all at once,
from ``posenc._api``, so the first ``posenc.<name>`` (or ``from posenc import <name>``) loads torch and the whole
library as an eager import would, and the command line (``posenc.cli``) refuses a bad argument before torch is imported.
"""

# ruff: noqa: F405  (the names of __all__ come from posenc._api, star-imported for type checkers only)

import sys
import types
from typing import TYPE_CHECKING

from posenc import _save_check
from posenc import registry as _registry
from posenc._version import __version__ as __version__

if TYPE_CHECKING:
    from pathlib import Path

    from posenc._api import *  # noqa: F403

__all__ = [
    "ALiBi",
    "ALiBi2D",
    "ALiBi2DConfig",
    "ALiBiConfig",
    "AxialRoPE",
    "AxialRoPEConfig",
    "CoPE",
    "CoPEConfig",
    "DynamicNTKScaling",
    "Encoding",
    "FIRE",
    "FIREConfig",
    "FoPE",
    "FoPEConfig",
    "KERPLE",
    "KERPLEConfig",
    "Learned2DConfig",
    "LearnedConfig",
    "LearnedPositions",
    "LearnedPositions2D",
    "LinearScaling",
    "Llama3Scaling",
    "LongRoPEScaling",
    "MRoPE",
    "MRoPEConfig",
    "MixedNTKScaling",
    "NTKAlphaScaling",
    "NTKScaling",
    "NoPE",
    "NoPETemperature",
    "NoPETemperatureConfig",
    "PoseSample",
    "ProportionalScaling",
    "RoPE3D",
    "RoPE3DConfig",
    "RoPEMixed",
    "RoPEMixedConfig",
    "RopeScaling",
    "RotaryConfig",
    "RotaryEmbedding",
    "Sandwich",
    "SandwichConfig",
    "ShawRelative",
    "ShawRelativeConfig",
    "Sinusoidal",
    "Sinusoidal2D",
    "Sinusoidal2DConfig",
    "SinusoidalConfig",
    "SSMax",
    "SSMaxConfig",
    "T5Bias",
    "T5BiasConfig",
    "TeleChat3YaRNScaling",
    "XDRoPE",
    "XDRoPEConfig",
    "XPos",
    "XPosConfig",
    "YaRNLogScaling",
    "grok_rope_scaling",
    "YaRNScaling",
    "alibi_slopes",
    "apply_rotary",
    "attention",
    "available",
    "available_scalings",
    "build",
    "default_inv_freq",
    "functional",
    "grid_positions",
    "hf",
    "p_rope",
    "packed_positions",
    "pose_sample",
    "randomized_positions",
    "document_lengths",
    "parse_scaling",
    "register",
    "register_scaling",
    "rope_angles",
    "rope_cos_sin",
    "rope_frequencies",
    "rope_ssmax",
    "t5_relative_position_bucket",
]


def _load() -> None:
    """Bind the whole API at once, as an eager import binds it."""
    from posenc import _api

    globals().update({n: getattr(_api, n) for n in __all__})


def _register_builtins() -> None:
    """Import the API's modules (they register the built-in encodings and scalings) without binding its names: safe
    while ``posenc._api`` is still being imported."""
    import posenc._api  # noqa: F401


_registry.load_builtins = _register_builtins  # a lookup in posenc.registry sees the built-in names


def _print_check(path: "Path") -> "list | None":
    """``posenc check``'s table for what a save wrote, printed; the rows (None where nothing could be compared: the
    save stands, the one line printed says why)."""
    from posenc.runtimes.check import check, print_rows

    try:
        rows = check(path)
    except ValueError as err:  # e.g. an ALiBi model: no runtime reader reads RoPE there
        print(f"posenc check {path}: not compared ({err})")
        return None
    print_rows(rows, title=f"What each runtime runs for {path} (posenc check)")
    return rows


_save_check.PRINT_CHECK = _print_check  # posenc.hf's writers print it without importing posenc.runtimes


class _Package(types.ModuleType):
    """The package's module type: ``posenc.attention`` is the function, as an eager ``from posenc._api import *``
    leaves it, also after ``import posenc.attention`` (or ``from posenc.attention import BACKENDS``) before the first
    ``posenc.<name>``: the import system binds the submodule ``posenc.attention`` on the package once it has run, which
    would hide the function of the same name. The module stays ``sys.modules["posenc.attention"]``."""

    def __setattr__(self, name: str, value: object) -> None:
        if name == "attention" and isinstance(value, types.ModuleType):
            if "posenc._api" not in sys.modules:  # a plain import of the submodule: bind the API now
                _load()
            return  # else posenc._api is binding the API (its _load sets the function) or has bound it
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> object:
    if name not in __all__:
        raise AttributeError(f"module 'posenc' has no attribute {name!r}")
    _load()
    return globals()[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
