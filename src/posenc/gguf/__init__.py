"""The GGUF format: a file's header (``header``), a transformers RoPE config as llama.cpp's keys and back (``rope``),
a Llama GGUF as a transformers model (``llama``), and writing a GGUF file from a source one (``write``).

Below ``posenc.hf`` (which saves a loaded model as GGUF with it) and ``posenc.runtimes`` (which reads a header as
llama.cpp and transformers do); it imports neither.
"""
