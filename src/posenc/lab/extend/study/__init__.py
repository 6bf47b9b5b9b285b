"""The ``posenc extend`` study: the command (``run.run_extend``), its plan and checks (``plan``) and what it writes
from ``results.csv`` (``report``, ``plot``); its settings are ``settings.config``."""
