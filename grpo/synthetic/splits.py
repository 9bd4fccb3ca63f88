"""The built-in synthetic splits (`tiny-train`, `tiny-noisy`, `tiny-train-long`, `tiny`, `tiny-probe`,
`tiny-candidates`, fresh probes `tiny-probe@S`).

Each row is the GLM-OCR task prompt with the serialized crop after a newline (`prompt`), the `target` and the
`task_type`. The splits are built from hash buckets: every candidate is assigned to a bucket by a hash of its
(true) content and each split keeps only the candidates of its buckets, so the GRPO pool `tiny` and the probe
never share an example with each other or with the training splits (which share the training buckets).

Example:
    >>> ds = build_split("tiny-probe")
    >>> ds[0]["prompt"].split("\\n")[0] in TASK_PROMPTS.values()
    True
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import random
from dataclasses import dataclass

from grpo.synthetic.crops import GENERATORS, LONG_TEXT, SHORT_TEXT, Example, blot
from grpo.synthetic.mislabels import mislabel

TASK_PROMPTS = {"text": "Text Recognition:", "table": "Table Recognition:", "formula": "Formula Recognition:"}


@dataclass(frozen=True)
class Split:
    """How a built-in split is generated."""

    rows: int
    seed: int
    buckets: range            # the hash buckets (out of 100) whose candidates it keeps
    text_lines: tuple = SHORT_TEXT   # line counts a text crop draws from
    noise: float = 0.0        # chance of each error kind at its decision point (`mislabel`)
    training: bool = False    # a training split: held-out splits avoid its true targets and prompts
    legacy_buckets: bool = False  # buckets hash the shown crop too (how `tiny-train` was built; `_bucket`)


# The base recipe trains on `tiny-train` (and builds the tokenizer from it): it must not change. The adapt
# recipe trains on `tiny-noisy`, the only split with noise; like `tiny-train` it draws from the training
# buckets, so neither can share an example with the GRPO pool `tiny` or the probe. Pool and probe show longer
# text crops (3-5 lines, ~45 target tokens: about three blocks of 16), so text TPF does not swing by a round.
SPLITS = {
    "tiny-train": Split(60000, 1, range(20, 100), training=True, legacy_buckets=True),
    "tiny-noisy": Split(20000, 4, range(20, 100), LONG_TEXT, noise=0.6, training=True),
    # The tiny GLM-OCR's candidate long-text stages (configs/joint_tiny_vlm_long*.yaml): clean rows whose text crops
    # have the pool's and the probe's 3-5 lines; `tiny-train`'s text crops have 1-3.
    "tiny-train-long": Split(6000, 6, range(20, 100), LONG_TEXT, training=True),
    "tiny": Split(240, 2, range(10, 20), LONG_TEXT),
    "tiny-probe": Split(60, 3, range(0, 10), LONG_TEXT),
    # Mining's candidates (docs/mining.md): the pool's buckets and crops, another generator seed, twice `tiny`'s
    # size; the shipped pools `tiny-mined` and `tiny-random` are each 120 of them.
    "tiny-candidates": Split(480, 5, range(10, 20), LONG_TEXT),
}
# `tiny-probe@S`: the probe's recipe (size, buckets, crops) drawn with generator seed S instead of 3, without
# tiny-probe's own rows: a fresh held-out probe, to check that a result is not tied to the one probe it was seen on.
FRESH_PROBE = "tiny-probe"

def prompt_for(example: Example) -> str:
    """The text-only prompt: task prompt, newline, the serialized crop."""
    return f"{TASK_PROMPTS[example.task_type]}\n{example.source}"


def _bucket(example: Example, shown: bool = False) -> int:
    """The hash bucket (0-99) of the true content (task and target); `shown` also hashes the blotted source,
    the rule `tiny-train` was built with (`Split.legacy_buckets`)."""
    key = f"{example.task_type}\0{example.source}\0{example.target}" if shown else f"{example.task_type}\0{example.target}"
    return int.from_bytes(hashlib.sha1(key.encode()).digest()[:4], "big") % 100


def _candidates(split: Split):
    """The split's clean (blotted, not mislabeled) examples in order: in its buckets, duplicates dropped."""
    rng = random.Random(split.seed)
    tasks = list(GENERATORS)
    seen, kept = set(), 0
    while True:
        task = tasks[kept % len(tasks)]
        clean = GENERATORS[task](rng, split.text_lines) if task == "text" else GENERATORS[task](rng)
        example = blot(rng, clean)
        if _bucket(example, split.legacy_buckets) not in split.buckets or (example.source, example.target) in seen:
            continue
        seen.add((example.source, example.target))
        kept += 1
        yield example


@functools.lru_cache(maxsize=1)
def _training_keys() -> frozenset:
    """(task, true target) and prompts of every training split, full size: what held-out splits must avoid."""
    keys = set()
    for split in SPLITS.values():
        if split.training:
            for example, _ in zip(_candidates(split), range(split.rows)):
                keys.update({(example.task_type, example.target), prompt_for(example)})
    return frozenset(keys)


def split_of(name: str) -> Split | None:
    """The `Split` a built-in name stands for, or None: a `SPLITS` key, or `tiny-probe@S` (`FRESH_PROBE`)."""
    base, sep, seed = name.partition("@")
    if not sep:
        return SPLITS.get(name)
    if base != FRESH_PROBE or not seed.isdigit():
        return None
    return dataclasses.replace(SPLITS[FRESH_PROBE], seed=int(seed))


def is_builtin(name: str) -> bool:
    """Whether `name` is a built-in synthetic split (`split_of`)."""
    return split_of(name) is not None


def generate(name: str, n: int | None = None) -> list[dict]:
    """Rows of split `name` (text-only columns), tasks in equal shares, deterministic.

    A held-out split (not `training`) also skips any candidate whose true target or prompt a training split
    holds: `tiny-train` keeps the buckets it was built with, which hash the shown crop. A fresh probe
    (`tiny-probe@S`) also skips those of `tiny-probe` itself.
    """
    split = split_of(name)
    if split is None:
        raise ValueError(f"unknown synthetic split {name!r}; valid: {', '.join(SPLITS)}, or {FRESH_PROBE}@SEED")
    n = split.rows if n is None else n
    noise_rng = random.Random(f"noise-{split.seed}")  # its own stream: noise never changes which crops a split holds
    avoid = frozenset() if split.training else _training_keys()
    if name not in SPLITS:  # a fresh probe
        avoid |= {key for row in generate(FRESH_PROBE) for key in ((row["task_type"], row["target"]), row["prompt"])}
    tasks = list(GENERATORS)
    rows = []
    candidates = _candidates(split)
    while len(rows) < n:
        task = tasks[len(rows) % len(tasks)]
        example = next(e for e in candidates if e.task_type == task
                       and (task, e.target) not in avoid and prompt_for(e) not in avoid)
        example = mislabel(noise_rng, example, split.noise)
        rows.append({"prompt": prompt_for(example), "target": example.target, "task_type": task})
    return rows


def build_split(name: str, n: int | None = None):
    """The built-in split `name` (`split_of`) as a `datasets.Dataset`; `grpo.synthetic.render` adds images."""
    import datasets

    return datasets.Dataset.from_list(generate(name, n))
