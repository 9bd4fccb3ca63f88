"""Reports on prompt pools (`pool-stats`) and mining runs (`mine`): counts per task, percentiles, PNG
histograms (matplotlib, Agg backend, imported only here).

Example:
    >>> describe_pool(load_pool("tiny"))["tasks"]["table"]["rows"]      # doctest: +SKIP
    80
"""
from __future__ import annotations

import json
from pathlib import Path

from grpo.mining.selection import is_dropped
from grpo.outputs import atomic_write, written
from grpo.rollouts.sampling import INDEX

PERCENTILES = (10, 25, 50, 75, 90, 99)
BINS = 20


def describe_pool(ds) -> dict:
    """Rows per task and reference-length percentiles (characters of `target`, numpy's linear
    interpolation), per task and overall."""
    import numpy as np

    lengths: dict[str, list[int]] = {}
    for task, target in zip(ds["task_type"], ds["target"]):
        lengths.setdefault(task, []).append(len(target))
    everything = [n for values in lengths.values() for n in values]

    def summary(values):
        return {"rows": len(values), "share": len(values) / len(everything), "max_chars": max(values),
                **{f"p{q}_chars": float(np.percentile(values, q)) for q in PERCENTILES}}

    return {"rows": len(everything), "tasks": {task: summary(v) for task, v in sorted(lengths.items())},
            "all": summary(everything), "lengths": lengths}


def histogram_png(values_by_task: dict[str, list[float]], path: Path, xlabel: str, title: str,
                  value_range: tuple[float, float] | None = None, software: str = "gravity-grpo",
                  replace: bool | str = True) -> Path:
    """One stacked histogram, a colour per task; `software` goes into the PNG's metadata, `replace` says what
    the finished file may replace (`grpo.outputs.publish`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted(values_by_task)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist([values_by_task[t] for t in tasks], bins=BINS, range=value_range, stacked=True, label=tasks)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("prompts")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    try:
        with written(path, replace) as tmp:  # renamed into place: a failed write leaves the old file
            fig.savefig(tmp, dpi=100, format="png", metadata={"Software": software})
    finally:
        plt.close(fig)
    return path


def write_report(records: list[dict], kept: list[int], min_std: float, out_dir: Path) -> dict:
    """Counts per task (mined, dropped for zero variance, ranked out, kept) and reward histograms.

    `records` are the per-prompt statistics of every mined prompt, `kept` the pool indices kept.
    Writes `report.json`, `reward_mean.png` and `reward_std.png` into `out_dir`; returns the summary.
    """
    kept_set = set(kept)
    counts: dict[str, dict[str, int]] = {}
    for rec in records:
        row = counts.setdefault(rec["task_type"], {"mined": 0, "dropped_zero_variance": 0, "ranked_out": 0,
                                                   "kept": 0})
        row["mined"] += 1
        if is_dropped(rec, min_std):
            row["dropped_zero_variance"] += 1
        elif rec[INDEX] in kept_set:
            row["kept"] += 1
        else:
            row["ranked_out"] += 1
    counts = dict(sorted(counts.items()))
    counts["all"] = {key: sum(row[key] for row in counts.values()) for key in ("mined", "dropped_zero_variance",
                                                                                "ranked_out", "kept")}
    by_task = {}
    for rec in records:
        by_task.setdefault(rec["task_type"], []).append(rec)
    means = {t: [r["reward_mean"] for r in rs] for t, rs in by_task.items()}
    stds = {t: [r["reward_std"] for r in rs] for t, rs in by_task.items()}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {
        "counts": counts,
        "truncated_rollouts": sum(r["truncated"] for r in records),
        "reward_mean_png": str(histogram_png(means, out_dir / "reward_mean.png", "reward mean over k rollouts",
                                             "Per-prompt reward mean (all mined prompts)", (0.0, 1.0))),
        "reward_std_png": str(histogram_png(stds, out_dir / "reward_std.png", "reward std over k rollouts",
                                            "Per-prompt reward std (all mined prompts)", (0.0, 0.5))),
    }
    atomic_write(out_dir / "report.json", json.dumps(summary, indent=2) + "\n")
    return summary
