"""``posenc``'s start: a bad argument to any subcommand is refused before torch or transformers is imported (seconds
on a loaded machine, so a typo used to wait 12-36 s for its one line), ``posenc --version``, and the parsing facts
the command line mirrors from modules that import torch, checked against their sources.

The refusals run ``python -X importtime -m posenc ...`` in a fresh process: its stderr holds one ``import time:`` line
per module imported, then the command's own line.
"""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import posenc
from posenc import cli
from posenc._version import __version__

SRC = Path(posenc.__file__).resolve().parents[1]

#: One bad argument per subcommand, each refused by a different check: argparse's types and choices, the command's own
#: checks that need no model (--pick's settings, --target's and --budget's forms, export's method, check's runtimes).
BAD = [
    (["lab", "--steps", "0"], "argument --steps: '0' is invalid"),
    (["lab", "--task", "sort"], "argument --task: invalid choice: 'sort'"),
    (["vision", "--pool", "max"], "argument --pool: invalid choice: 'max'"),
    (["extend", "smollm2", "--dtype", "f8"], "argument --dtype: invalid choice: 'f8'"),
    (["extend", "smollm2", "--lengths", "2xx"], "argument --lengths: '2xx' is invalid"),
    (["extend", "smollm2", "--target", "2x"], "--target='2x' is invalid: expected a setting of --pick"),
    (["extend", "smollm2", "--pick", "--target", "abc"], "target='abc' is invalid"),
    (["extend", "smollm2", "--pick", "--target", "2x", "--budget", "1q"], "budget='1q' is invalid"),
    (["export", "smollm2", "--method", "yarm", "--factor", "2", "--save", "x"], "method='yarm' is invalid"),
    (["export", "smollm2", "--method", "yarn", "--factor", "0.5", "--save", "x"], "argument --factor: '0.5'"),
    (["check", "smollm2", "--runtimes", "vllm,tgi"], "runtimes='tgi' is invalid: expected one of"),
    (["check", "smollm2", "--runtimes", "vllm,vllm"], "runtimes='vllm,vllm' is invalid: expected each of"),
    (["bench", "--min-run-time", "0"], "argument --min-run-time: '0' is invalid"),
    (["figures", "--bogus"], "unrecognized arguments: --bogus"),
    (["demo", "--factor", "0.5"], "argument --factor: '0.5' is invalid"),
]


def _posenc(*argv: str, cwd: Path) -> tuple[int, list[str], list[str]]:
    """``python -X importtime -m posenc *argv``: (exit status, modules imported, the other stderr lines)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "posenc", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    lines = done.stderr.splitlines()
    imported = [line.split("|")[-1].strip() for line in lines if line.startswith("import time:")]
    return done.returncode, imported[1:], [line for line in lines if not line.startswith("import time:")]


@pytest.mark.parametrize(("argv", "needle"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_argument_is_refused_before_torch_or_transformers_is_imported(argv, needle, tmp_path):
    code, imported, err = _posenc(*argv, cwd=tmp_path)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"posenc {argv[0]}: ") and needle in err[0], err
    heavy = [m for m in imported if m.split(".")[0] in ("torch", "transformers", "numpy", "gguf")]
    assert not heavy, f"imported before the refusal: {heavy[:5]}"
    assert not [m for m in imported if m.startswith(("posenc.hf", "posenc.runtimes", "posenc.lab.common"))]
    assert not any(tmp_path.iterdir())  # nothing written (no runs/ folder either)


def test_version(tmp_path, capsys):
    code, imported, err = _posenc("--version", cwd=tmp_path)
    assert code == 0 and not err and "torch" not in imported
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"posenc {__version__}\n"
    assert posenc.__version__ == __version__


def test_import_posenc_loads_the_library_on_first_use():
    """``import posenc`` imports no torch; the first public name loads the whole API, every name bound at once."""
    code = (
        "import sys, posenc; light = 'torch' not in sys.modules; rope = posenc.RotaryEmbedding; "
        "print(light, 'torch' in sys.modules, all(n in vars(posenc) for n in posenc.__all__), len(posenc.available()))"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    light, loaded, bound, encodings = out.stdout.split()
    assert (light, loaded, bound) == ("True", "True", "True") and int(encodings) == len(posenc.available())
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        posenc.nonexistent  # noqa: B018
    assert set(posenc.__all__) <= set(dir(posenc))


@pytest.mark.parametrize("package", ["posenc", "posenc.hf"])
def test_the_api_module_binds_exactly_the_public_names(package):
    """``posenc._api`` (``posenc.hf._api``) imports each name of the package's ``__all__`` and nothing else (read from
    its source), and the package binds them all on first use."""
    module = importlib.import_module(package)
    tree = ast.parse(Path(module.__file__).with_name("_api.py").read_text())
    names = [a.asname or a.name for node in tree.body if isinstance(node, ast.ImportFrom) for a in node.names]
    assert sorted(names) == sorted(module.__all__)
    assert all(getattr(module, n) is not None for n in module.__all__)


def test_the_parsing_facts_are_their_sources():
    from posenc import _dtypes
    from posenc.cli import check, lab, parsing, vision
    from posenc.gguf.write import TENSOR_TYPES
    from posenc.hf.dtypes import DTYPE_CHOICES
    from posenc.lab.extend.settings.config import ExtendConfig
    from posenc.lab.extend.settings.options import OPTIONS, config_settings
    from posenc.lab.length.config import DEFAULT_ENCODINGS as LAB
    from posenc.lab.length.config import StudyConfig
    from posenc.lab.vision.config import DEFAULT_ENCODINGS as VISION
    from posenc.lab.vision.config import VisionConfig
    from posenc.runtimes import RUNTIMES

    assert (_dtypes.DTYPE_CHOICES, parsing.TENSOR_TYPES, check.RUNTIMES) == (DTYPE_CHOICES, TENSOR_TYPES, RUNTIMES)
    assert (lab.LAB_ENCODINGS, vision.VISION_ENCODINGS) == (LAB, VISION)
    # posenc extend's defaults are ExtendConfig's own (posenc.lab.extend.settings.options: one list, no mirror)
    extend_defaults = {o.field: o.to_config(o.default) for o in OPTIONS if o.default is not None}
    assert extend_defaults == {"finetune_steps": 0, "finetune_positions": ("plain",), "task": "lm", "train_len": 128,
                               "train_steps": 1000, "device": "auto", "dtype": None, "seed": 0, "baseline": True}
    new = ExtendConfig(model="new", task="passkey")
    parsed = cli.build_parser().parse_args(["extend", "new", "--task", "passkey"])
    assert ExtendConfig(**config_settings(parsed)) == new
    for mirror, config in [(lab.LAB_DEFAULTS, StudyConfig()), (vision.VISION_DEFAULTS, VisionConfig()),
                           (extend_defaults, ExtendConfig(model="smollm2"))]:
        assert mirror == {name: getattr(config, name) for name in mirror}


def test_export_lists_only_the_methods_it_accepts(capsys, tmp_path):
    """export's "expected one of [...]" once listed every method of posenc.hf.extend.METHODS, self_extend, string and
    drope among them, which it then refused; now the list is what it writes (each one refused only for a model or a
    path), a method it never writes is refused up front saying why, and a remapping one passes on to the refusal
    that names the Python rebuilding the model (tests/lab/extend/test_plan_export.py)."""
    from posenc.deploy.methods import EXPORT_METHODS, KNOWN_METHODS, REFUSED, check_export_method
    from posenc.hf.extend import METHODS

    assert KNOWN_METHODS == METHODS

    code = cli.main(["export", "smollm2", "--method", "yarm", "--factor", "2", "--save", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    listed = ast.literal_eval(err.split("expected one of ", 1)[1].split("]", 1)[0] + "]")
    assert listed == list(EXPORT_METHODS)
    assert set(EXPORT_METHODS) <= set(METHODS)
    for method in EXPORT_METHODS:
        assert check_export_method(method) == method
    for method in [*REFUSED, "yarm", "yarn+strin", "yarn,ntk", ""]:
        with pytest.raises(ValueError, match=r"^method=.* is invalid: expected "):
            check_export_method(method)
    for method in ("self_extend", "string", "yarn+string", "dca"):  # refused later, for this model, with the Python
        assert check_export_method(method) == method
    with pytest.raises(ValueError, match="long_factor comes from a search"):
        check_export_method("longrope")
    with pytest.raises(ValueError, match="nothing to export before that fine-tune"):
        check_export_method("drope")


@pytest.mark.parametrize("first", ["from posenc.attention import BACKENDS", "import posenc.attention", ""])
def test_posenc_attention_is_the_function_whatever_was_imported_first(first):
    """``posenc.attention`` is the function also where the submodule of the same name was imported before the first
    ``posenc.<name>`` (the import system binds a submodule on its package; an eager import would have bound the
    function over it); the module stays ``sys.modules["posenc.attention"]``."""
    code = (
        f"{first}\nimport sys, types, torch, posenc\nq = torch.randn(1, 1, 4, 8)\n"
        "print(posenc.attention(q, q, q).shape == q.shape, "
        "isinstance(sys.modules['posenc.attention'], types.ModuleType))"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]
