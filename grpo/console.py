"""The consoles every command prints with (defined in `ocr_rewards.console`, shared by both CLIs), and the
logging of a command: quiet by default, everything with `-v`.

Quiet means a command prints its progress bar, this package's own log lines and its results. What the
libraries print while they load stays out: bitsandbytes' CPU kernel probe, DeepSpeed's accelerator guess,
torch's and vLLM's notes, transformers' weight-loading bars, deprecation warnings, and TRL's warning about the
vLLM version, which it repeats at every check of it, is shown once per run (by the main process only).
"""
from __future__ import annotations

import logging
import os
import warnings

from ocr_rewards.console import console, err_console, escape, print_error, print_table

__all__ = ["console", "err_console", "escape", "print_error", "print_table", "setup_logging"]

OWN_LOGGERS = ("grpo", "ocr_rewards")  # their INFO lines are results (the model loaded, each TPF probe)
# Loggers that speak while a library loads; their warnings say nothing a user can act on.
LOADER_LOGGERS = ("bitsandbytes.backends.cpu.ops", "DeepSpeed", "torch._library.triton")
TRL_VLLM_VERSION = "TRL currently supports vLLM versions"


def _own_or_warning(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or record.name.split(".")[0] in OWN_LOGGERS


def _errors_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR


def setup_logging(verbose: bool) -> None:
    """Configure logging and warnings for a command, before the libraries load (see the module docstring)."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if verbose:
        return
    for handler in logging.getLogger().handlers:
        handler.addFilter(_own_or_warning)
    for name in LOADER_LOGGERS:  # a filter survives the library setting its logger's level when it loads
        logging.getLogger(name).addFilter(_errors_only)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # vLLM's own handler, in this process and children
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' loading and saving bars
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    main_process = os.environ.get("RANK", "0") == "0" and os.environ.get("LOCAL_RANK", "0") == "0"
    warnings.filterwarnings("once" if main_process else "ignore", message=TRL_VLLM_VERSION)
