"""A malformed ``"posenc"`` record in a saved ``config.json`` -- a key of what ``posenc.hf.save_pretrained`` wrote
dropped or given a wrong type -- is refused by ``posenc.hf.load_causal_lm`` and by ``posenc check`` with one
``ValueError`` naming the key (on the command line one line on stderr, exit 2), never a bare ``KeyError`` /
``TypeError``, and never loaded as another model (an entry without ``in_config`` would re-apply YaRN on top of the
config's YaRN)."""

from __future__ import annotations

import copy
import json
import shutil
import warnings

import pytest
import torch

from hf.tiny import tiny_model
from posenc.cli import main
from posenc.hf import extend_context, load_causal_lm, save_pretrained
from posenc.hf._record_check import _METHODS, ARGUMENTS
from posenc.runtimes.check import check

DROP = object()  # the key is removed
# folder -> (model type, extend_context calls)
FOLDERS = {
    "yarn": ("llama", [("yarn", 2.0, {})]),
    "gemma": ("gemma3_text", [("linear", 2.0, {"layer_type": "full_attention"})]),
    "dca_vllm": ("qwen2", [("dca_vllm", 2.0, {})]),
    "drope": ("llama", [("drope", None, {})]),
}
# (folder, path in the record, new value or DROP, the key the message names)
E = ("extensions", 0)
CASES = [
    ("yarn", (), [], "posenc"),
    ("yarn", ("extensions",), DROP, "posenc.extensions"),
    ("yarn", ("extensions",), {}, "posenc.extensions"),
    ("yarn", ("version",), 3, "posenc.version"),
    ("yarn", E, "yarn", "posenc.extensions[0]"),
    *[(f, (*E, "method"), DROP, "posenc.extensions[0].method") for f in FOLDERS],
    ("yarn", (*E, "method"), "yarm", "posenc.extensions[0].method"),
    *[(f, (*E, "factor"), DROP, "posenc.extensions[0].factor") for f in FOLDERS],
    ("dca_vllm", (*E, "factor"), "2", "posenc.extensions[0].factor"),
    ("yarn", (*E, "factor"), 0.5, "posenc.extensions[0].factor"),
    ("yarn", (*E, "factor"), True, "posenc.extensions[0].factor"),
    ("yarn", (*E, "in_config"), DROP, "posenc.extensions[0].in_config"),
    ("yarn", (*E, "in_config"), False, "posenc.extensions[0].in_config"),
    ("dca_vllm", (*E, "in_config"), True, "posenc.extensions[0].in_config"),
    ("gemma", (*E, "arguments"), None, "posenc.extensions[0].arguments"),
    ("dca_vllm", (*E, "arguments"), [], "posenc.extensions[0].arguments"),
    ("gemma", (*E, "arguments", "layer_type"), ["full_attention"], "posenc.extensions[0].arguments.layer_type"),
    ("dca_vllm", (*E, "arguments", "window"), 4, "posenc.extensions[0].arguments.window"),
    ("dca_vllm", (*E, "arguments", "max_position_embeddings"), "64", "posenc.extensions[0].arguments.max_position_"),
    ("drope", (*E, "arguments", "replace"), "no", "posenc.extensions[0].arguments.replace"),
    ("dca_vllm", (*E, "options"), None, "posenc.extensions[0].options"),
    ("drope", (*E, "options"), "x", "posenc.extensions[0].options"),
    ("dca_vllm", (*E, "original_max_position_embeddings"), [], "posenc.extensions[0].original_max_position_embed"),
    ("yarn", (*E, "max_position_embeddings"), {}, "posenc.extensions[0].max_position_embeddings"),
    ("drope", (*E, "max_position_embeddings"), 0, "posenc.extensions[0].max_position_embeddings"),
    ("yarn", (*E, "rope_parameters"), "yarn", "posenc.extensions[0].rope_parameters"),
    ("gemma", (*E, "layer_contexts"), {"full_attention": "64"}, "posenc.extensions[0].layer_contexts"),
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from lab.extend.needles.test_passkey import byte_bpe_tokenizer

    tokenizer, out = byte_bpe_tokenizer(), {}
    for name, (kind, calls) in FOLDERS.items():
        torch.manual_seed(0)
        model = tiny_model(kind, **({"use_sliding_window": False} if kind == "qwen2" else {}))
        for method, factor, kwargs in calls:
            extend_context(model, method, factor, **kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ServedOnlyWarning, PosencOnlyWarning: not what this file checks
            out[name] = save_pretrained(model, tokenizer, tmp_path_factory.mktemp(name) / "out", check=False)
    return out


def _edited(folder, path, value, tmp_path):
    out = tmp_path / "edited"
    shutil.copytree(folder, out)
    config = json.loads((out / "config.json").read_text())
    *parents, last = ("posenc", *path)
    holder = config
    for key in parents:
        holder = holder[key]
    if value is DROP:
        del holder[last]
    else:
        holder[last] = copy.deepcopy(value)
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_the_record_lists_every_method_and_argument_extend_context_records():
    from posenc.hf import _record, extend

    assert _METHODS == extend.METHODS and _record._ARGUMENTS == ARGUMENTS


@pytest.mark.parametrize("name", list(FOLDERS))
def test_the_records_save_pretrained_writes_pass(folders, name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load_causal_lm(folders[name])
    assert check(folders[name])


@pytest.mark.parametrize(("name", "path", "value", "key"), CASES, ids=[f"{c[0]}-{'.'.join(map(str, c[1]))}-"
                         f"{'drop' if c[2] is DROP else repr(c[2])}" for c in CASES])
def test_a_malformed_record_is_refused_naming_the_key(folders, tmp_path, capsys, name, path, value, key):
    folder = _edited(folders[name], path, value, tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=r"^" + key.replace("[", r"\[").replace("]", r"\]")):
            load_causal_lm(folder)
    with pytest.raises(ValueError, match=r"^" + key.replace("[", r"\[").replace("]", r"\]")):
        check(folder)
    capsys.readouterr()  # transformers' progress bars
    code = main(["check", str(folder)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"posenc check: {key}") and err.count("\n") == 1, err
