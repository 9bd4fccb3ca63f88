"""What a step of the colocated vLLM engine costs on this machine: the draft-slot rule's `StepCost`
(`grpo.rollouts.draft_slots`, the recipe field `vllm_step_cost`), measured.

On a GRPO recipe's checkpoint (default configs/tiny_cpu.yaml), in float32, sampled at the recipe's temperature as
its rollouts are, with `ignore_eos` so that the b requests of a batch stay in the batch to the end:
- plain decoding: the time of one step over b requests, from two runs of 16 and 80 new tokens (the difference is 64
  steps, so the prefill and the per-request set-up cancel), at each `--batch-sizes` b;
- self-drafted at a fixed draft length K (`--draft-lengths`): the time of one step (a draft forward, a verify
  forward and the verification) over b requests, the steps counted by vLLM (`vllm:spec_decode_num_drafts` / b).
Each time is the least of `--repeats` runs (the machine is shared). Least squares fit a plain step as
`fixed + per_request * b` and a drafting step as `round_fixed + b * (round_request + round_slot * K)`; `step_cost`
is `[per_request, round_fixed, round_request, round_slot] / fixed`, the recipe's `vllm_step_cost`.

    python benchmarks/step_cost.py --config configs/tiny_cpu.yaml --json runs/step_cost.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def _engine(args: argparse.Namespace, draft_len: int | None):
    import torch

    from grpo.model_source import resolve_model
    from grpo.pool import load_pool
    from grpo.rollouts.engine import make_llm
    from grpo.training.config import load_config

    cfg = load_config(args.config)
    args.temperature = cfg.temperature
    torch.set_num_threads(cfg.cpu_threads or 1)
    model = resolve_model(cfg.model)
    llm = make_llm(model, seed=cfg.seed, max_model_len=cfg.vllm_max_model_length, dtype="float32",
                   self_speculation=draft_len is not None, draft_len=draft_len, log_stats=True)
    prompt = llm.get_tokenizer().encode(load_pool(cfg.pool)[0]["prompt"])
    return llm, prompt


def _least(args: argparse.Namespace, run) -> tuple[float, float]:
    """The least time of `--repeats` calls of `run`, with the verify rounds of that call."""
    from grpo.rollouts.engine_selfspec import DRAFTS, spec_counters

    best = (float("inf"), 0.0)
    for _ in range(args.repeats):
        args.llm.reset_prefix_cache()  # every run prefills its prompts
        before = spec_counters(args.llm)[DRAFTS]
        start = time.perf_counter()
        run()
        best = min(best, (time.perf_counter() - start, spec_counters(args.llm)[DRAFTS] - before))
    return best


def _decode(args: argparse.Namespace, prompt: list[int], batch: int, new_tokens: int) -> tuple[float, float]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=args.temperature, max_tokens=new_tokens, ignore_eos=True, detokenize=False)
    requests = [{"prompt_token_ids": prompt}] * batch
    return _least(args, lambda: args.llm.generate(requests, params, use_tqdm=False))


def measure(args: argparse.Namespace, draft_len: int | None) -> dict:
    """One engine's seconds per step by batch size (this runs in a child process)."""
    args.llm, prompt = _engine(args, draft_len)
    out: dict = {"step_seconds": {}}
    for batch in args.batch_sizes:
        (short, short_rounds), (long, long_rounds) = (_decode(args, prompt, batch, n) for n in (16, 80))
        steps = 64 if draft_len is None else (long_rounds - short_rounds) / batch
        out["step_seconds"][str(batch)] = (long - short) / steps
    return out


def fit(steps: dict[str, dict[str, float]]) -> dict:
    """The least-squares fit of the module docstring (seconds by batch size, plain and by draft length), in seconds,
    and `step_cost`."""
    import numpy as np

    plain = steps["plain"]
    drafted = {k: v for k, v in steps.items() if k != "plain"}
    per_request, fixed = np.polyfit([int(b) for b in plain], list(plain.values()), 1)
    rows = [(1, int(b), int(b) * int(k)) for k, by_batch in drafted.items() for b in by_batch]
    seconds = [s for by_batch in drafted.values() for s in by_batch.values()]
    round_fixed, round_request, round_slot = np.linalg.lstsq(np.array(rows, float), np.array(seconds), rcond=None)[0]
    return {"fixed": fixed, "per_request": per_request, "round_fixed": round_fixed, "round_request": round_request,
            "round_slot": round_slot,
            "step_cost": [float(v / fixed) for v in (per_request, round_fixed, round_request, round_slot)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tiny_cpu.yaml", help="GRPO recipe whose checkpoint to time")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--draft-lengths", type=int, nargs="*", default=[4, 17])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--part", type=int, help=argparse.SUPPRESS)  # a child: the draft length, 0 plain
    args = parser.parse_args()
    if args.part is not None:
        print(json.dumps(measure(args, args.part or None)))
        return
    steps = {}
    for part in (0, *args.draft_lengths):
        cmd = [sys.executable, __file__, "--config", args.config, "--part", str(part), "--repeats", str(args.repeats),
               "--batch-sizes", *map(str, args.batch_sizes)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        steps["plain" if part == 0 else str(part)] = json.loads(out.strip().splitlines()[-1])["step_seconds"]
    figures = {"config": args.config, "steps": steps, "fit": fit(steps)}
    text = json.dumps(figures, indent=1)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
