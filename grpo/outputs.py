"""Where a command may write: the one check of every output path, made before any work (docs/errors.md).

`output_file` and `output_folder` refuse, with a `UserError` naming the output, a path that
- is one of the command's inputs, holds one, or lies inside one;
- lies inside a dataset folder, a checkpoint folder, a mining output or a run folder that is not the
  command's own output (`protected_kind`);
- is an existing file that does not carry the command's `stamp` (a file it did not make), or a non-empty
  folder that `is_own` does not recognize; one of its own kind is replaced only with `overwrite`;
- is not a regular file or folder, or a file whose folder does not exist.
Writers then replace whole: `atomic_write` (a temporary name, fsync, rename) and `set_aside` (the old folder
kept until the new one is complete), so an interrupted run leaves the old output.

Example:
    >>> out = output_file("stats.json", "--out", stamp="gravity-grpo tpf")     # doctest: +SKIP
"""
from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

from grpo.errors import UserError

STAMP_BYTES = 4096  # a file of our own carries its stamp in its first bytes (a JSON key, a PNG text chunk)


def temporary(path: Path, kind: str = "tmp") -> Path:
    """The sibling name `path` is written under before it is renamed into place (one per process)."""
    return path.with_name(f".{path.name}.{kind}{os.getpid()}")


def temporary_file(path: Path) -> Path:
    """`temporary(path)` for a file about to replace `path`; a `path` that exists but is no regular file (a
    device such as /dev/null, a fifo, a folder) is refused: the rename would replace it."""
    if path.exists() and not path.is_file():
        raise UserError(f"{path} exists and is not a regular file; refusing to replace it")
    return temporary(path)


def atomic_write(path: Path, text: str) -> None:
    """Write, fsync, then rename: a reader (or a rerun after SIGKILL) sees the whole file or none."""
    tmp = temporary_file(path)
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@contextlib.contextmanager
def set_aside(folder: Path):
    """Rebuild `folder` in the block: the old one waits under a temporary name and is removed only once the
    block succeeds; if it fails, what it wrote goes and the old folder is put back."""
    aside = temporary(folder, "old")
    had = folder.exists()
    if had:
        os.rename(folder, aside)
    try:
        yield
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        if had:
            os.rename(aside, folder)
        raise
    if had:
        shutil.rmtree(aside)


def protected_kind(folder: Path) -> str | None:
    """What `folder` is when no command may write into it uninvited: a dataset, a checkpoint, a mining
    output or a run folder (by the files each always holds), else None."""
    has = lambda *names: all((folder / name).is_file() for name in names)  # noqa: E731
    if has("state.json", "dataset_info.json") or has("dataset_dict.json"):
        return "dataset folder"
    if has("config.json") and (any(folder.glob("*.safetensors")) or has("pytorch_model.bin")):
        return "checkpoint folder"
    if has("mining/manifest.json"):
        return "mining output"
    if has("run_config.json"):
        return "run folder"
    return None


def _check_place(path: Path, name: str, inputs: Iterable[str | Path], setting: str | None) -> None:
    """Refuse `path` when it is an input, holds one or lies inside one, or lies inside a protected folder."""
    target = path.resolve()
    for given in inputs:
        source = Path(given)
        if not source.exists():  # a built-in name such as 'tiny', not a path
            continue
        source = source.resolve()
        relation = ("is" if target == source else "lies inside" if source in target.parents else
                    "holds" if target in source.parents else None)
        if relation:
            raise UserError(f"{name} {path} {relation} the input {given}; choose another output", setting=setting)
    for folder in target.parents:
        kind = protected_kind(folder)
        if kind:
            raise UserError(f"{name} {path} lies inside the {kind} {folder}; choose another output",
                            setting=setting)


def output_file(value: str | Path | None, name: str, *, stamp: str, inputs: Iterable[str | Path] = (),
                suffix: str | None = None, overwrite: bool = False, setting: str | None = None) -> Path | None:
    """The file output `name` names (a flag, or a word with the library `setting`), checked as the module
    docstring says; None when not given. `stamp` is the text that every file of this kind written by the
    command holds in its first `STAMP_BYTES`.
    """
    if value is None:
        return None
    text, path = str(value), Path(value)
    if not text.strip() or text.endswith(("/", "\\")) or path.name in ("", ".", ".."):
        raise UserError(f"{name} {text!r}: give a file path", setting=setting)
    if path.is_dir():
        raise UserError(f"{name} {text} is a folder; give a file path", setting=setting)
    if path.exists() and not path.is_file():
        raise UserError(f"{name} {text} exists and is not a regular file", setting=setting)
    if suffix and path.suffix.lower() != suffix:
        raise UserError(f"{name} {text}: the file name must end in {suffix}", setting=setting)
    if not path.parent.is_dir():
        raise UserError(f"{name} {text}: the folder {path.parent} does not exist (none is created)",
                        setting=setting)
    _check_place(path, name, inputs, setting)
    if path.exists():
        with open(path, "rb") as f:
            ours = stamp.encode() in f.read(STAMP_BYTES)
        if not ours:
            raise UserError(f"{name} {text} exists and was not written by {stamp}; choose a new file",
                            setting=setting)
        if not overwrite:
            raise UserError(f"{name} {text} exists (an earlier output); choose a new file, or overwrite it",
                            setting="overwrite")
    return path


def output_folder(value: str | Path, name: str, *, kind: str, is_own: Callable[[Path], bool],
                  inputs: Iterable[str | Path] = (), overwrite: bool | None = None,
                  setting: str | None = None) -> Path:
    """The folder output `name` names, checked as the module docstring says.

    A non-empty folder is accepted only when `is_own(folder)` (it holds a `kind`, this command's output),
    and then only with `overwrite`, unless `overwrite` is None (a command that resumes its own output).
    """
    text, path = str(value), Path(value)
    if not text.strip():
        raise UserError(f"{name} {text!r}: give a folder path", setting=setting)
    if path.exists() and not path.is_dir():
        raise UserError(f"{name} {text} is a file, not a folder", setting=setting)
    _check_place(path, name, inputs, setting)
    if path.is_dir() and any(path.iterdir()):
        if not is_own(path):
            raise UserError(f"{name} {text} is not empty and holds no {kind}; choose a new or empty folder",
                            setting=setting)
        if overwrite is False:
            raise UserError(f"{name} {text} exists and is not empty; choose a new folder, or overwrite it",
                            setting="overwrite")
    return path
