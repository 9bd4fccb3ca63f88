"""Does a GLM-OCR checkpoint read? Greedy reward on fresh image probes, real crops against blank ones (paired).

For each `--seeds` seed, the first `--rows` crops of `tiny-probe@SEED` rendered by `build_image_split` are decoded
self-speculatively (greedy, fp32, with the AR-greedy comparison) and scored, then the same rows with a white crop
of the same size (`grpo.synthetic.reading.read_check`). Printed over all, per task and per task by the crop's lines: reward on real and blank
crops, real - blank with its 95% bootstrap interval, TPF and the AR-equal share; `--out` writes them as JSON.

    python benchmarks/vlm_reads.py --model tiny-vlm --seeds 101 102 --rows 24
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny-vlm", help="GLM-OCR joint checkpoint (folder or built-in name)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[101, 102], help="fresh probe seeds")
    parser.add_argument("--rows", type=int, default=24, help="crops per seed (tasks in turn)")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--out", type=Path, default=None, help="write the report as JSON here")
    args = parser.parse_args()

    import torch

    from grpo.checkpoint import load_checkpoint
    from grpo.synthetic.reading import read_check

    torch.set_num_threads(1)
    ckpt = load_checkpoint(args.model, need_drafter=True)
    report = read_check(ckpt.model, ckpt.processor, ckpt.bd, args.seeds, args.rows, args.max_new_tokens)
    print(f"{args.model}: seeds {args.seeds}, {args.rows} crops each")
    print(f"{'group':16} {'n':>4} {'real':>6} {'blank':>6} {'real-blank':>10} {'95% interval':>16} {'TPF':>5} {'AR-eq':>6}")
    for task, r in report.items():
        print(f"{task:16} {r['n']:4d} {r['after']:6.3f} {r['before']:6.3f} {r['diff']:+10.3f} "
              f"[{r['low']:+.3f}, {r['high']:+.3f}] {r['tpf']:5.2f} {r['ar_equal']:6.0%}")
    print("drafts accepted a round, by the output line the round starts on (rounds in brackets)")
    for task, r in report.items():
        if "/" not in task:
            print(f"{task:16} " + "  ".join(f"line {n + 1}: {mean:5.2f} ({count})"
                                            for n, (count, mean) in r["drafts_by_line"].items()))
    if args.out:
        args.out.write_text(json.dumps({"model": args.model, "seeds": args.seeds, "rows": args.rows,
                                        "report": report}, indent=2) + "\n")


if __name__ == "__main__":
    main()
