"""Plots of a GRPO run: the drafter's TPF (greedy and sampled) and the held-out reward of the probe's
self-speculative output versus step, and the training reward curves.

`plot_drift` is the one drift plot, drawn by the TPF probe during training and by `gravity-grpo tpf-drift`
after it. Both take plain records, so they work on a live run and on a finished one; `drift_figure` and
`rewards_figure` build the figures they save. Read at a glance: whole steps on the x axis, one colour-blind-safe
colour per task (Okabe & Ito) with "all" bold black, the legend beside the axes, and a running mean only as
long as the run allows (`smoothing_window`).

Example:
    >>> plot_drift([{"step": 0, "tpf": 3.1, "tpf_by_task": {"text": 3.0}, "eval_reward": 0.8}],
    ...            "tpf_drift.png")                                     # doctest: +SKIP
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

MAX_SMOOTH_STEPS = 10  # running-mean window of a long run (a step averages only a few prompts)
SMOOTH_FRACTION = 8    # a shorter run smooths over an eighth of its steps: a 2-step run is drawn unsmoothed

# Okabe & Ito's colour-blind-safe palette: "all" in black (and bold), one colour per task.
ALL_COLOUR = "#000000"
PALETTE = ("#E69F00", "#56B4E9", "#009E73", "#D55E00", "#0072B2", "#CC79A7", "#F0E442")
TASK_COLOURS = {"text": PALETTE[0], "table": PALETTE[1], "formula": PALETTE[2]}
ALL_WIDTH, TASK_WIDTH = 2.4, 1.2


def colour_of(name: str, others: Sequence[str] = ()) -> str:
    """The colour of a line: "all" (or the overall "reward") black, each task its own; a name outside the
    tasks takes the next unused colour of the palette, by its place in `others`."""
    if name in ("all", "reward"):
        return ALL_COLOUR
    if name in TASK_COLOURS:
        return TASK_COLOURS[name]
    spare = [c for c in PALETTE if c not in TASK_COLOURS.values()]
    extra = [n for n in others if n not in TASK_COLOURS and n not in ("all", "reward")]
    return spare[extra.index(name) % len(spare)] if name in extra else spare[0]


def smoothing_window(steps: int) -> int:
    """The running-mean window for a run of `steps` logged steps: an eighth of them, at most 10, at least 1."""
    return max(1, min(MAX_SMOOTH_STEPS, steps // SMOOTH_FRACTION))


def running_mean(points: Sequence[tuple[int, float]], window: int) -> list[tuple[int, float]]:
    """(step, mean of the last `window` values up to this step) for sorted (step, value) points."""
    values = [v for _, v in points]
    return [(step, sum(values[max(0, i + 1 - window):i + 1]) / len(values[max(0, i + 1 - window):i + 1]))
            for i, (step, _) in enumerate(points)]


def _step_axis(ax) -> None:
    """Whole steps on the x axis (a GRPO step is never fractional)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _legend_outside(ax) -> None:
    """The legend to the right of the axes, never over the data."""
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def plot_drift(records: Sequence[dict], path: str | Path,
               title: str = "Drafter agreement and held-out reward across GRPO steps",
               tpf_floor: float | None = None) -> Path:
    """Draw `drift_figure` into `path` (PNG)."""
    return _save(drift_figure(records, title, tpf_floor), path)


def drift_figure(records: Sequence[dict], title: str = "Drafter agreement and held-out reward across GRPO steps",
                 tpf_floor: float | None = None):
    """Two panels on one step axis: greedy TPF and TPF sampled at the rollout temperature (top; the `tpf_floor`
    line at (1 - tpf_floor) x the first greedy TPF, and the AR-equal rate written where it is below 100%), and
    the held-out reward of the self-speculative output with its 95% interval (bottom). Each task has its own
    colour (`colour_of`), "all" is bold black; greedy TPF is drawn solid, sampled TPF dashed.

    `records`: one dict per probe with `step`, `tpf` and optionally `tpf_by_task`, `tpf_sampled`,
    `tpf_sampled_by_task`, `ar_equal_rate`, `eval_reward`, `eval_reward_low`, `eval_reward_high` and
    `eval_reward_by_task` ({task: value}), as `grpo.evaluation.drift.drift_records` makes them.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = sorted(records, key=lambda r: r["step"])
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(8.5, 6.4), height_ratios=(3, 2))
    _lines(top, records, "tpf", "tpf_by_task", "TPF greedy", "-")
    _lines(top, records, "tpf_sampled", "tpf_sampled_by_task", "TPF sampled", "--")
    first = next((r["tpf"] for r in records if r.get("tpf") is not None), None)
    if tpf_floor is not None and first is not None:
        top.axhline((1 - tpf_floor) * first, color="black", ls="--", lw=1,
                    label=f"tpf_floor: {1 - tpf_floor:.0%} of step {records[0]['step']}")
    for r in records:  # where the self-speculative output left AR greedy
        rate = r.get("ar_equal_rate")
        if rate is not None and rate < 1 and r.get("tpf") is not None:
            top.plot(r["step"], r["tpf"], "x", color=PALETTE[3], ms=9, mew=2)
            top.annotate(f"AR-equal {rate:.0%}", (r["step"], r["tpf"]), textcoords="offset points", xytext=(4, 6),
                         fontsize=7, color=PALETTE[3])
    top.set_ylabel("tokens per forward")
    top.set_ylim(bottom=0)
    top.grid(alpha=0.3)
    _legend_outside(top)
    top.set_title(title)
    _lines(bottom, records, "eval_reward", "eval_reward_by_task", "held-out reward", "-")
    band = [(r["step"], r["eval_reward_low"], r["eval_reward_high"]) for r in records
            if r.get("eval_reward_low") is not None and r.get("eval_reward_high") is not None]
    if band:
        bottom.fill_between(*zip(*band), color=ALL_COLOUR, alpha=0.12, lw=0, label="95% interval (all)")
    bottom.set_xlabel("GRPO step")
    bottom.set_ylabel("held-out reward\n(self-speculative greedy)")
    bottom.set_ylim(top=1.02)  # rewards lie in [0, 1]; the lower end follows the data
    bottom.grid(alpha=0.3)
    _legend_outside(bottom)
    _step_axis(bottom)
    return fig


def _lines(ax, records: Sequence[dict], key: str, by_task: str, label: str, style: str) -> None:
    """`key` versus step as a bold black line, and each task of `by_task` as a thinner one in its own colour, all
    in line `style` (absent values skipped)."""
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    if points:
        ax.plot(*zip(*points), style, marker="o", color=ALL_COLOUR, lw=ALL_WIDTH, label=f"{label} (all)")
    tasks = sorted({t for r in records for t in r.get(by_task) or {}})
    for task in tasks:
        points = [(r["step"], r[by_task][task]) for r in records if (r.get(by_task) or {}).get(task) is not None]
        ax.plot(*zip(*points), style, marker=".", color=colour_of(task, tasks), lw=TASK_WIDTH, label=f"{label} {task}")


def plot_rewards(curves: dict[str, Sequence[tuple[int, float]]], path: str | Path,
                 title: str = "GRPO reward") -> Path:
    """Draw `rewards_figure` into `path` (PNG)."""
    return _save(rewards_figure(curves, title), path)


def rewards_figure(curves: dict[str, Sequence[tuple[int, float]]], title: str = "GRPO reward"):
    """Reward curves (name -> (step, value) points: "reward", the mean over tasks, drawn as "all", and each
    task) on one axis: per step, and where the run is long enough also as a running mean
    (`smoothing_window`), one colour per curve (`colour_of`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 4))
    window = smoothing_window(max((len(p) for p in curves.values()), default=0))
    for name, points in curves.items():
        if not points:
            continue
        points = sorted(points)
        colour, width = colour_of(name, list(curves)), ALL_WIDTH if name == "reward" else TASK_WIDTH
        label = "all" if name == "reward" else name
        if window == 1:
            ax.plot(*zip(*points), "o-", color=colour, lw=width, label=f"{label} (per step)")
            continue
        ax.plot(*zip(*points), color=colour, lw=0.6, alpha=0.35)
        ax.plot(*zip(*running_mean(points, window)), color=colour, lw=width, label=f"{label} ({window}-step running mean)")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("reward")
    ax.set_ylim(top=1.02)
    ax.grid(alpha=0.3)
    _step_axis(ax)
    _legend_outside(ax)
    ax.set_title(title)
    return fig


def _save(fig, path: str | Path) -> Path:
    """Write `fig` as a PNG to `path` and free it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the canvas grows to hold the legends beside the axes
    plt.close(fig)
    return path
