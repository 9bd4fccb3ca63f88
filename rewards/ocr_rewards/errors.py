"""The one family of errors that mean "the user asked for something that cannot run".

It sits at the bottom of the package: `ocr_rewards`, `grpo.data` and the rest of `grpo` raise these; it imports
nothing. Library code raises a subclass of `UserError` whose message names the file, row, key or setting
and the fix; `grpo.cli.main` catches it in one place, prints one `error: ...` line and exits 2. Anything else
that escapes is a bug and keeps its traceback.

`setting` names the option the fix touches (e.g. `skip_bad`); the CLI turns it into its flag, so library
messages never name CLI flags.

Example:
    >>> raise MissingFileError("prompt pool data/x.jsonl: no such file")   # doctest: +SKIP
"""
from __future__ import annotations

QUOTE_CHARS = 200  # a value quoted in a message is cut here: a 5 MB YAML value must not flood the terminal


class UserError(Exception):
    """A mistake in what was asked (a file, a row, a config key, a setting); the message says which."""

    def __init__(self, message: str, *, setting: str | None = None):
        super().__init__(message)
        self.setting = setting


class MissingFileError(UserError, FileNotFoundError):
    """A file the user named does not exist (also a `FileNotFoundError`)."""


def quoted(value: object, limit: int = QUOTE_CHARS) -> str:
    """`repr(value)` for a message, cut to about `limit` characters with the full length said.

    Example: `quoted("x" * 10**6)` is `'xxx…' (1,000,002 characters)` at 200 characters and the note."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"
