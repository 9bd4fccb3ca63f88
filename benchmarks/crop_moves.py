"""How each probe crop's held-out reward moves in a finished `gravity-grpo compare`, by task and by where it starts.

For every arm and task: the slope of a crop's change (mean over seeds) on its start reward, the mean change of the
crops the start reads below 0.6 and of those it reads at 0.8 or more, and how far one crop's reward spreads over
the seeds (the mean over crops of its standard deviation across seeds). A slope near -1 with a wide spread is a
crop that ends wherever its seed leaves it, whatever it started at; near 0 with a narrow spread, one that stays.

    python benchmarks/crop_moves.py runs/cmp8 --probe-set tiny-probe@401 --max-new-tokens 352
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import covariance, fmean, pstdev, variance

NAN = float("nan")


def mean_or_nan(values: list[float]) -> float:
    return fmean(values) if values else NAN


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="the comparison's --out folder")
    parser.add_argument("--probe-set", default="tiny-probe", help="the comparison's --probe-set")
    parser.add_argument("--probe-size", type=int, default=60, help="the comparison's --probe-size")
    parser.add_argument("--max-new-tokens", type=int, default=192, help="the comparison's --max-new-tokens")
    args = parser.parse_args()

    from grpo.compare import EVAL_FILE, START_FILE, probe_named

    probe = {"probe_set": args.probe_set, "probe_size": args.probe_size, "max_new_tokens": args.max_new_tokens}
    start = json.loads((args.out / probe_named(START_FILE, probe)).read_text())
    print(f"{'arm':6} {'task':8} {'seeds':>5} {'slope':>6} {'<0.6: n':>7} {'change':>7} {'>=0.8: n':>8} "
          f"{'change':>7} {'spread':>6}")
    for arm in sorted(p for p in args.out.iterdir() if p.is_dir()):
        runs = [json.loads(f.read_text()) for f in sorted(arm.glob(f"seed-*/{probe_named(EVAL_FILE, probe)}"))]
        if not runs:
            continue
        for task in sorted({row["task"] for row in start}):
            crops = [i for i, row in enumerate(start) if row["task"] == task]
            before = [start[i]["reward"] for i in crops]
            change = [fmean(run[i]["reward"] for run in runs) - start[i]["reward"] for i in crops]
            low = [c for b, c in zip(before, change) if b < 0.6]
            high = [c for b, c in zip(before, change) if b >= 0.8]
            var = variance(before)
            slope = covariance(before, change) / var if var else NAN
            spread = fmean(pstdev(run[i]["reward"] for run in runs) for i in crops)
            print(f"{arm.name:6} {task:8} {len(runs):5d} {slope:+6.2f} {len(low):7d} {mean_or_nan(low):+7.3f} "
                  f"{len(high):8d} {mean_or_nan(high):+7.3f} {spread:6.3f}")


if __name__ == "__main__":
    main()
