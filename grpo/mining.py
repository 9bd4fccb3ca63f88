"""Hard-prompt mining by reward variance (SPEC §8, paper appendix E).

Each prompt of the pool gets k rollouts from the policy (vLLM; HF `generate` only when asked), scored with
`rewards.ocr_reward`. A prompt whose k rewards are all equal gives every rollout zero group advantage, so it
is dropped (also any whose reward std is at most `min_std`). The rest are ranked by `RankRule` and the top
`keep` are written, with their statistics, as a `datasets` folder.

Ranking rule (higher first, ties by pool order), per prompt, independent of the other prompts so shards
rank alike:

    score = hard_weight * (1 - reward_mean)
          + length_weight * min(ref_chars / length_scale, 1)
          + table_bonus * [task_type == "table"]

`ref_chars` is the length of the reference in characters. Presets (`PREFER`): `long-tables` (all three
terms, weight 1, length_scale 1900 = the paper's median mined reference), `hard` (only low mean reward),
`pool-order` (no ranking).

Output folder OUT: the kept rows (original columns + statistics, best first, readable with
`datasets.load_from_disk`); `OUT/mining/` holds the run's manifest, one part file per mined chunk (written
atomically, keyed by the prompts' pool indices) and `done.json`; `OUT/report/` the report. A run killed at
any point resumes from the part files when rerun with the same arguments.

Example:
    >>> mine(MineConfig(model="tiny", data="tiny", out="mined", k=8, keep=64))   # doctest: +SKIP
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

log = logging.getLogger(__name__)

INDEX = "pool_index"   # the prompt id: the row's index in the pool as read
STAT_COLUMNS = ("reward_mean", "reward_std", "reward_min", "reward_max", "rewards", "completion_tokens_mean",
                "truncated", "ref_chars", "mine_score")
# what decides the sampled rollouts: a resumed run must agree on all of these
SAMPLING_FIELDS = ("model", "data", "skip_bad", "k", "temperature", "max_tokens", "seed", "shard", "hf_generate",
                   "dtype")


class MiningError(ValueError):
    """A mining run that cannot go on as asked (mismatched resume, incomplete or overlapping shards)."""


@dataclass(frozen=True)
class RankRule:
    """Weights of the ranking score (see the module docstring)."""

    hard_weight: float = 1.0
    length_weight: float = 1.0
    length_scale: float = 1900.0   # characters: the paper's median reference length after mining
    table_bonus: float = 1.0

    def score(self, reward_mean: float, ref_chars: int, task_type: str) -> float:
        return (self.hard_weight * (1.0 - reward_mean)
                + self.length_weight * min(ref_chars / self.length_scale, 1.0)
                + self.table_bonus * (task_type == "table"))


PREFER = {
    "long-tables": RankRule(),
    "hard": RankRule(length_weight=0.0, table_bonus=0.0),
    "pool-order": RankRule(hard_weight=0.0, length_weight=0.0, table_bonus=0.0),
}


@dataclass
class MineConfig:
    model: str                      # checkpoint folder or "tiny"
    data: str                       # pool spec (see data.pool.load_pool)
    out: str                        # output folder
    k: int = 8                      # rollouts per prompt
    temperature: float = 1.0        # no nucleus / top-k truncation, as in GRPO
    max_tokens: int = 8448          # completion cap (the GRPO recipe's max completion length)
    min_std: float = 0.0            # drop prompts whose reward std is <= this (and all with equal rewards)
    rank: RankRule = field(default_factory=RankRule)
    keep: int | None = None         # keep the top N after dropping (None: all)
    shard: tuple[int, int] = (0, 1)  # (I, N): mine rows whose position % N == I
    seed: int = 0
    chunk_size: int = 32            # prompts per part file (per engine call)
    skip_bad: bool = False          # leave malformed pool rows out instead of stopping
    hf_generate: bool = False       # sample with HF generate instead of vLLM (fallback)
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    dtype: str = "auto"             # vLLM engine dtype ("auto" runs a float32 checkpoint in 16 bits)
    progress: bool = True

    def __post_init__(self):
        if self.k < 2:
            raise ValueError(f"k={self.k}: reward variance needs at least 2 rollouts per prompt")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0")
        if self.max_tokens < 1 or self.chunk_size < 1:
            raise ValueError("max_tokens and chunk_size must be >= 1")
        if self.keep is not None and self.keep < 1:
            raise ValueError(f"keep={self.keep} must be >= 1 (or None to keep all)")
        i, n = self.shard
        if not 0 <= i < n:
            raise ValueError(f"shard {i}/{n}: need 0 <= I < N")


def parse_shard(text: str) -> tuple[int, int]:
    """`"I/N"` -> (I, N), I counted from 0."""
    try:
        i, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard {text!r}: expected I/N, e.g. 0/4") from None
    if not 0 <= i < n:
        raise ValueError(f"--shard {text!r}: need 0 <= I < N")
    return i, n


class Rollout(NamedTuple):
    text: str
    n_tokens: int     # completion tokens, EOS included
    truncated: bool   # stopped by max_tokens


def prompt_stats(rewards: list[float], rollouts: list[Rollout]) -> dict:
    """Per-prompt statistics over its k rollouts (std is the population std, as a group sees it)."""
    k = len(rewards)
    mean = sum(rewards) / k
    return {
        "reward_mean": mean,
        "reward_std": (sum((r - mean) ** 2 for r in rewards) / k) ** 0.5,
        "reward_min": min(rewards),
        "reward_max": max(rewards),
        "rewards": list(rewards),
        "completion_tokens_mean": sum(r.n_tokens for r in rollouts) / k,
        "truncated": sum(r.truncated for r in rollouts),
    }


def is_dropped(stats: dict, min_std: float) -> bool:
    """Zero group advantage: all rewards equal, or std at most `min_std`."""
    return stats["reward_max"] == stats["reward_min"] or stats["reward_std"] <= min_std


def select(records: dict[int, dict], rank: RankRule, min_std: float, keep: int | None) -> list[int]:
    """Pool indices kept, best first: drop zero-variance prompts, rank by `rank`, keep the top `keep`."""
    live = [i for i, rec in records.items() if not is_dropped(rec, min_std)]
    live.sort(key=lambda i: (-records[i]["mine_score"], i))
    return live if keep is None else live[:keep]


# ---------------------------------------------------------------------------------------------- samplers

def _prompt_seed(seed: int, pool_index: int, k: int) -> int:
    """A per-prompt seed (vLLM seeds the k samples seed, seed+1, ...), so a prompt's rollouts do not depend
    on which chunk or run samples it."""
    return seed * 2 ** 32 + pool_index * k


class VllmSampler:
    """k rollouts per row from a vLLM engine (`grpo.engine.make_llm`)."""

    def __init__(self, llm, is_vlm: bool):
        self.llm, self.is_vlm = llm, is_vlm

    def sample(self, rows: list[dict], cfg: MineConfig) -> list[list[Rollout]]:
        from vllm import SamplingParams

        greedy = cfg.temperature == 0  # vLLM samples greedy requests once (n=1); the k copies are equal
        params = [SamplingParams(n=1 if greedy else cfg.k, temperature=cfg.temperature, top_p=1.0,
                                 max_tokens=cfg.max_tokens, seed=_prompt_seed(cfg.seed, row[INDEX], cfg.k))
                  for row in rows]
        if self.is_vlm:
            messages = [[{"role": "user", "content": [{"type": "image_pil", "image_pil": row["image"]},
                                                      {"type": "text", "text": row["prompt"]}]}] for row in rows]
            outputs = self.llm.chat(messages, params, use_tqdm=False)
        else:
            outputs = self.llm.generate([row["prompt"] for row in rows], params, use_tqdm=False)
        return [[Rollout(o.text, len(o.token_ids), o.finish_reason == "length") for o in out.outputs]
                * (cfg.k if greedy else 1) for out in outputs]


class HfSampler:
    """k rollouts per row with HF `generate` (fallback where vLLM cannot serve the model)."""

    def __init__(self, model_dir: Path):
        from grpo.checkpoint import load_checkpoint, tokenizer_of
        from grpo.decoding import stop_token_ids

        self.ckpt = load_checkpoint(model_dir)
        self.tok = tokenizer_of(self.ckpt.processor)
        self.stop_ids = stop_token_ids(self.ckpt.model, self.tok)

    def sample(self, rows: list[dict], cfg: MineConfig) -> list[list[Rollout]]:
        return [self._sample_one(row, cfg) for row in rows]

    def _sample_one(self, row: dict, cfg: MineConfig) -> list[Rollout]:
        import torch
        from transformers import GenerationConfig

        from grpo.prompting import encode_prompt

        inputs = encode_prompt(self.ckpt.processor, row, self.ckpt.is_vlm)
        greedy = cfg.temperature == 0
        # an explicit config: plain temperature sampling as vLLM does, whatever the checkpoint's defaults
        gen = GenerationConfig(max_new_tokens=cfg.max_tokens, do_sample=not greedy,
                               num_return_sequences=1 if greedy else cfg.k, eos_token_id=sorted(self.stop_ids),
                               pad_token_id=self.tok.pad_token_id if self.tok.pad_token_id is not None
                               else self.tok.eos_token_id,
                               **({} if greedy else {"temperature": cfg.temperature, "top_p": 1.0, "top_k": 0}))
        torch.manual_seed(_prompt_seed(cfg.seed, row[INDEX], cfg.k))
        with torch.no_grad():
            out = self.ckpt.model.generate(**inputs, generation_config=gen)
        rollouts = []
        for seq in out[:, inputs["input_ids"].shape[1]:].tolist():
            stop = next((j for j, t in enumerate(seq) if t in self.stop_ids), None)
            n = len(seq) if stop is None else stop + 1  # EOS counted, as vLLM counts it
            rollouts.append(Rollout(self.tok.decode(seq[:n], skip_special_tokens=True), n, stop is None))
        return rollouts * cfg.k if greedy else rollouts


# ------------------------------------------------------------------------------------------------ state

class RunDir:
    """The files of one mining run under OUT (see the module docstring)."""

    def __init__(self, out: str | Path):
        self.out = Path(out)
        self.work = self.out / "mining"
        self.parts = self.work / "parts"
        self.manifest = self.work / "manifest.json"
        self.done = self.work / "done.json"
        self.report = self.out / "report"

    def read_parts(self) -> dict[int, dict]:
        """Records of every mined prompt by pool index; a prompt in two part files is an error."""
        records, source = {}, {}
        for path in sorted(self.parts.glob("part-*.jsonl")):
            for line in path.read_text().splitlines():
                rec = json.loads(line)
                if rec[INDEX] in records:
                    raise MiningError(f"prompt {rec[INDEX]} is in both {source[rec[INDEX]]} and {path} "
                                      "(were two runs writing to the same OUT?)")
                records[rec[INDEX]], source[rec[INDEX]] = rec, path
        return records

    def write_part(self, records: list[dict]) -> None:
        first = min(rec[INDEX] for rec in records)
        _atomic_write(self.parts / f"part-{first:09d}.jsonl", "".join(json.dumps(r) + "\n" for r in records))


def _atomic_write(path: Path, text: str) -> None:
    """Write, fsync, then rename: a reader (or a rerun after SIGKILL) sees the whole file or none."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _pool_fingerprint(ds) -> str:
    digest = hashlib.sha256()
    for row in ds.select_columns([INDEX, "prompt", "target", "task_type"]):
        digest.update(json.dumps(row, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def _check_manifest(run: RunDir, manifest: dict) -> None:
    if run.manifest.is_file():
        old = json.loads(run.manifest.read_text())
        diff = [f"{key}: {old.get(key)!r} then, {manifest[key]!r} now" for key in manifest if old.get(key) != manifest[key]]
        if diff:
            raise MiningError(f"{run.out} holds a mining run with other settings ({'; '.join(diff)}); "
                              "rerun with the same arguments to resume, or choose another --out")
        return
    run.parts.mkdir(parents=True, exist_ok=True)
    _atomic_write(run.manifest, json.dumps(manifest, indent=2) + "\n")


# ------------------------------------------------------------------------------------------------- main

def mine(cfg: MineConfig, llm=None) -> dict:
    """Mine (or resume mining) one shard of the pool into `cfg.out`; returns the report summary.

    `llm`: a running vLLM engine of `cfg.model` to sample with (default: start one unless every prompt is
    already mined, or `cfg.hf_generate`).
    """
    from data.pool import load_pool
    from grpo.checkpoint import resolve_model
    from grpo.engine import is_vlm_checkpoint

    model_dir = resolve_model(cfg.model)
    pool = load_pool(cfg.data, skip_bad=cfg.skip_bad, index_column=INDEX)
    previous = [c for c in STAT_COLUMNS if c in pool.column_names]
    if previous:  # a mined pool mined again: its old statistics make way for the new ones
        pool = pool.remove_columns(previous)
    i, n = cfg.shard
    ds = pool.select(range(i, len(pool), n))
    run = RunDir(cfg.out)
    manifest = {key: getattr(cfg, key) for key in SAMPLING_FIELDS}
    manifest.update(model=str(model_dir.resolve()), shard=list(cfg.shard), pool_rows=len(pool),
                    pool_fingerprint=_pool_fingerprint(pool))
    _check_manifest(run, manifest)
    for stale in run.parts.glob(".*.tmp*"):  # left by a killed run
        stale.unlink()

    done = run.read_parts()
    todo = [pos for pos, index in enumerate(ds[INDEX]) if index not in done]
    log.info("shard %d/%d: %d prompts, %d already mined, %d to go", i, n, len(ds), len(ds) - len(todo),
             len(todo))
    if todo:
        if cfg.hf_generate:
            sampler = HfSampler(model_dir)
        else:
            if llm is None:
                from grpo.engine import make_llm

                llm = make_llm(model_dir, seed=cfg.seed, max_model_len=cfg.max_model_len,
                               gpu_memory_utilization=cfg.gpu_memory_utilization, dtype=cfg.dtype)
            sampler = VllmSampler(llm, is_vlm_checkpoint(model_dir))
        _mine_rows(ds, todo, sampler, cfg, run, initial=len(ds) - len(todo))
    return assemble(ds, run.read_parts(), run, cfg.rank, cfg.min_std, cfg.keep, manifest)


def _mine_rows(ds, todo: list[int], sampler, cfg: MineConfig, run: RunDir, initial: int) -> None:
    from tqdm.auto import tqdm

    from rewards import ocr_reward

    with tqdm(total=initial + len(todo), initial=initial, unit="prompt", desc="mining",
              disable=not cfg.progress) as bar:
        for start in range(0, len(todo), cfg.chunk_size):
            rows = list(ds.select(todo[start:start + cfg.chunk_size]))
            rollouts = sampler.sample(rows, cfg)
            prompts = [row["prompt"] for row in rows for _ in range(cfg.k)]
            rewards = ocr_reward(prompts, [r.text for group in rollouts for r in group],
                                 target=[row["target"] for row in rows for _ in range(cfg.k)],
                                 task_type=[row["task_type"] for row in rows for _ in range(cfg.k)])
            records = []
            for j, (row, group) in enumerate(zip(rows, rollouts, strict=True)):
                stats = prompt_stats(rewards[j * cfg.k:(j + 1) * cfg.k], group)
                records.append({INDEX: row[INDEX], "task_type": row["task_type"],
                                "ref_chars": len(row["target"]), **stats})
            run.write_part(records)
            bar.update(len(rows))


def assemble(ds, records: dict[int, dict], run: RunDir, rank: RankRule, min_std: float, keep: int | None,
             manifest: dict) -> dict:
    """Write OUT: the selected rows of `ds` with their statistics, the report over all `records`, done.json.

    Every row of `ds` needs a record; the selection is made over all records and must fall inside `ds`
    (for a merge, `ds` holds only the rows the shards kept, which contain the global selection).
    """
    from datasets import Dataset, concatenate_datasets

    from grpo.mining_report import write_report

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

    run.out.mkdir(parents=True, exist_ok=True)
    run.done.unlink(missing_ok=True)
    for old in run.out.glob("data-*.arrow"):
        old.unlink()
    out_ds.save_to_disk(str(run.out), num_shards=None if len(out_ds) else 1)  # 0 shards would not load
    summary = write_report(list(records.values()), kept, min_std, run.report)
    selection = {"rank": dataclasses.asdict(rank), "min_std": min_std, "keep": keep}
    run.work.mkdir(parents=True, exist_ok=True)
    _atomic_write(run.done, json.dumps({"manifest": manifest, "selection": selection, "summary": summary},
                                       indent=2) + "\n")
    return summary


def _stat_features():
    from datasets import Features, List, Value

    return Features({c: List(Value("float64")) if c == "rewards" else
                     Value("int64" if c in ("truncated", "ref_chars") else "float64") for c in STAT_COLUMNS})


def merge(shard_outs: list[str], out: str) -> dict:
    """Join the OUT folders of shards 0..N-1 of one mining run into `out`, selecting as they did.

    Each shard kept its own top `keep`; the global top `keep` lies within their union because the score
    of a prompt does not depend on the other prompts.
    """
    from datasets import concatenate_datasets, load_from_disk

    runs = [RunDir(p) for p in shard_outs]
    unfinished = [str(r.out) for r in runs if not r.done.is_file()]
    if unfinished:
        raise MiningError(f"not finished (no mining/done.json): {', '.join(unfinished)}; rerun mine on them")
    dones = [json.loads(r.done.read_text()) for r in runs]
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
    ds = concatenate_datasets([load_from_disk(str(r.out)) for r in runs]).remove_columns(list(STAT_COLUMNS))
    sel = first["selection"]
    manifest = {**first["manifest"], "shard": [0, 1], "merged_from": [str(r.out) for r in runs]}
    return assemble(ds, records, RunDir(out), RankRule(**sel["rank"]), sel["min_std"], sel["keep"], manifest)
