"""The tiny default end to end: `gravity-grpo demo` for two steps, and the TPF floor stopping a run whose
learning rate wrecks the drafter (the tiny default drafts several tokens per forward; a random model
does not, so its TPF cannot fall)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

TINY_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "tiny_cpu.yaml"

pytestmark = pytest.mark.slow


def test_demo_runs_the_tiny_config(tmp_path, capsys):
    from grpo.cli import main

    out = tmp_path / "demo"
    assert main(["demo", "--output-dir", str(out), "--max-steps", "2"]) == 0
    printed = capsys.readouterr().out
    for name in ("reward_curve.png", "tpf_drift.png", "metrics.jsonl", "wall_time.json"):
        assert (out / name).stat().st_size > 0
        assert str(out / name) in printed.replace("\n", "")
    for phase in ("generation", "reward", "backward", "tpf_probe"):
        assert phase in printed
    steps = [json.loads(line)["step"] for line in (out / "tpf_drift.jsonl").open()]
    assert steps == [0, 2]  # step 0 and the last step


def test_tpf_floor_stops_and_saves(tmp_path):
    from grpo.cli import main
    from grpo.checkpoint import load_checkpoint

    out = tmp_path / "run"
    code = main(["train", "--config", str(TINY_CONFIG), "--output-dir", str(out), "--max-steps", "6",
                 "--tpf-every", "1", "--learning-rate", "0.003",  # a rate that wrecks the drafter
                 "--set", "tpf_floor=0.2", "--set", "tpf_floor_action=stop", "--set", "save_steps=100",
                 "--set", "per_device_train_batch_size=16"])
    assert code == 3
    records = [json.loads(line) for line in (out / "tpf_drift.jsonl").open()]
    stop = records[-1]["step"]
    assert 0 < stop < 6
    assert records[-1]["tpf"] < 0.8 * records[0]["tpf"]
    assert all(r["tpf"] >= 0.8 * records[0]["tpf"] for r in records[:-1])  # it stopped at the first breach
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{stop}"]  # save_steps never hit
    load_checkpoint(out / f"checkpoint-{stop}", need_drafter=True)


def test_self_drafted_rollouts_keep_the_policys_distribution(tmp_path):
    """Check `engine-selfspec`: with the engine drafting for itself at the full length, the rollouts' logprobs stay
    the policy's (TRL's sampling_logp_difference, as small as without speculation) and each target forward makes
    >= 3 tokens (half that per forward of the weights, the drafter's counted)."""
    from grpo.cli import main

    out = tmp_path / "run"
    assert main(["train", "--config", str(TINY_CONFIG), "--output-dir", str(out), "--max-steps", "2",
                 "--tpf-every", "0", "--set", "vllm_self_speculation=true", "--set", "vllm_fixed_drafting=true"]) == 0
    steps = [e for e in map(json.loads, (out / "metrics.jsonl").open()) if "loss" in e]
    assert len(steps) == 2
    for entry in steps:
        assert entry["sampling/sampling_logp_difference/max"] <= 0.05, entry
        assert entry["rollout/tokens_per_target_forward"] >= 3.0, entry
        assert entry["rollout/tokens_per_forward"] == pytest.approx(entry["rollout/tokens_per_target_forward"] / 2)
        assert entry["rollout/accepted_per_round"] > 0, entry
        assert entry["rollout/draft_slots"] == pytest.approx(17.0), entry


def test_self_drafted_rollouts_follow_the_slot_schedule(tmp_path):
    """By default the recipe's slot schedule reaches the engine: the rollout batch of 32 decodes plainly while 8 or
    more requests run and drafts in its tail, so a step drafts between 0 and 17 slots on average, some steps are
    plain (tokens per forward above half those per target forward), and the logprobs stay the policy's."""
    from grpo.cli import main

    out = tmp_path / "run"
    assert main(["train", "--config", str(TINY_CONFIG), "--output-dir", str(out), "--max-steps", "1",
                 "--tpf-every", "0", "--set", "vllm_self_speculation=true"]) == 0
    steps = [e for e in map(json.loads, (out / "metrics.jsonl").open()) if "loss" in e]
    assert len(steps) == 1
    entry = steps[0]
    assert entry["sampling/sampling_logp_difference/max"] <= 0.05, entry
    assert 0.0 < entry["rollout/draft_slots"] < 17.0, entry
    assert entry["rollout/tokens_per_forward"] > entry["rollout/tokens_per_target_forward"] / 2, entry
    assert entry["rollout/accepted_per_round"] > 0, entry
