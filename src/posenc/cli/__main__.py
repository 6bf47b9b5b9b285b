"""``python -m posenc.cli`` runs the command line, as ``python -m posenc`` does."""

from posenc.cli import main

raise SystemExit(main())
