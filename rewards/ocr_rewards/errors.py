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

import errno
import re

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


# Write errors of the machine, not of the command: a full disk or quota, a failing device, a read-only file
# system, a file past its size limit, a closed pipe. Each ends a command as a user error naming the file.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG, errno.EPIPE})


def write_errno(err: BaseException) -> int | None:
    """The errno of `err` when it is a write error (`WRITE_ERRNOS`): an `OSError`, or an error of a library that
    writes in Rust or C and says `(os error N)` (safetensors' `SafetensorError`); None otherwise."""
    if isinstance(err, OSError):
        return err.errno if err.errno in WRITE_ERRNOS else None
    found = re.search(r"\(os error (\d+)\)", str(err)) if type(err).__name__ == "SafetensorError" else None
    return int(found.group(1)) if found and int(found.group(1)) in WRITE_ERRNOS else None
