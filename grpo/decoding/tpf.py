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
from grpo.decoding.kv_session import stop_token_ids
from grpo.decoding.diffusion import diffusion_generate
from grpo.prompting import encode_prompt
from rewards.settings import HELD_OUT, RewardSettings
from grpo.decoding.selfspec import SelfSpecDecoder, ar_generate

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
        "truncated": sum(r["truncated"] for r in records),
        "wall_s": sum(r["wall_s"] for r in records),
    }


def _grouped(records: list[dict], key: str, order: Iterable[str] = ()) -> dict:
    """Summaries per value of `key`: the values in `order` first, then the rest sorted."""
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(r[key], []).append(r)
    order = [k for k in order if k in groups]
    return {k: summarize(groups[k]) for k in order + sorted(set(groups) - set(order))}


def decode_rows(model: Any, processor: Any, rows: Iterable[Mapping[str, Any]], bd: BlockDiffusionConfig | None, *,
                indices: Iterable[int] | None = None, is_vlm: bool = False, bd_size: int | None = None,
                max_new_tokens: int = 512, compare_ar: bool = False, mode: str = "selfspec", tau: float = 0.9,
                score: bool = False, reward_settings: RewardSettings = HELD_OUT, progress: bool = True) -> list[dict]:
    """Decode every row greedily with the drafter (`mode` "selfspec" or "diffusion" with threshold `tau`).

    Returns one record per row: `index` (from `indices`, default 0, 1, ...), `task`, `prompt_ids` (text-only
    policies; None for images), `output_ids`, `tokens`, `forwards`, `rounds`, `accepted` (drafts committed
    in each verified round, SPEC §5), `truncated` (stopped by `max_new_tokens`), `ar_equal` (None without
    `compare_ar`), `reward` and `exact` (None without `score`: the GRPO reward of the output against the
    row's `target`, read with `reward_settings`, default `rewards.settings.HELD_OUT`; in selfspec mode that is
    AR greedy's reward), `length_bin`, `wall_s`.
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
    indices = list(range(len(rows)) if indices is None else indices)
    records = []
    was_training = model.training
    model.eval()
    try:
        for index, row in zip(indices, tqdm(rows, desc=f"TPF ({mode}, B={size})", disable=not progress), strict=True):
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
                ar_equal = ar_generate(model, inputs, stops, max_new_tokens).tokens == result.tokens
            reward = exact = None
            if score:
                text = tokenizer.decode(result.tokens, skip_special_tokens=True)
                reward = rewards.score(text, row["target"], row["task_type"], reward_settings).value
                exact = text == row["target"]
            records.append({
                "index": index, "task": row.get("task_type", "unknown"),
                "prompt_ids": None if is_vlm else inputs["input_ids"][0].tolist(), "output_ids": result.tokens,
                "tokens": len(result.tokens), "forwards": result.forwards, "rounds": result.rounds,
                "accepted": result.accepted, "truncated": result.tokens[-1] not in stops,
                "ar_equal": ar_equal, "reward": reward, "exact": exact,
                "length_bin": length_bin(len(result.tokens)), "wall_s": wall})
    finally:
        model.train(was_training)
    return records


def tpf_stats(records: list[dict], **settings: Any) -> dict:
    """The overall summary of `records` (`tpf`, `accepted_per_round`, `ar_equal_rate`, `reward`, `exact_rate`,
    `n`, `tokens`, `forwards`, `rounds`, `truncated`, `wall_s`), `by_task`, `by_length`, the records as
    `rows` (by index), and `settings` (e.g. mode, bd_size) as they are."""
    records = sorted(records, key=lambda r: r["index"])
    stats = summarize(records)
    stats.update(settings)
    stats.update(by_task=_grouped(records, "task"),
                 by_length=_grouped(records, "length_bin", [label for label, _, _ in LENGTH_BINS]), rows=records)
    return stats


def measure_tpf(model: Any, processor: Any, rows: Iterable[Mapping[str, Any]], bd: BlockDiffusionConfig | None, *,
                bd_size: int | None = None, max_new_tokens: int = 512, mode: str = "selfspec", tau: float = 0.9,
                **options: Any) -> dict:
    """`decode_rows` then `tpf_stats`: TPF of a checkpoint on `rows`, by task and length bin, with every record.

    `ar_equal_rate` is None without `compare_ar`; `accepted_per_round` is None in diffusion mode; `reward`
    and `exact_rate` are None without `score`.
    """
    records = decode_rows(model, processor, rows, bd, bd_size=bd_size, max_new_tokens=max_new_tokens, mode=mode,
                          tau=tau, **options)
    settings = {"mode": mode, "bd_size": bd_size or bd.bd_size, "max_new_tokens": max_new_tokens}
    if mode == "diffusion":
        settings["tau"] = tau
    return tpf_stats(records, **settings)
