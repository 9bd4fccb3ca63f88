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
               title: str = "Drafter agreement and held-out reward across GRPO steps",
               tpf_floor: float | None = None) -> Path:
    """Two panels on one step axis: greedy TPF and TPF sampled at the rollout temperature (top; the `tpf_floor`
    line at (1 - tpf_floor) x the first greedy TPF, and the AR-equal rate written where it is below 100%), and
    the held-out reward of the self-speculative output with its 95% interval (bottom). Per-task lines are
    thinner and lighter than the overall one.

    `records`: one dict per probe with `step`, `tpf` and optionally `tpf_by_task`, `tpf_sampled`,
    `tpf_sampled_by_task`, `ar_equal_rate`, `eval_reward`, `eval_reward_low`, `eval_reward_high` and
    `eval_reward_by_task` ({task: value}), as `grpo.evaluation.drift.drift_records` makes them.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = sorted(records, key=lambda r: r["step"])
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(7, 6.4), height_ratios=(3, 2))
    _lines(top, records, "tpf", "tpf_by_task", "TPF greedy", "tab:blue")
    _lines(top, records, "tpf_sampled", "tpf_sampled_by_task", "TPF sampled", "tab:green")
    first = next((r["tpf"] for r in records if r.get("tpf") is not None), None)
    if tpf_floor is not None and first is not None:
        top.axhline((1 - tpf_floor) * first, color="black", ls="--", lw=1,
                    label=f"tpf_floor: {1 - tpf_floor:.0%} of step {records[0]['step']}")
    for r in records:  # where the self-speculative output left AR greedy
        rate = r.get("ar_equal_rate")
        if rate is not None and rate < 1 and r.get("tpf") is not None:
            top.plot(r["step"], r["tpf"], "x", color="tab:red", ms=9, mew=2)
            top.annotate(f"AR-equal {rate:.0%}", (r["step"], r["tpf"]), textcoords="offset points", xytext=(4, 6),
                         fontsize=7, color="tab:red")
    top.set_ylabel("tokens per forward")
    top.set_ylim(bottom=0)
    top.grid(alpha=0.3)
    top.legend(fontsize=7, ncol=2, loc="lower left")
    top.set_title(title)
    _lines(bottom, records, "eval_reward", "eval_reward_by_task", "held-out reward", "tab:red")
    band = [(r["step"], r["eval_reward_low"], r["eval_reward_high"]) for r in records
            if r.get("eval_reward_low") is not None and r.get("eval_reward_high") is not None]
    if band:
        bottom.fill_between(*zip(*band), color="tab:red", alpha=0.15, lw=0, label="95% interval (all)")
    bottom.set_xlabel("GRPO step")
    bottom.set_ylabel("held-out reward\n(self-speculative greedy)")
    bottom.set_ylim(top=1.02)  # rewards lie in [0, 1]; the lower end follows the data
    bottom.grid(alpha=0.3)
    bottom.legend(fontsize=7, ncol=2, loc="lower left")
    return _save(fig, path)


def _lines(ax, records: Sequence[dict], key: str, by_task: str, label: str, color: str) -> None:
    """`key` versus step as a thick line, and each task of `by_task` as a thin, lighter dashed one (absent values
    skipped)."""
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    if points:
        ax.plot(*zip(*points), "o-", color=color, lw=2.2, label=f"{label} (all)")
    styles = iter(("--", ":", "-."))
    for task in sorted({t for r in records for t in r.get(by_task) or {}}):
        points = [(r["step"], r[by_task][task]) for r in records if (r.get(by_task) or {}).get(task) is not None]
        ax.plot(*zip(*points), next(styles, "--"), color=color, lw=0.9, alpha=0.4, label=f"{label} {task}")


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
