"""Reward regression cases: a JSONL file of pairs, each line optionally with the reward it must get.

A line is `{"pred": ..., "ref": ..., "task": ...}` plus, optionally, bounds on its reward:
`expect` (with `tol`, default `DEFAULT_TOL`), and/or `min` / `max`; any other key is an error (a misspelled
bound would otherwise check nothing). `read_pairs` validates every line and reports all bad ones by their
1-based line in the file (`ocr_rewards.jsonl`); `check_pairs` scores the file and returns the cases outside their bounds.
`gravity-grpo score --pairs FILE --check` prints the same failures and exits 1 when there are any.

Example (in a pytest test):
    >>> assert_pairs("tests/fixtures/reward_cases.jsonl")                   # doctest: +SKIP
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from pathlib import Path

from .errors import UserError
from .jsonl import read_lines
from .result import RewardResult
from .scoring import check_reference, task_problem
from .settings import RewardSettings

PAIR_FIELDS = ("pred", "ref", "task")
BOUND_FIELDS = ("expect", "tol", "min", "max")
DEFAULT_TOL = 1e-6  # rewards are deterministic; the tolerance absorbs float summation order only


class PairsError(UserError, ValueError):
    """A pairs file that cannot be scored; the message lists every bad line by number."""


@dataclass(frozen=True)
class Bounds:
    """Where a case's reward must lie: `expect` +- `tol`, and within [`min`, `max`] (each optional)."""

    expect: float | None = None
    tol: float = DEFAULT_TOL
    min: float | None = None
    max: float | None = None

    @property
    def interval(self) -> tuple[float, float]:
        low = [v for v in (self.min, None if self.expect is None else self.expect - self.tol) if v is not None]
        high = [v for v in (self.max, None if self.expect is None else self.expect + self.tol) if v is not None]
        return max(low, default=-math.inf), min(high, default=math.inf)

    def holds(self, value: float) -> bool:
        low, high = self.interval
        return low <= value <= high

    def __str__(self) -> str:
        parts = [] if self.expect is None else [f"expect {self.expect:g} ± {self.tol:g}"]
        parts += [f"{name} {value:g}" for name, value in (("min", self.min), ("max", self.max)) if value is not None]
        return ", ".join(parts)


@dataclass(frozen=True)
class Pair:
    line: int                 # 1-based line number in the file
    pred: str
    ref: str
    task: str
    bounds: Bounds | None     # None: the line carries no expectation


@dataclass(frozen=True)
class Failure:
    """A case whose reward lies outside its bounds."""

    line: int
    task: str
    value: float
    bounds: Bounds
    components: dict[str, float]

    def __str__(self) -> str:
        parts = ", ".join(f"{name} {value:.6f}" for name, value in self.components.items())
        return f"line {self.line} ({self.task}): reward {self.value:.6f} outside {self.bounds}; components: {parts}"


def _number(row: dict, name: str) -> float | None:
    value = row.get(name)
    if value is None:
        return None
    try:  # an integer too large for a float (10**400) is no bound either
        finite = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    except OverflowError:
        finite = False
    if not finite:
        raise ValueError(f"field {name!r} must be a finite number, got {str(value)[:40]}")
    return float(value)


def _bounds(row: dict) -> Bounds | None:
    """The line's bounds, or None; a ValueError says which field is wrong."""
    expect, tol, low, high = (_number(row, name) for name in BOUND_FIELDS)
    if expect is None and low is None and high is None:
        if tol is not None:
            raise ValueError("field 'tol' needs 'expect'")
        return None
    if tol is not None and tol < 0:
        raise ValueError(f"field 'tol' must be >= 0, got {tol:g}")
    if low is not None and high is not None and low > high:
        raise ValueError(f"'min' {low:g} is above 'max' {high:g}")
    tol = DEFAULT_TOL if tol is None else tol
    for name, unmet in (("expect", expect is not None and (expect - tol > 1 or expect + tol < 0)),
                        ("min", low is not None and low > 1), ("max", high is not None and high < 0)):
        if unmet:  # a bound no reward meets: the check would fail whatever the scorer does
            raise ValueError(f"field {name!r} {row[name]:g} can never be met: every reward lies in [0, 1]")
    return Bounds(expect=expect, tol=tol, min=low, max=high)


def _unknown_fields(row: dict) -> str | None:
    """The keys of `row` that a pairs line cannot have, each with its likely meaning, or None."""
    known = PAIR_FIELDS + BOUND_FIELDS
    unknown = [key for key in row if key not in known]
    if not unknown:
        return None
    named = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), known, n=1)
        named.append(f"{key!r:.40}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return f"unknown field(s) {', '.join(named)}; a line has {', '.join(known)}"


def _pair(number: int, row) -> Pair:
    """One parsed line as a Pair; a ValueError gives the reason it is bad."""
    if not isinstance(row, dict):
        raise ValueError("not a JSON object")
    missing = [f for f in PAIR_FIELDS if not isinstance(row.get(f), str)]
    if missing:
        raise ValueError(f"missing or non-string field(s) {', '.join(missing)}")
    unknown = _unknown_fields(row)
    if unknown:
        raise ValueError(unknown)
    problem = task_problem(row["task"])
    if problem:
        raise ValueError(problem)
    try:
        check_reference(row["ref"])
    except ValueError as err:
        raise ValueError(f"field 'ref': {err}") from None
    return Pair(number, row["pred"], row["ref"], row["task"], _bounds(row))


def read_pairs(path: str | Path) -> list[Pair]:
    """The pairs of a JSONL file (blank lines skipped); a `PairsError` lists every bad line by number."""
    pairs, errors = [], []
    for number, row, problem in read_lines(path, "pairs file"):
        try:
            if problem:
                raise ValueError(problem)
            pairs.append(_pair(number, row))
        except ValueError as err:
            errors.append(f"line {number}: {err}")
    if errors:
        raise PairsError(f"{path}: {len(errors)} bad line(s):\n" + "\n".join(errors))
    if not pairs:
        raise PairsError(f"{path}: no pairs (the file is empty)")
    return pairs


def failures(pairs: list[Pair], results: list[RewardResult]) -> list[Failure]:
    """The cases among `pairs` (scored as `results`, in order) whose reward is outside their bounds."""
    return [Failure(p.line, p.task, r.value, p.bounds, dict(r.components))
            for p, r in zip(pairs, results, strict=True) if p.bounds is not None and not p.bounds.holds(r.value)]


def check_pairs(path: str | Path, settings: RewardSettings | None = None, workers: int | None = 1) -> list[Failure]:
    """Score every line of `path`; return the cases outside their bounds (empty: all pass)."""
    from .trl_reward import score_many

    pairs = read_pairs(path)
    results = score_many([p.pred for p in pairs], [p.ref for p in pairs], [p.task for p in pairs], settings,
                         workers=workers)
    return failures(pairs, results)


def assert_pairs(path: str | Path, **kwargs) -> None:
    """`check_pairs` for pytest: an AssertionError listing every failing case by line."""
    found = check_pairs(path, **kwargs)
    assert not found, f"{path}: {len(found)} case(s) outside their bounds:\n" + "\n".join(map(str, found))
