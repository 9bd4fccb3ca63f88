"""Rollouts from the colocated vLLM engine, plain against self-drafted (`vllm_self_speculation`), and the package's
own self-speculative decoder on the same prompts.

The demo's rollouts (a GRPO recipe, default configs/tiny_cpu.yaml; configs/tiny_vlm_cpu.yaml for the tiny GLM-OCR,
whose prompts go to the engine as the chat-template text with their image): the recipe's checkpoint and pool
(or `--model`, `--pool`), `max_completion_length`, `temperature`, seed and `vllm_max_model_length`, in `--dtype`
(default float32, HF float32's tokens). Each engine runs in its own process (one vLLM engine per process), one
after the other:
- greedy (temperature 0) over the first `--greedy-prompts` pool prompts: outputs compared token for token between
  the engines and with `grpo.decoding.selfspec.SelfSpecDecoder` (greedy, same caps and block size);
- sampled (the recipe's temperature, one seed per request) at each `--batch-sizes` N: batches of N pool prompts
  (cycling through the pool), each on empty prefix and encoder caches as a GRPO step after its weight sync, after
  one warm-up batch, until the engine has run `--seconds` on that size; wall
  time, tokens, and the counts of `grpo.rollouts.engine_selfspec.rollout_metrics` (`draft_slots`: slots a step
  drafted). The self-drafted engine drafts as the recipe's rollouts do: by its draft-slot schedule
  (`grpo.rollouts.draft_slots.recipe_slots`, written as `slots`), or at the full length at every step with
  `vllm_fixed_drafting` in the recipe or `--fixed-drafting`.

Accepted per round, one definition for both drafters: the tokens a verify round commits beyond the one the target
adds (its bonus token; a round that ends an output counts its last token as that), i.e. (output tokens - prefill
tokens - rounds) / rounds, the engine's rounds being vLLM's `num_drafts`. vLLM's own figure, counted before the cut
at a stop token or `max_tokens`, is written beside it. Under a slot schedule the greedy batch drafts its batch size's
slots, fewer than the decoder's or none, and its plain steps add tokens without rounds: the engine's accepted per
round and its ratio to the decoder's are then None. `--fixed-drafting` gives them.

    python benchmarks/rollout_bench.py --config configs/tiny_cpu.yaml --json runs/rollout_bench.json
    python benchmarks/rollout_bench.py --config configs/tiny_cpu.yaml --fixed-drafting --json runs/bench_full.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def _setup(args: argparse.Namespace):
    import torch

    from grpo.checkpoint import is_vlm_checkpoint
    from grpo.model_source import resolve_model
    from grpo.pool import load_pool
    from grpo.training.config import load_config

    cfg = load_config(args.config)
    torch.set_num_threads(cfg.cpu_threads or 1)
    model = resolve_model(args.model or cfg.model)
    vlm = is_vlm_checkpoint(model)
    return cfg, model, vlm, list(load_pool(args.pool or cfg.pool, images=vlm))


def run_engine(args: argparse.Namespace, drafted: bool) -> dict:
    """One engine's figures (this runs in a child process)."""
    from vllm import SamplingParams

    from grpo.block_diffusion import BlockDiffusionConfig
    from grpo.prompting import user_turn
    from grpo.rollouts.draft_slots import recipe_slots
    from grpo.rollouts.engine import make_llm, reset_caches
    from grpo.rollouts.engine_selfspec import rollout_metrics, spec_counters

    cfg, model, vlm, rows = _setup(args)
    slots = (recipe_slots(cfg, BlockDiffusionConfig.load(model).bd_size) if drafted and not args.fixed_drafting
             else None)
    llm = make_llm(model, seed=cfg.seed, max_model_len=cfg.vllm_max_model_length, dtype=args.dtype,
                   self_speculation=drafted, slots=slots, log_stats=True)
    tokenizer = llm.get_tokenizer()

    def request(row: dict):
        if not vlm:
            return row["prompt"]
        text = tokenizer.apply_chat_template(user_turn(row["prompt"], row["image"]), add_generation_prompt=True,
                                             tokenize=False)
        return {"prompt": text, "multi_modal_data": {"image": row["image"]}}

    greedy_rows = rows[:args.greedy_prompts]
    before = spec_counters(llm)
    greedy = llm.generate([request(r) for r in greedy_rows],
                          SamplingParams(temperature=0.0, max_tokens=cfg.max_completion_length), use_tqdm=False)
    out = {"slots": slots,
           "greedy": [list(o.outputs[0].token_ids) for o in greedy],
           "prompt_ids": [list(o.prompt_token_ids) for o in greedy],
           "greedy_counts": rollout_metrics(before, spec_counters(llm), drafted),
           "greedy_rounds": spec_counters(llm)["vllm:spec_decode_num_drafts"] - before["vllm:spec_decode_num_drafts"],
           "sampled": {}}
    cursor = 0
    for size in args.batch_sizes:
        def batch(seed: int) -> int:
            nonlocal cursor
            group = [rows[(cursor + i) % len(rows)] for i in range(size)]
            cursor += size
            params = [SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_completion_length,
                                     seed=cfg.seed * 1_000_003 + seed * 1000 + i) for i in range(size)]
            reset_caches(llm)  # as a GRPO step finds them after its weight sync: no prompt cached from another batch
            outs = llm.generate([request(r) for r in group], params, use_tqdm=False)
            return sum(len(o.outputs[0].token_ids) for o in outs)

        batch(0)  # warm-up, not timed
        before, start, tokens, batches = spec_counters(llm), time.perf_counter(), 0, 0
        while time.perf_counter() - start < args.seconds:
            batches += 1
            tokens += batch(batches)
        seconds = time.perf_counter() - start
        out["sampled"][str(size)] = {"seconds": seconds, "batches": batches, "tokens": tokens,
                                     **rollout_metrics(before, spec_counters(llm), drafted)}
    return out


def run_decoder(args: argparse.Namespace) -> dict:
    """`SelfSpecDecoder`'s greedy outputs and rounds on the greedy prompts (this runs in a child process)."""
    from grpo.checkpoint import load_checkpoint
    from grpo.decoding.kv_session import stop_token_ids
    from grpo.decoding.selfspec import SelfSpecDecoder
    from grpo.prompting import encode_prompt

    import torch

    cfg, model, vlm, rows = _setup(args)
    ckpt = load_checkpoint(model, dtype=getattr(torch, args.dtype))
    if torch.cuda.is_available():
        ckpt.model.to("cuda")
    tokenizer = getattr(ckpt.processor, "tokenizer", ckpt.processor)
    decoder = SelfSpecDecoder(ckpt.model, ckpt.bd.mask_id, ckpt.bd.bd_size, stop_token_ids(ckpt.model, tokenizer),
                              cfg.max_completion_length)
    start, tokens, rounds, prompt_ids = time.perf_counter(), [], 0, []
    for row in rows[:args.greedy_prompts]:
        inputs = encode_prompt(ckpt.processor, row, is_vlm=vlm)
        result = decoder.generate(inputs)
        tokens.append(result.tokens)
        prompt_ids.append(inputs["input_ids"][0].tolist())
        rounds += result.rounds
    return {"greedy": tokens, "prompt_ids": prompt_ids, "rounds": rounds, "seconds": time.perf_counter() - start}


def accepted_per_round(outputs: list[list[int]], rounds: float) -> float | None:
    """Tokens a round commits beyond the target's one (module docstring): (tokens - prefills - rounds) / rounds;
    None without rounds."""
    return (sum(map(len, outputs)) - len(outputs) - rounds) / rounds if rounds else None


def summary(plain: dict, drafted: dict, hf: dict) -> dict:
    """The figures the bench writes (module docstring)."""
    n = len(plain["greedy"])
    engine_apr = accepted_per_round(drafted["greedy"], drafted["greedy_rounds"]) if drafted["slots"] is None else None
    hf_apr = accepted_per_round(hf["greedy"], hf["rounds"])
    out = {"greedy_prompts": n,
           "greedy_equal": sum(a == b for a, b in zip(plain["greedy"], drafted["greedy"])) / n,
           "greedy_equal_hf_decoder": sum(a == b for a, b in zip(hf["greedy"], drafted["greedy"])) / n,
           "prompt_ids_equal": plain["prompt_ids"] == drafted["prompt_ids"] == hf["prompt_ids"],
           "engine_accepted_per_round": engine_apr, "hf_accepted_per_round": hf_apr,
           "accepted_ratio_engine_hf": None if engine_apr is None else engine_apr / hf_apr,
           "engine_accepted_per_round_vllm": drafted["greedy_counts"].get("rollout/accepted_per_round"),
           "engine_accepted_at": {k.rsplit("_", 1)[1]: v for k, v in drafted["greedy_counts"].items()
                                  if k.startswith("rollout/accepted_at_")},
           "greedy_tokens_per_forward": drafted["greedy_counts"]["rollout/tokens_per_forward"],
           "hf_decoder_greedy_seconds": hf["seconds"], "batch_sizes": {}}
    for size, d in drafted["sampled"].items():
        p = plain["sampled"][size]
        out["batch_sizes"][size] = {
            "tokens_per_forward": d["rollout/tokens_per_forward"],
            "tokens_per_target_forward": d["rollout/tokens_per_target_forward"],
            "tpf": d.get("rollout/tpf"),
            "draft_slots": d.get("rollout/draft_slots"),
            "accepted_per_round_vllm": d.get("rollout/accepted_per_round"),
            "accepted_at": {k.rsplit("_", 1)[1]: v for k, v in d.items() if k.startswith("rollout/accepted_at_")},
            "plain_seconds": p["seconds"], "plain_tokens": p["tokens"], "plain_batches": p["batches"],
            "drafted_seconds": d["seconds"], "drafted_tokens": d["tokens"], "drafted_batches": d["batches"],
            "plain_tokens_per_s": p["tokens"] / p["seconds"], "drafted_tokens_per_s": d["tokens"] / d["seconds"],
            "ratio_plain_over_drafted_time_per_token": (p["seconds"] / p["tokens"]) / (d["seconds"] / d["tokens"]),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/tiny_cpu.yaml", help="GRPO recipe whose rollouts to time")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32], help="sampled batch sizes")
    parser.add_argument("--seconds", type=float, default=30.0, help="least time each engine runs per batch size")
    parser.add_argument("--greedy-prompts", type=int, default=32, help="prompts decoded greedily")
    parser.add_argument("--dtype", default="float32", help="the engines' dtype (float32: equal to HF float32)")
    parser.add_argument("--model", help="checkpoint instead of the recipe's")
    parser.add_argument("--pool", help="prompt pool instead of the recipe's")
    parser.add_argument("--fixed-drafting", action="store_true",
                        help="the self-drafted engine drafts the full length at every step (vllm_fixed_drafting)")
    parser.add_argument("--part", choices=("plain", "drafted", "decoder"), help=argparse.SUPPRESS)  # a child
    args = parser.parse_args()
    if args.part:
        result = run_decoder(args) if args.part == "decoder" else run_engine(args, args.part == "drafted")
        print(json.dumps(result))
        return
    results = {}
    for part in ("plain", "drafted", "decoder"):
        cmd = [sys.executable, __file__, "--config", args.config, "--part", part, "--dtype", args.dtype,
               "--seconds", str(args.seconds), "--greedy-prompts", str(args.greedy_prompts),
               "--batch-sizes", *map(str, args.batch_sizes)]
        if args.fixed_drafting:
            cmd.append("--fixed-drafting")
        for flag, value in (("--model", args.model), ("--pool", args.pool)):
            if value:
                cmd += [flag, value]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results[part] = json.loads(out.strip().splitlines()[-1])
    figures = {"config": args.config, "dtype": args.dtype, "slots": results["drafted"]["slots"],
               **summary(results["plain"], results["drafted"], results["decoder"])}
    text = json.dumps(figures, indent=1)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
