"""The consoles every command prints with (defined in `ocr_rewards.console`, shared by both CLIs), and the
logging of a command: quiet by default, everything with `-v`.

Quiet means a command prints its progress bar, this package's own log lines and its results. What the
libraries print while they load stays out: bitsandbytes' CPU kernel probe, DeepSpeed's accelerator guess,
torch's and vLLM's notes, transformers' weight-loading bars and deprecation warnings. Every other warning is
shown once per process, where Python shows it once per line of code that raises it: TRL warns about the vLLM
version at each of its checks (six times in a 2-step `train`); its main process shows it once, the other
processes of a launch not at all.
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
_shown: set[tuple[type, str]] = set()  # (category, text) of the warnings shown so far
_show = warnings.showwarning


def _show_once(message, category, filename, lineno, file=None, line=None) -> None:
    """`warnings.showwarning`, skipping a warning whose category and text were shown before."""
    if (category, str(message)) not in _shown:
        _shown.add((category, str(message)))
        _show(message, category, filename, lineno, file, line)


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
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' loading and saving bars
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # datasets' map bars over a pool
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.showwarning = _show_once
    if os.environ.get("RANK", "0") != "0" or os.environ.get("LOCAL_RANK", "0") != "0":
        warnings.filterwarnings("ignore", message=TRL_VLLM_VERSION)
