"""Reward speed, measured against references in the same run.

1. TEDS_s of the project (numba Zhang–Shasha, `ocr_rewards.teds`) vs plain apted (`rewards/tests/teds_apted.py`, the
   algorithm of PubTabNet's metric.py) on synthetic r x c tables with a noisy prediction, both from the
   raw HTML (parsing included), checking that the two values are equal (1e-9).
2. Wall time of `ocr_reward` on a GRPO step's worth of table completions: 24 references of ~1,900
   characters x 28 noisy predictions = 672 completions (docs/spec.md §7), with the default worker pool (cold:
   includes spawning the workers; warm: a second step with new references) and in one process.
3. Hostile floods: `normalize_formula`, and one whole `score`, on 8,192 and 65,536 characters of
   one repeated opening (`\\[`, `\\tag{`, ...) beside an ordinary formula of the same length: the ratio to
   the ordinary input, and the growth from 8,192 to 65,536 characters (8x for linear time, 64x quadratic).

Run: `python benchmarks/rewards_bench.py` (about a minute on 2 cores; apted dominates);
`--only floods` runs part 3 alone.
"""
from __future__ import annotations

import argparse
import random
import re
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ocr_rewards import OcrReward, score, teds
from ocr_rewards.normalize import normalize_formula, normalize_table_html, normalize_text
from ocr_rewards.trl_reward import default_workers
from ocr_rewards.table import parse_table
from ocr_rewards.teds import parse_tree

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rewards" / "tests"))  # the tests' reference TEDS
from teds_apted import teds_apted  # noqa: E402

SIZES = [(10, 5), (30, 8), (60, 10), (100, 10)]
WORDS = ["total", "mean", "n", "p", "value", "ratio", "group", "control", "dose", "week", "age", "SD"]


def cell_text(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.5:
        return f"{rng.uniform(0, 100):.{rng.randint(0, 2)}f}"
    if kind < 0.8:
        return " ".join(rng.choices(WORDS, k=rng.randint(1, 2)))
    return f"{rng.randint(1, 99)} ({rng.uniform(0, 1):.2f})"


def make_rows(rng: random.Random, n_rows: int, n_cols: int) -> list[list[str]]:
    return [[cell_text(rng) for _ in range(n_cols)] for _ in range(n_rows)]


def to_html(rows: list[list[str]], spans: dict[tuple[int, int], int] | None = None) -> str:
    """Header row as <thead>/<th>, the rest in <tbody>; `spans[(r, c)] = k` merges k cells into one."""
    spans = spans or {}
    out = []
    for r, row in enumerate(rows):
        tag, cells, c = ("th" if r == 0 else "td"), [], 0
        while c < len(row):
            k = spans.get((r, c), 1)
            attr = f' colspan="{k}"' if k > 1 else ""
            cells.append(f"<{tag}{attr}>{row[c]}</{tag}>")
            c += k
        out.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead>{out[0]}</thead><tbody>{''.join(out[1:])}</tbody></table>"


def noisy(rng: random.Random, rows: list[list[str]], spans: dict) -> str:
    """A plausible imperfect prediction of the table `rows` (one or two random defects)."""
    rows = [list(row) for row in rows]
    spans = dict(spans)
    for _ in range(rng.randint(1, 2)):
        kind = rng.choice(["text", "text", "drop", "dup", "merge", "split", "loop", "unclosed", "plain", "same"])
        r = rng.randrange(1, len(rows))
        if kind == "text":
            for _ in range(rng.randint(1, 6)):
                rr, cc = rng.randrange(len(rows)), rng.randrange(len(rows[0]))
                rows[rr][cc] = cell_text(rng)
        elif kind == "drop" and len(rows) > 2:
            del rows[r]
            spans = {k: v for k, v in spans.items() if k[0] < r}
        elif kind == "dup":
            rows.insert(r, list(rows[r]))
            spans = {k: v for k, v in spans.items() if k[0] < r}
        elif kind == "merge":
            spans[(r, rng.randrange(len(rows[0]) - 1))] = 2
        elif kind == "split":
            spans = {}
        elif kind == "loop":
            rows = rows[:r] + [rows[r]] * rng.randint(5, 15)
            spans = {k: v for k, v in spans.items() if k[0] < r}
        elif kind == "unclosed":
            return to_html(rows, spans)[: -len("</tbody></table>") - rng.randint(0, 30)]
        elif kind == "plain":
            return "\n".join(" | ".join(row) for row in rows)
    return to_html(rows, spans)


def reference(rng: random.Random, target_chars: int = 1_900) -> tuple[list[list[str]], dict, str]:
    """A reference table of about `target_chars` characters, with a spanning header cell."""
    n_cols = rng.randint(4, 8)
    rows = make_rows(rng, 2, n_cols)
    spans = {(0, 1): 2}
    while len(to_html(rows, spans)) < target_chars:
        rows.append([cell_text(rng) for _ in range(n_cols)])
    return rows, spans, to_html(rows, spans)


def clear_caches() -> None:
    parse_tree.cache_clear()
    parse_table.cache_clear()


def bench_teds(console: Console, rng: random.Random, repeats: int) -> None:
    teds("<table><tr><td>a</td></tr></table>", "<table><tr><td>b</td></tr></table>")  # compile/load numba
    table = Table(title="TEDS_s: project (numba Zhang–Shasha) vs plain apted, parsing included")
    for column in ("table", "nodes", "apted s", "project ms", "ratio", "TEDS_s", "equal"):
        table.add_column(column, justify="right")
    for n_rows, n_cols in SIZES:
        rows = make_rows(rng, n_rows, n_cols)
        ref = to_html(rows)
        # a middle row lost, the header repeated at the end, two cells of row 1 merged
        pred = to_html(rows[:n_rows // 2] + rows[n_rows // 2 + 1:] + [rows[0]], {(1, 0): 2})
        start = time.perf_counter()
        slow = teds_apted(pred, ref)
        apted_s = time.perf_counter() - start
        times = []
        for _ in range(repeats):
            clear_caches()
            start = time.perf_counter()
            fast = teds(pred, ref)
            times.append(time.perf_counter() - start)
        project_s = min(times)
        table.add_row(f"{n_rows}x{n_cols}", str(parse_tree(ref).lml.size), f"{apted_s:.2f}",
                      f"{project_s * 1e3:.1f}", f"{apted_s / project_s:.0f}x", f"{fast:.6f}",
                      "yes" if abs(fast - slow) <= 1e-9 else f"NO ({slow:.9f})")
    console.print(table)


def step_batch(seed: int) -> tuple[list[str], list[str], list[str]]:
    rng = random.Random(seed)
    completions, targets = [], []
    for _ in range(24):
        rows, spans, ref = reference(rng)
        for _ in range(28):
            completions.append(noisy(rng, rows, spans))
            targets.append(ref)
    return completions, targets, ["table"] * len(completions)


def bench_batch(console: Console) -> None:
    table = Table(title="ocr_reward on 672 table completions (24 references x 28 predictions)")
    for column in ("run", "workers", "distinct", "ref chars (mean)", "wall s", "mean reward"):
        table.add_column(column, justify="right")
    workers = default_workers()
    runs = [("cold pool (spawn included)", workers, 1), ("warm pool, new step", workers, 2),
            ("one process", 1, 3)]
    for name, n_workers, seed in runs:
        completions, targets, tasks = step_batch(seed)
        clear_caches()
        reward = OcrReward(workers=n_workers)
        start = time.perf_counter()
        values = reward(None, completions, target=targets, task_type=tasks)
        wall = time.perf_counter() - start
        table.add_row(name, str(n_workers), str(len(set(completions))),
                      f"{sum(map(len, set(targets))) / len(set(targets)):.0f}", f"{wall:.2f}",
                      f"{sum(values) / len(values):.3f}")
    console.print(table)


FLOODS = {  # name -> (repeated unit, task); each task's first entry is its ordinary input
    "ordinary formula": ("\\frac{a_{1}}{b^{2}} + \\sqrt{x} ", "formula"),
    "\\[ flood": ("\\[", "formula"),
    "\\tag{ flood": ("\\tag{", "formula"),
    "\\end{ flood": ("\\end{", "formula"),
    "\\begin{ flood": ("\\begin{", "formula"),
    "ordinary text": ("Energy $E = m c^2$ is conserved. ", "text"),
    "\\( flood": ("\\(", "text"),
    "ordinary table": ("<tr><td>12.5</td><td>mean</td></tr>", "table"),
    "<math> flood": ("<math>", "table"),
}
FLOOD_SIZES = (8_192, 65_536)
FLOOD_REF = {"formula": "x^{2}", "text": "hello world", "table": "<table><tr><td>a</td></tr></table>"}
NORMALIZERS = {"formula": normalize_formula, "text": normalize_text,
               "table": lambda text: normalize_table_html("<table>" + text + "</table>")}
# OmniDocBench's formula regexes as published (backtracking), for the comparison column
UPSTREAM_BODY = re.compile(r"\\\[(.+?)(?<!\\)\\\]")
UPSTREAM_DROPPED = [re.compile(p) for p in (r"\\tag\{.*?\}", r"\\hspace\{.*?\}", r"\\begin\{.*?\}",
                                             r"\\end\{.*?\}", r"\\arraycolsep.*?\}")]


def upstream_formula(text: str) -> None:
    match = UPSTREAM_BODY.search(text)
    text = match.group(1) if match else text
    for pattern in UPSTREAM_DROPPED:
        text = pattern.sub("", text)


def _best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_floods(console: Console, repeats: int) -> None:
    table = Table(title="hostile floods beside ordinary input of the same task and length (same run)")
    for column in ("input", "chars", "normalize ms", "x ordinary", "growth 8K->64K", "upstream regexes ms",
                   "score ms"):
        table.add_column(column, justify="left" if column == "input" else "right")
    ordinary, slowest = {}, 0.0
    for name, (unit, task) in FLOODS.items():
        previous = None
        for size in FLOOD_SIZES:
            text = (unit * (size // len(unit) + 1))[:size]
            normal = _best_of(repeats, lambda: NORMALIZERS[task](text))
            upstream = _best_of(1, lambda: upstream_formula(text)) if task == "formula" else None
            whole = _best_of(1, lambda: score(text, FLOOD_REF[task], task))
            slowest = max(slowest, whole)
            ordinary.setdefault((task, size), normal)
            table.add_row(Text(name), f"{size:,}", f"{normal * 1e3:.2f}", f"{normal / ordinary[task, size]:.2f}",
                          f"{normal / previous:.1f}x" if previous else "",
                          f"{upstream * 1e3:.0f}" if upstream is not None else "", f"{whole * 1e3:.0f}")
            previous = normal
    console.print(table)
    console.print(f"slowest single score: {slowest:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timings of the project TEDS (minimum kept)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=("floods",), default=None, help="run one part alone")
    args = parser.parse_args()
    console = Console()
    if args.only is None:
        bench_teds(console, random.Random(args.seed), args.repeats)
        bench_batch(console)
    bench_floods(console, args.repeats)


if __name__ == "__main__":
    main()
