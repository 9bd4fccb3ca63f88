"""What a mining run of an image pool keeps and drops, by task and by the crop's lines.

Reads the per-prompt rollout statistics a `gravity-grpo mine` run wrote (`OUT/mining/parts`) and the pool's crops,
groups the crops as `compare` and `vlm_reads.py` do (`grpo.synthetic.reading.grouped`: a crop's lines are its cell
rows, so this is for the tiny world's rendered pools), and prints for the crops kept and dropped at `--min-std` the
mean over crops of their rollouts' reward mean, standard deviation and range (max - min); with `--keep`, "kept"
also counts the crops ranked out.

    python benchmarks/mined_crops.py runs/mine-vlm10 --pool tiny --min-std 0.05
"""
from __future__ import annotations

import argparse
from statistics import fmean


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", help="the mining run's OUT folder")
    parser.add_argument("--pool", default="tiny", help="the pool it mined (a built-in name is rendered as crops)")
    parser.add_argument("--min-std", type=float, default=0.05, help="the run's --min-std")
    args = parser.parse_args()

    from grpo.mining.selection import is_dropped
    from grpo.mining.store import MiningStore
    from grpo.pool import load_pool
    from grpo.synthetic.reading import grouped

    records = MiningStore(args.out).read_parts()   # by the row's index in the pool as read (no --skip-bad)
    rows = list(load_pool(args.pool, images=True))
    groups = {name: pick for name, pick in grouped(rows).items() if "/" in name}   # task by lines
    print(f"{args.out}: {len(records)} of {len(rows)} crops mined, --min-std {args.min_std}")
    print(f"{'':8} {'group':18} {'crops':>5} {'reward':>7} {'std':>6} {'max-min':>7}")
    for fate in ("kept", "dropped"):
        for group, pick in groups.items():
            recs = [records[i] for i in pick
                    if i in records and (fate == "dropped") == is_dropped(records[i], args.min_std)]
            if recs:
                print(f"{fate:8} {group:18} {len(recs):5d} {fmean(r['reward_mean'] for r in recs):7.3f} "
                      f"{fmean(r['reward_std'] for r in recs):6.3f} "
                      f"{fmean(r['reward_max'] - r['reward_min'] for r in recs):7.3f}")


if __name__ == "__main__":
    main()
