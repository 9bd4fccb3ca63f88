"""The user errors of the package (defined in `ocr_rewards.errors`, below both `rewards` and `grpo`).

Raise a `UserError` subclass for anything the user asked that cannot run; `grpo.cli.main` prints its one
line and exits 2.
"""
from ocr_rewards.errors import MissingFileError, UserError, quoted

__all__ = ["CheckpointError", "MissingFileError", "UserError", "quoted"]


class CheckpointError(UserError, ValueError):
    """A checkpoint folder that cannot serve the requested use; the message names the file and field."""
