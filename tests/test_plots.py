"""The run's plots read at a glance: whole steps, one distinct colour per task with "all" bold, the legend
beside the data, and a running-mean window that fits the run."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_hex

from grpo.evaluation.plots import (ALL_COLOUR, drift_figure, plot_drift, plot_rewards, rewards_figure,
                                   running_mean, smoothing_window)

PNG = b"\x89PNG\r\n\x1a\n"
TASKS = ("text", "table", "formula")
RECORDS = [{"step": step, "tpf": 4.0 + step / 10, "tpf_sampled": 3.5, "eval_reward": 0.6 + step / 100,
            "eval_reward_low": 0.5, "eval_reward_high": 0.7, "ar_equal_rate": 1.0 if step == 0 else 0.75,
            "tpf_by_task": {t: 3.0 + i for i, t in enumerate(TASKS)},
            "eval_reward_by_task": {t: 0.2 + 0.3 * i for i, t in enumerate(TASKS)}} for step in (0, 2)]
CURVES = {"reward": [(1, 0.7), (2, 0.5)], **{t: [(1, 0.1 * i), (2, 0.2 * i)] for i, t in enumerate(TASKS, 1)}}


def _check_axes(fig, ax) -> dict[str, tuple[str, float]]:
    """Assert whole-step ticks and a legend outside the axes; return {label: (colour, width)} of the lines."""
    fig.canvas.draw()
    ticks = ax.get_xticks()
    assert len(ticks) and all(float(t).is_integer() for t in ticks), ticks
    legend = ax.get_legend()
    assert legend is not None
    inside = ax.get_window_extent()
    assert legend.get_window_extent().x0 >= inside.x1  # entirely to the right of the data
    return {line.get_label(): (to_hex(line.get_color()), line.get_linewidth()) for line in ax.get_lines()
            if not line.get_label().startswith("_")}


def _check_colours(lines: dict[str, tuple[str, float]], label: str, all_label: str) -> None:
    """Each task's line (`label` with `{}` for the task) has its own colour, none black; "all" is black, bolder."""
    colours = {task: lines[label.format(task)][0] for task in TASKS}
    assert len(set(colours.values()) | {ALL_COLOUR}) == len(TASKS) + 1
    colour, width = lines[all_label]
    assert colour == ALL_COLOUR and width > max(lines[label.format(t)][1] for t in TASKS)


def test_drift_plot_reads_at_a_glance(tmp_path):
    path = plot_drift(RECORDS, tmp_path / "drift.png", tpf_floor=0.1)
    assert path.read_bytes().startswith(PNG)
    fig = drift_figure(RECORDS, tpf_floor=0.1)
    top, bottom = fig.axes
    _check_axes(fig, top)
    lines = _check_axes(fig, bottom)
    _check_colours(lines, "held-out reward {}", "held-out reward (all)")
    plt.close(fig)


def test_reward_plot_reads_at_a_glance(tmp_path):
    path = plot_rewards(CURVES, tmp_path / "reward.png")
    assert path.read_bytes().startswith(PNG)
    fig = rewards_figure(CURVES)
    lines = _check_axes(fig, fig.axes[0])
    _check_colours(lines, "{} (per step)", "all (per step)")
    assert all("running mean" not in label for label in lines)  # 2 steps: nothing to smooth over
    plt.close(fig)


def test_a_long_run_is_smoothed_over_at_most_ten_steps():
    long = {"reward": [(s, s % 2) for s in range(1, 81)]}
    fig = rewards_figure(long)
    assert [line.get_label() for line in fig.axes[0].get_lines() if not line.get_label().startswith("_")] == \
        ["all (10-step running mean)"]
    plt.close(fig)


@pytest.mark.parametrize(("steps", "window"), [(0, 1), (2, 1), (15, 1), (16, 2), (40, 5), (80, 10), (1000, 10)])
def test_the_window_fits_the_run(steps, window):
    assert smoothing_window(steps) == window


def test_running_mean_averages_the_last_values():
    assert running_mean([(1, 0.0), (2, 1.0), (3, 2.0)], 2) == [(1, 0.0), (2, 0.5), (3, 1.5)]
