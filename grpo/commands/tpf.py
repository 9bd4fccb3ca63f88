"""`gravity-grpo tpf`: tokens per forward of a joint checkpoint on a prompt pool, by task and length."""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

STAMP = "gravity-grpo tpf"  # in each file it writes (grpo.outputs)
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


# The flag of each `DecodeSettings` field its errors name.
FLAGS = {field: "--" + field.replace("_", "-") for field in (
    "mode", "max_new_tokens", "bd_size", "batch_size", "temperature", "samples", "seed", "tau", "compare_ar",
    "image_long_side")}


def decode_settings(args: argparse.Namespace, preset):
    """The `DecodeSettings` the flags ask for, decoded with `preset` (its round as --round says); a value out of
    bounds, or flags that exclude each other, raise a `UserError` naming the flags."""
    from grpo.decoding.tpf import DecodeSettings, DecodeSettingsError
    from grpo.errors import UserError
    from ocr_rewards.settings import HELD_OUT

    given = {"max_new_tokens": args.max_new_tokens} if args.max_new_tokens is not None else {}
    try:
        return DecodeSettings(mode=args.mode, bd_size=args.bd_size, batch_size=args.batch_size,
                              temperature=args.temperature, samples=args.samples, seed=args.seed, tau=args.tau,
                              compare_ar=args.compare_ar, score=args.score, preset=preset,
                              image_long_side=args.image_long_side,
                              reward_settings=HELD_OUT.replace(postprocess=args.postprocess), **given)
    except DecodeSettingsError as err:
        raise UserError("; ".join(err.worded(FLAGS))) from None


def _check_sizes(args: argparse.Namespace, settings, ckpt, pool, side: str | None) -> None:
    """Refuse an output cap or block size the model cannot decode, rows its processor cannot take (crops fitted
    to `side`), and rows that do not fit in its positions."""
    from grpo.checkpoint import context_length
    from grpo.errors import UserError
    from grpo.pool import policy_mismatch
    from grpo.prompting import prompt_problems, rows_over_context

    cap = settings.max_new_tokens
    positions = context_length(ckpt.model.config)
    if positions is not None and cap >= positions:
        raise UserError(f"--max-new-tokens {cap}: the model has {positions} positions in all")
    size, where = (args.bd_size, "--bd-size") if args.bd_size else (ckpt.bd.bd_size, f"{ckpt.bd.source}: bd_size")
    if size > cap:
        raise UserError(f"{where} {size}: a draft block longer than --max-new-tokens {cap} "
                        "drafts tokens that can never be kept")
    problem = policy_mismatch(pool, f"prompt pool {args.pool}", ckpt.is_vlm)
    if problem:
        raise UserError(problem)
    bad = prompt_problems(ckpt.processor, pool, ckpt.is_vlm, side)
    if bad:
        raise UserError(f"prompt pool {args.pool}: {len(bad)} row(s) the model's processor cannot take: "
                        f"{'; '.join(bad[:5])}")
    over = rows_over_context(ckpt.processor, pool, ckpt.is_vlm, positions, cap)
    if over:
        raise UserError(f"prompt pool {args.pool}: {len(over)} row(s) longer than the model's context with "
                        f"--max-new-tokens {cap}: {'; '.join(over[:5])}")


def run(args: argparse.Namespace) -> int:
    import torch

    from grpo.pool import load_pool
    from grpo.checkpoint import load_checkpoint
    from grpo.console import console
    from grpo.decoding.presets import preset_named
    from grpo.decoding.tpf import measure_tpf
    from grpo.errors import UserError
    from grpo.hardware import torch_device, torch_device_named
    from grpo.outputs import atomic_write, output_file

    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit must be >= 1, got {args.limit}")
    preset = preset_named(args.preset)
    if args.round is not None:
        preset = dataclasses.replace(preset, round=args.round)
    if args.max_new_tokens is not None and preset.max_new_tokens:
        preset = dataclasses.replace(preset, max_new_tokens=None, other_cap=None)  # the flag's one cap replaces the preset's
    if args.postprocess != "none" and not args.score:
        raise UserError("--postprocess is the scoring mode of --score: add --score", setting="postprocess")
    settings = decode_settings(args, preset)
    dtype = args.dtype or preset.dtype
    device = torch_device_named(args.device) if args.device is not None else torch_device()
    out = output_file(args.out, "--out", stamp=STAMP, inputs=[args.pool, args.model], overwrite=args.overwrite)
    ckpt = load_checkpoint(args.model, need_drafter=True, dtype=getattr(torch, dtype))
    console.print(f"model: {ckpt.source.describe()}", markup=False)
    pool = load_pool(args.pool, skip_bad=args.skip_bad, images=ckpt.is_vlm)
    if args.limit is not None:
        pool = pool.select(range(min(args.limit, len(pool))))
    _check_sizes(args, settings, ckpt, pool, preset.image_long_side if args.image_long_side is None
                 else args.image_long_side)
    ckpt.model.to(device)
    stats = measure_tpf(ckpt.model, ckpt.processor, pool, ckpt.bd, settings, is_vlm=ckpt.is_vlm)
    if args.score:
        stats["settings"]["eval_postprocess"] = args.postprocess
    stats = {"written_by": STAMP, **stats, "model": str(ckpt.path), "pool": args.pool}
    console.print(_table(stats))
    console.print(f"decode wall time {stats['wall_s']:.2f} s at batch size {args.batch_size}", markup=False)
    if stats["truncated"]:
        console.print(f"{stats['truncated']} output(s) reached --max-new-tokens {settings.max_new_tokens}",
                      markup=False)
    if out is not None:
        atomic_write(out, json.dumps(stats, indent=2) + "\n", replace=STAMP if args.overwrite else False)
        console.print(f"wrote {out}", markup=False)
    return 0
