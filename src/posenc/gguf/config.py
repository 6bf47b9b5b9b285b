"""A GGUF file's transformers config from posenc's header reader: what transformers builds, in milliseconds.

transformers builds the config of a GGUF it has no fast reader for (Gemma 3, Qwen2, ... in transformers 5.24)
through ``load_gguf_checkpoint(..., return_tensors=False)``, whose ``gguf.GGUFReader`` turns every string of the
vocabulary into a numpy view: 30 s for Gemma 3's 262,144 tokens on an idle 2-core EPYC, 110 s under load -- before
a bad ``--lengths`` could be refused. :func:`config_dict` gives the same dict from ``posenc.gguf.header`` (which
leaves string arrays unread) through transformers' own tables (``GGUF_TO_TRANSFORMERS_MAPPING["config"]``,
``GGUF_CONFIG_DEFAULTS_MAPPING``), and :func:`hf_config` the config transformers makes of it; a test keeps both equal
to transformers' slow path on the real files.

Only the architectures :data:`ARCHITECTURES` lists: those whose config ``load_gguf_checkpoint`` builds from the
metadata alone, with no architecture-specific step (it has some for Mistral's name, StableLM, LFM2, gpt-oss,
Gemma 4, T5, MoE models); the others go through transformers.
"""

from __future__ import annotations

from typing import Any

from posenc.gguf.header import GGUFArray, GGUFHeader

#: GGUF ``general.architecture`` values :func:`config_dict` reads, each as ``load_gguf_checkpoint`` would.
ARCHITECTURES = frozenset({"qwen2", "qwen3", "phi3", "gemma2", "gemma3"})
#: Architectures ``load_gguf_checkpoint`` ties the embeddings of whatever the tensors say (its ``exceptions``).
_ALWAYS_TIED = frozenset({"falcon", "bloom"})
#: ``load_gguf_checkpoint`` names Gemma 3's text backbone so.
_MODEL_TYPES = {"gemma3": "gemma3_text"}


def handles(header: GGUFHeader) -> bool:
    """Whether :func:`config_dict` reads this file's architecture."""
    return header.architecture in ARCHITECTURES


def _value(value: Any) -> Any:
    """A metadata value as transformers parses it: numeric arrays as lists (one element: the element)."""
    if isinstance(value, tuple):
        return list(value) if len(value) != 1 else value[0]
    return value


def config_dict(header: GGUFHeader) -> dict[str, Any]:
    """The config dict ``load_gguf_checkpoint(path, return_tensors=False)["config"]`` returns, from the header.

    Raises:
        ValueError: an architecture not in :data:`ARCHITECTURES`.
    """
    from transformers.modeling_gguf_pytorch_utils import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_TO_TRANSFORMERS_MAPPING

    from posenc._checks import fail

    architecture = header.architecture
    if architecture not in ARCHITECTURES:
        fail("general.architecture", architecture, f"one of {sorted(ARCHITECTURES)} (file {header.path})")
    renames = GGUF_TO_TRANSFORMERS_MAPPING["config"]
    config: dict[str, Any] = {
        "tie_word_embeddings": architecture in _ALWAYS_TIED or all(t.name != "output.weight" for t in header.tensors)
    }
    for key, value in GGUF_CONFIG_DEFAULTS_MAPPING.get(architecture, {}).items():
        config.setdefault(key, value)
    for key, value in header.metadata.items():
        prefix, _, rest = key.partition(".")
        table = renames.get(prefix)
        if table is None or rest not in table or table[rest] in (None, -1):
            continue
        if isinstance(value, GGUFArray):  # a string array: no config key of these architectures is one
            fail(key, f"an array of {value.count} strings", f"a value transformers' config reads (file {header.path})")
        config[table[rest]] = _value(value)
    config["model_type"] = _MODEL_TYPES.get(config.get("model_type", architecture), config.get("model_type"))
    tokens = header.metadata.get("tokenizer.ggml.tokens")
    if "vocab_size" not in config and tokens is not None:  # as transformers: the vocabulary's size (its #32526)
        config["vocab_size"] = tokens.count if isinstance(tokens, GGUFArray) else len(tokens)
    return config


def hf_config(header: GGUFHeader) -> Any:
    """The transformers config of :func:`config_dict`, made as ``AutoConfig.from_pretrained(folder,
    gguf_file=...)`` makes it (``CONFIG_MAPPING[model_type].from_dict``, ``_name_or_path`` the file's folder)."""
    from transformers import CONFIG_MAPPING

    values = config_dict(header)
    config = CONFIG_MAPPING[values["model_type"]].from_dict(values)
    config._name_or_path = str(header.path.parent)
    return config
