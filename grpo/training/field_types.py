"""Config values checked against their dataclass fields' types before the config is built.

A value of the wrong type (`tpf_every: "3"`, `learning_rate: 1e-4`, which YAML reads as a string) is the
user's mistake and becomes a `ConfigError` naming the key; a `TypeError` raised while building the config
is then a bug, and keeps its traceback instead of ending as a user error.

Example:
    >>> check_field_types(GravityGRPOConfig, {"tpf_every": "3"}, "run.yaml")   # doctest: +SKIP
    ConfigError: run.yaml: key 'tpf_every' must be int, got '3' (str)
"""
from __future__ import annotations

import enum
import functools
import types
import typing
from typing import Any

from grpo.yaml_config import ConfigError


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def fits(value: Any, hint: Any) -> bool:
    """Whether `value` is of the annotated type `hint` (unions, Optional, Literal, enums by name, generics
    by their container); an annotation it does not read passes."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, arg) for arg in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if hint in (int, float):  # an int is a float; a bool is neither
        kinds = (int,) if hint is int else (int, float)
        return isinstance(value, kinds) and not isinstance(value, bool)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return isinstance(value, (hint, str))
    container = origin or hint
    return isinstance(value, container) if isinstance(container, type) else True


def _name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def check_field_types(cls: type, values: dict[str, Any], source: str) -> None:
    """Raise `ConfigError` for the first value in `values` whose field in `cls` does not take its type."""
    hints = _hints(cls)
    for key, value in values.items():
        if key in hints and not fits(value, hints[key]):
            raise ConfigError(f"{source}: key {key!r} must be {_name(hints[key])}, got {value!r} "
                                 f"({type(value).__name__})", setting=key)
