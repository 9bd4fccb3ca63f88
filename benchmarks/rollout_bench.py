"""Rollouts from the colocated vLLM engine, plain against self-drafted (`vllm_self_speculation`), in one run.

The demo's rollouts (a GRPO recipe, default configs/tiny_cpu.yaml; configs/tiny_vlm_cpu.yaml for the tiny GLM-OCR,
whose crops go to the engine as chat messages with their image): its checkpoint and pool (or `--model`, `--pool`),
`max_completion_length`, `temperature`, seed, and batches of `per_device_train_batch_size` completions
(`num_generations` per prompt; or `--prompts-per-batch`), over the first `--steps` batches of pool prompts, in
`--dtype` (default float32, HF float32's tokens). Each engine runs in its own
process (one vLLM engine per process), one after the other, over the same requests:
- greedy (temperature 0): the outputs of both engines are compared token for token;
- sampled (the recipe's temperature, seeded per request): generation wall time (after one warm-up batch),
  output tokens, and the counts of `grpo.rollouts.engine_selfspec.rollout_metrics` (tokens per forward of the
  policy's weights with the drafting counted, tokens per target forward, accepted per draft);
- the KV cache the engine allocated, in tokens (a drafting engine's draft copy has its own).
Printed at the end: the wall-time ratio plain / self-drafted and whether the greedy outputs are equal, or why the
self-drafted engine cannot start on the checkpoint.

    python benchmarks/rollout_bench.py --config configs/tiny_cpu.yaml --steps 4
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def run_engine(args: argparse.Namespace, drafted: bool) -> dict:
    """One engine's figures, or {"cannot": why} when it does not start (this runs in a child process)."""
    import torch
    from vllm import SamplingParams

    from grpo.checkpoint import is_vlm_checkpoint, resolve_model
    from grpo.pool import load_pool
    from grpo.prompting import user_turn
    from grpo.rollouts.engine import make_llm
    from grpo.rollouts.engine_selfspec import rollout_metrics, spec_counters
    from grpo.training.config import load_config

    cfg = load_config(args.config)
    if cfg.cpu_threads:
        torch.set_num_threads(cfg.cpu_threads)
    per_batch = args.prompts_per_batch or cfg.per_device_train_batch_size // cfg.num_generations
    model = resolve_model(args.model or cfg.model)
    vlm = is_vlm_checkpoint(model)
    pool = load_pool(args.pool or cfg.pool)
    rows = list(pool.select(range(min(len(pool), per_batch * (args.steps + 1)))))
    try:
        llm = make_llm(model, seed=cfg.seed, max_model_len=cfg.vllm_max_model_length, dtype=args.dtype,
                       self_speculation=drafted, draft_len=args.draft_length, log_stats=True)
    except Exception as err:  # noqa: BLE001 - the bench reports why the engine does not start
        return {"cannot": f"{type(err).__name__}: {err}"}

    def generate(batch: list[dict], params) -> list:
        if vlm:
            return llm.chat([user_turn(r["prompt"], r["image"], image_part="image_pil") for r in batch], params,
                            use_tqdm=False)
        return llm.generate([r["prompt"] for r in batch], params, use_tqdm=False)

    greedy = generate(rows[per_batch:], SamplingParams(temperature=0.0, max_tokens=cfg.max_completion_length))

    def sampled(batch: int) -> list:
        group = rows[batch * per_batch:(batch + 1) * per_batch]
        params = [SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_completion_length,
                                 seed=cfg.seed * 1_000_003 + batch * 1000 + i)
                  for i in range(len(group)) for _ in range(cfg.num_generations)]
        return generate([r for r in group for _ in range(cfg.num_generations)], params)

    sampled(0)  # warm-up batch, not timed
    before, start, tokens = spec_counters(llm), time.perf_counter(), 0
    for batch in range(1, args.steps + 1):
        tokens += sum(len(o.outputs[0].token_ids) for o in sampled(batch))
    seconds = time.perf_counter() - start
    cache = llm.llm_engine.vllm_config.cache_config
    return {"greedy": [list(o.outputs[0].token_ids) for o in greedy], "seconds": seconds, "tokens": tokens,
            "kv_cache_tokens": cache.num_gpu_blocks * cache.block_size,
            **rollout_metrics(before, spec_counters(llm), drafted)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tiny_cpu.yaml", help="GRPO recipe whose rollouts to time")
    parser.add_argument("--steps", type=int, default=4, help="timed batches (one warm-up batch before them)")
    parser.add_argument("--draft-length", type=int, default=None, help="tokens drafted per round (default B + 1)")
    parser.add_argument("--model", help="checkpoint instead of the recipe's")
    parser.add_argument("--pool", help="prompt pool instead of the recipe's")
    parser.add_argument("--dtype", default="float32", help="the engines' dtype (float32: equal to HF float32)")
    parser.add_argument("--prompts-per-batch", type=int, default=None,
                        help="prompts per batch (default per_device_train_batch_size / num_generations)")
    parser.add_argument("--engine", choices=("plain", "drafted"), help=argparse.SUPPRESS)  # the child's side
    args = parser.parse_args()
    if args.engine:
        print(json.dumps(run_engine(args, args.engine == "drafted")))
        return
    results = {}
    for engine in ("plain", "drafted"):
        cmd = [sys.executable, __file__, "--config", args.config, "--steps", str(args.steps), "--engine", engine,
               "--dtype", args.dtype]
        for flag, value in (("--draft-length", args.draft_length), ("--model", args.model), ("--pool", args.pool),
                            ("--prompts-per-batch", args.prompts_per_batch)):
            if value:
                cmd += [flag, str(value)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results[engine] = json.loads(out.strip().splitlines()[-1])
    for name, r in results.items():
        if "cannot" in r:
            print(f"{name:8s} cannot start on {args.config}: {r['cannot']}")
            continue
        print(f"{name:8s} sampled: {r['seconds']:.2f} s, {r['tokens']} tokens, "
              f"{r['tokens'] / r['seconds']:.0f} tokens/s, tokens per forward {r['rollout/tokens_per_forward']:.2f} "
              f"(per target forward {r['rollout/tokens_per_target_forward']:.2f}), accepted per draft "
              f"{r.get('rollout/accepted_per_draft', 0.0):.2f}, KV cache {r['kv_cache_tokens']} tokens")
    plain, drafted = results["plain"], results["drafted"]
    if "cannot" in plain or "cannot" in drafted:
        return
    same = sum(a == b for a, b in zip(plain["greedy"], drafted["greedy"]))
    print(f"greedy outputs equal: {same}/{len(plain['greedy'])}")
    print(f"generation wall-time ratio plain / self-drafted: {plain['seconds'] / drafted['seconds']:.2f}x")


if __name__ == "__main__":
    main()
