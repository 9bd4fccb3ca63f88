"""Where torch runs: the one test of "on CPU" in the package.

Example:
    >>> on_cpu(use_cpu=True)
    True
"""
from __future__ import annotations


def on_cpu(use_cpu: bool = False, *, local: bool = True) -> bool:
    """True when the run's torch work is on CPU: asked for (`use_cpu`), or, on this machine (`local`), no CUDA
    device. `local` False judges a run for another machine by its setting alone."""
    if use_cpu:
        return True
    if not local:
        return False
    import torch

    return not torch.cuda.is_available()
