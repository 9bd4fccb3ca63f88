"""Load and validate GRPO prompt pools (SPEC §3), and turn them into TRL prompts.

A pool is a `datasets` dataset with columns `prompt`, `target`, `task_type` and, for vision-language
policies, `image`. It can be a `save_to_disk` folder, a `.parquet` file, a `.jsonl` file or a built-in
synthetic split name (`data.synthetic.SPLITS`). In a jsonl file `image` is a path relative to the file, or
`{"bytes": "<base64>"}`, or absent / null for text-only pools.

Every row is checked (task_type known, target and prompt non-empty strings, image readable); all bad rows
are reported together by index and reason. Nothing is dropped unless `skip_bad=True`.

Example:
    >>> ds = load_pool("pool.jsonl")                        # doctest: +SKIP
    >>> train = as_prompts(ds, is_vlm=False)                # doctest: +SKIP
"""
from __future__ import annotations

import base64
import glob
import io
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from grpo.errors import MissingFileError, UserError
from rewards.scoring import task_problem

log = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("prompt", "target", "task_type")
FORMATS = "a save_to_disk folder, .parquet, .jsonl or a built-in split name"


@dataclass(frozen=True)
class BadRow:
    index: int    # 0-based row index in the pool as read
    reason: str


class PoolError(UserError, ValueError):
    """A pool that cannot be used: missing columns, or malformed rows (`.bad` lists every one)."""

    def __init__(self, spec: str, message: str, bad: list[BadRow] | None = None, setting: str | None = None):
        self.bad = bad or []
        lines = [f"prompt pool {spec}: {message}"]
        lines += [f"  row {b.index}: {b.reason}" for b in self.bad]
        super().__init__("\n".join(lines), setting=setting)


def load_pool(spec: str, skip_bad: bool = False, index_column: str | None = None):
    """Read and validate a pool; returns a `datasets.Dataset` whose `image` column (if any) decodes to PIL.

    With `skip_bad` the bad rows are logged and left out; otherwise `PoolError` lists them all.
    `index_column`, when given, names a new int column holding each row's index in the pool as read
    (stable ids for mining when `skip_bad` drops rows).
    """
    from datasets import Dataset, Image

    rows, base_dir, bad = _read(spec)
    if isinstance(rows, list):  # jsonl
        rows = [{**row, "image": _jsonl_image(row["image"])} if "image" in row else row for row in rows]
    elif "image" in rows.column_names and isinstance(rows.features["image"], Image):
        rows = rows.cast_column("image", Image(decode=False))  # validate before decoding
    columns = _columns(rows)
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise PoolError(spec, f"missing column(s) {', '.join(missing)} (has: {', '.join(columns) or 'none'})")
    if len(rows) == 0:
        raise PoolError(spec, "no rows")
    has_image = "image" in columns and any(v is not None for v in _column(rows, "image"))
    if "image" in columns and not has_image:
        log.info("pool %s: the image column is empty everywhere; treating the pool as text-only", spec)

    parsed = {b.index for b in bad}
    bad += [BadRow(i, r) for i, row in enumerate(rows) if i not in parsed
            for r in [_row_problem(row, base_dir, has_image)] if r]
    bad.sort(key=lambda b: b.index)
    if bad and not skip_bad:
        raise PoolError(spec, f"{len(bad)} bad row(s) of {len(rows)}; set skip_bad to leave them out", bad,
                        setting="skip_bad")
    for b in bad:
        log.warning("pool %s: skipping row %d: %s", spec, b.index, b.reason)
    bad_index = {b.index for b in bad}
    keep = [i for i in range(len(rows)) if i not in bad_index]
    if not keep:
        raise PoolError(spec, "every row is bad", bad)

    if isinstance(rows, Dataset):
        ds = rows.select(keep)
    else:
        ds = _from_rows([rows[i] for i in keep], columns, spec)
    if "image" in ds.column_names and not has_image:
        ds = ds.remove_columns("image")
    if has_image:
        ds = ds.map(lambda row: {"image": _image_value(row["image"], base_dir)})
        ds = ds.cast_column("image", Image())
    if index_column:
        if index_column in ds.column_names:
            log.info("pool %s: replacing its column %s with the row indices", spec, index_column)
            ds = ds.remove_columns(index_column)
        ds = ds.add_column(index_column, keep)
    return ds


def as_prompts(ds, is_vlm: bool):
    """Give `ds` TRL's `prompt` column: the plain string for text-only policies, or one user message with
    the task prompt for VLM policies (TRL inserts the row's `image` before the text). Other columns stay.
    """
    if not is_vlm:
        return ds
    if "image" not in ds.column_names:
        raise PoolError("(in memory)", "a vision-language policy needs an image column; this pool is text-only")
    from grpo.prompting import user_turn

    return ds.map(lambda row: {"prompt": user_turn(row["prompt"])})


def _read(spec: str):
    """(rows: a Dataset or a list of dicts, folder relative image paths start from, unparsable rows)."""
    from datasets import Dataset, DatasetDict, load_from_disk

    path = Path(spec)
    if path.is_dir():
        ds = load_from_disk(str(path))
        if isinstance(ds, DatasetDict):
            if len(ds) != 1:
                raise PoolError(spec, f"holds splits {', '.join(ds)}; point at one split's folder")
            ds = next(iter(ds.values()))
        return ds, path, []
    if path.suffix in (".parquet", ".jsonl"):
        if not path.is_file():
            raise MissingFileError(f"prompt pool {spec}: no such file")
        if path.suffix == ".parquet":
            # datasets reads its argument as a glob: a folder named like `[exp1]` must not be a pattern
            return Dataset.from_parquet(glob.escape(str(path))), path.parent, []
        return (*_read_jsonl(path), )
    from data.synthetic import SPLITS, build_split

    if spec in SPLITS:
        return build_split(spec), Path.cwd(), []
    raise PoolError(spec, f"not found; expected {FORMATS} ({', '.join(SPLITS)})")


def _read_jsonl(path: Path):
    """Parse a jsonl file (blank lines ignored); a line that is not a JSON object is a bad, empty row."""
    rows, bad = [], []
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for index, line in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            row, reason = {}, f"invalid JSON ({err.msg} at column {err.colno})"
        else:
            reason = None if isinstance(row, dict) else f"not a JSON object ({type(row).__name__})"
        if reason:
            bad.append(BadRow(index, reason))
            row = {}
        rows.append(row)
    return rows, path.parent, bad


def _columns(rows) -> list[str]:
    if isinstance(rows, list):
        return sorted({key for row in rows for key in row})
    return list(rows.column_names)


def _column(rows, name: str) -> list:
    return [row.get(name) for row in rows] if isinstance(rows, list) else rows[name]


def _from_rows(rows: list[dict], columns: list[str], spec: str):
    from datasets import Dataset

    try:
        return Dataset.from_list([{c: row.get(c) for c in columns} for row in rows])
    except (TypeError, ValueError) as err:  # pyarrow errors subclass these
        raise PoolError(spec, f"a column mixes value types across rows: {err}") from err


def _jsonl_image(value):
    """A jsonl `image` value (path string, {"path"}, {"bytes": base64}, or null) as a {"bytes", "path"} cell."""
    if value is None:
        return None
    if isinstance(value, str):
        return {"bytes": None, "path": value}
    if isinstance(value, dict) and isinstance(value.get("bytes"), str):
        try:
            return {"bytes": base64.b64decode(value["bytes"], validate=True), "path": None}
        except ValueError:
            return {"bytes": None, "path": None, "error": "image bytes are not valid base64"}
    if isinstance(value, dict) and isinstance(value.get("path"), str):
        return {"bytes": None, "path": value["path"]}
    return {"bytes": None, "path": None, "error": f"image is not a path or {{'bytes': base64}} ({value!r:.40})"}


def _row_problem(row: dict, base_dir: Path, has_image: bool) -> str | None:
    """Why one row is unusable ("; "-joined reasons), or None."""
    reasons = []
    task = row.get("task_type")
    if task is None:
        reasons.append("missing task_type")
    elif problem := task_problem(task, "task_type"):
        reasons.append(problem)
    for column in ("target", "prompt"):
        value = row.get(column)
        if value is None:
            reasons.append(f"missing {column}")
        elif not isinstance(value, str):
            reasons.append(f"{column} is not a string ({value!r:.40})")
        elif not value.strip():
            reasons.append(f"empty {column}")
    if has_image:
        reason = _image_problem(row.get("image"), base_dir)
        if reason:
            reasons.append(reason)
    return "; ".join(reasons) or None


def _image_problem(value, base_dir: Path) -> str | None:
    from PIL import Image, UnidentifiedImageError

    if value is None:
        return "missing image"
    cell = _image_cell(value)
    if cell.get("error"):
        return cell["error"]
    try:
        with Image.open(_image_source(cell, base_dir)) as image:
            image.load()
    except FileNotFoundError:
        return f"image file not found: {cell['path']}"
    except (UnidentifiedImageError, OSError, ValueError) as err:
        return f"unreadable image ({cell['path'] or 'bytes'}): {err}"
    return None


def _image_cell(value) -> dict:
    """An image value (bytes, path string or `{"bytes", "path"}`) as a `{"bytes", "path"}` dict."""
    if isinstance(value, bytes):
        return {"bytes": value, "path": None}
    if isinstance(value, str):
        return {"bytes": None, "path": value}
    return value


def _image_source(cell: dict, base_dir: Path):
    """What `PIL.Image.open` takes for a `{"bytes", "path"}` cell; relative paths start at `base_dir`."""
    if cell.get("bytes"):
        return io.BytesIO(cell["bytes"])
    if not cell.get("path"):
        raise ValueError("the image has neither bytes nor a path")
    path = Path(cell["path"])
    return path if path.is_absolute() else base_dir / path


def _image_value(value, base_dir: Path) -> dict:
    """A validated image as `{"bytes", "path"}` with an absolute path, for the `datasets.Image` feature."""
    source = _image_source(_image_cell(value), base_dir)
    if isinstance(source, io.BytesIO):
        return {"bytes": source.getvalue(), "path": None}
    return {"bytes": None, "path": str(Path(source).resolve())}
