"""The user errors of the package (defined in `ocr_rewards.errors`, below both `rewards` and `grpo`).

Raise a `UserError` subclass for anything the user asked that cannot run; `grpo.cli.main` prints its one
line and exits 2.
"""
from ocr_rewards.errors import MissingFileError, UserError, quoted

__all__ = ["MissingFileError", "UserError", "quoted"]
