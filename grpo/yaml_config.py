"""Reading a YAML recipe into the fields of a config dataclass: the one YAML reader of the package.

Used by the GRPO config (`grpo.training.config`) and the joint-training config (`grpo.joint.train`).
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from grpo.errors import UserError


class ConfigError(UserError, ValueError):
    """A configuration that cannot run; the message names the file or field and the fix."""


def read_yaml(path: str | Path, known: set[str]) -> dict[str, Any]:
    """The mapping in a YAML config file; unknown keys raise `ConfigError` naming the file and key."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as err:  # issue 17: a non-UTF-8 file too
        raise ConfigError(f"{path}: not valid YAML ({_yaml_problem(err)})") from err
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys, got {type(raw).__name__}")
    check_keys(raw, str(path), known)
    return raw


def _yaml_problem(err) -> str:
    """A YAML parse error on one line: `line L, column C: context, problem`."""
    mark, problem = getattr(err, "problem_mark", None), getattr(err, "problem", None)
    if mark is None or problem is None:
        return " ".join(str(err).split())
    context = f"{err.context}, " if getattr(err, "context", None) else ""
    return f"line {mark.line + 1}, column {mark.column + 1}: {context}{problem}"


def check_keys(values: dict[str, Any], source: str, known: set[str]) -> None:
    """Raise `ConfigError` for keys that are not in `known`, with the closest valid names."""
    for key in values:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(f"{source}: unknown config key {key!r}{hint}")
