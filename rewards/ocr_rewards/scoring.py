"""`score`: the one per-sample entry point, dispatching on the task (docs/spec.md §4)."""
from __future__ import annotations

from .formula import score_formula
from .gate import gate as gate_factor
from .postprocess import gravityocr_postprocess
from .result import RewardResult
from .settings import MAX_PRED_CHARS, RewardSettings, settings_of
from .similarity import similarity
from .table import score_table
from .text import score_text
from .think import strip_think

# task -> scorer(pred, ref) -> (base reward in [0, 1], components); the only list of task names
SCORERS = {"text": score_text, "table": score_table, "formula": score_formula}
TASKS = tuple(SCORERS)
__all__ = ["MAX_PRED_CHARS", "TASKS", "check_task", "score", "task_problem"]  # MAX_PRED_CHARS: ocr_rewards.settings

# The time of a task scorer grows with the reference as well. A longer reference is scored by the cheaper
# `long_reference_score`; the pool and pairs readers refuse one (`check_reference`) before any scoring starts.
MAX_REF_CHARS = 65_536
# Past this, a reference scores 0 unread: the raw edit similarity of a prediction (at most `MAX_PRED_CHARS`)
# against it is below 1/16 anyway, and computing it takes ~3 s per completion at this length (seconds grow
# linearly with it, in C code that the per-completion alarm cannot stop).
MAX_LONG_REF_CHARS = 16 * MAX_REF_CHARS


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


def long_reference_score(pred: str, ref: str, task: str) -> RewardResult:
    """The reward against a reference longer than `MAX_REF_CHARS`: the edit similarity of the raw strings (no
    normalization, parsing or gate), 0 past `MAX_LONG_REF_CHARS`; component `long_ref` marks it.

    >>> long_reference_score("ab" * 40_000, "ab" * 40_000 + "c", "table").value > 0.99
    True
    """
    value = 1.0 if pred == ref else similarity(pred, ref) if len(ref) <= MAX_LONG_REF_CHARS else 0.0
    return RewardResult(value, {"long_ref": 1.0}, task)


def score(pred: str, ref: str, task: str, settings: RewardSettings | None = None, **changes) -> RewardResult:
    """Reward of one prediction against its reference, in [0, 1], with its components.

    `settings` (`ocr_rewards.settings.RewardSettings`, default its defaults) with `changes` to its fields (e.g.
    `gate="absolute"`) say how. First the prediction's closed think blocks are removed (`ocr_rewards.think`;
    component `think_removed` says one was), unless `think="keep"`; with `postprocess="gravityocr"` it is then
    formatted as GravityOCR formats a region (`ocr_rewards.postprocess`; component `postprocessed` says it
    changed; a prediction over `max_pred_chars` is left as it is). A prediction identical to its reference
    always scores 1.0 (component `identical`), whatever the task; one over `max_pred_chars` scores 0
    (`too_long`); a reference over `MAX_REF_CHARS` by `long_reference_score`; otherwise `value = base * g`,
    g the degeneration gate (`ocr_rewards.gate`).
    `table_bonus` is the reading of the table shape bonus (`ocr_rewards.table`); a table that is not identical to
    its reference carries `saturated` (1.0 when it still scores 1.0, so its group advantage vanishes).

    >>> score("x^2", "x^{2}", "formula").value
    1.0
    >>> score("<think>\\n</think>\\nHello world", "Hello world", "text").components["think_removed"]
    1.0
    """
    check_task(task)
    settings = settings_of(settings, **changes)
    marks = {}
    if settings.think == "strip":
        pred, removed = strip_think(pred)
        marks.update({"think_removed": 1.0} if removed else {})
    if settings.postprocess == "gravityocr" and len(pred) <= settings.max_pred_chars:
        formatted = gravityocr_postprocess(pred, task)
        marks.update({"postprocessed": 1.0} if formatted != pred else {})
        pred = formatted
    result = _score(pred, ref, task, settings)
    if marks:
        return RewardResult(result.value, {**result.components, **marks}, task)
    return result


def _score(pred: str, ref: str, task: str, settings: RewardSettings) -> RewardResult:
    """`score` of a prediction already rid of its think block (as `settings.think` says)."""
    if len(pred) > settings.max_pred_chars and pred != ref:
        return RewardResult(0.0, {"too_long": 1.0}, task)
    if len(ref) > MAX_REF_CHARS:
        return long_reference_score(pred, ref, task)
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
