"""Where a command may write: the one check of every output path, made before any work (docs/errors.md).

`output_file` and `output_folder` refuse, with a `UserError` naming the output, a path that
- is one of the command's inputs, holds one, or lies inside one;
- lies inside a dataset folder, a checkpoint folder, a mining output or a run folder that is not the
  command's own output (`protected_kind`);
- is a symbolic link (a dangling one too): the write would land where the link points;
- is an existing file or a non-empty folder that is not provably the command's own: a file of its own carries
  `"written_by": STAMP` as a JSON key or the PNG text `Software: STAMP` (`owns_file`, parsed, never searched
  for), a folder of its own holds the `MARKER` file naming the command (`mark`, `owns_folder`); one of its
  own is replaced only with `overwrite`;
- is not a regular file or folder, or a file whose folder does not exist.
Writers then replace whole: `written`/`atomic_write` (a temporary name, fsync, then the move) and `set_aside`
(the old folder kept until the new one is complete), so an interrupted run leaves the old output. The move of
an output never replaces a file that appeared after the check (`publish`), and a run folder is taken with an
O_EXCL marker (`claimed`), so two commands that checked one new folder at once cannot both write into it.

Example:
    >>> out = output_file("stats.json", "--out", stamp="gravity-grpo tpf")     # doctest: +SKIP
    >>> atomic_write(out, text, replace=False)                                  # doctest: +SKIP
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from grpo.errors import UserError

MARKER = ".gravity-grpo.json"  # in each output folder a command made: {"written_by": "gravity-grpo <command>"}
MAX_OWN_BYTES = 64 << 20  # a file of our own is small (stats, reports); a larger one is not parsed, hence not ours


def plain_mode() -> int:
    """The mode a plain `open()` gives a new file: 0666 less the umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def temporary(path: Path, kind: str = "tmp", folder: bool = False) -> Path:
    """A new sibling of `path` to write it under before the rename into place: an empty file (of `plain_mode`)
    or, with `folder`, an empty folder, made by `tempfile` under a name no file held, so no one's file is taken."""
    path = Path(path)
    prefix, suffix = f".{path.name}.", f".{kind}"
    if folder:
        return Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=path.parent))
    handle, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=path.parent)
    os.fchmod(handle, plain_mode())
    os.close(handle)
    return Path(name)


def temporary_file(path: Path) -> Path:
    """`temporary(path)` for a file about to replace `path`; a `path` that exists but is no regular file (a
    device such as /dev/null, a fifo, a folder, a link) is refused: the rename would replace it."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise UserError(f"{path} exists and is not a regular file; refusing to replace it")
    return temporary(path)


def owns_file(path: Path, stamp: str) -> bool:
    """True when the regular file `path` was written by the command `stamp`: its PNG text `Software` or its
    JSON object's `written_by` is exactly `stamp` (parsed; a file merely mentioning the command is not)."""
    path = Path(path)
    if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_OWN_BYTES:
        return False
    with open(path, "rb") as f:
        data = f.read(MAX_OWN_BYTES)
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        import io

        from PIL import Image

        try:
            with Image.open(io.BytesIO(data)) as image:
                return getattr(image, "text", {}).get("Software") == stamp
        except (OSError, ValueError, SyntaxError):
            return False
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    return isinstance(value, dict) and value.get("written_by") == stamp


def owns_folder(folder: Path, stamp: str) -> bool:
    """True when `folder` holds the `MARKER` that the command `stamp` left in it (`mark`)."""
    return owns_file(Path(folder) / MARKER, stamp)


def mark(folder: Path, stamp: str) -> None:
    """Leave the `MARKER` of the command `stamp` in `folder` (created if need be): later runs know it as its own."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / MARKER, json.dumps({"written_by": stamp}) + "\n")


@contextlib.contextmanager
def claimed(folder: Path, stamp: str, name: str = "output_dir"):
    """Make the checked, new or empty `folder` this command's for the block: its `MARKER` is created with
    O_EXCL, so of two commands that checked the same folder at once only the first goes on; the second gets a
    `UserError` naming the folder. A block that fails before writing anything else gives the folder back
    (the marker removed, and the folder too when this claim created it)."""
    folder = Path(folder)
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        handle = os.open(folder / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, plain_mode())
    except FileExistsError:
        raise UserError(f"{name} {folder} was taken by another run that started meanwhile; it is left to that "
                        "run (choose another folder)") from None
    with os.fdopen(handle, "w") as f:
        f.write(json.dumps({"written_by": stamp}) + "\n")
    try:
        yield folder
    except BaseException:
        if [p.name for p in folder.iterdir()] == [MARKER]:
            (folder / MARKER).unlink()
            if made:
                folder.rmdir()
        raise


@contextlib.contextmanager
def writing(folder: Path, name: str = "output_dir"):
    """Run the block that writes into `folder`; a write error (a full disk, a failing device:
    `ocr_rewards.errors.write_errno`), a library's too, becomes a `UserError` naming the file, else `folder`."""
    from ocr_rewards.errors import write_errno

    try:
        yield
    except Exception as err:
        code = write_errno(err)
        if code is None:
            raise
        where = getattr(err, "filename", None) or f"into {name} {folder}"
        raise UserError(f"cannot write {where}: {os.strerror(code)}; what was being written there is incomplete "
                        "(files of a checkpoint being saved stay in its hidden .saving folder)") from err


def publish(tmp: Path, path: Path, replace: bool | str) -> None:
    """Move the complete file `tmp` to `path`. `replace` True: whatever is there goes (a file inside the
    command's own folder); False: only a new name is taken (a file that appeared since the check is kept, and
    `tmp` removed); a stamp: only a file that stamp wrote is replaced (`--overwrite` of a checked output)."""
    if replace is True:
        os.replace(tmp, path)
        return
    if os.path.lexists(path):
        if isinstance(replace, str) and owns_file(path, replace):
            os.replace(tmp, path)
            return
        tmp.unlink(missing_ok=True)
        raise UserError(f"{path} appeared while the command ran and was not written by it; it is kept, and "
                        "this output was not written (run again with another output)")
    try:
        os.link(tmp, path)  # fails, unlike a rename, when a file of that name appeared meanwhile
    except FileExistsError:
        tmp.unlink(missing_ok=True)
        raise UserError(f"{path} appeared while the command ran; it is kept, and this output was not written "
                        "(run again with another output)") from None
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        os.replace(tmp, path)  # a file system without hard links: the check just above is the last word
        return
    tmp.unlink()


@contextlib.contextmanager
def written(path: Path, replace: bool | str = True):
    """Yield the temporary name to write `path` under; when the block succeeds, `publish` it with `replace`.
    A failed block removes the temporary file and leaves `path` as it was."""
    path = Path(path)
    tmp = temporary_file(path)
    try:
        yield tmp
        publish(tmp, path, replace)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(path: Path, text: str, replace: bool | str = True) -> None:
    """Write, fsync, then `publish`: a reader (or a rerun after SIGKILL) sees the whole file or none."""
    with written(path, replace) as tmp:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


@contextlib.contextmanager
def set_aside(folder: Path):
    """Rebuild `folder` in the block: the old one waits under a temporary name and is removed only once the
    block succeeds; if it fails, what it wrote goes and the old folder is put back."""
    had = folder.exists()
    if had:
        aside = temporary(folder, "old", folder=True)
        os.rename(folder, aside)  # onto the empty folder `temporary` made
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


def check_place(path: Path, name: str, inputs: Iterable[str | Path], setting: str | None = None, *,
                holding: bool = False, within: Path | None = None) -> None:
    """Refuse `path` when it is an input, holds one (unless `holding`: a folder the command only adds files to)
    or lies inside one, or lies inside a protected folder other than `within` (the run folder a command
    reports on, say)."""
    target = path.resolve()
    for given in inputs:
        source = Path(given)
        if not source.exists():  # a built-in name such as 'tiny', not a path
            continue
        source = source.resolve()
        relation = ("is" if target == source else "lies inside" if source in target.parents else
                    "holds" if target in source.parents and not holding else None)
        if relation:
            raise UserError(f"{name} {path} {relation} the input {given}; choose another output", setting=setting)
    for folder in target.parents:
        kind = protected_kind(folder) if within is None or folder != Path(within).resolve() else None
        if kind:
            raise UserError(f"{name} {path} lies inside the {kind} {folder}; choose another output",
                            setting=setting)


KERNEL_FOLDERS = ("/proc", "/sys", "/dev")  # file systems of the kernel: nothing of a command's is written there


def check_writable(path: Path, name: str, setting: str | None = None) -> None:
    """Refuse an output that cannot be written: under a kernel file system (`KERNEL_FOLDERS`), or whose nearest
    existing folder is not a folder this process may create files in. Called by `output_file` and `output_folder`
    (so the dry run of `train` checks the folder the run writes)."""
    from grpo.paths import check_path

    target = Path(os.path.abspath(check_path(path, name, setting)))
    for kernel in KERNEL_FOLDERS:
        if target == Path(kernel) or Path(kernel) in target.parents:
            raise UserError(f"{name} {path} lies under {kernel}, a file system of the kernel; choose another "
                            "output", setting=setting)
    existing = next(p for p in (target, *target.parents) if os.path.lexists(p))
    if existing != target and not existing.is_dir():
        raise UserError(f"{name} {path} cannot be created: {existing} is a file, not a folder", setting=setting)
    folder = existing if existing.is_dir() else existing.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(f"{name} {path} cannot be written: this user may not create files in {folder}",
                        setting=setting)


def _no_link(path: Path, text: str, name: str, setting: str | None) -> None:
    """Refuse an output that is a symbolic link, a dangling one too (the write would land where it points)."""
    if path.is_symlink():
        raise UserError(f"{name} {text} is a symbolic link; give the real path (nothing is written through a link)",
                        setting=setting)


def output_file(value: str | Path | None, name: str, *, stamp: str, inputs: Iterable[str | Path] = (),
                suffix: str | None = None, overwrite: bool = False, setting: str | None = None) -> Path | None:
    """The file output `name` names (a flag, or a word with the library `setting`), checked as the module
    docstring says; None when not given. `stamp` names the command (`owns_file`); write the file with
    `atomic_write(path, text, replace=stamp if overwrite else False)`.
    """
    if value is None:
        return None
    text, path = str(value), Path(value)
    if not text.strip() or text.endswith(("/", "\\")) or path.name in ("", ".", ".."):
        raise UserError(f"{name} {text!r}: give a file path", setting=setting)
    check_writable(path, name, setting)
    _no_link(path, text, name, setting)
    if path.is_dir():
        raise UserError(f"{name} {text} is a folder; give a file path", setting=setting)
    if path.exists() and not path.is_file():
        raise UserError(f"{name} {text} exists and is not a regular file", setting=setting)
    if suffix and path.suffix.lower() != suffix:
        raise UserError(f"{name} {text}: the file name must end in {suffix}", setting=setting)
    if not path.parent.is_dir():
        raise UserError(f"{name} {text}: the folder {path.parent} does not exist (none is created)",
                        setting=setting)
    check_place(path, name, inputs, setting)
    if path.exists():
        if not owns_file(path, stamp):
            raise UserError(f"{name} {text} exists and was not written by {stamp}; choose a new file",
                            setting=setting)
        if not overwrite:
            raise UserError(f"{name} {text} exists (an earlier output); choose a new file, or overwrite it",
                            setting="overwrite")
    return path


def output_folder(value: str | Path, name: str, *, kind: str, is_own: Callable[[Path], bool] | None = None,
                  stamp: str | None = None, inputs: Iterable[str | Path] = (), overwrite: bool | None = None,
                  setting: str | None = None, within: Path | None = None) -> Path:
    """The folder output `name` names, checked as the module docstring says.

    A non-empty folder is accepted only when it is the command's own: `is_own(folder)` (a parsed marker of the
    command's own kind), or by default `owns_folder(folder, stamp)`; and then only with `overwrite`, unless
    `overwrite` is None (a command that resumes its own output).
    """
    text, path = str(value), Path(value)
    if not text.strip():
        raise UserError(f"{name} {text!r}: give a folder path", setting=setting)
    check_writable(path, name, setting)
    _no_link(path, text, name, setting)
    if path.exists() and not path.is_dir():
        raise UserError(f"{name} {text} is a file, not a folder", setting=setting)
    check_place(path, name, inputs, setting, within=within)
    own = is_own or (lambda folder: owns_folder(folder, stamp))
    if path.is_dir() and any(path.iterdir()):
        if not own(path):
            raise UserError(f"{name} {text} is not empty and holds no {kind}; choose a new or empty folder",
                            setting=setting)
        if overwrite is False:
            raise UserError(f"{name} {text} exists and is not empty; choose a new folder, or overwrite it",
                            setting="overwrite")
    return path
