"""Hard-prompt mining by reward variance (docs/spec.md §8, paper appendix E): the run that ties the parts together.

Each prompt of the pool gets k rollouts from the policy (`grpo.rollouts.sampling`), scored with
`ocr_rewards.ocr_reward`. A prompt whose k rewards are all equal gives every rollout zero group advantage, so it
is dropped (also any whose reward std is at most `min_std`); the rest are ranked and the top `keep` are
written, with their statistics, as a `datasets` folder (`grpo.mining.selection`).

Output folder OUT: the kept rows (original columns + statistics, best first, readable with
`datasets.load_from_disk`); `OUT/mining/` holds the run's manifest, one part file per mined chunk and
`done.json` (`grpo.mining.store`); `OUT/report/` the report (`grpo.mining.report`).

Example:
    >>> mine(MineConfig(model="tiny", pool="tiny", output_dir="mined", num_generations=8, keep=64))   # doctest: +SKIP
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from grpo.mining.report import write_report
from grpo.rollouts.sampling import INDEX, HfSampler, VllmSampler
from grpo.mining.selection import PREFER, STAT_COLUMNS, RankRule, prompt_stats, select
from grpo.mining.store import MiningError, MiningStore, check_manifest, pool_fingerprint
from grpo.limits import MAX_NEW_TOKENS, MAX_NUM_GENERATIONS, MAX_ROLLOUTS_PER_CALL, MAX_SEED
from grpo.outputs import atomic_write, output_folder, set_aside, temporary
from grpo.crop_size import image_long_side_field, long_side, with_long_side
from grpo.yaml_config import Fields
from ocr_rewards.settings import RewardFields

log = logging.getLogger(__name__)

SAMPLING_FIELDS = ("model", "pool", "skip_bad", "num_generations", "temperature", "max_completion_length", "seed",
                   "shard", "hf_generate", "dtype", "gate", "table_bonus", "think", "image_long_side")
PREFER_NAMES = tuple(PREFER)
# Old key -> new key: the names `train` uses for the same things (one deprecation line each).
ALIASES = {"data": "pool", "out": "output_dir", "k": "num_generations", "max_tokens": "max_completion_length",
           "max_model_len": "vllm_max_model_length", "gpu_memory_utilization": "vllm_gpu_memory_utilization"}


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class MineConfig(RewardFields):
    """Settings of `gravity-grpo mine`; recipe keys and flags are these field names (old names: `ALIASES`)."""

    pool: str = field(metadata=_help("prompt pool: save_to_disk folder, .parquet, .jsonl or a built-in name"))
    output_dir: str = field(metadata=_help("output folder (a datasets folder + mining/ + report/); rerun with "
                                           "the same settings to resume"))
    model: str = field(default="tiny", metadata=_help("checkpoint: a folder (full or LoRA), a hub id, or 'tiny'"))
    num_generations: int = field(default=8, metadata=_help("rollouts per prompt (k)"))
    temperature: float = field(default=1.0, metadata=_help("sampling temperature; no nucleus / top-k "
                                                           "truncation, as in GRPO"))
    max_completion_length: int = field(default=8448, metadata=_help(
        "completion cap in tokens (the GRPO recipe's max_completion_length)"))
    min_std: float = field(default=0.0, metadata=_help(
        "drop prompts whose reward std is <= this (equal rewards are always dropped)"))
    prefer: Literal[PREFER_NAMES] = field(default="long-tables", metadata=_help(
        "ranking preset; the rule is in grpo/mining/selection.py"))
    hard_weight: float | None = field(default=None, metadata=_help("override the preset's weight of 1 - mean"))
    length_weight: float | None = field(default=None, metadata=_help(
        "override the preset's weight of min(ref_chars / length_scale, 1)"))
    length_scale: float | None = field(default=None, metadata=_help("override the preset's length scale "
                                                                    "(characters)"))
    rank_table_bonus: float | None = field(default=None, metadata=_help(
        "override the preset's ranking bonus of a table prompt"))
    keep: int | None = field(default=None, metadata=_help("keep the top N prompts (default: all that vary)"))
    shard: str = field(default="0/1", metadata=_help("mine part I of N (I from 0), e.g. 2/4; join with "
                                                     "mine-merge"))
    seed: int = field(default=0, metadata=_help("sampling seed (per prompt, so resumes agree)"))
    chunk_size: int = field(default=32, metadata=_help("prompts per engine call and part file"))
    skip_bad: bool = field(default=False, metadata=_help("leave malformed pool rows out (they are listed)"))
    hf_generate: bool = field(default=False, metadata=_help(
        "fallback: sample with HF generate instead of vLLM (e.g. GLM-OCR on a CPU)"))
    vllm_max_model_length: int | None = field(default=None, metadata=_help("vLLM context length (default: "
                                                                           "the model's)"))
    vllm_gpu_memory_utilization: float = field(default=0.9, metadata=_help("vLLM GPU memory share"))
    dtype: str = field(default="auto", metadata=_help(
        "vLLM dtype: auto (runs a float32 checkpoint in 16 bits), float32, bfloat16, float16"))
    progress: bool = field(default=True, metadata=_help("show a progress bar"))
    image_long_side: str = image_long_side_field()
    @property
    def rank(self) -> RankRule:
        """The ranking rule: the `prefer` preset with the overrides that are set."""
        overrides = {"hard_weight": self.hard_weight, "length_weight": self.length_weight,
                     "length_scale": self.length_scale, "table_bonus": self.rank_table_bonus}
        return dataclasses.replace(PREFER[self.prefer], **{k: v for k, v in overrides.items() if v is not None})

    @property
    def shards(self) -> tuple[int, int]:
        """`shard` as (I, N)."""
        return parse_shard(self.shard)

    def __post_init__(self):
        if not 2 <= self.num_generations <= MAX_NUM_GENERATIONS:
            raise MiningError(f"num_generations={self.num_generations}: reward variance needs at least 2 rollouts "
                              f"per prompt, and at most {MAX_NUM_GENERATIONS} are sampled", setting="num_generations")
        from grpo.decoding.tpf import DecodeSettings, DecodeSettingsError

        try:
            DecodeSettings(temperature=self.temperature)  # the one sampling-temperature bound
        except DecodeSettingsError as err:
            raise MiningError(str(err), setting="temperature") from None
        if not 0 <= self.min_std < math.inf:
            raise MiningError(f"min_std={self.min_std} must be a finite number >= 0", setting="min_std")
        if self.chunk_size * self.num_generations > MAX_ROLLOUTS_PER_CALL:
            raise MiningError(f"chunk_size {self.chunk_size} x num_generations {self.num_generations} rollouts per "
                              f"engine call is over {MAX_ROLLOUTS_PER_CALL:,}; lower chunk_size", setting="chunk_size")
        if self.max_completion_length < 1 or self.chunk_size < 1:
            raise MiningError("max_completion_length and chunk_size must be >= 1")
        if not 0 <= self.seed <= MAX_SEED:
            raise MiningError(f"seed must be an integer in [0, {MAX_SEED}], got {self.seed}", setting="seed")
        if self.max_completion_length > MAX_NEW_TOKENS:
            raise MiningError(f"max_completion_length must be at most {MAX_NEW_TOKENS:,}, got "
                              f"{self.max_completion_length}", setting="max_completion_length")
        if self.keep is not None and self.keep < 1:
            raise MiningError(f"keep={self.keep} must be >= 1 (or None to keep all)", setting="keep")
        if self.prefer not in PREFER:
            raise MiningError(f"prefer must be one of {', '.join(PREFER)}, got {self.prefer!r}", setting="prefer")
        self.shards  # noqa: B018 - raises for a bad shard
        try:
            long_side(self.image_long_side)
        except ValueError as err:
            raise MiningError(str(err), setting="image_long_side") from None
        try:
            self.rank
        except ValueError as err:
            raise MiningError(f"ranking: {err}") from None
        try:
            self.reward_settings
        except ValueError as err:
            raise MiningError(str(err)) from None


@functools.cache
def fields() -> Fields:
    """The keys of `MineConfig` (and their old names), typed by transformers' HfArgumentParser."""
    return Fields(MineConfig, aliases=ALIASES)


def parse_shard(text: str) -> tuple[int, int]:
    """`"I/N"` -> (I, N), I counted from 0; a `MiningError` naming the setting `shard` otherwise."""
    try:
        i, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise MiningError(f"shard {text!r}: expected I/N, e.g. 0/4", setting="shard") from None
    if not 0 <= i < n:
        raise MiningError(f"shard {text!r}: need 0 <= I < N", setting="shard")
    return i, n


def mine(cfg: MineConfig, llm=None) -> dict:
    """Mine (or resume mining) one shard of the pool into `cfg.output_dir`; returns the report summary.

    `llm`: a running vLLM engine of `cfg.model` to sample with (default: start one unless every prompt is
    already mined, or `cfg.hf_generate`).
    """
    from grpo.pool import load_pool, policy_mismatch
    from grpo.checkpoint import is_vlm_checkpoint
    from grpo.model_source import locate

    output_folder(cfg.output_dir, "output", kind="mining run (no mining/manifest.json)",
                  is_own=lambda out: MiningStore(out).is_run(), inputs=[cfg.pool, cfg.model], setting="out")
    source = locate(cfg.model)
    log.info("model: %s", source.describe())
    is_vlm = is_vlm_checkpoint(source.model_dir)
    pool = load_pool(cfg.pool, skip_bad=cfg.skip_bad, index_column=INDEX, images=is_vlm)
    problem = policy_mismatch(pool, f"prompt pool {cfg.pool}", is_vlm)
    if problem:
        raise MiningError(problem)
    previous = [c for c in STAT_COLUMNS if c in pool.column_names]
    if previous:  # a mined pool mined again: its old statistics make way for the new ones
        pool = pool.remove_columns(previous)
    i, n = cfg.shards
    ds = pool.select(range(i, len(pool), n))
    run = MiningStore(cfg.output_dir)
    manifest = {key: getattr(cfg, key) for key in SAMPLING_FIELDS}
    manifest.update(model=str(source.folder.resolve()), shard=list(cfg.shards), pool_rows=len(pool),
                    pool_fingerprint=pool_fingerprint(pool))
    check_manifest(run, manifest)
    for stale in run.parts.glob(".*.tmp*"):  # left by a killed run
        stale.unlink()

    done = run.read_parts()
    todo = [pos for pos, index in enumerate(ds[INDEX]) if index not in done]
    log.info("shard %d/%d: %d prompts, %d already mined, %d to go", i, n, len(ds), len(ds) - len(todo),
             len(todo))
    if todo:
        if cfg.hf_generate:
            sampler = HfSampler(cfg.model)
        else:
            if llm is None:
                llm = _start_engine(source, cfg)
            sampler = VllmSampler(llm, is_vlm_checkpoint(source.model_dir))
        _mine_rows(ds, todo, sampler, cfg, run, initial=len(ds) - len(todo))
    return assemble(ds, run.read_parts(), run, cfg.rank, cfg.min_std, cfg.keep, manifest)


def _start_engine(source, cfg: MineConfig):
    """A vLLM engine serving `source`; a LoRA checkpoint's engine starts on its base and gets the merged
    weights (vLLM reads a folder with config.json, which a LoRA checkpoint lacks)."""
    from grpo.rollouts.engine import make_llm, sync_weights

    llm = make_llm(source.model_dir, seed=cfg.seed, max_model_len=cfg.vllm_max_model_length,
                   gpu_memory_utilization=cfg.vllm_gpu_memory_utilization, dtype=cfg.dtype)
    if source.base is not None:
        from grpo.checkpoint import load_checkpoint

        sync_weights(llm, load_checkpoint(source.folder).model)
    return llm


def _mine_rows(ds, todo: list[int], sampler, cfg: MineConfig, run: MiningStore, initial: int) -> None:
    from tqdm.auto import tqdm

    from ocr_rewards import OcrReward

    ocr_reward = OcrReward(cfg.reward_settings)
    with tqdm(total=initial + len(todo), initial=initial, unit="prompt", desc="mining",
              disable=not cfg.progress) as bar:
        for start in range(0, len(todo), cfg.chunk_size):
            rows = list(with_long_side(ds.select(todo[start:start + cfg.chunk_size]), cfg.image_long_side))
            rollouts = sampler.sample(rows, cfg)
            prompts = [row["prompt"] for row in rows for _ in range(cfg.num_generations)]
            rewards = ocr_reward(prompts, [r.text for group in rollouts for r in group],
                                 target=[row["target"] for row in rows for _ in range(cfg.num_generations)],
                                 task_type=[row["task_type"] for row in rows for _ in range(cfg.num_generations)])
            records = []
            for j, (row, group) in enumerate(zip(rows, rollouts, strict=True)):
                stats = prompt_stats(rewards[j * cfg.num_generations:(j + 1) * cfg.num_generations], group)
                records.append({INDEX: row[INDEX], "task_type": row["task_type"],
                                "ref_chars": len(row["target"]), **stats})
            run.write_part(records)
            bar.update(len(rows))


def assemble(ds, records: dict[int, dict], run: MiningStore, rank: RankRule, min_std: float, keep: int | None,
             manifest: dict) -> dict:
    """Write OUT: the selected rows of `ds` with their statistics, the report over all `records`, done.json.

    Every row of `ds` needs a record; the selection is made over all records and must fall inside `ds`
    (for a merge, `ds` holds only the rows the shards kept, which contain the global selection).
    """
    from datasets import Dataset, concatenate_datasets

    missing = sorted(set(ds[INDEX]) - set(records))
    if missing:
        raise MiningError(f"{run.out}: {len(missing)} prompts not mined yet (e.g. {missing[:5]}); rerun mine")
    for rec in records.values():
        rec["mine_score"] = rank.score(rec["reward_mean"], rec["ref_chars"], rec["task_type"])
    kept = select(records, rank, min_std, keep)
    position = {index: pos for pos, index in enumerate(ds[INDEX])}
    absent = [i for i in kept if i not in position]
    if absent:
        raise MiningError(f"selected prompts {absent[:5]} are not among the rows given (shards disagree?)")
    stats = Dataset.from_dict({c: [records[i][c] for i in kept] for c in STAT_COLUMNS}, features=_stat_features())
    out_ds = concatenate_datasets([ds.select([position[i] for i in kept]), stats], axis=1)

    run.work.mkdir(parents=True, exist_ok=True)
    staged = temporary(run.work / "dataset", folder=True)
    shutil.rmtree(staged, ignore_errors=True)
    out_ds.save_to_disk(str(staged), num_shards=None if len(out_ds) else 1)  # 0 shards would not load
    summary = write_report(list(records.values()), kept, min_std, run.report)
    selection = {"rank": dataclasses.asdict(rank), "min_std": min_std, "keep": keep}
    run.publish_dataset(staged)
    atomic_write(run.done, json.dumps({"manifest": manifest, "selection": selection, "summary": summary},
                                       indent=2) + "\n")
    return summary


def _stat_features():
    from datasets import Features, List, Value

    return Features({c: List(Value("float64")) if c == "rewards" else
                     Value("int64" if c in ("truncated", "ref_chars") else "float64") for c in STAT_COLUMNS})


def merge(shard_outs: list[str], out: str, overwrite: bool = False) -> dict:
    """Join the OUT folders of shards 0..N-1 of one mining run into `out`, selecting as they did.

    Each shard kept its own top `keep`; the global top `keep` lies within their union because the score
    of a prompt does not depend on the other prompts. `out` must not be a shard, and must be new or empty
    unless `overwrite`; it is then rebuilt with the old folder set aside until the merge has succeeded.
    """
    from datasets import concatenate_datasets

    from grpo.pool import read_dataset_folder

    runs, target = [MiningStore(p) for p in shard_outs], Path(out)
    dones = [r.read_done() for r in runs]
    output_folder(target, "output", kind="mining output (no mining/done.json)", inputs=[r.out for r in runs],
                  is_own=lambda out: MiningStore(out).is_finished(), overwrite=overwrite, setting="out")
    first = dones[0]
    for run, d in zip(runs, dones):
        diff = [key for key in first["manifest"] if key != "shard" and d["manifest"].get(key) != first["manifest"][key]]
        if d["selection"] != first["selection"]:
            diff.append("selection (min_std, keep, ranking)")
        if diff:
            raise MiningError(f"{run.out} was mined with other settings than {runs[0].out}: {', '.join(diff)}")
    n = first["manifest"]["shard"][1]
    shards = sorted(d["manifest"]["shard"][0] for d in dones)
    if shards != list(range(n)):
        raise MiningError(f"need each of shards 0..{n - 1} of {n} once, got {shards}")

    records = {}
    for run in runs:
        part = run.read_parts()
        overlap = sorted(set(part) & set(records))
        if overlap:
            raise MiningError(f"{run.out} repeats prompts of another shard (e.g. {overlap[:5]})")
        records.update(part)
    shards_ds = [read_dataset_folder(r.out, f"mining output {r.out}", "the OUT folder of a finished mine run")
                 for r in runs]
    missing = [str(r.out) for r, ds in zip(runs, shards_ds) if not set(STAT_COLUMNS) <= set(ds.column_names)]
    if missing:
        raise MiningError(f"{', '.join(missing)}: the dataset lacks the mining statistics; is it a mine output?")
    ds = concatenate_datasets(shards_ds).remove_columns(list(STAT_COLUMNS))
    sel = first["selection"]
    try:
        rank = RankRule(**sel["rank"])
        min_std, keep = sel["min_std"], sel["keep"]
    except (KeyError, TypeError, ValueError):
        raise MiningError(f"{runs[0].done} is damaged (selection needs rank, min_std and keep)") from None
    manifest = {**first["manifest"], "shard": [0, 1], "merged_from": [str(r.out) for r in runs]}
    with set_aside(target):
        return assemble(ds, records, MiningStore(target), rank, min_std, keep, manifest)
