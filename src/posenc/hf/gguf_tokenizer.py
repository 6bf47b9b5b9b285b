"""A GGUF file's tokenizer, converted by transformers once and kept in the cache folder.

transformers converts a GGUF's vocabulary into a tokenizer on every load, through ``gguf.GGUFReader``: 30-70 s for
Gemma 3's 262,144 tokens on a 2-core EPYC, before a refusal of a bad option could be printed. The converted
tokenizer is saved (``save_pretrained``) under ``<cache>/tokenizers/<key>`` (``posenc.hf.packaged.cache_dir``), the key
a hash of the file's absolute path, size and modification time, the tokenizer class asked for, and the transformers
version that converted it, so a changed file or another transformers converts again; it is written to a temporary
folder renamed into place, and loaded from there after (about a second). Nothing the user has is touched.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any


def _key(path: Path, kind: str) -> str:
    import transformers

    stat = path.stat()
    text = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{kind}|{transformers.__version__}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _convert(folder: Path, file: str, kind: str) -> Any:
    if kind == "TokenizersBackend":
        from transformers import TokenizersBackend

        return TokenizersBackend.from_pretrained(str(folder), gguf_file=file, local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, gguf_file=file, local_files_only=True)


def gguf_tokenizer(path: str | os.PathLike, *, kind: str = "AutoTokenizer") -> Any:
    """The tokenizer transformers converts from the GGUF ``path`` (``kind``: ``"AutoTokenizer"``, or
    ``"TokenizersBackend"`` as posenc's Llama loader builds it), from the cache when it was converted before."""
    from transformers import AutoTokenizer

    from posenc.hf.packaged import cache_dir

    path = Path(path)
    folder = cache_dir() / "tokenizers" / _key(path, kind)
    if (folder / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    tokenizer = _convert(path.parent, path.name, kind)
    temporary = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(temporary)
        os.replace(temporary, folder)  # another process's copy may have won the race: theirs is the same
    except OSError:
        pass  # a cache that cannot be written costs the next load the conversion, nothing else
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return tokenizer
