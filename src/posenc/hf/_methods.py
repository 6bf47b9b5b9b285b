"""The names of the frequency methods ``posenc.hf.extend_context`` applies through the model's RoPE config (the
remapping ones come from ``posenc.remapping``) and of the method that drops RoPE (DroPE), apart so that the extension
record (``posenc.hf._record``) reads them without importing ``posenc.hf.extend``, which imports the record."""

FREQUENCY_METHODS = ("linear", "ntk", "dynamic", "yarn", "longrope", "llama3")
#: Methods that remove RoPE instead of scaling or remapping it (``posenc.hf._drope_patch``).
DROP_METHODS = ("drope",)
