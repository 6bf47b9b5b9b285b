"""``posenc extend``: patch a trained model's positions for a longer context; what does each method rescue?

Each method and factor patches a fresh copy of the model (a ``posenc lab`` run, a pretrained model: GGUF,
transformers folder, ``smollm2``; or ``new``), measured beside the unpatched one up to past its original context:
perplexity, passkey over a length x depth grid, lm-eval's RULER (``--task ruler``), every rate with a Wilson
interval; ``--pick --target T`` picks the method for a length (``pick``). Writing a model is ``posenc.deploy``'s.

Files in ``OUT``: ``extend.json`` (the settings, checked on ``--resume``), ``results.csv`` (one row per measurement,
``study.run.COLUMNS``), ``extend.png``, ``passkey.png``, ``rates.png``, ``report.md``, ``runs/`` (training and
fine-tuning runs).

Folders import one way: ``settings`` (what a study is told) below ``needles`` and ``stats`` below ``targets`` (the
models behind one interface) below ``study`` (run, plan, report, plot) below ``pick``; docs/contributing.md lists
each module's job.
"""
