"""One rich console for the CLI's tables and progress lines."""

from __future__ import annotations

import sys

from rich import box
from rich.console import Console
from rich.table import Table


def console() -> Console:
    # Piped output (CI logs, files) has no width: give tables room instead of rich's 80 columns.
    return Console() if sys.stdout.isatty() else Console(width=140)


def table(title: str, columns: list[str], left: int = 1) -> Table:
    """A compact table; the first ``left`` columns are text, the rest right-aligned numbers."""
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i < left else "right", no_wrap=i < left)
    return t
