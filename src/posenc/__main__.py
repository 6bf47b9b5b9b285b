"""``python -m posenc`` (and ``torchrun -m posenc lab ...``) runs the command line."""

from posenc.cli import main

raise SystemExit(main())
