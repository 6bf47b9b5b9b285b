"""Position encodings as small ``nn.Module`` shells over ``posenc.functional``."""
