"""mkdocs hook: the studies (``experiments/``) and the timing figures (``BENCHMARKS.md``) built into the site from the
repository's root, and the links to them made to work there.

The pages of ``docs/`` link those files as the repository lays them out (``../../BENCHMARKS.md`` from
``docs/guides/``), so a link works where the Markdown is read (a clone, a forge). On the site they sit at its root
(``BENCHMARKS/``, ``experiments/...``): ``on_files`` adds every file of ``INCLUDED`` there, and a page listing the
files of each included folder that has no README.md; ``on_page_markdown`` rewrites a link to one of those files or
folders, and one of theirs to a page of docs/, to its place in the site. A link to anything else is left as written,
so ``mkdocs build --strict`` reports it where it is broken.
"""

from __future__ import annotations

import functools
import posixpath
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: What the site carries from outside docs/, relative to the repository's root: files, and folders (every file in
#: them but dotfiles). bench/gpu/README.md is linked from BENCHMARKS.md.
INCLUDED = ("BENCHMARKS.md", "experiments", "bench/gpu/README.md")
#: A Markdown link's target: ``](path#anchor)`` or ``](path)``.
LINK = re.compile(r"\]\((?P<path>[^()\s#]+)(?P<anchor>#[^()\s]*)?\)")


@functools.cache
def repo_files() -> tuple[str, ...]:
    """Every file of ``INCLUDED``, as a path relative to the repository's root (posix), sorted."""
    found = []
    for name in INCLUDED:
        path = ROOT / name
        children = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for child in children:
            rel = child.relative_to(ROOT)
            if not any(part.startswith(".") for part in rel.parts):
                found.append(rel.as_posix())
    return tuple(found)


@functools.cache
def folders() -> dict[str, str]:
    """Each folder holding an included file, to the page that stands for it on the site: its README.md, else a
    generated ``index.md`` listing it."""
    names = {posixpath.dirname(f) for f in repo_files()} - {""}
    names |= {posixpath.dirname(n) for n in names} - {""}  # a folder holding only folders
    files = set(repo_files())
    return {n: f"{n}/README.md" if f"{n}/README.md" in files else f"{n}/index.md" for n in sorted(names)}


def listing(folder: str) -> str:
    """The generated page of ``folder``: a link to each of its files and folders."""
    files = [f for f in repo_files() if posixpath.dirname(f) == folder]
    subs = [n for n in folders() if posixpath.dirname(n) == folder]
    lines = [f"# `{folder}/`", "", "The folder's files in the repository:", ""]
    lines += [f"- [{posixpath.basename(n)}/]({posixpath.relpath(folders()[n], folder)})" for n in subs]
    lines += [f"- [{posixpath.basename(f)}]({posixpath.basename(f)})" for f in files]
    return "\n".join(lines) + "\n"


def site_link(page: str, target: str) -> str | None:
    """Where a link of ``page`` (its path in the repository: ``docs/...`` or an included file) to ``target``
    points on the site, relative to the page's place there; None where it names no included file or folder and no
    file of docs/."""
    if "://" in target or target.startswith(("/", "mailto:")):
        return None
    in_repo = posixpath.normpath(posixpath.join(posixpath.dirname(page), target))
    if in_repo in set(repo_files()):
        site = in_repo
    elif in_repo in folders():
        site = folders()[in_repo]
    elif in_repo.startswith("docs/") and (ROOT / in_repo).is_file():
        site = in_repo.removeprefix("docs/")  # a repository page's link to a page of the site
    else:
        return None
    here = posixpath.dirname(page.removeprefix("docs/")) if page.startswith("docs/") else posixpath.dirname(page)
    return posixpath.relpath(site, here or ".")


def on_files(files, config):  # noqa: ANN001, ANN201
    from mkdocs.structure.files import File

    for rel in repo_files():
        if files.get_file_from_path(rel) is None:
            files.append(File(rel, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    for folder, page in folders().items():
        if page.endswith("/index.md") and files.get_file_from_path(page) is None:
            files.append(File.generated(config, page, content=listing(folder)))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001, ARG001
    uri = page.file.src_uri
    in_repo = uri if uri in set(repo_files()) or uri in folders().values() else f"docs/{uri}"

    def rewrite(match: re.Match) -> str:
        where = site_link(in_repo, match["path"])
        return match[0] if where is None else f"]({where}{match['anchor'] or ''})"

    return LINK.sub(rewrite, markdown)
