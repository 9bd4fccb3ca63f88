"""JSON-lines files, read the one way every reader of the project reads them (pools, pairs, mining parts).

A line is numbered as in the file: 1-based, blank lines counted (what an editor shows). A UTF-8 byte-order
mark is accepted; an object that gives a key twice is a bad line (never "the last value wins"). A line that is not UTF-8 or not JSON is reported with its number and reason instead of
stopping the read, so a caller can list every bad line at once.

Example:
    >>> for number, value, problem in read_lines("pool.jsonl", "prompt pool"): ...   # doctest: +SKIP
"""
from __future__ import annotations

import json
from pathlib import Path

from .errors import MissingFileError, UserError

BOM = b"\xef\xbb\xbf"


def read_bytes(path: str | Path, what: str) -> bytes:
    """The bytes of the file `path`; a `UserError` naming it (`what` says which file) when there are none."""
    path = Path(path)
    if not path.exists():
        raise MissingFileError(f"{what} {path}: no such file")
    if not path.is_file():
        raise UserError(f"{what} {path}: not a file")
    try:
        return path.read_bytes()
    except OSError as err:
        raise UserError(f"{what} {path}: cannot be read ({err.strerror or err})") from None


def decode_line(raw: bytes) -> str:
    """One line as text; a ValueError names the first byte that is not UTF-8, by its column (1-based)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"not UTF-8 text (byte 0x{raw[err.start]:02x} at column {err.start + 1}); "
                         "save the file as UTF-8") from None


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's dict; a key given twice is an error (json would keep the last value silently)."""
    value = dict(pairs)
    if len(value) < len(pairs):
        seen = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise ValueError(f"key {twice!r} appears twice")
    return value


# The deepest nesting of arrays and objects a JSON line may hold. The project's JSON is a few levels deep; the
# readers after `json` (datasets, pyarrow) recurse once per level, and 500 levels ended in a RecursionError there.
MAX_JSON_DEPTH = 100


def _nested_too_deeply(value: object) -> bool:
    """True when `value` nests arrays and objects more than `MAX_JSON_DEPTH` deep (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def parse_line(raw: bytes):
    """One line's JSON value; a ValueError gives the reason it is not UTF-8 JSON (or repeats a key)."""
    text = decode_line(raw)
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON ({err.msg} at column {err.colno})") from None
    except RecursionError:
        raise ValueError("not JSON (nested too deeply)") from None
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _nested_too_deeply(value):
        raise ValueError(f"nested too deeply (arrays and objects more than {MAX_JSON_DEPTH} levels deep)")
    if "\\u" in text:  # an escape may decode to half a surrogate pair: no text, and no arrow column takes it
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError(f"a lone surrogate escape (\\u{ord(err.object[err.start]):04x}) where text is "
                             "expected") from None
        except RecursionError:
            raise ValueError("not JSON (nested too deeply)") from None
    return value


def read_lines(path: str | Path, what: str) -> list[tuple[int, object, str | None]]:
    """(line number, JSON value, None) for each non-blank line, or (line number, None, reason) for a bad one."""
    data = read_bytes(path, what)
    if data.startswith(BOM):
        data = data[len(BOM):]
    out = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            out.append((number, parse_line(raw), None))
        except ValueError as err:
            out.append((number, None, str(err)))
    return out


def read_json_object(path: str | Path, error: type[UserError] = UserError) -> dict:
    """The JSON object in the file `path` (a byte-order mark accepted): the one reader of the project's JSON
    files. `error` (a `UserError` subclass) names the file when it is missing, unreadable, not JSON or not an
    object."""
    try:
        data = read_bytes(path, "file")
        value = parse_line(data[len(BOM):] if data.startswith(BOM) else data)
    except (UserError, ValueError) as err:
        raise error(f"{path}: {str(err).removeprefix(f'file {path}: ')}") from None
    if not isinstance(value, dict):
        raise error(f"{path}: not a JSON object (a {type(value).__name__})")
    return value
