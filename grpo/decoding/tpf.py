"""Tokens per forward (TPF) of a joint checkpoint on a set of prompts (docs/spec.md §5), by task and length bin.

Two conventions, both ratios of sums over the prompts, both 1.0 for plain AR decoding:
- `tpf` (this package's): output tokens after x0 / (draft + verify forwards). x0 comes from the prefill, so
  neither the prefill's token nor its forward is counted; AR decoding commits one token per forward after it.
- `tpf_bench` (GravityOCR's `tools/bench_forwards.py`, line for line): the output up to its stop token, decoded
  without special tokens, its think block removed (`ocr_rewards.think`), re-tokenized without special tokens
  / every forward, the prefill included (what a hook on decoder layer 0 counts). With the preset
  `gravityocr-bench` (its caps, crops and round layout) it is the bench's own figure.
The GRPO trainer calls `decode_rows` every N steps (its `DecodeSettings`: one object of the decode bounds); the `gravity-grpo tpf` command wraps `measure_tpf`.

Example:
    >>> ckpt = load_checkpoint("tiny", need_drafter=True)
    >>> stats = measure_tpf(ckpt.model, ckpt.processor, rows, ckpt.bd, compare_ar=True, batch_size=16)
    >>> stats["tpf"], stats["accepted_per_round"], stats["by_task"]["table"]["tpf"]
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterable, Mapping

import torch
from tqdm.auto import tqdm

import ocr_rewards as rewards
from grpo.block_diffusion import BlockDiffusionConfig
from grpo.checkpoint import tokenizer_of
from grpo.errors import CheckpointError, quoted
from grpo.decoding.batched import BatchARDecoder, BatchDecoder, Sampler
from grpo.decoding.diffusion import diffusion_generate
from grpo.decoding.presets import PRESETS, DecodePreset, settings_record
from grpo.decoding.selfspec import GravityRoundDecoder
from grpo.crop_size import LONG_SIDE_VALUES, long_side
from grpo.limits import MAX_BATCH, MAX_BD_SIZE, MAX_NEW_TOKENS, MAX_SAMPLES, MAX_SEED, MIN_TEMPERATURE, whole_in
from grpo.prompting import encode_prompt
from ocr_rewards.settings import HELD_OUT, RewardSettings
from ocr_rewards.think import strip_think

MODES = ("selfspec", "diffusion")
CHUNK_BATCHES = 8  # prompts encoded and decoded together: this many batches' worth
TPF_CONVENTION = {"tpf": "sum(tokens - 1) / sum(forwards): output tokens after x0 over draft + verify forwards",
                  "tpf_bench": "sum(text_tokens) / sum(forwards + 1): the text (think block removed) re-tokenized, "
                               "over every forward, prefill included (GravityOCR's tools/bench_forwards.py)"}
# Output-length bins of the paper's breakdown: (label, lower bound inclusive, upper bound exclusive).
LENGTH_BINS = (("<128", 0, 128), ("128-511", 128, 512), ("512-1023", 512, 1024), (">=1024", 1024, None))


def length_bin(n_tokens: int) -> str:
    """The label of the output-length bin holding `n_tokens`."""
    for label, low, high in LENGTH_BINS:
        if n_tokens >= low and (high is None or n_tokens < high):
            return label
    raise ValueError(f"negative length {n_tokens}")


def tpf_of(records: Iterable[Mapping[str, Any]]) -> float | None:
    """`tpf`: output tokens after x0 over draft + verify forwards, summed over `records` (None without forwards)."""
    records = list(records)
    forwards = sum(r["forwards"] for r in records)
    return sum(r["tokens"] - 1 for r in records) / forwards if forwards else None


def tpf_bench_of(records: Iterable[Mapping[str, Any]]) -> float | None:
    """`tpf_bench`: re-tokenized text tokens over every forward, prefill included (GravityOCR's bench)."""
    records = list(records)
    if not records or any(r.get("text_tokens") is None for r in records):
        return None
    return sum(r["text_tokens"] for r in records) / sum(r["forwards"] + 1 for r in records)


Z_95 = 1.96  # two-sided 95% normal quantile


def mean_interval(values: list[float]) -> tuple[float, float] | None:
    """95% normal-approximation interval of the mean of `values` (None with fewer than two)."""
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    half = Z_95 * (sum((v - mean) ** 2 for v in values) / (n - 1) / n) ** 0.5
    return mean - half, mean + half


def summarize(records: list[dict]) -> dict:
    """Aggregate per-prompt records: ratios of sums, plus counts."""
    accepted = [a for r in records for a in r["accepted"]]
    compared = [r["ar_equal"] for r in records if r["ar_equal"] is not None]
    scored = [r for r in records if r.get("reward") is not None]
    return {
        "n": len(records),
        "tpf": tpf_of(records),
        "tpf_bench": tpf_bench_of(records),
        "accepted_per_round": sum(accepted) / len(accepted) if accepted else None,
        "ar_equal_rate": sum(compared) / len(compared) if compared else None,
        "ar_compared": len(compared),
        "reward": sum(r["reward"] for r in scored) / len(scored) if scored else None,
        "reward_interval": mean_interval([r["reward"] for r in scored]),
        "exact_rate": sum(r["exact"] for r in scored) / len(scored) if scored else None,
        "tokens": sum(r["tokens"] for r in records),
        "forwards": sum(r["forwards"] for r in records),
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


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _long_side(value: Any) -> bool:
    try:
        value is None or long_side(value)
    except ValueError:
        return False
    return True


# The bounds of `DecodeSettings` (grpo.limits): field -> (test of its value, what it must be).
BOUNDS = {
    "mode": (lambda v: v in MODES, f"one of {', '.join(MODES)}"),
    "max_new_tokens": (lambda v: whole_in(v, 1, MAX_NEW_TOKENS), f"an integer in [1, {MAX_NEW_TOKENS}]"),
    "bd_size": (lambda v: v is None or whole_in(v, 1, MAX_BD_SIZE), f"an integer in [1, {MAX_BD_SIZE}]"),
    "batch_size": (lambda v: whole_in(v, 1, MAX_BATCH), f"an integer in [1, {MAX_BATCH}]"),
    "temperature": (lambda v: _number(v) and (v == 0 or MIN_TEMPERATURE <= v < math.inf),
                    f"0 (greedy) or a finite number >= {MIN_TEMPERATURE} (less overflows the softmax)"),
    "samples": (lambda v: whole_in(v, 1, MAX_SAMPLES), f"an integer in [1, {MAX_SAMPLES}]"),
    "seed": (lambda v: whole_in(v, 0, MAX_SEED), f"an integer in [0, {MAX_SEED}]"),
    "tau": (lambda v: _number(v) and 0 <= v <= 1, "a confidence threshold in [0, 1]"),
    "image_long_side": (_long_side, LONG_SIDE_VALUES),
}


Words = Callable[[Callable[[str], str]], str]  # a problem's text, given what to call each setting: name(field)


class DecodeSettingsError(ValueError):
    """The `DecodeSettings` values out of bounds, or the settings that exclude each other: one text per problem
    (`Words`), each naming the settings through `name(field)`. `str()` calls them by field, `worded(names)` as
    the caller does (a command by its flags, a config by its keys)."""

    def __init__(self, texts: list[Words]):
        self.texts = texts
        super().__init__("; ".join(self.worded({})))

    def worded(self, names: Mapping[str, str]) -> list[str]:
        """The problems, one line each, each setting called by `names` (field -> name; else by its field)."""
        return [text(lambda field: names.get(field, field)) for text in self.texts]


@dataclass(frozen=True)
class DecodeSettings:
    """How `decode_rows` decodes: the one place that decides the decode bounds.

    `mode` "selfspec" (batches of `batch_size` prompts; greedy at `temperature` 0, else exact speculative
    sampling, `samples` draws per prompt from one generator seeded with `seed`) or "diffusion" (threshold
    `tau`, batch 1, greedy). `max_new_tokens` is the output cap where the `preset` has none for a task;
    `bd_size` None takes the checkpoint's block size; `compare_ar` True compares every row with AR greedy, or a
    collection of the indices to compare; `score` scores each output against its row's `target`, read with
    `reward_settings`; `image_long_side` None takes the preset's (`grpo.crop_size`). A `DecodeSettingsError`
    names the setting out of bounds (`BOUNDS`, from `grpo.limits`) or the settings that exclude each other.
    """

    mode: str = "selfspec"
    max_new_tokens: int = 512
    bd_size: int | None = None
    batch_size: int = 1
    temperature: float = 0.0
    samples: int = 1
    seed: int = 0
    tau: float = 0.9
    compare_ar: bool | Collection[int] = False
    score: bool = False
    reward_settings: RewardSettings = HELD_OUT
    preset: DecodePreset = PRESETS["cpu"]
    image_long_side: str | None = None
    progress: bool = True

    def __post_init__(self):
        bounds = [(field, wanted, getattr(self, field)) for field, (fine, wanted) in BOUNDS.items()
                  if not fine(getattr(self, field))]
        if bounds:
            raise DecodeSettingsError([lambda name, field=field, wanted=wanted, value=value:
                                       f"{name(field)} must be {wanted}, got {quoted(value)}"
                                       for field, wanted, value in bounds])
        problem = self._conflict()
        if problem:
            raise DecodeSettingsError([problem])

    def _conflict(self) -> Words | None:
        """The first pair of settings that exclude each other, or None."""
        temperature, samples, batch, mode = self.temperature, self.samples, self.batch_size, self.mode
        if samples > 1 and temperature == 0:
            return lambda name: (f"{name('samples')} > 1 needs {name('temperature')} > 0: greedy decoding gives "
                                 "one output per prompt")
        if temperature > 0 and self.compare_ar:
            return lambda name: (f"{name('compare_ar')} checks equality with AR greedy: it needs "
                                 f"{name('temperature')} 0")
        if mode == "diffusion" and (batch > 1 or temperature > 0):
            return lambda name: (f"{name('mode')} diffusion decodes greedily at batch 1: leave {name('batch_size')} "
                                 f"and {name('temperature')} out")
        if self.preset.round != "gravityocr":
            return None
        if mode != "selfspec":
            return lambda name: (f"GravityOCR's round layout decodes self-speculatively: {name('mode')} must be "
                                 f"selfspec, got {mode}")
        if batch > 1:
            return lambda name: (f"GravityOCR's round layout decodes at batch 1: {name('batch_size')} must be 1, "
                                 f"got {batch}")
        if temperature > 0:
            return lambda name: (f"GravityOCR's round layout decodes greedily: it samples nothing (got "
                                 f"{name('temperature')} {temperature} with {name('samples')} {samples})")
        return None


def decode_rows(model: Any, processor: Any, rows: Iterable[Mapping[str, Any]], bd: BlockDiffusionConfig | None,
                settings: DecodeSettings = DecodeSettings(), *, indices: Iterable[int] | None = None,
                is_vlm: bool = False) -> list[dict]:
    """Decode every row with the drafter as `settings` say (`DecodeSettings`).

    Returns one record per (row, sample): `index` (from `indices`, default 0, 1, ...), `sample`, `task`,
    `prompt_ids` (text-only policies; None for images), `output_ids`, `tokens`, `text_tokens` (the output's
    text re-tokenized as `tpf_bench` counts it), `forwards` (draft + verify, prefill excluded), `rounds`,
    `accepted` (drafts committed in each verified round, docs/spec.md §5), `truncated` (stopped by the cap),
    `ar_equal` (None unless compared; AR greedy decoded at the same batch size), `reward` and `exact` (None
    without `score`), `length_bin`, `wall_s` (the row's share of its batch's decode time). The model's
    train/eval mode is restored afterwards. The `preset` (`grpo.decoding.presets`) sets the output cap per task,
    the stop ids, the crops' `image_long_side` and the round layout (`round: gravityocr`: `GravityRoundDecoder`;
    its output may run past the cap, and AR equality compares its first `max_new_tokens` tokens).
    """
    if bd is None:
        raise CheckpointError("measuring TPF needs the drafter: the checkpoint has no block_diffusion.json")
    preset, mode = settings.preset, settings.mode
    rows = list(rows)
    indices = list(range(len(rows)) if indices is None else indices)
    if len(indices) != len(rows):
        raise ValueError(f"{len(indices)} indices for {len(rows)} rows")
    caps = [preset.cap(row.get("task_type", "unknown"), settings.max_new_tokens) for row in rows]
    if len(set(caps)) > 1:  # one decoder per output cap: the rows of each cap decoded together
        return [r for cap in sorted(set(caps)) for r in decode_rows(
            model, processor, [row for row, c in zip(rows, caps) if c == cap], bd,
            dataclasses.replace(settings, max_new_tokens=cap), indices=[i for i, c in zip(indices, caps) if c == cap],
            is_vlm=is_vlm)]
    max_new_tokens = caps[0] if caps else settings.max_new_tokens
    side = preset.image_long_side if settings.image_long_side is None else settings.image_long_side
    size = settings.bd_size or bd.bd_size
    batch_size, samples, compare_ar = settings.batch_size, settings.samples, settings.compare_ar
    tokenizer = tokenizer_of(processor)
    stops = preset.stop_ids(model, tokenizer)
    sampler = Sampler(settings.temperature, torch.Generator().manual_seed(settings.seed))
    selfspec = BatchDecoder(model, bd.mask_id, size, stops, max_new_tokens, sampler)
    gravity = GravityRoundDecoder(model, bd.mask_id, size, stops, max_new_tokens)
    jobs = [(index, row, k) for index, row in zip(indices, rows) for k in range(samples)]
    compared = set(indices) if compare_ar is True else set(compare_ar or ())
    scoring = settings.reward_settings if settings.score else None
    records = []
    was_training = model.training
    model.eval()
    try:
        ar = BatchARDecoder(model, stops, max_new_tokens)
        bar = tqdm(total=len(jobs), desc=f"TPF ({mode}, B={size}, batch {batch_size})",
                   disable=not settings.progress)
        chunk = CHUNK_BATCHES * batch_size   # a finished row's place goes to the next prompt within a chunk
        for start in range(0, len(jobs), chunk):
            part = jobs[start:start + chunk]
            inputs = [encode_prompt(processor, row, is_vlm, side) for _, row, _ in part]
            begin = time.perf_counter()
            if preset.round == "gravityocr":
                results = [gravity.generate(x) for x in inputs]
            elif mode == "selfspec":
                results = selfspec.generate(inputs, batch_size)
            else:
                results = [diffusion_generate(model, x, mask_id=bd.mask_id, bd_size=size, stop_ids=stops,
                                              max_new_tokens=max_new_tokens, tau=settings.tau) for x in inputs]
            wall = (time.perf_counter() - begin) / len(part)
            check = [j for j, (index, _, _) in enumerate(part) if index in compared]
            greedy = ar.generate([inputs[j] for j in check], batch_size) if check else []
            # over the cap: GravityOCR's last round may run past it, AR greedy stops at it
            ar_equal = {j: a.tokens == results[j].tokens[:max_new_tokens] for j, a in zip(check, greedy)}
            for j, ((index, row, k), x, result) in enumerate(zip(part, inputs, results)):
                records.append(_record(index, k, row, x, result, tokenizer, stops, is_vlm, scoring,
                                       ar_equal.get(j), wall))
            bar.update(len(part))
        bar.close()
    finally:
        model.train(was_training)
    return records


def _record(index: int, sample: int, row: Mapping[str, Any], inputs: dict, result: Any, tokenizer: Any,
            stops: frozenset[int], is_vlm: bool, scoring: RewardSettings | None, ar_equal: bool | None,
            wall: float) -> dict:
    """One decoded (row, sample) as `decode_rows` documents it; scored with `scoring` unless None."""
    text = tokenizer.decode(result.tokens, skip_special_tokens=True)
    ended = result.tokens[:-1] if result.tokens[-1] in stops else result.tokens
    bench_text, _ = strip_think(tokenizer.decode(ended, skip_special_tokens=True))
    reward = exact = None
    if scoring is not None:
        scored = rewards.score(text, row["target"], row["task_type"], scoring)
        reward, exact = scored.value, "identical" in scored.components  # after the think block's removal
    return {
        "index": index, "sample": sample, "task": row.get("task_type", "unknown"),
        "prompt_ids": None if is_vlm else inputs["input_ids"][0].tolist(), "output_ids": result.tokens,
        "tokens": len(result.tokens), "text_tokens": len(tokenizer.encode(bench_text, add_special_tokens=False)),
        "forwards": result.forwards, "rounds": result.rounds, "accepted": result.accepted,
        "truncated": result.tokens[-1] not in stops, "ar_equal": ar_equal, "reward": reward, "exact": exact,
        "length_bin": length_bin(len(result.tokens)), "wall_s": wall}


def tpf_stats(records: list[dict], **settings: Any) -> dict:
    """The overall summary of `records` (`tpf`, `tpf_bench`, `accepted_per_round`, `ar_equal_rate`,
    `ar_compared`, `reward`, `exact_rate`, `n`, `tokens`, `forwards`, `rounds`, `truncated`, `wall_s`),
    `by_task`, `by_length`, the records as `rows` (by index, then sample), and `settings` as they are."""
    records = sorted(records, key=lambda r: (r["index"], r.get("sample", 0)))
    stats = summarize(records)
    stats.update(settings)
    stats.update(by_task=_grouped(records, "task"),
                 by_length=_grouped(records, "length_bin", [label for label, _, _ in LENGTH_BINS]), rows=records)
    return stats


def measure_tpf(model: Any, processor: Any, rows: Iterable[Mapping[str, Any]], bd: BlockDiffusionConfig | None,
                settings: DecodeSettings = DecodeSettings(), *, indices: Iterable[int] | None = None,
                is_vlm: bool = False, **fields: Any) -> dict:
    """`decode_rows` then `tpf_stats`: TPF of a checkpoint on `rows`, by task and length bin, with every record
    and the `settings` that shaped the figure (`grpo.decoding.presets.settings_record`). `fields` replace those
    of `settings` (`DecodeSettings`).

    `ar_equal_rate` is None without `compare_ar`; `accepted_per_round` is None in diffusion mode; `reward`
    and `exact_rate` are None without `score`.
    """
    settings = dataclasses.replace(settings, **fields)
    records = decode_rows(model, processor, rows, bd, settings, indices=indices, is_vlm=is_vlm)
    preset, bd_size = settings.preset, settings.bd_size or bd.bd_size
    figure = {"mode": settings.mode, "bd_size": bd_size, "max_new_tokens": settings.max_new_tokens,
              "batch_size": settings.batch_size, "temperature": settings.temperature, "samples": settings.samples,
              "tpf_convention": TPF_CONVENTION}
    if settings.mode == "diffusion":
        figure["tau"] = settings.tau
    figure["settings"] = settings_record(
        preset, dtype=str(next(model.parameters()).dtype).removeprefix("torch."), max_new_tokens=settings.max_new_tokens,
        tasks=sorted({r["task"] for r in records}), bd_size=bd_size,
        stop_ids=preset.stop_ids(model, tokenizer_of(processor)), batch_size=settings.batch_size,
        conventions=TPF_CONVENTION, image_long_side=settings.image_long_side)
    return tpf_stats(records, **figure)
