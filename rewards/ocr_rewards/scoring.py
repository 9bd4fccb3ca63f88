"""`score`: the one per-sample entry point, dispatching on the task (docs/spec.md §4)."""
from __future__ import annotations

from .formula import score_formula
from .gate import gate as gate_factor
from .result import RewardResult
from .settings import MAX_PRED_CHARS, RewardSettings, settings_of
from .table import score_table
from .text import score_text

# task -> scorer(pred, ref) -> (base reward in [0, 1], components); the only list of task names
SCORERS = {"text": score_text, "table": score_table, "formula": score_formula}
TASKS = tuple(SCORERS)
__all__ = ["MAX_PRED_CHARS", "TASKS", "check_task", "score", "task_problem"]  # MAX_PRED_CHARS: ocr_rewards.settings

# A longer reference is refused (`check_reference`): the time of a score grows with the reference as well, and
# the pool and pairs readers name the row or line of one beyond it before any scoring starts.
MAX_REF_CHARS = 65_536


def task_problem(task, name: str = "task") -> str | None:
    """Why `task` (the value of field `name`) is not a task, or None: the one task check of the package."""
    if task in SCORERS:
        return None
    return f"unknown {name} {task!r} (valid: {', '.join(TASKS)})"


def check_task(task: str) -> None:
    """Raise a ValueError naming the valid tasks when `task` is not one of them."""
    problem = task_problem(task)
    if problem:
        raise ValueError(problem)


def check_reference(ref: str) -> None:
    """Raise a ValueError when `ref` is longer than `MAX_REF_CHARS`."""
    if len(ref) > MAX_REF_CHARS:
        raise ValueError(f"reference of {len(ref):,} characters is over the limit of {MAX_REF_CHARS:,}")


def score(pred: str, ref: str, task: str, settings: RewardSettings | None = None, **changes) -> RewardResult:
    """Reward of one prediction against its reference, in [0, 1], with its components.

    `settings` (`ocr_rewards.settings.RewardSettings`, default its defaults) with `changes` to its fields (e.g.
    `gate="absolute"`) say how. A prediction identical to its reference always scores 1.0 (component
    `identical`), whatever the task; otherwise `value = base * g`, g the degeneration gate (`ocr_rewards.gate`).
    `table_bonus` is the reading of the table shape bonus (`ocr_rewards.table`); a table that is not identical to
    its reference carries `saturated` (1.0 when it still scores 1.0, so its group advantage vanishes).

    >>> score("x^2", "x^{2}", "formula").value
    1.0
    """
    check_task(task)
    settings = settings_of(settings, **changes)
    check_reference(ref)
    if len(pred) > settings.max_pred_chars and pred != ref:
        return RewardResult(0.0, {"too_long": 1.0}, task)
    if task == "table":
        base, components = score_table(pred, ref, settings.table_bonus)
    else:
        base, components = SCORERS[task](pred, ref)
    g = gate_factor(pred, ref, settings.gate)
    components = {**components, "g": g}
    if pred == ref:
        return RewardResult(1.0, {**components, "identical": 1.0}, task)
    value = min(1.0, max(0.0, base * g))
    if task == "table":
        components["saturated"] = float(value == 1.0)
    return RewardResult(value, components, task)
