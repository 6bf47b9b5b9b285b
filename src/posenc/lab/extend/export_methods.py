"""The methods ``posenc export`` writes: ``posenc.deploy.methods``'s names, kept here for the command line's import
(no torch) until it imports ``posenc.deploy.methods`` itself."""

from __future__ import annotations

from posenc.deploy.methods import EXPORT_METHODS, KNOWN_METHODS, REFUSED, check_export_method

__all__ = ["EXPORT_METHODS", "KNOWN_METHODS", "REFUSED", "check_export_method"]
