"""``posenc.deploy.methods``: a method name parsed once, and the pre-check the command line runs before torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from posenc.deploy.methods import Method, calls, check_export_method, parse, rebuild


def test_parse_splits_a_composed_name_once():
    assert parse("yarn+string", 2.0) == Method(name="yarn+string", first="yarn", then="string", factor=2.0)
    yarn, self_extend, drope = parse("yarn", 2.0), parse("self_extend", 2.0), parse("drope")
    assert (yarn.frequency, yarn.remapping, yarn.drops, yarn.label) == ("yarn", None, False, "yarn x2")
    assert (self_extend.frequency, self_extend.remapping) == (None, "self_extend")
    assert parse("yarn+string").remapping == "string" and parse("yarn+string", 2.0).label == "yarn+string x2"
    assert (drope.drops, drope.label, drope.frequency) == (True, "drope", None)


@pytest.mark.parametrize(
    ("name", "match"),
    [("yarn+self_extend", "a remapping method that runs within"), ("yarn+string+string", "two parts at most"),
     ("string+yarn", "FREQUENCY\\+REMAP")],
)
def test_a_bad_composed_name_is_refused_naming_methods(name, match):
    with pytest.raises(ValueError, match=f"^methods='{name.replace('+', '[+]')}' is invalid: expected .*{match}"):
        parse(name)


def test_the_calls_and_the_python_that_rebuild_a_model():
    assert calls("yarn+string", 2.0, original=64) == (
        "posenc.hf.extend_context(model, 'yarn', 2, original_max_position_embeddings=64); "
        "posenc.hf.extend_context(model, 'string', 1)"
    )
    assert calls("drope", 1.0, original=64) == "posenc.hf.extend_context(model, 'drope')"
    assert rebuild("m", "linear", 4.0, dtype="bfloat16", original=32, layer_types=("full_attention",)) == (
        "model, tokenizer = posenc.hf.load_causal_lm('m', dtype='bfloat16'); posenc.hf.extend_context(model, "
        "'linear', 4, original_max_position_embeddings=32, layer_type='full_attention')"
    )


def test_the_export_pre_check_imports_no_torch():
    code = "import sys; from posenc.deploy.methods import check_export_method; check_export_method('yarn'); " \
           "import posenc.deploy; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
    with pytest.raises(ValueError, match="method='yarm' is invalid"):
        check_export_method("yarm+string")
