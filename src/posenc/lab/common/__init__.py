"""The machinery every lab study shares; it imports the library (``posenc``) and itself, never a study.

Running a study:
    ``train``       the training loop of every lab model (GPT and ViT): AdamW, warmup + cosine, resumable bit for
                    bit, interruptible, data-parallel under ``torchrun``; ``load_model`` reads a lab run back
    ``checkpoint``  weights, optimizer and RNG states as safetensors
    ``dist``        data-parallel helpers (``torchrun``'s environment; no-ops for one process)
    ``devices``     ``--device`` checked against this machine before any work
    ``runfiles``    output folders (a command writes only into a new folder or its own run) and keyed result CSVs
    ``files``       atomic writes (temporary file, then ``os.replace``) and JSON read back with a clear error
    ``progress``    progress bars and what a resumed run skips

Reporting it (from the results CSV alone, never by rerunning a model):
    ``report``      the environment record, durations, findings as markdown, the closing report sections, Wilson
                    intervals
    ``plots``       a matplotlib canvas without pyplot, colour-blind-aware colours and markers, readable log axes

The byte-level language model, shared by ``posenc lab`` (which trains it) and ``posenc extend`` (which loads and
patches it):
    ``gpt``         ``GPT`` and ``ModelConfig``: a nanoGPT-style decoder written once for every sequence encoding,
                    one per model or two per layer (``rope/nope:4``)
    ``corpus``      byte-level text corpora (the Python standard library by default), training and evaluation
                    windows
    ``evaluate``    perplexity over windows, loss and exact match on task instances
    ``scaling``     the Hugging Face ``rope_scaling`` dict per method and a RoPE / ALiBi like the model's with it
"""
