"""The product path: a parsed method, applied to a loaded model, written as a folder or GGUF, and checked.

``posenc export`` runs it whole (``export``); the lab's ``posenc extend --save`` and ``--pick --save`` write through
``check_save`` and ``save``. Modules, one job each:

- ``methods``: a method name parsed once (``Method``, ``parse``) and what export writes (``check_export_method``);
  imports no torch, so the command line refuses a bad ``--method`` at once;
- ``source``: the model read without its weights (``open_pretrained``), then its weights (``load_weights``);
- ``patch``: ``apply``, the method on a model, and what changed;
- ``formats``: ``check_save`` (what each format carries, before any weight is read) and ``save``;
- ``verify``: what each runtime runs from what was written (``check_written``) and ``how_to_run``;
- ``exporting``: ``export``, all of the above in order (``Exported``).

Nothing is imported here until a name is used (``posenc.deploy.methods`` stays torch-free); ``posenc.deploy`` never
imports ``posenc.lab``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from posenc.deploy.exporting import Exported, export
    from posenc.deploy.formats import GGUF_METHODS, check_save, save
    from posenc.deploy.methods import Method, check_export_method, parse
    from posenc.deploy.patch import Applied, apply
    from posenc.deploy.verify import how_to_run

_NAMES = {
    "Exported": "exporting", "export": "exporting", "GGUF_METHODS": "formats", "check_save": "formats",
    "save": "formats", "Method": "methods", "check_export_method": "methods", "parse": "methods",
    "Applied": "patch", "apply": "patch", "how_to_run": "verify",
}

__all__ = [
    "GGUF_METHODS",
    "Applied",
    "Exported",
    "Method",
    "apply",
    "check_export_method",
    "check_save",
    "export",
    "how_to_run",
    "parse",
    "save",
]


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'posenc.deploy' has no attribute {name!r}")
    return getattr(importlib.import_module(f"posenc.deploy.{_NAMES[name]}"), name)
