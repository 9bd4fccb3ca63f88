"""The mining measurement's two recipes (docs/mining.md#pays): configs/tiny_mined.yaml and configs/tiny_random.yaml
differ only in the pool, and both shipped pools are 120 of `tiny-candidates`, held out from the probe and the
tiny model's training splits. No model, no training."""
from __future__ import annotations

import json
import random
from pathlib import Path

from grpo.synthetic.splits import SPLITS, _bucket, generate
from grpo.synthetic.crops import Example
from grpo.yaml_config import read_recipe

ROOT = Path(__file__).resolve().parent.parent
POOL_SIZE = 120


def _pool(name: str) -> list[dict]:
    return [json.loads(line) for line in (ROOT / "data" / "tiny" / "pools" / f"{name}.jsonl").read_text().splitlines()]


def test_the_two_recipes_differ_only_in_the_pool():
    mined, plain = read_recipe(ROOT / "configs" / "tiny_mined.yaml"), read_recipe(ROOT / "configs" / "tiny_random.yaml")
    assert {key for key in mined.keys() | plain.keys() if mined.get(key) != plain.get(key)} == {"pool"}
    assert Path(mined["pool"]).name == "mined.jsonl" and Path(plain["pool"]).name == "random.jsonl"
    assert {key: value for key, value in mined.items() if key != "pool"} == {
        key: value for key, value in read_recipe(ROOT / "configs" / "tiny_cpu.yaml").items() if key != "pool"}


def test_the_pools_are_candidates_held_out_from_probe_and_training():
    candidates = generate("tiny-candidates")
    assert _pool("random") == random.Random(0).sample(candidates, POOL_SIZE)  # how docs/mining.md draws it
    mined = _pool("mined")
    assert len(mined) == POOL_SIZE and len({r["prompt"] for r in mined}) == POOL_SIZE
    assert all(row in candidates for row in mined)
    # the candidates' buckets are the GRPO pool's, apart from the probe's and the training splits' (generate()
    # also skips every training target and prompt: tests/test_synthetic.py checks it on the full splits)
    pool_buckets = SPLITS["tiny-candidates"].buckets
    assert pool_buckets == SPLITS["tiny"].buckets
    assert not set(pool_buckets) & (set(SPLITS["tiny-probe"].buckets) | set(SPLITS["tiny-train"].buckets))
    for row in candidates:
        assert _bucket(Example(row["task_type"], row["prompt"].split("\n", 1)[1], row["target"])) in pool_buckets
    probes = generate("tiny-probe") + generate("tiny-probe@201")
    assert not {r["target"] for r in candidates} & {r["target"] for r in probes}
    assert not {r["prompt"] for r in candidates} & {r["prompt"] for r in probes}
