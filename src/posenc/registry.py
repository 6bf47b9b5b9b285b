"""Name registries: encodings (``posenc.build``) and RoPE scalings (plain dicts, Hugging Face ``rope_type`` strings)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar, cast

from posenc._fail import fail

T = TypeVar("T", bound=type)

_ROPE_SCALINGS: dict[str, type] = {}


#: Loads the library's own encodings and scalings, which register as their modules load: set by the package root
#: (``posenc.__init__``), which defers them to first use so that the command line parses before torch is imported.
load_builtins: Callable[[], object] | None = None


def _builtins() -> None:
    """Load the built-in encodings and scalings before a lookup, so that a program reaching ``posenc.registry``
    without a ``posenc.<name>`` first still sees them."""
    if load_builtins is not None:
        load_builtins()


def register_scaling(cls: T) -> T:
    """Class decorator: make a ``RopeScaling`` subclass available under its ``rope_type``."""
    name = cast(Any, cls).rope_type  # a RopeScaling subclass's ClassVar
    if name in _ROPE_SCALINGS and _ROPE_SCALINGS[name] is not cls:
        fail("rope_type", name, f"a name not already registered (taken by {_ROPE_SCALINGS[name].__name__})")
    _ROPE_SCALINGS[name] = cls
    return cls


def scaling_class(rope_type: str) -> type:
    """The scaling config class registered as ``rope_type``."""
    _builtins()
    if rope_type not in _ROPE_SCALINGS:
        fail("rope_type", rope_type, f"one of {available_scalings()}")
    return _ROPE_SCALINGS[rope_type]


def available_scalings() -> list[str]:
    """Registered rope scaling types, ``"default"`` (no scaling) first."""
    _builtins()
    return ["default", *sorted(_ROPE_SCALINGS)]


# ---------------------------------------------------------------------------------------------------------------
# Encodings by name: ``posenc.build("alibi", num_heads=8)``.

_ENCODINGS: dict[str, Callable[..., Any]] = {}

#: Facts about the model, not the encoding: ``build`` passes each to the encodings that take it and drops it for
#: the rest, so one call ``build(name, dim=..., num_heads=..., head_dim=..., max_len=...)`` serves every name.
MODEL_KEYS = ("dim", "num_heads", "head_dim", "max_len", "grid_size")


def register(name: str, factory: Callable[..., Any] | None = None):  # noqa: ANN201 - decorator or factory
    """Make an encoding buildable by name: ``register("mine", MyEncoding)`` or ``@register("mine")`` on a class.

    ``factory`` is an ``Encoding`` subclass (or any callable returning one) taking keyword arguments. Registering
    a taken name for a different factory is an error.
    """
    if not isinstance(name, str) or not name.isidentifier():
        fail("name", name, "an identifier-like string such as 'my_bias'")

    def add(f: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(f):
            fail("factory", f, "an Encoding subclass or a callable returning an Encoding")
        if name in _ENCODINGS and _ENCODINGS[name] is not f:
            fail("name", name, f"a name not already registered (taken by {_ENCODINGS[name]!r})")
        _ENCODINGS[name] = f
        return f

    return add if factory is None else add(factory)


def available() -> list[str]:
    """Names ``build`` accepts, sorted."""
    _builtins()
    return sorted(_ENCODINGS)


def _parameters(factory: Callable[..., Any]) -> tuple[set[str], set[str], bool]:
    """(accepted keywords, required keywords, takes **kwargs) of ``factory``'s signature."""
    import torch

    # the class's own constructor, not a bound instance's (mypy: misc, unsound on instances only)
    if isinstance(factory, type) and factory.__init__ is torch.nn.Module.__init__:  # type: ignore[misc]
        return set(), set(), False  # a module without its own constructor takes no configuration
    params = inspect.signature(factory).parameters.values()
    accepted = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    required = {p.name for p in params if p.name in accepted and p.default is p.empty}
    return accepted, required, any(p.kind is p.VAR_KEYWORD for p in params)


def takes(name: str, key: str) -> bool:
    """Whether ``build(name, ...)`` reads keyword ``key`` (a model key it would drop counts as not read)."""
    _builtins()
    if name not in _ENCODINGS:
        fail("name", name, f"one of {available()} (or register your own with posenc.register)")
    accepted, _, var_kw = _parameters(_ENCODINGS[name])
    return key in accepted or var_kw


def build(name: str, /, **config: Any):  # noqa: ANN201 - returns an Encoding
    """The encoding registered as ``name``, built from keyword ``config``.

    Keys in ``MODEL_KEYS`` that the encoding does not use are dropped; any other unknown key is an error.
    """
    _builtins()
    if name not in _ENCODINGS:
        fail("name", name, f"one of {available()} (or register your own with posenc.register)")
    factory = _ENCODINGS[name]
    accepted, required, var_kw = _parameters(factory)
    if not var_kw:
        unknown = sorted(set(config) - accepted - set(MODEL_KEYS))
        if unknown:
            fail(f"{name}: {unknown[0]}", config[unknown[0]], f"only the keys {sorted(accepted)}")
        config = {k: v for k, v in config.items() if k in accepted}
    missing = sorted(required - set(config))
    if missing:
        fail(f"{name}: {missing[0]}", None, f"a value: build({name!r}, ...) needs {missing}")
    return factory(**config)
