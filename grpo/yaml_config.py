"""Config dataclasses from YAML recipes and the command line, typed by their fields: the one config reader.

`Fields(*dataclasses)` reads the types, choices and flags of the fields through transformers'
`HfArgumentParser` (as TRL's `TrlParser` does), and applies them to every value, wherever it comes from:
a recipe (`read_recipe`, which follows `extends:`), a generated flag (`--learning-rate 1e-4`) or
`--set KEY=VALUE`. A value that does not fit its field, an unknown key (with the closest names) and an empty
`--set` value raise `ConfigError` naming the source and the key. Renamed keys keep working: `aliases` maps an
old name to the new one, with one deprecation line.

Used by `gravity-grpo train` (`grpo.training.config`), `joint` (`grpo.joint.train`) and `mine`
(`grpo.mining.miner`).

Example:
    >>> fields = Fields(JointConfig, aliases={"lr": "learning_rate"})            # doctest: +SKIP
    >>> fields.values({"lr": "3e-6"}, "run.yaml")                                 # doctest: +SKIP
    {'learning_rate': 3e-06}
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import logging
import os
import re
import typing
from pathlib import Path
from collections.abc import Hashable
from typing import Any

from grpo.errors import UserError, quoted

log = logging.getLogger(__name__)

EXTENDS = "extends"  # recipe key: the recipe (path relative to this file) whose keys this one starts from
# Recipe keys naming something to read (a checkpoint, a pool): a relative value that exists beside the recipe
# is read there, as `extends:` is; any other value (a built-in name, a hub id) stays as written. Values given on
# the command line stay relative to the current directory.
INPUT_KEYS = ("model", "pool", "probe_set")
# Every command names its output `--out` (file or folder); a config's `output_dir` field keeps its own spellings
# (`--output-dir`, `--output_dir`) as aliases.
OUTPUT_FIELD, OUTPUT_FLAG = "output_dir", "--out"


class RenamedFlag(argparse.Action):
    """A flag's old spelling: stores as the new one (`dest`) and prints one deprecation line.

    Example: `parser.add_argument("--data", dest="pool", action=RenamedFlag, new="--pool")`.
    """

    def __init__(self, option_strings, dest, new: str, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        log.warning("%s is deprecated; use %s (same meaning)", option_string, self.new)
        setattr(namespace, self.dest, values)


class ConfigError(UserError, ValueError):
    """A configuration that cannot run; the message names the file or field and the fix."""


def read_recipe(path: str | Path, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The mapping of a YAML recipe (a file, or a shipped recipe's name: `tiny_cpu`, `grpo.builtin.recipe`), on
    top of the recipe its `extends` names (followed recursively); values of `INPUT_KEYS` that name a file or
    folder beside the recipe point there."""
    import yaml

    from grpo.builtin import recipe, recipes

    from grpo.paths import check_path

    path = check_path(recipe(path), "config file")  # a FIFO or a device is refused just below, before any read
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist (the shipped recipes: {', '.join(recipes())})"
                          if not path.exists() else f"config file {path} is not a regular file (a folder or a device)")
    if path.resolve() in _chain:
        raise ConfigError(f"{path}: 'extends' makes a loop ({' -> '.join(str(p) for p in (*_chain, path))})")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_unique_key_loader()) or {}
    except _DuplicateKey as err:
        raise ConfigError(f"{path}: {err}; give each key once") from None
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as err:  # a non-UTF-8 file too
        raise ConfigError(f"{path}: not valid YAML ({yaml_problem(err)})") from None
    except OSError as err:  # a folder, a device, a file without read permission
        raise ConfigError(f"{path}: cannot be read ({err.strerror or err})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys, got {type(raw).__name__}")
    for key in INPUT_KEYS:
        value = raw.get(key)
        if isinstance(value, str) and value and not Path(value).is_absolute() and (path.parent / value).exists():
            raw[key] = os.path.normpath(path.parent / value)
    parent = raw.pop(EXTENDS, None)
    if parent is None:
        return raw
    if not isinstance(parent, str) or not parent:
        raise ConfigError(f"{path}: '{EXTENDS}' must name one recipe file, got {quoted(parent)}")
    return {**read_recipe(path.parent / parent, (*_chain, path.resolve())), **raw}


class _DuplicateKey(Exception):
    """A YAML mapping that gives a key twice (`line L: key 'k' appears twice`)."""


@functools.cache
def _unique_key_loader():
    """yaml's SafeLoader, refusing a mapping that gives a key twice (it would keep the last value silently)."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base` merges keys that the mapping's own override (YAML's merge key)
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, Hashable):
                    continue  # SafeLoader refuses it below, with its line
                if key in seen:
                    raise _DuplicateKey(f"line {key_node.start_mark.line + 1}: key {quoted(key)} appears twice")
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    # YAML 1.2's booleans: only true / false. YAML 1.1 also reads yes, no, on, off, y and n as booleans, which
    # turns `save_strategy: no` into False; here they stay words (a bool field still reads "yes" as true).
    Loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                 list("tTfF"))
    return Loader


def load_value(text: str) -> Any:
    """One `--set` value, read as a recipe reads it (`_unique_key_loader`); bad YAML raises `yaml.YAMLError`."""
    import yaml

    try:
        return yaml.load(text, Loader=_unique_key_loader())
    except _DuplicateKey as err:
        raise yaml.YAMLError(str(err)) from None


def assignment(text: str, where: str) -> tuple[str, Any]:
    """One `KEY=VALUE` of the command line: the key, and the value read as a recipe reads it (`load_value`)."""
    import yaml

    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"{where}: expected KEY=VALUE, got {quoted(text)}")
    if not value.strip():
        raise ConfigError(f"{where}: {key} has an empty value (KEY=VALUE)")
    try:
        return key, load_value(value)
    except (yaml.YAMLError, RecursionError) as err:
        raise ConfigError(f"{where}: {key}: not a YAML value ({yaml_problem(err)})") from None


def yaml_problem(err) -> str:
    """A YAML parse error on one line: `line L, column C: context, problem`."""
    if isinstance(err, RecursionError):
        return "nested too deeply"
    mark, problem = getattr(err, "problem_mark", None), getattr(err, "problem", None)
    if mark is None or problem is None:
        return " ".join(str(err).split())
    context = f"{err.context}, " if getattr(err, "context", None) else ""
    return f"line {mark.line + 1}, column {mark.column + 1}: {context}{problem}"


def _annotated(dtype: type) -> dict[str, set[type]]:
    """Per field of `dtype`, the plain types its annotation names (`dict | str | None` -> dict, str, NoneType),
    None included when the default is None."""
    hints = typing.get_type_hints(dtype)
    out = {}
    for f in dataclasses.fields(dtype):
        kinds = typing.get_args(hints.get(f.name)) or (hints.get(f.name),)
        out[f.name] = {typing.get_origin(k) or k for k in kinds} | ({type(None)} if f.default is None else set())
    return out


def _kind(action: argparse.Action) -> str:
    """The expected type of a field, in words."""
    if action.choices is not None:
        return "one of " + ", ".join(str(c) for c in action.choices)
    name = {int: "an integer", float: "a number", str: "a string", dict: "a mapping"}.get(action.type)
    if name is None:
        name = "true or false" if getattr(action.type, "__name__", "") == "string_to_bool" else "a value"
    return f"a list of {name.removeprefix('a ').removeprefix('an ')}s" if action.nargs in ("+", "*") else name


class Fields:
    """Keys, types and flags of one or more config dataclasses (see the module docstring)."""

    def __init__(self, *dataclass_types: type, aliases: dict[str, str] | None = None,
                 exclude: frozenset[str] = frozenset()):
        from transformers import HfArgumentParser

        self.aliases = dict(aliases or {})
        dropped = exclude | set(self.aliases)  # an alias may be a field name of a library dataclass
        self.annotated = {k: v for t in dataclass_types for k, v in _annotated(t).items()}
        parser = HfArgumentParser(dataclass_types)
        self.flags = [a for a in parser._actions if a.dest != "help" and a.dest not in dropped]
        self.actions = {a.dest: a for a in self.flags if a.type is not None}
        self.owner = {f.name: t for t in dataclass_types for f in dataclasses.fields(t)
                      if f.init and f.name not in dropped}

    @property
    def known(self) -> set[str]:
        return set(self.actions) | set(self.aliases)

    # --- values ---
    def values(self, raw: dict[str, Any], source: str, problems: list[str] | None = None) -> dict[str, Any]:
        """`raw` with aliases renamed and every value typed by its field. The first bad key raises
        `ConfigError`, or, with `problems`, every bad key is listed there and left out."""
        out = {}
        for key, value in raw.items():
            try:
                name = self.canonical(key, source)
                out[name] = self.typed(name, value, source)
            except ConfigError as err:
                if problems is None:
                    raise
                problems.append(str(err))
        return out

    def canonical(self, key: Any, source: str) -> str:
        """The field a key names: itself, or the new name of an alias (with one deprecation line)."""
        if key in self.aliases:
            log.warning("%s: %r is deprecated; use %r (same meaning)", source, key, self.aliases[key])
            return self.aliases[key]
        if key not in self.actions:
            close = difflib.get_close_matches(str(key), self.known, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(f"{source}: unknown config key {quoted(key)}{hint}")
        return key

    def typed(self, key: str, value: Any, source: str) -> Any:
        """`value` as the type of field `key` (a string is parsed: "3e-6" is a float)."""
        action, annotated = self.actions[key], self.annotated.get(key, set())
        if isinstance(value, (dict, list)) and type(value) in annotated and action.nargs not in ("+", "*"):
            return value  # a mapping (or list) where the annotation allows one, e.g. generation_kwargs
        if value is None:
            if type(None) in annotated:
                return None
            raise ConfigError(f"{source}: {key} must be {_kind(action)}, got nothing (null)")
        if action.nargs in ("+", "*"):
            return [self._scalar(key, action, v, source) for v in (value if isinstance(value, list) else [value])]
        return self._scalar(key, action, value, source)

    @staticmethod
    def _scalar(key: str, action: argparse.Action, value: Any, source: str) -> Any:
        kind = action.type
        bad = ConfigError(f"{source}: {key} must be {_kind(action)}, got {quoted(value)}")
        if isinstance(value, str) and getattr(kind, "__name__", "") == "string_to_bool" and \
                value.lower() in ("on", "off"):
            out = value.lower() == "on"  # YAML 1.1's other booleans (the loader keeps them as words)
        elif isinstance(value, str):
            try:
                out = kind(value)
            except (ValueError, TypeError, argparse.ArgumentTypeError):
                raise bad from None
        elif getattr(kind, "__name__", "") == "string_to_bool":
            out = value if isinstance(value, bool) else None
        elif kind is int:
            out = value if isinstance(value, int) and not isinstance(value, bool) else None
        elif kind is float:
            try:
                out = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
            except OverflowError:
                raise ConfigError(f"{source}: {key} must be {_kind(action)}, got an integer past the float "
                                  "range") from None
        elif kind is str:
            out = str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        elif kind is dict:
            out = value if isinstance(value, dict) else None
        else:  # a choice function (Literal or Enum fields); a list or a mapping is none of its choices
            try:
                out = kind(value) if isinstance(value, Hashable) else None
            except (ValueError, TypeError, KeyError):
                raise bad from None
        if out is None or (action.choices is not None and out not in action.choices):
            raise bad
        return out

    # --- the command line ---
    def add_flags(self, parser: argparse.ArgumentParser, shown: set[str] | None = None) -> None:
        """A flag per field (`--name-with-dashes` and `--name`, as HfArgumentParser spells them) and per alias,
        each storing its text under the field's (alias's) name only when given; help is printed for the fields in
        `shown` (all when None), the others are accepted silently."""
        taken = set()
        for action in self.flags:
            visible = shown is None or action.dest in shown
            kwargs: dict[str, Any] = {"dest": action.dest, "default": argparse.SUPPRESS,
                                      "help": (action.help or action.dest) if visible else argparse.SUPPRESS}
            if action.nargs == 0:  # the `--no-NAME` complement of a boolean that defaults to True
                kwargs.update(action="store_const", const=action.const)
            else:
                kwargs.update(nargs=action.nargs, const=action.const, metavar=action.dest.upper())
            names = sorted(action.option_strings, key=lambda o: "_" in o)
            names = [OUTPUT_FLAG, *names] if action.dest == OUTPUT_FIELD else names
            parser.add_argument(*names, **kwargs)
            taken.update(names)
        for old in self.aliases:
            flags = [f"--{old}"] + ([f"--{old.replace('_', '-')}"] if "_" in old else [])
            flags = [flag for flag in flags if flag not in taken]  # `--out` is the output folder's own flag
            if flags:
                parser.add_argument(*flags, dest=old, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        parser.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
                            help="set any config key (VALUE read as YAML, e.g. --set beta=0.001); repeatable")

    def command_line(self, args: argparse.Namespace, problems: list[str] | None = None) -> dict[str, Any]:
        """The keys set on the command line, typed: the generated flags, then every `--set KEY=VALUE`."""
        raw = {name: value for name, value in vars(args).items() if name in self.known}
        out = self.values(raw, "command line", problems)
        for text in getattr(args, "assignments", []):
            try:
                key, value = assignment(text, "command line")
                typed = self.values({key: value}, "command line", problems)
                twice = sorted(set(typed) & set(out))
                if twice:  # never "the last value wins", as in a recipe
                    raise ConfigError(f"command line: key {quoted(twice[0])} is set twice; give each key once")
            except ConfigError as err:
                if problems is None:
                    raise
                problems.append(str(err))
                continue
            out.update(typed)
        return out

    def split(self, values: dict[str, Any]) -> dict[type, dict[str, Any]]:
        """`values` grouped by the dataclass that owns each key."""
        groups: dict[type, dict[str, Any]] = {t: {} for t in dict.fromkeys(self.owner.values())}
        for key, value in values.items():
            groups[self.owner[key]][key] = value
        return groups

    def load(self, path: str | Path | None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """The recipe at `path` (optional), typed, with `overrides` (typed already, e.g. `command_line`) on top."""
        values = self.values(read_recipe(path), str(path)) if path is not None else {}
        values.update(overrides or {})
        return values


def build(dtype: type, values: dict[str, Any], source: str) -> Any:
    """`dtype(**values)`; a `ValueError` of its checks (TRL's among them) becomes a `ConfigError` naming
    `source`. The values are typed already, so a `TypeError` here is a bug and keeps its traceback."""
    missing = [f.name for f in dataclasses.fields(dtype) if f.init and f.name not in values
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{source}: {', '.join(missing)} must be set")
    try:
        return dtype(**values)
    except ValueError as err:  # ConfigError (and other UserErrors that are ValueErrors) included
        raise ConfigError(f"{source}: {err}", setting=getattr(err, "setting", None)) from err
