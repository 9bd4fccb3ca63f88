"""`score`: the one per-sample entry point, dispatching on the task (SPEC §4)."""
from __future__ import annotations

from rewards.formula import score_formula
from rewards.gate import check_gate
from rewards.gate import gate as gate_factor
from rewards.result import RewardResult
from rewards.table import check_table_bonus, score_table
from rewards.text import score_text

# task -> scorer(pred, ref) -> (base reward in [0, 1], components); the only list of task names
SCORERS = {"text": score_text, "table": score_table, "formula": score_formula}
TASKS = tuple(SCORERS)

# A prediction longer than this scores 0 without being parsed (flag `too_long`). The policy's completions
# stop at 8,448 tokens (SPEC §7), a few characters each, so only a runaway output comes near it.
MAX_PRED_CHARS = 65_536
# A longer reference is refused (`check_reference`): the time of a score grows with the reference as well, and
# the pool and pairs readers name the row or line of one beyond it before any scoring starts.
MAX_REF_CHARS = 65_536


def check_task(task: str) -> None:
    """Raise a ValueError naming the valid tasks when `task` is not one of them."""
    if task not in SCORERS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(TASKS)}")


def check_reference(ref: str) -> None:
    """Raise a ValueError when `ref` is longer than `MAX_REF_CHARS`."""
    if len(ref) > MAX_REF_CHARS:
        raise ValueError(f"reference of {len(ref):,} characters is over the limit of {MAX_REF_CHARS:,}")


def score(pred: str, ref: str, task: str, gate: str = "relative", table_bonus: str = "clipped") -> RewardResult:
    """Reward of one prediction against its reference, in [0, 1], with its components.

    A prediction identical to its reference always scores 1.0 (component `identical`), whatever the
    task; otherwise `value = base * g`, g the degeneration gate (`rewards.gate`). `table_bonus` is the
    reading of the table shape bonus (`rewards.table`); a table that is not identical to its reference
    carries `saturated` (1.0 when it still scores 1.0, so its group advantage vanishes).

    >>> score("x^2", "x^{2}", "formula").value
    1.0
    """
    check_task(task)
    check_gate(gate)
    check_table_bonus(table_bonus)
    check_reference(ref)
    if len(pred) > MAX_PRED_CHARS and pred != ref:
        return RewardResult(0.0, {"too_long": 1.0}, task)
    base, components = score_table(pred, ref, table_bonus) if task == "table" else SCORERS[task](pred, ref)
    g = gate_factor(pred, ref, gate)
    components = {**components, "g": g}
    if pred == ref:
        return RewardResult(1.0, {**components, "identical": 1.0}, task)
    value = min(1.0, max(0.0, base * g))
    if task == "table":
        components["saturated"] = float(value == 1.0)
    return RewardResult(value, components, task)
