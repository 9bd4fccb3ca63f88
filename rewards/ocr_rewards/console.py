"""The consoles every command prints with: soft wrap, and user text never read as rich markup.

Soft wrap keeps a message on one logical line (a narrow terminal wraps it, rich does not break it), so
`COLUMNS=40` or a pipe never splits "3 bad line(s)" or a path. Output that goes to a pipe or a file has no
width to fit, so tables there keep their natural width (up to `PIPE_WIDTH`) instead of squeezing cells to
`COLUMNS`; a terminal gets its own width. Text that holds user input (paths, rows,
messages of errors) goes through `escape` when printed with markup, or is printed with `markup=False`:
a path like `runs/[exp1]` stays whole.

Example:
    >>> from ocr_rewards.console import console, escape
    >>> console.print(f"[green]wrote[/green] {escape('runs/[exp1]/x.png')}")   # doctest: +SKIP
"""
from __future__ import annotations

from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from rich.text import Text

PIPE_WIDTH = 512  # columns of a pipe or file: wider than any table of the commands, so none is squeezed


class _Console(Console):
    """A rich console whose width is the terminal's, or `PIPE_WIDTH` when it does not write to a terminal."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        return size if self.is_terminal else ConsoleDimensions(max(size.width, PIPE_WIDTH), size.height)


console = _Console(soft_wrap=True, highlight=False)
err_console = _Console(stderr=True, soft_wrap=True, highlight=False)

__all__ = ["console", "err_console", "escape", "print_error", "print_table"]


def print_error(message: str) -> None:
    """One `error: ...` message on stderr; `message` is printed as is (no markup)."""
    err_console.print(Text.assemble(("error:", "bold red"), " ", message))


def print_table(title: str, headers: list[str], rows: list[list[str]], right_from: int = 1) -> None:
    """A table of `rows` under `headers` (columns from `right_from` on right-aligned); where it would not fit
    the console's width, the title and one line per row, `first cell: header value, header value, ...`."""
    from rich.table import Table

    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    if sum(width + 3 for width in widths) + 1 <= console.width:  # cell, its padding and its left border
        table = Table(title=escape(title))
        for i, header in enumerate(headers):
            table.add_column(header, justify="right" if i >= right_from else "left")
        for row in rows:
            table.add_row(*(escape(str(cell)) for cell in row))
        console.print(table)
        return
    console.print(title, markup=False)
    for row in rows:
        console.print(f"{row[0]}: " + ", ".join(f"{h} {c}" for h, c in zip(headers[1:], row[1:])), markup=False)
