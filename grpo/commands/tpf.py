"""`gravity-grpo tpf`: tokens per forward of a joint checkpoint on a prompt pool, by task and length."""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

from grpo.limits import MAX_BATCH, MAX_SAMPLES, MIN_TEMPERATURE  # bounds shared with tpf-drift's run configs

STAMP = "gravity-grpo tpf"  # in each file it writes (grpo.outputs)
DEFAULT_MAX_NEW_TOKENS = 512  # the output cap where neither --max-new-tokens nor the preset gives one
HELP = "measure the drafter's tokens per forward (self-speculative or direct diffusion) on a prompt pool"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny", help="checkpoint: a folder (full or LoRA), a hub id, or a built-in "
                                                        "name: tiny (default), tiny-vlm")
    from grpo.yaml_config import RenamedFlag

    pool = parser.add_mutually_exclusive_group(required=True)
    pool.add_argument("--pool", help="prompt pool: save_to_disk folder, .parquet, .jsonl or a built-in name "
                                     "(e.g. tiny-probe, tiny-vlm-probe)")
    pool.add_argument("--data", dest="pool", action=RenamedFlag, new="--pool", help=argparse.SUPPRESS)
    parser.add_argument("--limit", type=int, default=None, help="use the first N rows")
    parser.add_argument("--skip-bad", action="store_true", help="leave malformed pool rows out (listed) "
                                                                 "instead of stopping")
    parser.add_argument("--bd-size", type=int, default=None, help="draft block size B (default: the checkpoint's)")
    from grpo.decoding.presets import PRESETS

    parser.add_argument("--preset", choices=tuple(PRESETS), default="cpu",
                        help="decode settings (grpo/decoding/presets.py): cpu, the tiny world's (fp32, one cap); "
                             "gravityocr, GravityOCR's published decode (bf16, caps per task, crops as given, stop "
                             "at the tokenizer's EOS)")
    parser.add_argument("--round", choices=("package", "gravityocr"), default=None,
                        help="round layout (docs/spec.md §5): package, x0 from the prefill; gravityocr, GravityOCR's "
                             "(batch 1, greedy; default: the preset's)")
    parser.add_argument("--image-long-side", default=None, metavar="full|768|1344|N",
                        help="long side crops are resized to (grpo/crop_size.py; default: the "
                             "preset's, full)")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="output cap per prompt (default: the preset's per task, else 512)")
    parser.add_argument("--compare-ar", action="store_true", help="also decode AR greedy; report the equal share")
    parser.add_argument("--batch-size", type=int, default=1, help="prompts decoded at once (selfspec mode); "
                                                                  "greedy output is the same at every size")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0: exact self-speculative "
                                                                       "sampling at this temperature (no top-k/p)")
    parser.add_argument("--samples", type=int, default=1, help="samples per prompt (with --temperature > 0)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampler")
    parser.add_argument("--score", action="store_true", help="also score each output against the row's target "
                                                             "(the GRPO reward of the decoded output)")
    parser.add_argument("--postprocess", choices=("none", "gravityocr"), default="none",
                        help="scoring mode of --score (ocr_rewards.postprocess): 'gravityocr' formats each output "
                             "as GravityOCR's evaluation does before the reward")
    parser.add_argument("--mode", choices=("selfspec", "diffusion"), default="selfspec", help="decoder")
    parser.add_argument("--tau", type=float, default=0.9, help="confidence threshold of --mode diffusion")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                        help="model dtype (default: the preset's)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--out", type=Path, default=None, help="write the statistics as JSON here (its folder "
                                                               "must exist)")
    parser.add_argument("--overwrite", action="store_true", help="replace an --out file of an earlier tpf run")


def _table(stats: dict):
    from rich.table import Table

    sampled = f", T={stats['temperature']}, {stats['samples']} samples" if stats["temperature"] else ""
    table = Table(title=f"TPF ({stats['mode']}, B={stats['bd_size']}, n={stats['n']}{sampled})")
    for column in ("group", "n", "TPF", "TPF bench", "accepted/round", "AR-equal", "reward", "exact", "tokens", "forwards"):
        table.add_column(column, justify="left" if column == "group" else "right")

    def fmt(value, spec=".2f"):
        return "-" if value is None else format(value, spec)

    def add(name: str, s: dict) -> None:
        table.add_row(name, str(s["n"]), fmt(s["tpf"]), fmt(s["tpf_bench"]), fmt(s["accepted_per_round"]),
                      fmt(s["ar_equal_rate"], ".1%"), fmt(s["reward"], ".3f"), fmt(s["exact_rate"], ".0%"),
                      str(s["tokens"]), str(s["forwards"]))

    add("all", stats)
    for task, s in stats["by_task"].items():
        add(f"task {task}", s)
    for label, s in stats["by_length"].items():
        add(f"length {label}", s)
    return table


def _check_decoding(args: argparse.Namespace, error: type) -> None:
    """Refuse decoding flags that contradict each other or that no decoder takes, naming the flag."""
    from grpo.limits import MAX_SEED

    for flag, value in (("--max-new-tokens", args.max_new_tokens), ("--bd-size", args.bd_size)):
        if value is not None and value < 1:
            raise error(f"{flag} must be >= 1, got {value}")

    if not 0 <= args.tau <= 1:
        raise error(f"--tau is a confidence threshold in [0, 1], got {args.tau}")
    if not (1 <= args.batch_size <= MAX_BATCH and 1 <= args.samples <= MAX_SAMPLES):
        raise error(f"--batch-size must be in [1, {MAX_BATCH}] and --samples in [1, {MAX_SAMPLES}], got "
                    f"{args.batch_size} and {args.samples}")
    if not (args.temperature == 0 or MIN_TEMPERATURE <= args.temperature < math.inf):
        raise error(f"--temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE} (less overflows "
                    f"the softmax), got {args.temperature}")
    if not 0 <= args.seed <= MAX_SEED:
        raise error(f"--seed must be in [0, {MAX_SEED}], got {args.seed}")
    if args.samples > 1 and args.temperature == 0:
        raise error("--samples > 1 needs --temperature > 0: greedy decoding gives one output per prompt")
    if args.temperature > 0 and args.compare_ar:
        raise error("--compare-ar checks equality with AR greedy: leave it out with --temperature > 0")
    if args.mode == "diffusion" and (args.batch_size > 1 or args.temperature > 0):
        raise error("--mode diffusion decodes greedily at batch 1: leave --batch-size and --temperature out")


def _check_sizes(args: argparse.Namespace, ckpt, pool, side: str | None) -> None:
    """Refuse an output cap or block size the model cannot decode, rows its processor cannot take (crops fitted
    to `side`), and rows that do not fit in its positions."""
    from grpo.checkpoint import context_length
    from grpo.errors import UserError
    from grpo.pool import policy_mismatch
    from grpo.prompting import prompt_problems, rows_over_context

    positions = context_length(ckpt.model.config)
    if positions is not None and args.max_new_tokens >= positions:
        raise UserError(f"--max-new-tokens {args.max_new_tokens}: the model has {positions} positions in all")
    size, where = (args.bd_size, "--bd-size") if args.bd_size else (ckpt.bd.bd_size, f"{ckpt.bd.source}: bd_size")
    if size > args.max_new_tokens:
        raise UserError(f"{where} {size}: a draft block longer than --max-new-tokens {args.max_new_tokens} "
                        "drafts tokens that can never be kept")
    problem = policy_mismatch(pool, f"prompt pool {args.pool}", ckpt.is_vlm)
    if problem:
        raise UserError(problem)
    bad = prompt_problems(ckpt.processor, pool, ckpt.is_vlm, side)
    if bad:
        raise UserError(f"prompt pool {args.pool}: {len(bad)} row(s) the model's processor cannot take: "
                        f"{'; '.join(bad[:5])}")
    over = rows_over_context(ckpt.processor, pool, ckpt.is_vlm, positions, args.max_new_tokens)
    if over:
        raise UserError(f"prompt pool {args.pool}: {len(over)} row(s) longer than the model's context with "
                        f"--max-new-tokens {args.max_new_tokens}: {'; '.join(over[:5])}")


def run(args: argparse.Namespace) -> int:
    import torch

    from grpo.pool import load_pool
    from grpo.checkpoint import load_checkpoint
    from grpo.console import console
    from grpo.decoding.presets import preset_named
    from grpo.decoding.tpf import measure_tpf
    from ocr_rewards.settings import HELD_OUT
    from grpo.errors import UserError
    from grpo.hardware import torch_device, torch_device_named
    from grpo.outputs import atomic_write, output_file
    from grpo.crop_size import long_side

    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit must be >= 1, got {args.limit}")
    preset = preset_named(args.preset)
    if args.image_long_side is not None:
        try:
            long_side(args.image_long_side)
        except ValueError as err:
            raise UserError(f"--image-long-side: {err}") from None
    if args.round is not None:
        preset = dataclasses.replace(preset, round=args.round)
    if preset.round == "gravityocr" and (args.mode != "selfspec" or args.batch_size > 1 or args.temperature > 0):
        raise UserError(f"GravityOCR's round layout (preset {args.preset}, --round {preset.round}) decodes "
                        "self-speculatively and greedily at batch 1: leave out --mode, --batch-size and --temperature")
    if args.max_new_tokens is not None and preset.max_new_tokens:
        preset = dataclasses.replace(preset, max_new_tokens=None, other_cap=None)  # the flag's one cap replaces the preset's
    if args.max_new_tokens is None:
        args.max_new_tokens = DEFAULT_MAX_NEW_TOKENS
    args.dtype = args.dtype or preset.dtype
    if args.postprocess != "none" and not args.score:
        raise UserError("--postprocess is the scoring mode of --score: add --score", setting="postprocess")
    _check_decoding(args, UserError)
    device = torch_device_named(args.device) if args.device is not None else torch_device()
    out = output_file(args.out, "--out", stamp=STAMP, inputs=[args.pool, args.model], overwrite=args.overwrite)
    ckpt = load_checkpoint(args.model, need_drafter=True, dtype=getattr(torch, args.dtype))
    console.print(f"model: {ckpt.source.describe()}", markup=False)
    pool = load_pool(args.pool, skip_bad=args.skip_bad)
    if args.limit is not None:
        pool = pool.select(range(min(args.limit, len(pool))))
    _check_sizes(args, ckpt, pool, preset.image_long_side if args.image_long_side is None else args.image_long_side)
    ckpt.model.to(device)
    stats = measure_tpf(ckpt.model, ckpt.processor, pool, ckpt.bd, is_vlm=ckpt.is_vlm, bd_size=args.bd_size,
                        max_new_tokens=args.max_new_tokens, compare_ar=args.compare_ar, mode=args.mode,
                        tau=args.tau, score=args.score, batch_size=args.batch_size, temperature=args.temperature,
                        samples=args.samples, seed=args.seed, preset=preset, image_long_side=args.image_long_side,
                        reward_settings=HELD_OUT.replace(postprocess=args.postprocess))
    if args.score:
        stats["settings"]["eval_postprocess"] = args.postprocess
    stats = {"written_by": STAMP, **stats, "model": str(ckpt.path), "pool": args.pool}
    console.print(_table(stats))
    console.print(f"decode wall time {stats['wall_s']:.2f} s at batch size {args.batch_size}", markup=False)
    if stats["truncated"]:
        console.print(f"{stats['truncated']} output(s) reached --max-new-tokens {args.max_new_tokens}", markup=False)
    if out is not None:
        atomic_write(out, json.dumps(stats, indent=2) + "\n", replace=STAMP if args.overwrite else False)
        console.print(f"wrote {out}", markup=False)
    return 0
