"""``posenc export``, now ``posenc.deploy.export``: kept here for the command line's import until it imports
``posenc.deploy`` itself."""

from __future__ import annotations

from posenc.deploy.exporting import Exported, export
from posenc.deploy.verify import how_to_run

__all__ = ["Exported", "export", "how_to_run"]
