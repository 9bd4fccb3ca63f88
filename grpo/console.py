"""The consoles every command prints with (defined in `ocr_rewards.console`, shared by both CLIs)."""
from ocr_rewards.console import console, err_console, escape, print_error, print_table

__all__ = ["console", "err_console", "escape", "print_error", "print_table"]
