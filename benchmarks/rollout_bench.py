"""Rollouts from the colocated vLLM engine, plain against self-drafted (`vllm_self_speculation`), in one run.

The demo's rollouts (a GRPO recipe, default configs/tiny_cpu.yaml): its checkpoint, pool, dtype (float32 on CPU),
`max_completion_length`, `temperature`, seed, and batches of `per_device_train_batch_size` completions
(`num_generations` per prompt), over the first `--steps` batches of pool prompts. Each engine runs in its own
process (one vLLM engine per process), one after the other, over the same requests:
- greedy (temperature 0): the outputs of both engines are compared token for token;
- sampled (the recipe's temperature, seeded per request): generation wall time (after one warm-up batch),
  output tokens, and the engine's own counters (`rollout/tokens_per_target_forward`,
  `rollout/accepted_per_draft`).
Printed at the end: the wall-time ratio plain / self-drafted and whether the greedy outputs are equal.

    python benchmarks/rollout_bench.py --config configs/tiny_cpu.yaml --steps 4
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def run_engine(args: argparse.Namespace, drafted: bool) -> dict:
    """One engine's figures (this runs in a child process)."""
    import torch
    from vllm import SamplingParams

    from grpo.checkpoint import resolve_model
    from grpo.pool import load_pool
    from grpo.rollouts.engine import make_llm
    from grpo.rollouts.engine_selfspec import rollout_metrics, spec_counters
    from grpo.training.config import load_config

    cfg = load_config(args.config)
    if cfg.cpu_threads:
        torch.set_num_threads(cfg.cpu_threads)
    per_batch = cfg.per_device_train_batch_size // cfg.num_generations
    prompts = list(load_pool(cfg.pool)["prompt"][: per_batch * (args.steps + 1)])
    llm = make_llm(resolve_model(cfg.model), seed=cfg.seed, max_model_len=cfg.vllm_max_model_length,
                   dtype="float32", self_speculation=drafted, draft_len=args.draft_length, log_stats=True)
    greedy = llm.generate(prompts[per_batch:], SamplingParams(temperature=0.0, max_tokens=cfg.max_completion_length),
                          use_tqdm=False)

    def sampled(batch: int) -> list:
        rows = prompts[batch * per_batch:(batch + 1) * per_batch]
        params = [SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_completion_length,
                                 seed=cfg.seed * 1_000_003 + batch * 1000 + i)
                  for i in range(len(rows)) for _ in range(cfg.num_generations)]
        return llm.generate([p for p in rows for _ in range(cfg.num_generations)], params, use_tqdm=False)

    sampled(0)  # warm-up batch, not timed
    before, start, tokens = spec_counters(llm), time.perf_counter(), 0
    for batch in range(1, args.steps + 1):
        tokens += sum(len(o.outputs[0].token_ids) for o in sampled(batch))
    seconds = time.perf_counter() - start
    return {"greedy": [list(o.outputs[0].token_ids) for o in greedy], "seconds": seconds, "tokens": tokens,
            **rollout_metrics(before, spec_counters(llm))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tiny_cpu.yaml", help="GRPO recipe whose rollouts to time")
    parser.add_argument("--steps", type=int, default=4, help="timed batches (one warm-up batch before them)")
    parser.add_argument("--draft-length", type=int, default=None, help="tokens drafted per round (default B + 1)")
    parser.add_argument("--engine", choices=("plain", "drafted"), help=argparse.SUPPRESS)  # the child's side
    args = parser.parse_args()
    if args.engine:
        print(json.dumps(run_engine(args, args.engine == "drafted")))
        return
    results = {}
    for engine in ("plain", "drafted"):
        cmd = [sys.executable, __file__, "--config", args.config, "--steps", str(args.steps), "--engine", engine]
        if args.draft_length:
            cmd += ["--draft-length", str(args.draft_length)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results[engine] = json.loads(out.strip().splitlines()[-1])
    plain, drafted = results["plain"], results["drafted"]
    for name, r in results.items():
        print(f"{name:8s} sampled: {r['seconds']:.2f} s, {r['tokens']} tokens, "
              f"{r['tokens'] / r['seconds']:.0f} tokens/s, tokens per target forward "
              f"{r['rollout/tokens_per_target_forward']:.2f}, accepted per draft "
              f"{r.get('rollout/accepted_per_draft', 0.0):.2f}")
    same = sum(a == b for a, b in zip(plain["greedy"], drafted["greedy"]))
    print(f"greedy outputs equal: {same}/{len(plain['greedy'])}")
    print(f"generation wall-time ratio plain / self-drafted: {plain['seconds'] / drafted['seconds']:.2f}x")


if __name__ == "__main__":
    main()
