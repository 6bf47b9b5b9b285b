"""``posenc export`` then ``posenc check`` on the real models, through the command line: Gemma 3 270M (linear x8 on
its full_attention layers: two bases, 1e6 scaled and 1e4 sliding unscaled) and Qwen2.5-Coder 0.5B (YaRN x4), each to
a transformers folder and to a GGUF. Skipped unless the model is at hand (``posenc.hf.packaged.available``); minutes
each (a load of the model, its weights compared with the source's for a GGUF).

What each row must say (the runtime releases of ``posenc.runtimes``): a folder runs as measured in transformers, vLLM
and llama.cpp (converted), SGLang too (its gemma3_causal.py read from the 0.5.23 wheel: the global layers through
transformers' init function); a GGUF runs as measured in llama.cpp, transformers' own GGUF loader drops the scaling
(differs, naming posenc's loader), vLLM has no GGUF loader, SGLang builds the config with transformers' loader, which
drops it too (differs).
"""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest

pytest.importorskip("gguf")
pytest.importorskip("accelerate")

from posenc.cli import main  # noqa: E402 - after the skips
from posenc.gguf.header import read_gguf_header  # noqa: E402
from posenc.hf import packaged  # noqa: E402
from posenc.hf.load import load_config, resolve_model  # noqa: E402

pytestmark = pytest.mark.slow

#: A GGUF export compares every weight with the source's (minutes on 2 cores): run where POSENC_LONG_TESTS=1; the
#: path itself is tested on tiny files in tests/hf/test_gguf_export_archs.py.
LONG = os.environ.get("POSENC_LONG_TESTS") == "1"

#: model -> (method, factor, expected status per runtime: folder, GGUF)
CASES = {
    "gemma3-270m": ("linear", 8, {"transformers": "same", "vllm": "same", "sglang": "same", "llamacpp": "same"},
                    {"transformers": "differs", "vllm": "cannot run this", "sglang": "differs", "llamacpp": "same"}),
    "qwen2.5-coder-0.5b": ("yarn", 4, {"transformers": "same", "vllm": "same", "sglang": "same", "llamacpp": "same"},
                           {"transformers": "differs", "vllm": "cannot run this", "sglang": "differs",
                            "llamacpp": "same"}),
}


def _cli(*args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def _statuses(path) -> tuple[int, dict[str, str]]:
    code, out, _ = _cli("check", path, "--json")
    return code, {row["runtime"]: row["status"] for row in json.loads(out)}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("to", ["folder", "gguf"])
def test_export_then_check(name, to, tmp_path):
    if not packaged.available(name):
        pytest.skip(f"{name} is not at hand (posenc.hf.packaged.available)")
    if to == "gguf" and not LONG:
        pytest.skip("a real GGUF export takes minutes on 2 cores: POSENC_LONG_TESTS=1 runs it")
    method, factor, folder_rows, gguf_rows = CASES[name]
    save = tmp_path / (f"{name}.gguf" if to == "gguf" else name)
    code, out, err = _cli("export", name, "--method", method, "--factor", factor, "--save", save, "--quiet")
    assert code == 0, err
    source = resolve_model(name)
    original = read_gguf_header(source.path).arch_value("context_length")
    code, rows = _statuses(save)
    assert rows == (gguf_rows if to == "gguf" else folder_rows)
    assert code == (1 if to == "gguf" else 0)  # a GGUF: transformers' own loader differs

    config = load_config(save) if to == "gguf" else json.loads((save / "config.json").read_text())
    params = config.rope_parameters if to == "gguf" else config["rope_parameters"]
    context = config.max_position_embeddings if to == "gguf" else config["max_position_embeddings"]
    assert context == factor * original
    if name.startswith("gemma3"):  # the full layers scaled at 1e6, the sliding ones untouched at 1e4
        assert params["full_attention"] == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
        assert params["sliding_attention"] == {"rope_type": "default", "rope_theta": 1e4}
    else:
        assert (params["rope_type"], params["factor"], params["rope_theta"]) == ("yarn", 4.0, 1e6)
        assert params["original_max_position_embeddings"] == original
    if to == "gguf":  # the source's tensors, byte for byte
        src, dst = read_gguf_header(source.path), read_gguf_header(save)
        assert [(t.name, t.ggml_type, t.shape) for t in dst.tensors] == [(t.name, t.ggml_type, t.shape)
                                                                        for t in src.tensors]
        with open(src.path, "rb") as a, open(dst.path, "rb") as b:
            for t, u in zip(src.tensors, dst.tensors, strict=True):
                a.seek(t.offset), b.seek(u.offset)
                assert a.read(t.n_bytes) == b.read(u.n_bytes), t.name


def test_gemma3_extended_on_its_sliding_layers_is_refused_for_a_gguf(tmp_path):
    """One line on stderr, exit 2, nothing written: llama.cpp would leave the sliding layers unscaled."""
    if not packaged.available("gemma3-270m"):
        pytest.skip("gemma3-270m is not at hand (posenc.hf.packaged.available)")
    save = tmp_path / "g.gguf"
    code, out, err = _cli("export", "gemma3-270m", "--method", "linear", "--factor", 8, "--layer-type", "all",
                          "--save", save)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "would run them unscaled" in err and "--save DIR" in err
    assert list(tmp_path.iterdir()) == []
