"""Paths that upstream tools mishandle, and what this package does about them (docs/paths.md).

- vLLM finds a checkpoint's weights with `glob`, so a folder whose path holds `[`, `]`, `*` or `?` matches
  nothing ("Cannot find any model weights"). `glob_safe` hands vLLM a link to the folder from a path
  without those characters.
- torch's inductor links its C++ kernels with `-L<torch>/lib` unquoted, so a torch installed under a path
  with white space cannot compile anything; vLLM compiles two small sampler helpers with it even when it runs
  eagerly (the one TRL hits: the rank of each sampled token's logprob), and DeepSpeed JIT-builds its CPU
  shared-memory collective op the same way. `compile_where_possible` turns torch's compiler and that op off
  in that case only, so those helpers run as plain PyTorch and DeepSpeed uses torch.distributed.

Example:
    >>> glob_safe("/runs/ocr [rl]/model")                       # doctest: +SKIP
    '/tmp/gravity-grpo-links/5d0c…'
"""
from __future__ import annotations

import glob
import hashlib
import logging
import os
import tempfile
from pathlib import Path

from grpo.errors import UserError

log = logging.getLogger(__name__)

LINKS_DIR = "gravity-grpo-links"


def is_glob_safe(path: str | Path) -> bool:
    """True when `glob` reads `path` as itself (no `[`, `]`, `*` or `?`)."""
    return glob.escape(str(path)) == str(path)


def glob_safe(path: str | Path) -> str:
    """`path` itself when `glob` reads it literally; else a symlink to it under the temp folder.

    The link's name is a hash of the resolved path, so every process (each rank of a launch) gets the same
    link, and making it again is a no-op.
    """
    if is_glob_safe(path):
        return str(path)
    target = Path(path).resolve()
    links = Path(tempfile.gettempdir()) / LINKS_DIR
    link = links / hashlib.sha256(str(target).encode()).hexdigest()[:16]
    if not is_glob_safe(link):
        raise UserError(f"{path}: vLLM cannot read a folder whose path holds [ ] * ?, and the temp folder "
                      f"{links.parent} holds them too; set TMPDIR to a plain path")
    links.mkdir(exist_ok=True)
    if not (link.is_symlink() and link.resolve() == target):
        spare = links / f"{link.name}.{os.getpid()}"
        spare.unlink(missing_ok=True)
        spare.symlink_to(target, target_is_directory=True)
        spare.replace(link)  # atomic: a concurrent rank sees the old link or the new one, never none
    return str(link)


def torch_can_compile() -> bool:
    """False when torch lies under a path with white space, where inductor's link command breaks."""
    import torch

    return not any(ch.isspace() for ch in str(Path(torch.__file__).parent))


def compile_where_possible() -> None:
    """Turn torch's compiler (dynamo) off when inductor cannot link here, so compiled helpers run eagerly."""
    if torch_can_compile():
        return
    import importlib.util

    import torch._dynamo

    if importlib.util.find_spec("deepspeed") is not None:  # its CPU shared-memory op is JIT-built the same way
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # plain torch.distributed instead

    if not torch._dynamo.config.disable:
        log.warning("torch lies under a path with spaces (%s), where its compiler cannot link C++; "
                    "torch.compile is off for this process", Path(torch._dynamo.__file__).parents[1])
        torch._dynamo.config.disable = True
