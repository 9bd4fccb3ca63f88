"""Load and validate GRPO prompt pools (docs/spec.md §3), and turn them into TRL prompts.

A pool is a `datasets` dataset with columns `prompt`, `target`, `task_type` and, for vision-language
policies, `image`. It can be a `save_to_disk` folder, a `.parquet` file, a `.jsonl` file or a built-in
synthetic split name (`grpo.synthetic.splits.split_of`: `tiny`, `tiny-probe`, a fresh probe `tiny-probe@SEED`,
...; for a vision-language policy its crops, rendered by `grpo.synthetic.render`), or the name of a shipped image pool (`grpo.builtin.POOLS`: `tiny-vlm`, `tiny-vlm-probe`). In a jsonl file `image` is a path relative to the file, or `{"bytes": "<base64>"}`, or absent / null
for text-only pools.

Every row is checked (task_type known, target and prompt non-empty strings, target within the reward's
`MAX_REF_CHARS`, image readable); all bad rows are reported together, with their reason, by where a user finds
them: the 1-based line of a jsonl file (blank lines counted, `ocr_rewards.jsonl`), the 0-based row index of a
dataset folder or parquet file. Nothing is dropped unless `skip_bad=True`. A file or folder that cannot be
read at all (not UTF-8, damaged parquet or arrow, a folder that is no dataset) is a `PoolError` naming it.

Example:
    >>> ds = load_pool("pool.jsonl")                        # doctest: +SKIP
    >>> train = as_prompts(ds, is_vlm=False)                # doctest: +SKIP
"""
from __future__ import annotations

import base64
import glob
import io
import logging
from dataclasses import dataclass
from pathlib import Path

from grpo.builtin import POOLS, pool_folder
from grpo.errors import MissingFileError, UserError
from grpo.limits import MAX_PROMPT_CHARS
from ocr_rewards.jsonl import read_json_object, read_lines
from ocr_rewards.scoring import check_reference, task_problem

log = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("prompt", "target", "task_type")
FORMATS = "a save_to_disk folder, .parquet, .jsonl or a built-in split name"


@dataclass(frozen=True)
class BadRow:
    index: int              # 0-based row index in the pool as read
    reason: str
    line: int | None = None  # a jsonl row's 1-based line in its file

    @property
    def where(self) -> str:
        """`line N` for a jsonl row, `row N` (its index) for a dataset row."""
        return f"line {self.line}" if self.line is not None else f"row {self.index}"


class PoolError(UserError, ValueError):
    """A pool that cannot be used: missing columns, or malformed rows (`.bad` lists every one)."""

    def __init__(self, spec: str, message: str, bad: list[BadRow] | None = None, setting: str | None = None):
        self.bad = bad or []
        lines = [f"prompt pool {spec}: {message}"]
        lines += [f"  {b.where}: {b.reason}" for b in self.bad]
        super().__init__("\n".join(lines), setting=setting)


def load_pool(spec: str, skip_bad: bool = False, index_column: str | None = None, images: bool = False):
    """Read and validate a pool; returns a `datasets.Dataset` whose `image` column (if any) decodes to PIL.

    `images`: the pool is for a vision-language policy, so a built-in split comes as its rendered crops
    (`builtin_rows`); a pool file or folder is read as it is.

    With `skip_bad` the bad rows are logged and left out; otherwise `PoolError` lists them all.
    `index_column`, when given, names a new int column holding each row's index in the pool as read
    (stable ids for mining when `skip_bad` drops rows).
    """
    from datasets import Dataset, Image

    rows, base_dir, bad, lines = _read(spec, images)
    if isinstance(rows, list):  # jsonl
        rows = [{**row, "image": _jsonl_image(row["image"])} if "image" in row else row for row in rows]
    elif "image" in rows.column_names and isinstance(rows.features["image"], Image):
        rows = rows.cast_column("image", Image(decode=False))  # validate before decoding
    if len(rows) == 0:
        raise PoolError(spec, "no rows")
    columns = _columns(rows)
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:  # with the lines that could not be read: they may be why
        raise PoolError(spec, f"missing column(s) {', '.join(missing)} (has: {', '.join(columns) or 'none'})", bad)
    has_image = "image" in columns and any(v is not None for v in _column(rows, "image"))
    if "image" in columns and not has_image:
        log.info("pool %s: the image column is empty everywhere; treating the pool as text-only", spec)

    parsed = {b.index for b in bad}
    bad += [BadRow(i, r, lines and lines[i]) for i, row in enumerate(rows) if i not in parsed
            for r in [_row_problem(row, base_dir, has_image)] if r]
    bad.sort(key=lambda b: b.index)
    if bad and not skip_bad:
        raise PoolError(spec, f"{len(bad)} bad row(s) of {len(rows)}; set skip_bad to leave them out", bad,
                        setting="skip_bad")
    for b in bad:
        log.warning("pool %s: skipping %s: %s", spec, b.where, b.reason)
    bad_index = {b.index for b in bad}
    keep = [i for i in range(len(rows)) if i not in bad_index]
    if not keep:
        raise PoolError(spec, "every row is bad", bad)

    if isinstance(rows, Dataset):
        ds = rows.select(keep)
    else:
        ds = _from_rows([rows[i] for i in keep], columns, spec, [lines[i] for i in keep])
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


def policy_mismatch(ds, spec: str, is_vlm: bool) -> str | None:
    """Why the pool `ds` (named `spec`) does not suit a policy (vision-language or text-only), or None: the one
    image check of every command that decodes a pool (train, tpf, mine)."""
    if is_vlm and "image" not in ds.column_names:
        return f"{spec}: a vision-language policy needs an image column; this pool is text-only"
    if not is_vlm and "image" in ds.column_names:
        return (f"{spec}: the pool has images but the policy is text-only (it would never see them); use a "
                "vision-language checkpoint or a text pool")
    return None


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


def builtin_rows(spec: str, images: bool, n: int | None = None, indent: int = 0):
    """The first `n` rows (None: all) of the built-in split `spec` as a `datasets.Dataset`: the crops of
    `grpo.synthetic.render` with the bare task prompt for a vision-language policy (`images`; lines drawn up to
    `indent` cells in), else text rows."""
    if images:
        from grpo.synthetic.render import build_image_split

        return build_image_split(spec, n, indent)
    from grpo.synthetic.splits import build_split

    return build_split(spec, n)


def _read(spec: str, images: bool):
    """(rows: a Dataset or a list of dicts, folder relative image paths start from, unparsable rows,
    the file line of each row: a list for jsonl, None otherwise)."""
    from datasets import DatasetDict

    from grpo.paths import check_readable

    path = check_readable(spec, "prompt pool")
    if not path.exists() and spec in POOLS:
        path = pool_folder(spec)
    if path.is_dir():
        ds = read_dataset_folder(path, f"prompt pool {spec}")
        if isinstance(ds, DatasetDict):
            if len(ds) != 1:
                raise PoolError(spec, f"holds splits {', '.join(ds)}; point at one split's folder")
            ds = next(iter(ds.values()))
        return ds, path, [], None
    if path.suffix in (".parquet", ".jsonl"):
        if path.exists() and not path.is_file():
            raise PoolError(spec, "not a regular file")
        if not path.is_file():
            raise MissingFileError(f"prompt pool {spec}: no such file")
        if path.suffix == ".parquet":
            return _read_parquet(path, spec), path.parent, [], None
        return _read_jsonl(path)
    from grpo.synthetic.splits import FRESH_PROBE, SPLITS, is_builtin
    if is_builtin(spec):
        return builtin_rows(spec, images), Path.cwd(), [], None
    raise PoolError(spec, f"not found; expected {FORMATS} ({', '.join((*SPLITS, *POOLS))}, or {FRESH_PROBE}@SEED)")


def _read_parquet(path: Path, spec: str):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import Dataset

    try:
        pq.read_schema(path)  # a damaged file fails here, before datasets logs its own error about it
        # datasets reads its argument as a glob: a folder named like `[exp1]` must not be a pattern; and it
        # prepends the cwd to a relative one
        return Dataset.from_parquet(glob.escape(str(path.resolve())))
    except (pa.ArrowException, OSError, ValueError) as err:
        raise PoolError(spec, f"not a readable parquet file ({_first_line(err)})") from None


def read_dataset_folder(path: Path, what: str, expected: str = FORMATS):
    """`datasets.load_from_disk(path)`, or a `UserError` starting with `what` that names the damaged file, or
    says the folder is no save_to_disk dataset (a folder of parquet shards included) and that `expected` was.
    Turns off datasets' cache files for the process, so that nothing is ever written into `path`."""
    import pyarrow as pa
    from datasets import Dataset, disable_caching, load_from_disk

    from grpo.paths import check_tree_readable

    check_tree_readable(path, what, "**/*")  # a FIFO among the arrow files would hang the load
    markers = [path / name for name in ("state.json", "dataset_info.json", "dataset_dict.json")]
    if not any(m.is_file() for m in markers):
        if any(path.glob("*.parquet")):
            raise UserError(f"{what}: a folder of parquet files, not a save_to_disk dataset; expected {expected} "
                            "(give one .parquet file, or join the shards into one)")
        raise UserError(f"{what}: a folder without state.json or dataset_dict.json, so not a save_to_disk "
                        f"dataset; expected {expected}")
    for marker in markers:
        if marker.is_file():
            read_json_object(marker, PoolError)
    # datasets writes the cache files of later transforms (select, map, flatten) beside the arrow files it
    # read: into the user's folder. Without its cache they go to a temporary folder, removed at exit.
    disable_caching()
    try:
        return load_from_disk(str(path))
    except (pa.ArrowException, OSError, ValueError, TypeError, KeyError, AttributeError) as err:
        damaged = [arrow for arrow in sorted(path.glob("*.arrow")) if not _readable_arrow(arrow, Dataset)]
        culprit = f"{damaged[0]} is damaged" if damaged else "cannot be loaded"
        raise UserError(f"{what}: {culprit} ({_first_line(err)})") from None


def _readable_arrow(path: Path, dataset_class) -> bool:
    import pyarrow as pa

    try:
        dataset_class.from_file(str(path))
    except (pa.ArrowException, OSError, ValueError):
        return False
    return True


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:200]


def _read_jsonl(path: Path):
    """Parse a jsonl file (blank lines ignored); a line that is no UTF-8 JSON object is a bad, empty row."""
    rows, bad, lines = [], [], []
    for number, row, problem in read_lines(path, "prompt pool"):
        if problem is None and not isinstance(row, dict):
            problem = f"not a JSON object ({type(row).__name__})"
        if problem:
            bad.append(BadRow(len(rows), problem, number))
            row = {}
        rows.append(row)
        lines.append(number)
    return rows, path.parent, bad, lines


def _columns(rows) -> list[str]:
    if isinstance(rows, list):
        return sorted({key for row in rows for key in row})
    return list(rows.column_names)


def _column(rows, name: str) -> list:
    return [row.get(name) for row in rows] if isinstance(rows, list) else rows[name]


def _from_rows(rows: list[dict], columns: list[str], spec: str, lines: list[int]):
    from datasets import Dataset

    try:
        return Dataset.from_list([{c: row.get(c) for c in columns} for row in rows])
    except (TypeError, ValueError, OverflowError) as err:  # pyarrow errors subclass these
        raise PoolError(spec, _unstorable(rows, columns, lines) or
                        f"a column mixes value types across rows ({_first_line(err)})") from err


def _arrow_error(values: list) -> Exception | None:
    import pyarrow as pa

    try:
        pa.array(values)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as err:
        return err
    return None


def _unstorable(rows: list[dict], columns: list[str], lines: list[int]) -> str | None:
    """The first line whose value of a column cannot join the lines before it in one typed column, or None."""
    for column in columns:
        values = [row.get(column) for row in rows]
        if _arrow_error(values) is None:
            continue
        good, bad = 0, len(values)  # the first `good` values convert, the first `bad` do not
        while bad - good > 1:
            middle = (good + bad) // 2
            good, bad = (middle, bad) if _arrow_error(values[:middle]) is None else (good, middle)
        value = values[bad - 1]
        before = {type(v).__name__ for v in values[:bad - 1] if v is not None}
        if before and before != {type(value).__name__}:
            why = f"where the lines before hold {', '.join(sorted(before))}"
        else:
            why = f"which cannot be stored with the lines before ({_first_line(_arrow_error(values[:bad]))})"
        return f"line {lines[bad - 1]}: column {column!r} holds {type(value).__name__} ({value!r:.40}) {why}"
    return None


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
        elif column == "prompt" and len(value) > MAX_PROMPT_CHARS:
            reasons.append(f"prompt of {len(value):,} characters is over the limit of {MAX_PROMPT_CHARS:,}")
        elif column == "target":
            try:
                check_reference(value)
            except ValueError as err:
                reasons.append(f"target: {err}")
    if has_image:
        reason = _image_problem(row.get("image"), base_dir)
        if reason:
            reasons.append(reason)
    return "; ".join(reasons) or None


def _image_problem(value, base_dir: Path) -> str | None:
    from PIL import Image, UnidentifiedImageError

    from grpo.crop_size import crop_problem

    if value is None:
        return "missing image"
    cell = _image_cell(value)
    if cell.get("error"):
        return cell["error"]
    try:
        source = _image_source(cell, base_dir)
        if isinstance(source, Path) and source.exists() and not source.is_file():
            return f"image is not a regular file: {cell['path']}"  # a fifo or a device would block the read
        with Image.open(source) as image:
            image.load()
            problem = crop_problem(image.size)
        if problem:
            return problem
    except FileNotFoundError:
        return f"image file not found: {cell['path']}"
    except Image.DecompressionBombError as err:
        return f"image too large ({cell['path'] or 'bytes'}): {err}"
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
