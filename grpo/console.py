"""The consoles every command prints with: soft wrap, and user text never read as rich markup.

Soft wrap keeps a message on one logical line (a narrow terminal wraps it, rich does not break it), so
`COLUMNS=40` or a pipe never splits "3 bad line(s)" or a path. Output that goes to a pipe or a file has no
width to fit, so tables there keep their natural width (up to `PIPE_WIDTH`) instead of squeezing cells to
`COLUMNS`; a terminal gets its own width. Text that holds user input (paths, rows,
messages of errors) goes through `escape` when printed with markup, or is printed with `markup=False`:
a path like `runs/[exp1]` stays whole.

Example:
    >>> from grpo.console import console, escape
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

__all__ = ["console", "err_console", "escape", "print_error"]


def print_error(message: str) -> None:
    """One `error: ...` message on stderr; `message` is printed as is (no markup)."""
    err_console.print(Text.assemble(("error:", "bold red"), " ", message))
