"""A markdown table read back from a report or README, for the tests that check what a user reads."""

from __future__ import annotations


def markdown_table(text: str, header_start: str) -> tuple[list[str], list[list[str]]]:
    """The header cells and body rows (cells, stripped) of the first markdown table in ``text`` whose header line
    starts with ``header_start``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))

    def cells(line: str) -> list[str]:
        return [cell.strip() for cell in line.strip().strip("|").split(" | ")]

    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(cells(line))
    return cells(lines[start]), rows
