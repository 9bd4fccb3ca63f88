"""Plots of a GRPO run: the drafter's TPF and the mean reward versus step, and the reward curves.

`plot_drift` is the one drift plot, drawn by the TPF probe during training and by `gravity-grpo tpf-drift`
after it. Both take plain records, so they work on a live run and on a finished one.

Example:
    >>> plot_drift([{"step": 0, "tpf": 3.1, "tpf_by_task": {"text": 3.0}}], "tpf_drift.png",
    ...            rewards=[(1, 0.61), (2, 0.64)])                     # doctest: +SKIP
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

SMOOTH_STEPS = 10  # running-mean window for per-step rewards (a step averages only a few prompts)


def running_mean(points: Sequence[tuple[int, float]], window: int = SMOOTH_STEPS) -> list[tuple[int, float]]:
    """(step, mean of the last `window` values up to this step) for sorted (step, value) points."""
    values = [v for _, v in points]
    return [(step, sum(values[max(0, i + 1 - window):i + 1]) / len(values[max(0, i + 1 - window):i + 1]))
            for i, (step, _) in enumerate(points)]


def plot_drift(records: Sequence[dict], path: str | Path, rewards: Iterable[tuple[int, float]] = (),
               title: str = "Drafter agreement across GRPO steps") -> Path:
    """Draw TPF (overall, and per task) and mean reward versus step into `path` (PNG).

    `records`: one dict per probe with `step`, `tpf` and optionally `tpf_by_task` {task: tpf};
    `rewards`: (step, mean reward) points, drawn on a second axis, per step and as a running mean.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = sorted(records, key=lambda r: r["step"])
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [r["step"] for r in records]
    ax.plot(steps, [r["tpf"] for r in records], "o-", color="tab:blue", lw=2, label="TPF (all probes)")
    tasks = sorted({task for r in records for task in r.get("tpf_by_task", {})})
    for task in tasks:
        points = [(r["step"], r["tpf_by_task"][task]) for r in records
                  if r.get("tpf_by_task", {}).get(task) is not None]
        ax.plot(*zip(*points), "--", lw=1, alpha=0.7, label=f"TPF {task}")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("tokens per forward")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    rewards = sorted(rewards)
    if rewards:
        twin = ax.twinx()
        twin.plot(*zip(*rewards), color="tab:red", lw=0.6, alpha=0.35)
        twin.plot(*zip(*running_mean(rewards)), color="tab:red", lw=1.5,
                  label=f"mean reward ({SMOOTH_STEPS}-step running mean)")
        twin.set_ylabel("mean reward")
        twin.set_ylim(top=1.02)  # rewards lie in [0, 1]; the lower end follows the data
        more_handles, more_labels = twin.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    ax.legend(handles, labels, loc="lower left", fontsize=8)
    ax.set_title(title)
    return _save(fig, path)


def plot_rewards(curves: dict[str, Sequence[tuple[int, float]]], path: str | Path,
                 title: str = "GRPO reward") -> Path:
    """Draw reward curves (name -> (step, value) points; e.g. the mean and each task) into `path` (PNG),
    each per step (thin) and as a running mean (thick)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, points in curves.items():
        if points:  # thin: per step; thick: running mean
            line, = ax.plot(*zip(*sorted(points)), lw=0.6, alpha=0.35)
            ax.plot(*zip(*running_mean(sorted(points))), color=line.get_color(), lw=2.2 if name == "reward" else 1.2,
                    label=f"{name} ({SMOOTH_STEPS}-step running mean)")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("reward")
    ax.set_ylim(top=1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title)
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    """Write `fig` as a PNG to `path` and free it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
