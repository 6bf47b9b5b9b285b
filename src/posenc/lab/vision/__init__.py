"""``posenc vision``: which 2-D position encoding keeps a ViT's accuracy at resolutions it was not trained at?

The RoPE-ViT comparison (Heo et al. 2024) on a CPU: a small ViT is trained once per 2-D encoding at one resolution
on Fashion-MNIST (or scikit-learn's digits, or your image folders), then tested at 0.75x to 2x that resolution with
the same patch size, so a larger image means more patches and positions never seen in training. Encodings that read
patch coordinates are also tested with the coordinates interpolated back into the trained range. The findings check
RoPE-ViT's ordering (RoPE-Mixed >= RoPE-Axial > learned) against the noise of a finite test set.

Command: ``posenc vision [--encodings learned,rope_axial,...] [--train-res 16] [--out OUT] [--resume]``.

Files in ``OUT``:
    vision.json         the settings (``VisionConfig``), checked on ``--resume``
    results.csv         one row per (encoding, scaling, train_res, eval_res), upserted as each finishes
    resolution.png      accuracy against evaluation resolution, one line per encoding
    report.md           table, figure, findings, configuration and environment
    runs/<encoding>/    each training run: config.json, metrics.jsonl, checkpoint.safetensors, done.json

Where to change what:
    ``study``       the command: data, training, evaluation (``accuracy``), the results file (``run_vision``)
    ``config``      the settings and their defaults (``VisionConfig``, ``DEFAULT_ENCODINGS``, ``EVAL_MULTIPLES``)
    ``vit``         the model, ``ViT``, written once for every 2-D encoding
    ``images``      the data: Fashion-MNIST, digits or image folders; resizing, normalisation, random crops
    ``report``      the table, the findings, ``resolution.png`` and ``report.md``
    training is ``posenc.lab.common.train``.
"""
