"""How far the best of k sampled rollouts reads above greedy decoding, crop by crop, by task.

GRPO moves probability towards the better rollouts of each group, so what greedy decoding can gain from it on a
crop is bounded in practice by what the best of its k samples reads. This joins a `gravity-grpo mine` run over a
probe (`--min-std 0`: every crop's k rewards, `OUT/mining/parts`) with the greedy rewards of the same probe's crops
from a `gravity-grpo compare` that evaluated on it (its start model's rows, found as `compare` names them for the
probe the mining run mined), and prints by task the greedy mean, the sampled mean, the best-of-k mean, their
difference, and on how many crops the best sample beats greedy by > 0.01.

    gravity-grpo mine --model tiny-vlm --pool tiny-probe@602 --num-generations 8 --max-completion-length 352 \\
        --vllm-max-model-length 1280 --min-std 0 --out runs/head/p602
    python benchmarks/headroom.py runs/head/p602 runs/cmp20 --max-new-tokens 352
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import fmean


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mined", help="the mining run's OUT folder (the probe as its --pool, --min-std 0)")
    parser.add_argument("compared", type=Path, help="the --out folder of a compare that evaluated on that probe")
    parser.add_argument("--probe-size", type=int, default=60, help="the comparison's --probe-size")
    parser.add_argument("--max-new-tokens", type=int, default=192, help="the comparison's --max-new-tokens")
    args = parser.parse_args()

    from grpo.compare import START_FILE, probe_named
    from grpo.mining.store import MiningStore

    store = MiningStore(args.mined)
    probe = {"probe_set": store.read_done()["manifest"]["pool"], "probe_size": args.probe_size,
             "max_new_tokens": args.max_new_tokens}
    start = args.compared / probe_named(START_FILE, probe)
    records = store.read_parts()
    greedy = {row["index"]: row["reward"] for row in json.loads(start.read_text())}
    if set(records) != set(greedy):
        raise SystemExit(f"{args.mined} mined {len(records)} crops, {start} holds {len(greedy)}")
    print(f"{'task':8} {'crops':>5} {'greedy':>7} {'sampled':>7} {'best':>7} {'best-greedy':>11} {'best wins':>9}")
    for task in ("text", "table", "formula", "all"):
        pick = [i for i, r in records.items() if task in ("all", r["task_type"])]
        best = [records[i]["reward_max"] for i in pick]
        base = [greedy[i] for i in pick]
        wins = sum(b > g + 0.01 for b, g in zip(best, base))
        print(f"{task:8} {len(pick):5d} {fmean(base):7.3f} {fmean(records[i]['reward_mean'] for i in pick):7.3f} "
              f"{fmean(best):7.3f} {fmean(best) - fmean(base):+11.3f} {wins:9d}")


if __name__ == "__main__":
    main()
