"""Plots of a GRPO run: the drafter's TPF (greedy and sampled) and the held-out reward of the probe's
self-speculative output versus step, and the training reward curves.

`plot_drift` is the one drift plot, drawn by the TPF probe during training and by `gravity-grpo tpf-drift`
after it. Both take plain records, so they work on a live run and on a finished one.

Example:
    >>> plot_drift([{"step": 0, "tpf": 3.1, "tpf_by_task": {"text": 3.0}, "eval_reward": 0.8}],
    ...            "tpf_drift.png")                                     # doctest: +SKIP
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

SMOOTH_STEPS = 10  # running-mean window for per-step rewards (a step averages only a few prompts)


def running_mean(points: Sequence[tuple[int, float]], window: int = SMOOTH_STEPS) -> list[tuple[int, float]]:
    """(step, mean of the last `window` values up to this step) for sorted (step, value) points."""
    values = [v for _, v in points]
    return [(step, sum(values[max(0, i + 1 - window):i + 1]) / len(values[max(0, i + 1 - window):i + 1]))
            for i, (step, _) in enumerate(points)]


def plot_drift(records: Sequence[dict], path: str | Path,
               title: str = "Drafter agreement and held-out reward across GRPO steps") -> Path:
    """Draw greedy TPF and TPF sampled at the rollout temperature (overall and per task), and the held-out reward
    of the self-speculative output (overall and per task), versus step.

    `records`: one dict per probe with `step`, `tpf` and optionally `tpf_by_task`, `tpf_sampled`,
    `tpf_sampled_by_task`, `eval_reward` and `eval_reward_by_task` ({task: value}), as
    `grpo.evaluation.drift.drift_records` makes them.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = sorted(records, key=lambda r: r["step"])
    fig, ax = plt.subplots(figsize=(7, 4.6))
    _lines(ax, records, "tpf", "tpf_by_task", "TPF greedy", "tab:blue")
    _lines(ax, records, "tpf_sampled", "tpf_sampled_by_task", "TPF sampled", "tab:green")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("tokens per forward")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    twin = ax.twinx()
    _lines(twin, records, "eval_reward", "eval_reward_by_task", "held-out reward", "tab:red")
    twin.set_ylabel("held-out reward (self-speculative greedy output)")
    twin.set_ylim(top=1.02)  # rewards lie in [0, 1]; the lower end follows the data
    handles, labels = ax.get_legend_handles_labels()
    more_handles, more_labels = twin.get_legend_handles_labels()
    ax.legend(handles + more_handles, labels + more_labels, loc="upper center", bbox_to_anchor=(0.5, -0.16),
              fontsize=7, ncol=4, frameon=False)  # below the axes: the lines fill the plot
    ax.set_title(title)
    return _save(fig, path)


def _lines(ax, records: Sequence[dict], key: str, by_task: str, label: str, color: str) -> None:
    """`key` versus step as a thick line, and each task of `by_task` as a thin dashed one (absent values skipped)."""
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    if points:
        ax.plot(*zip(*points), "o-", color=color, lw=2, label=f"{label} (all)")
    styles = iter(("--", ":", "-."))
    for task in sorted({t for r in records for t in r.get(by_task) or {}}):
        points = [(r["step"], r[by_task][task]) for r in records if (r.get(by_task) or {}).get(task) is not None]
        ax.plot(*zip(*points), next(styles, "--"), color=color, lw=1, alpha=0.7, label=f"{label} {task}")


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
