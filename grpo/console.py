"""The consoles every command prints with: soft wrap, and user text never read as rich markup.

Soft wrap keeps a message on one logical line (a narrow terminal wraps it, rich does not break it), so
`COLUMNS=40` or a pipe never splits "3 bad line(s)" or a path. Text that holds user input (paths, rows,
messages of errors) goes through `escape` when printed with markup, or is printed with `markup=False`:
a path like `runs/[exp1]` stays whole.

Example:
    >>> from grpo.console import console, escape
    >>> console.print(f"[green]wrote[/green] {escape('runs/[exp1]/x.png')}")   # doctest: +SKIP
"""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.text import Text

console = Console(soft_wrap=True, highlight=False)
err_console = Console(stderr=True, soft_wrap=True, highlight=False)

__all__ = ["console", "err_console", "escape", "print_error"]


def print_error(message: str) -> None:
    """One `error: ...` message on stderr; `message` is printed as is (no markup)."""
    err_console.print(Text.assemble(("error:", "bold red"), " ", message))
