"""The package layout, read from the source with ``ast`` (nothing imported): dependencies run one way.

- no import cycle between modules of ``posenc``, counting every import: module level, ``if TYPE_CHECKING:`` blocks (a
  type that can only be named through a cycle is a cycle in the design) and imports inside functions (one that only
  runs late hides a cycle at run time, not in the design: two modules that need each other are one module, or a
  third is missing); the package root ``posenc`` counts as a module that imports what it re-exports;
- the core (``posenc`` outside ``posenc.lab``; the command line aside) never imports the lab or the command line;
- inside the lab: ``common`` imports nothing of the lab but itself; a study package (every other subpackage of
  ``posenc.lab``: ``length``, ``vision``, ``extend``) imports ``common`` and itself, never another study; a tool
  (a module directly in ``posenc.lab``: ``bench``, ``figures``) imports ``common`` only. These rules hold for every
  import, lazy ones included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import posenc

ROOT = Path(posenc.__file__).resolve().parent
#: The command line (the package ``posenc.cli`` and its modules): the one place where the core meets the lab.
CLI = frozenset({"posenc.cli", "posenc.__main__"})


def module_names(root: Path = ROOT) -> dict[str, Path]:
    """Every module under ``root`` by dotted name (a package by its ``__init__.py``)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = ("posenc", *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(source: str, module: str, modules: set[str], *, is_package: bool = False) -> list[tuple[str, bool]]:
    """``(imported module, lazy)`` for every import of a module of ``modules`` in ``source``, in order.

    ``from X import y`` is an import of ``X.y`` when that is a module, else of ``X``; relative imports are resolved
    against ``module`` (a package's own name when ``is_package``). ``lazy``: the import sits inside a function and
    runs only when it is called; anything else, ``if TYPE_CHECKING:`` blocks included, is module level.
    """
    found: list[tuple[str, bool]] = []
    package = module if is_package else module.rpartition(".")[0]

    def visit(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend((alias.name, lazy) for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source_module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source_module = node.module or ""
            for alias in node.names:
                child = f"{source_module}.{alias.name}"
                if child in modules:
                    found.append((child, lazy))
                elif source_module in modules:
                    found.append((source_module, lazy))
        for child_node in ast.iter_child_nodes(node):
            visit(child_node, lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source), False)
    return found


def import_graph(root: Path = ROOT) -> dict[str, list[tuple[str, bool]]]:
    """Each module's imports of other ``posenc`` modules (``imports_of``), self-imports left out."""
    names = module_names(root)
    graph = {}
    for name, path in names.items():
        found = imports_of(path.read_text(encoding="utf-8"), name, set(names), is_package=path.name == "__init__.py")
        graph[name] = [(target, lazy) for target, lazy in found if target != name]
    return graph


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph ``edges`` as ``[a, b, ..., a]``, or None when it has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def lab_part(module: str) -> str | None:
    """Where a module sits: ``"core"``, ``"cli"``, ``"lab"`` (the package itself), ``"common"``, ``"study:<name>"``
    or ``"tool:<name>"``."""
    if module in CLI or module.startswith("posenc.cli."):
        return "cli"
    parts = module.split(".")
    if parts[:2] != ["posenc", "lab"]:
        return "core"
    if len(parts) == 2:
        return "lab"
    if parts[2] == "common":
        return "common"
    is_package = len(parts) > 3 or (ROOT / "lab" / parts[2] / "__init__.py").is_file()
    return f"study:{parts[2]}" if is_package else f"tool:{parts[2]}"


def layering_errors(graph: dict[str, list[tuple[str, bool]]]) -> list[str]:
    """Every import that breaks the one-way rules of the module docstring, as ``"a -> b (why)"``."""
    errors = []
    for module, imports in graph.items():
        part = lab_part(module)
        for target, lazy in imports:
            other = lab_part(target)
            how = " (lazy)" if lazy else ""
            if part == "core" and other != "core":
                errors.append(f"{module} -> {target}{how}: the core never imports the lab or the command line")
            elif part == "common" and other not in ("core", "common"):
                errors.append(f"{module} -> {target}{how}: common imports no study, tool or lab package")
            elif part.startswith("study:") and other not in ("core", "common", part):
                errors.append(f"{module} -> {target}{how}: a study imports only common and itself, not {other}")
            elif part.startswith("tool:") and other not in ("core", "common", part):
                errors.append(f"{module} -> {target}{how}: a tool imports only common, not {other}")
    return errors


# ---------------------------------------------------------------------------------------------------------------------
# The tree as it is


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_the_graph_sees_the_imports_it_must(graph):
    """Guards the checks below against passing on an empty or mis-resolved graph."""
    assert {"posenc.lab.common", "posenc.lab.length", "posenc.lab.vision", "posenc.lab.extend"} <= set(graph)
    assert {lab_part(m) for m in graph} >= {"core", "cli", "lab", "common", "study:length", "study:vision",
                                            "study:extend", "tool:bench", "tool:figures"}
    edges = {(m, t) for m, imports in graph.items() for t, lazy in imports if not lazy}
    assert ("posenc.lab.length.study", "posenc.lab.common.train") in edges
    # `from posenc.lab.extend.targets import cost`: a submodule imported from its package
    assert ("posenc.lab.extend.targets.lab", "posenc.lab.extend.targets.cost") in edges
    assert ("posenc.lab.common.train", "posenc.lab.common.gpt") in edges
    lazy = {(m, t) for m, imports in graph.items() for t, lazy in imports if lazy}
    assert ("posenc.cli.lab", "posenc.lab.length.study") in lazy


def test_no_import_cycle(graph):
    """No cycle, lazy imports inside functions included (issue 49: attention <-> remapping, rotary <-> rotary_hf,
    _rope_patch <-> rope_float32, the posenc.hf save/load/record knot, and rates <-> report <-> sampling were cycles
    through such imports)."""
    edges = {m: {t for t, _ in imports} for m, imports in graph.items()}
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_a_cycle_through_an_import_inside_a_function_is_found():
    modules = {"posenc", "posenc.a", "posenc.b"}
    graph = {
        "posenc.a": imports_of("from posenc import b\n", "posenc.a", modules),
        "posenc.b": imports_of("def f():\n    from posenc.a import x\n", "posenc.b", modules),
    }
    assert graph["posenc.b"] == [("posenc.a", True)]
    edges = {m: {t for t, _ in imports} for m, imports in graph.items()}
    assert find_cycle(edges) == ["posenc.a", "posenc.b", "posenc.a"]


def test_dependencies_run_one_way(graph):
    """study -> common -> core; tools -> common; the core never imports the lab."""
    errors = layering_errors(graph)
    assert not errors, "\n".join(errors)


def test_the_core_never_imports_the_interop_package(graph):
    """``posenc.hf`` (transformers, GGUF), ``posenc.runtimes`` (the runtime readers, on top of it) and ``posenc.deploy``
    (the product path, on both) build on the core, never the reverse, lazily either: the core's own Hugging Face
    config translation (``RotaryEmbedding.from_hf``) lives in ``posenc.encodings.rotary_hf``. The package root
    is the public facade (``posenc.hf`` is one of its names; ``posenc._api`` imports them for it on first use), not a
    module the core's code imports."""
    def is_interop(m: str) -> bool:  # transformers/GGUF interop, the runtime readers and the product path on them
        return any(m == p or m.startswith(p + ".") for p in ("posenc.hf", "posenc.runtimes", "posenc.deploy"))

    interop = {m for m in graph if is_interop(m)}
    core = {m for m in graph if lab_part(m) == "core"} - interop - {"posenc", "posenc._api"}
    wrong = [f"{m} -> {t}" for m in sorted(core) for t, _ in graph[m] if is_interop(t)]
    assert not wrong, "\n".join(wrong)
    assert ("posenc.hf.rotary", "posenc.encodings.rotary_hf") in {(m, t) for m, i in graph.items() for t, _ in i}


# ---------------------------------------------------------------------------------------------------------------------
# The checks themselves, on made-up modules


MODULES = {"posenc", "posenc.a", "posenc.lab", "posenc.lab.common", "posenc.lab.common.x", "posenc.lab.length",
           "posenc.lab.length.study", "posenc.lab.vision", "posenc.lab.vision.vit"}


def test_imports_are_resolved_to_modules():
    source = (
        "import posenc.a\n"
        "import os\n"
        "from posenc.lab.common import x\n"  # a submodule
        "from posenc.lab.common.x import thing\n"  # a name in a module
        "from posenc import build\n"  # a name in a package
        "from . import study\n"  # relative, inside posenc.lab.length
        "from ..common import x as y\n"
        "if TYPE_CHECKING:\n"
        "    from posenc.lab.vision import vit\n"
        "def f():\n"
        "    from posenc.a import z\n"
        "class C:\n"
        "    import posenc.a\n"
    )
    found = imports_of(source, "posenc.lab.length.study", MODULES)
    assert found == [
        ("posenc.a", False),
        ("posenc.lab.common.x", False),
        ("posenc.lab.common.x", False),
        ("posenc", False),
        ("posenc.lab.length.study", False),
        ("posenc.lab.common.x", False),
        ("posenc.lab.vision.vit", False),
        ("posenc.a", True),
        ("posenc.a", False),
    ]
    assert imports_of("from . import x", "posenc.lab.common", MODULES, is_package=True) == [
        ("posenc.lab.common.x", False)
    ]


def test_a_cycle_is_found_and_named():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]


def test_every_forbidden_direction_is_reported():
    graph = {
        "posenc.a": [("posenc.lab.common.x", True)],
        "posenc.lab.common.x": [("posenc.lab.length.study", False), ("posenc.a", False)],
        "posenc.lab.length.study": [("posenc.lab.vision.vit", True), ("posenc.lab.common.x", False)],
        "posenc.cli": [("posenc.lab.length.study", True)],
    }
    assert layering_errors(graph) == [
        "posenc.a -> posenc.lab.common.x (lazy): the core never imports the lab or the command line",
        "posenc.lab.common.x -> posenc.lab.length.study: common imports no study, tool or lab package",
        "posenc.lab.length.study -> posenc.lab.vision.vit (lazy): a study imports only common and itself, "
        "not study:vision",
    ]


def test_deploy_never_imports_the_lab(graph):
    """``posenc.deploy`` (``posenc export``, the product path the lab's --save writes through) imports torch, the core,
    ``posenc.hf`` and ``posenc.runtimes``, never ``posenc.lab`` or the command line, lazily either (issue 69)."""
    deploy = {m for m in graph if m == "posenc.deploy" or m.startswith("posenc.deploy.")}
    assert {"posenc.deploy", "posenc.deploy.methods", "posenc.deploy.exporting"} <= deploy
    wrong = [f"{m} -> {t}" + (" (lazy)" if lazy else "") for m in sorted(deploy) for t, lazy in graph[m]
             if lab_part(t) != "core"]
    assert not wrong, "\n".join(wrong)


def test_the_gguf_format_and_the_interop_package_import_nothing_above_them(graph):
    """``posenc.gguf`` (the file format) sits below ``posenc.hf`` and ``posenc.runtimes``, and ``posenc.hf`` below
    the runtime readers, the product path and the lab, lazy imports included: a save prints the runtime check through
    a hook the package root sets (``posenc._save_check``), not an import."""

    def under(m: str, *packages: str) -> bool:
        return any(m == p or m.startswith(p + ".") for p in packages)

    above = {
        "posenc.gguf": ("posenc.hf", "posenc.runtimes", "posenc.deploy", "posenc.lab"),
        "posenc.hf": ("posenc.runtimes", "posenc.deploy", "posenc.lab"),
    }
    wrong = [
        f"{m} -> {t}{' (lazy)' if lazy else ''}"
        for package, forbidden in above.items()
        for m in sorted(graph)
        if under(m, package)
        for t, lazy in graph[m]
        if under(t, *forbidden)
    ]
    assert not wrong, "\n".join(wrong)
    edges = {(m, t) for m, imports in graph.items() for t, _ in imports}
    assert {("posenc.hf.gguf_export", "posenc.gguf.write"), ("posenc.gguf.write", "posenc.gguf.rope")} <= edges


def test_no_two_folders_of_extend_import_each_other(graph):
    """Inside ``posenc.lab.extend`` dependencies run one way between its folders (``study``, ``targets``, ``stats``,
    ...; a module directly in the package counts as a folder of its own), lazy imports included: issue 69 found
    ``study`` <-> ``targets`` (the settings, the cost model, fine-tuning and labels both needed) and ``stats`` <->
    ``study``."""
    package = "posenc.lab.extend."

    def folder(module: str) -> str | None:
        return module[len(package) :].split(".")[0] if module.startswith(package) else None

    edges: dict[tuple[str, str], list[str]] = {}
    for module, imports in graph.items():
        for target, lazy in imports:
            a, b = folder(module), folder(target)
            if a is not None and b is not None and a != b:
                edges.setdefault((a, b), []).append(f"{module} -> {target}{' (lazy)' if lazy else ''}")
    assert {("study", "targets"), ("pick", "study")} <= set(edges)  # the check sees the folders' imports
    both = [f"{a} <-> {b}: {edges[a, b][0]}; {edges[b, a][0]}" for a, b in sorted(edges) if a < b and (b, a) in edges]
    assert not both, "\n".join(both)
