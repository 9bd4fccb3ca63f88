"""Tokens per forward (TPF) of a joint checkpoint on a set of prompts (SPEC §5), by task and length bin.

TPF = committed output tokens / (draft + verify forwards), prefill excluded, summed over the prompts
(a ratio of sums). The GRPO trainer calls `measure_tpf` every N steps; the `gravity-grpo tpf` command wraps it.

Example:
    >>> ckpt = load_checkpoint("tiny", need_drafter=True)
    >>> stats = measure_tpf(ckpt.model, ckpt.processor, rows, ckpt.bd, compare_ar=True)
    >>> stats["tpf"], stats["accepted_per_round"], stats["by_task"]["table"]["tpf"]
"""
from __future__ import annotations

import time
from typing import Any, Iterable, Mapping

from tqdm.auto import tqdm

import rewards
from grpo.checkpoint import BlockDiffusionConfig, CheckpointError, tokenizer_of
from grpo.decoding import stop_token_ids
from grpo.diffusion_decode import diffusion_generate
from grpo.prompting import encode_prompt
from grpo.selfspec import SelfSpecDecoder, ar_generate

MODES = ("selfspec", "diffusion")
# Output-length bins of the paper's breakdown: (label, lower bound inclusive, upper bound exclusive).
LENGTH_BINS = (("<128", 0, 128), ("128-511", 128, 512), ("512-1023", 512, 1024), (">=1024", 1024, None))


def length_bin(n_tokens: int) -> str:
    """The label of the output-length bin holding `n_tokens`."""
    for label, low, high in LENGTH_BINS:
        if n_tokens >= low and (high is None or n_tokens < high):
            return label
    raise ValueError(f"negative length {n_tokens}")


def summarize(records: list[dict]) -> dict:
    """Aggregate per-prompt records: ratios of sums, plus counts."""
    tokens = sum(r["tokens"] for r in records)
    forwards = sum(r["forwards"] for r in records)
    accepted = [a for r in records for a in r["accepted"]]
    compared = [r["ar_equal"] for r in records if r["ar_equal"] is not None]
    scored = [r for r in records if r.get("reward") is not None]
    return {
        "n": len(records),
        "tpf": tokens / forwards if forwards else None,
        "accepted_per_round": sum(accepted) / len(accepted) if accepted else None,
        "ar_equal_rate": sum(compared) / len(compared) if compared else None,
        "reward": sum(r["reward"] for r in scored) / len(scored) if scored else None,
        "exact_rate": sum(r["exact"] for r in scored) / len(scored) if scored else None,
        "tokens": tokens,
        "forwards": forwards,
        "rounds": sum(r["rounds"] for r in records),
        "wall_s": sum(r["wall_s"] for r in records),
    }


def _grouped(records: list[dict], key: str, order: Iterable[str] = ()) -> dict:
    """Summaries per value of `key`: the values in `order` first, then the rest sorted."""
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(r[key], []).append(r)
    order = [k for k in order if k in groups]
    return {k: summarize(groups[k]) for k in order + sorted(set(groups) - set(order))}


def measure_tpf(model: Any, processor: Any, rows: Iterable[Mapping[str, Any]], bd: BlockDiffusionConfig | None, *,
                is_vlm: bool = False, bd_size: int | None = None, max_new_tokens: int = 512,
                compare_ar: bool = False, mode: str = "selfspec", tau: float = 0.9,
                score: bool = False, progress: bool = True) -> dict:
    """Decode every row greedily with the drafter (`mode` "selfspec" or "diffusion" with threshold `tau`).

    Returns the overall summary (`tpf`, `accepted_per_round`, `ar_equal_rate`, `n`, `tokens`, `forwards`,
    `rounds`, `wall_s`) plus `by_task`, `by_length`, and with `compare_ar` the AR reference's `ar_wall_s`
    and `ar_forwards`. `ar_equal_rate` is None without `compare_ar`; `accepted_per_round` is None in
    diffusion mode. With `score`, each output is scored against the row's `target` (`rewards.score`, the
    GRPO reward), adding `reward` (mean) and `exact_rate`; in selfspec mode that is AR greedy's reward.
    The model's train/eval mode is restored afterwards.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if bd is None:
        raise CheckpointError("measuring TPF needs the drafter: the checkpoint has no block_diffusion.json")
    size = bd_size or bd.bd_size
    tokenizer = tokenizer_of(processor)
    stops = stop_token_ids(model, tokenizer)
    selfspec = SelfSpecDecoder(model, bd.mask_id, size, stops, max_new_tokens)
    rows = list(rows)
    records, ar_wall, ar_forwards = [], 0.0, 0
    was_training = model.training
    model.eval()
    try:
        for index, row in enumerate(tqdm(rows, desc=f"TPF ({mode}, B={size})", disable=not progress)):
            inputs = encode_prompt(processor, row, is_vlm)
            start = time.perf_counter()
            if mode == "selfspec":
                result = selfspec.generate(inputs)
            else:
                result = diffusion_generate(model, inputs, mask_id=bd.mask_id, bd_size=size, stop_ids=stops,
                                            max_new_tokens=max_new_tokens, tau=tau)
            wall = time.perf_counter() - start
            ar_equal = None
            if compare_ar:
                start = time.perf_counter()
                reference = ar_generate(model, inputs, stops, max_new_tokens)
                ar_wall += time.perf_counter() - start
                ar_forwards += reference.forwards
                ar_equal = reference.tokens == result.tokens
            reward = exact = None
            if score:
                text = tokenizer.decode(result.tokens, skip_special_tokens=True)
                reward = rewards.score(text, row["target"], row["task_type"]).value
                exact = text == row["target"]
            records.append({"index": index, "task_type": row.get("task_type", "unknown"),
                            "length_bin": length_bin(len(result.tokens)), "tokens": len(result.tokens),
                            "forwards": result.forwards, "rounds": result.rounds, "accepted": result.accepted,
                            "wall_s": wall, "ar_equal": ar_equal, "reward": reward, "exact": exact})
    finally:
        model.train(was_training)
    stats = summarize(records)
    stats.update(mode=mode, bd_size=size, max_new_tokens=max_new_tokens,
                 by_task=_grouped(records, "task_type"),
                 by_length=_grouped(records, "length_bin", [label for label, _, _ in LENGTH_BINS]))
    if mode == "diffusion":
        stats["tau"] = tau
    if compare_ar:
        stats.update(ar_wall_s=ar_wall, ar_forwards=ar_forwards)
    return stats

