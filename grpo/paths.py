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
from grpo.limits import MAX_NAME_CHARS

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


MAX_PATH_BYTES, MAX_PART_BYTES = 4096, 255  # Linux's PATH_MAX and NAME_MAX


def check_name(value: object, what: str, setting: str | None = None) -> str:
    """`value` when it may be used as one folder name: text of 1 to `MAX_NAME_CHARS` characters without a
    separator, a NUL or control character, and not `.` or `..`; else a `UserError` naming `what`."""
    from grpo.errors import quoted

    text = value if isinstance(value, str) else None
    problem = ("is not text" if text is None else "is empty" if not text.strip() else
               f"is over {MAX_NAME_CHARS} characters" if len(text) > MAX_NAME_CHARS else
               "holds a NUL byte" if "\0" in text else
               "holds a path separator (/ or \\)" if "/" in text or "\\" in text else
               "holds a control character" if any(ord(ch) < 32 for ch in text) else
               "is . or .." if text in (".", "..") else None)
    if problem:
        shown = quoted(text[:MAX_NAME_CHARS] + ("..." if len(text) > MAX_NAME_CHARS else "")) if text is not None \
            else repr(value)[:60]
        raise UserError(f"{what} {shown} {problem}; a name becomes a folder name", setting=setting)
    return text


def path_problem(text: str) -> str | None:
    """Why `text` cannot be a path here (a NUL byte, a name over 255 bytes, a path over 4,096), or None."""
    if "\0" in text:
        return "holds a NUL byte"
    if len(os.fsencode(text)) > MAX_PATH_BYTES:
        return f"is a path over {MAX_PATH_BYTES:,} bytes"
    if any(len(os.fsencode(part)) > MAX_PART_BYTES for part in text.split("/")):
        return f"holds a name over {MAX_PART_BYTES} bytes"
    return None


def check_path(value: str | Path, what: str, setting: str | None = None) -> Path:
    """`Path(value)` when the system can look it up; else a `UserError` naming `what` and the fault."""
    from grpo.errors import quoted

    text = str(value)
    problem = path_problem(text)
    if problem:
        raise UserError(f"{what} {quoted(text[:80] + ('...' if len(text) > 80 else ''))} {problem}",
                        setting=setting)
    return Path(text)


def special_kind(path: str | Path) -> str | None:
    """'a FIFO', 'a device', 'a socket' when `path` (links followed) is one: what reading would hang on or
    stream forever; None for a regular file, a folder, or nothing there."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else None)


def check_readable(path: str | Path, what: str, setting: str | None = None) -> Path:
    """`check_path`, then refuse a FIFO, a device or a socket before anything opens it."""
    path = check_path(path, what, setting)
    kind = special_kind(path)
    if kind:
        raise UserError(f"{what} {path} is {kind}, not a regular file or folder", setting=setting)
    return path


def check_tree_readable(folder: str | Path, what: str, pattern: str = "*") -> None:
    """`check_readable` for `folder` and each entry of it matching `pattern` (a dataset's files, say)."""
    folder = check_readable(folder, what)
    if folder.is_dir():
        for entry in sorted(folder.glob(pattern)):
            kind = special_kind(entry)
            if kind:
                raise UserError(f"{what}: {entry} is {kind}, not a regular file")
