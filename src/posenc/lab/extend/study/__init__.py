"""The ``posenc extend`` study: the command (``run.run_extend``), its settings (``config``), its plan and checks
(``plan``), the fine-tunes it adds (``finetune``) and what it writes from ``results.csv`` (``report``, ``labels``)."""
