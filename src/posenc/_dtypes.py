"""The dtype names ``posenc extend`` and ``posenc export`` offer, defined here without torch so that the command
line's parsers and ``posenc.hf.dtypes`` share one list (parsing imports no torch)."""

#: ``dtype`` choices of ``posenc extend`` and ``posenc export`` for a pretrained model.
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
