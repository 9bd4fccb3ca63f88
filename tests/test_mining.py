"""Hard-prompt mining (docs/spec.md §8): statistics, zero-variance drop, ranking rule, shards, kill-and-resume."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers_env import child_env

from grpo.mining.miner import MineConfig, merge, mine, parse_shard
from grpo.rollouts.sampling import Rollout
from grpo.mining.selection import PREFER, STAT_COLUMNS, RankRule, is_dropped, prompt_stats, select
from grpo.rollouts.sampling import INDEX
from grpo.mining.store import MiningError, MiningStore

ORIGINAL = ["prompt", "target", "task_type"]
ROOT = str(Path(__file__).resolve().parents[1])  # the child imports this checkout's grpo, from any cwd


# ------------------------------------------------------------------------------------------- no model

def _rec(index, mean, ref_chars, task="table", std=0.1, rank=PREFER["long-tables"]):
    rec = {INDEX: index, "task_type": task, "ref_chars": ref_chars, "reward_mean": mean, "reward_std": std,
           "reward_min": mean - std, "reward_max": mean + std}
    rec["mine_score"] = rank.score(mean, ref_chars, task)
    return rec


def test_rank_score_is_the_documented_formula():
    rule = RankRule(hard_weight=1.0, length_weight=1.0, length_scale=1900.0, table_bonus=1.0)
    assert rule.score(0.25, 950, "table") == pytest.approx(0.75 + 0.5 + 1.0)
    assert rule.score(0.25, 3800, "text") == pytest.approx(0.75 + 1.0)  # length term capped at 1
    assert PREFER["long-tables"] == rule
    assert PREFER["hard"].score(0.25, 3800, "table") == pytest.approx(0.75)
    assert PREFER["pool-order"].score(0.0, 3800, "table") == 0.0


def test_select_drops_zero_variance_ranks_and_keeps_top_n():
    records = {
        0: _rec(0, 0.9, 100, "text"),                 # easy, short: last
        1: _rec(1, 0.2, 1900, "table"),               # hard long table: first
        2: _rec(2, 0.2, 1900, "text"),                # same but not a table: after 1
        3: _rec(3, 0.5, 500, "table", std=0.0),       # all rewards equal: dropped
        4: _rec(4, 0.2, 1900, "table"),               # ties with 1: pool order decides
        5: _rec(5, 0.6, 200, "formula", std=0.04),    # dropped only when min_std >= 0.04
    }
    assert select(records, PREFER["long-tables"], 0.0, None) == [1, 4, 2, 5, 0]
    assert select(records, PREFER["long-tables"], 0.05, 3) == [1, 4, 2]
    hard = {i: _rec(i, r["reward_mean"], r["ref_chars"], r["task_type"], r["reward_std"], PREFER["hard"])
            for i, r in records.items()}
    assert select(hard, PREFER["hard"], 0.0, None) == [1, 2, 4, 5, 0]


def test_prompt_stats_values():
    rollouts = [Rollout("a", 3, False), Rollout("b", 5, True), Rollout("c", 4, False), Rollout("d", 8, True)]
    stats = prompt_stats([0.0, 1.0, 1.0, 0.0], rollouts)
    assert stats == {"reward_mean": 0.5, "reward_std": 0.5, "reward_min": 0.0, "reward_max": 1.0,
                     "rewards": [0.0, 1.0, 1.0, 0.0], "completion_tokens_mean": 5.0, "truncated": 2}
    same = prompt_stats([0.3] * 4, rollouts)
    assert is_dropped(same, 0.0) and not is_dropped(stats, 0.49) and is_dropped(stats, 0.5)


def test_bad_settings_are_refused(tmp_path):
    assert parse_shard("2/4") == (2, 4)
    for text in ("4/4", "a/b", "1"):
        with pytest.raises(MiningError, match="shard"):
            parse_shard(text)
    with pytest.raises(ValueError, match="at least 2 rollouts"):
        MineConfig(model="m", pool="d", output_dir="o", num_generations=1)
    with pytest.raises(MiningError, match="no mining/done.json"):
        merge([str(tmp_path)], str(tmp_path / "merged"))


def test_a_prompt_in_two_part_files_is_an_error(tmp_path):
    run = MiningStore(tmp_path)
    run.parts.mkdir(parents=True)
    run.write_part([_rec(0, 0.5, 10), _rec(1, 0.5, 10)])
    run.write_part([_rec(1, 0.5, 10)])
    with pytest.raises(MiningError, match="prompt 1 is in both"):
        run.read_parts()


# ------------------------------------------------------------------------------------- with vLLM

def _pool(tmp_path, n):
    from grpo.pool import load_pool

    path = tmp_path / f"pool{n}.jsonl"
    load_pool("tiny").select(range(n)).to_json(str(path))
    return str(path)


def _cfg(text_ckpt, data, out, **kw):
    return MineConfig(model=str(text_ckpt), pool=data, output_dir=str(out),
                      **{"num_generations": 4, "max_completion_length": 24, "dtype": "float32", "progress": False,
                         **kw})


def _records(out):
    return {i: {k: r[k] for k in ("rewards", "completion_tokens_mean", "truncated")}
            for i, r in MiningStore(out).read_parts().items()}


@pytest.mark.slow
def test_mining_writes_statistics(tmp_path, text_ckpt, engine):
    from datasets import load_from_disk

    from grpo.pool import load_pool

    data = _pool(tmp_path, 12)
    summary = mine(_cfg(text_ckpt, data, tmp_path / "out"), engine)
    out = load_from_disk(str(tmp_path / "out"))
    assert out.column_names == ORIGINAL + [INDEX, *STAT_COLUMNS]
    pool = load_pool(data)
    assert summary["counts"]["all"]["mined"] == 12
    assert summary["counts"]["all"]["kept"] == len(out) > 0
    assert out["mine_score"] == sorted(out["mine_score"], reverse=True)
    for row in out:
        assert row["target"] == pool[row[INDEX]]["target"] and row["ref_chars"] == len(row["target"])
        rewards = row["rewards"]
        assert len(rewards) == 4 and all(0.0 <= r <= 1.0 for r in rewards)
        assert row["reward_mean"] == pytest.approx(sum(rewards) / 4)
        assert (row["reward_min"], row["reward_max"]) == (min(rewards), max(rewards))
        assert row["reward_std"] > 0 and 0 <= row["truncated"] <= 4 and 1 <= row["completion_tokens_mean"] <= 24
    for name in ("report.json", "reward_mean.png", "reward_std.png"):
        assert (tmp_path / "out" / "report" / name).stat().st_size > 0

    with pytest.raises(MiningError, match="num_generations: 4 then, 5 now"):
        mine(_cfg(text_ckpt, data, tmp_path / "out", num_generations=5), engine)

    again = mine(_cfg(text_ckpt, str(tmp_path / "out"), tmp_path / "again", num_generations=2), engine)  # mined again
    assert again["counts"]["all"]["mined"] == len(out)
    assert load_from_disk(str(tmp_path / "again")).column_names == out.column_names


@pytest.mark.slow
def test_identical_rollouts_are_dropped_and_hf_fallback_agrees(tmp_path, text_ckpt, engine):
    from datasets import load_from_disk

    data = _pool(tmp_path, 6)
    summary = mine(_cfg(text_ckpt, data, tmp_path / "greedy", temperature=0.0), engine)
    assert summary["counts"]["all"] == {"mined": 6, "dropped_zero_variance": 6, "ranked_out": 0, "kept": 0}
    assert len(load_from_disk(str(tmp_path / "greedy"))) == 0

    mine(_cfg(text_ckpt, data, tmp_path / "hf", temperature=0.0, hf_generate=True))
    assert _records(tmp_path / "hf") == _records(tmp_path / "greedy")


@pytest.mark.slow
def test_shards_merge_to_the_unsharded_result(tmp_path, text_ckpt, engine):
    from datasets import load_from_disk

    data = _pool(tmp_path, 10)
    kw = {"keep": 4, "chunk_size": 1}  # one prompt per engine call: batch-invariant samples
    mine(_cfg(text_ckpt, data, tmp_path / "whole", **kw), engine)
    shards = [str(tmp_path / f"s{i}") for i in range(2)]
    for i, out in enumerate(shards):
        mine(_cfg(text_ckpt, data, out, shard=f"{i}/2", **kw), engine)
    assert set(_records(shards[0])).isdisjoint(_records(shards[1]))
    with pytest.raises(MiningError, match="shards 0..1 of 2"):
        merge(shards[:1], str(tmp_path / "bad"))
    summary = merge(shards, str(tmp_path / "merged"))
    whole, merged = load_from_disk(str(tmp_path / "whole")), load_from_disk(str(tmp_path / "merged"))
    assert merged[INDEX] == whole[INDEX] and merged["rewards"] == whole["rewards"]
    assert summary["counts"]["all"]["mined"] == 10


# The child mines through the CLI and SIGKILLs itself right after its KILL_AFTER-th part file is written:
# a deterministic point mid-run, set from the outside (the production code has no hook for it).
KILL_AFTER = 3
KILLED_CHILD = """
import os, signal, sys
from grpo.cli import main
from grpo.mining.store import MiningStore
write_part, written = MiningStore.write_part, []
def write_then_die(self, records):
    write_part(self, records)
    written.append(len(records))
    if len(written) == int(os.environ["KILL_AFTER"]):
        os.kill(os.getpid(), signal.SIGKILL)
MiningStore.write_part = write_then_die
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_kill_and_resume_loses_and_repeats_nothing(tmp_path, text_ckpt, engine):
    from datasets import load_from_disk

    data = _pool(tmp_path, 24)
    kw = {"chunk_size": 1, "max_completion_length": 32}
    killed = tmp_path / "killed"
    cmd = [sys.executable, "-c", KILLED_CHILD, "mine", "--model", str(text_ckpt), "--data", data, "--out", str(killed),
           "--k", "4", "--max-tokens", "32", "--chunk-size", "1", "--dtype", "float32", "--no-progress"]
    proc = subprocess.run(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600,
                          env=child_env(OMP_NUM_THREADS="1", KILL_AFTER=str(KILL_AFTER),
                                        PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))))
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert not MiningStore(killed).done.exists()
    assert len(MiningStore(killed).read_parts()) == KILL_AFTER  # chunk_size 1: one prompt per part

    mine(_cfg(text_ckpt, data, killed, **kw), engine)  # the rerun, same arguments
    mine(_cfg(text_ckpt, data, tmp_path / "straight", **kw), engine)
    assert _records(killed) == _records(tmp_path / "straight")
    assert sorted(_records(killed)) == list(range(24))
    assert load_from_disk(str(killed))[INDEX] == load_from_disk(str(tmp_path / "straight"))[INDEX]
    done = json.loads(MiningStore(killed).done.read_text())
    assert done["summary"]["counts"]["all"]["mined"] == 24
