"""``posenc lab``: which position encoding extrapolates past its training length, and by how much?

A tiny byte-level GPT is trained once per encoding at length L (64 bytes by default) on the Python standard
library's source, then evaluated at L, 2L, ... 16L: perplexity on held-out text (or, with ``--task copy`` /
``--task recall``, exact-match accuracy on synthetic tasks), both as trained and with each way of running it past L
without retraining (RoPE scalings, a learned table or ALiBi's slopes interpolated; ``--finetune-steps``: Position
Interpolation's short fine-tune). The findings check the papers' claims (ALiBi, KERPLE, Sandwich, FIRE, ...) on
the measured table.

Command: ``posenc lab [--encodings rope,alibi,...] [--task lm|copy|recall] [--out OUT] [--resume]``.

Files in ``OUT``:
    study.json          the settings (``StudyConfig``), checked on ``--resume``
    results.csv         one row per measurement, upserted as each finishes (``report.RESULT_COLUMNS``)
    extrapolation.png   the metric against evaluation length, one line per encoding and extension
    report.md           table, figure, findings, configuration and environment
    runs/<encoding>/    each training run: config.json, metrics.jsonl, checkpoint.safetensors, done.json
                        (a lab run folder ``posenc extend`` can load)

Where to change what:
    ``study``       the command: what trains, in which order, what is evaluated and written (``run_study``)
    ``config``      the settings and their defaults (``StudyConfig``, ``DEFAULT_ENCODINGS``, ``TASK_DEFAULTS``)
    ``evaluate``    which extensions run past L for each encoding (``extension_names``, ``extended_encoding``)
    ``tasks``       the synthetic copy and recall tasks
    ``report``      the results CSV, the tables, the findings and ``report.md``
    ``plot``        ``extrapolation.png``
    the model, the corpus, perplexity and the RoPE scalings are shared with ``posenc extend``, in
    ``posenc.lab.common`` (``gpt``, ``corpus``, ``evaluate``, ``scaling``); training is ``posenc.lab.common.train``.
"""
