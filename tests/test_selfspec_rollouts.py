"""`rollout_decoder: selfspec`: GRPO on the HF generation path with rollouts from the batched self-speculative
sampler (their distribution is AR sampling's: tests/test_selfspec_sampling.py), and the settings it refuses."""
from __future__ import annotations

import json

import pytest

from grpo.training.config import ConfigError, load_config
from helpers_models import build_text_checkpoint

ROWS = [
    {"prompt": "Text Recognition:\nthe north road", "target": "the north road", "task_type": "text"},
    {"prompt": "Formula Recognition:\na_1 + b", "target": "a_{1}+b", "task_type": "formula"},
]


@pytest.mark.parametrize("settings, message", [
    ({"use_vllm": True}, "set use_vllm: false"),
    ({"top_p": 0.9}, "no top_k, top_p"),
    ({"top_k": 5}, "no top_k, top_p"),
    ({"generation_kwargs": {"top_k": 5}}, "does not pass generation_kwargs to its exact sampler \\(got top_k\\)"),
    ({"rollout_decoder": "beam"}, "rollout_decoder must be one of")])
def test_selfspec_rollouts_refuse_what_they_cannot_sample_exactly(tmp_path, settings, message):
    values = {"output_dir": str(tmp_path), "use_cpu": True, "use_vllm": False, "rollout_decoder": "selfspec",
              **settings}
    with pytest.raises(ConfigError, match=message):
        load_config(None, values)


def test_rollout_seeds_differ_per_generation_call():
    from grpo.rollouts.selfspec import rollout_seed

    seeds = {rollout_seed(0, step, rank, call) for step in range(3) for rank in range(2) for call in range(4)}
    assert len(seeds) == 3 * 2 * 4 and all(0 <= s < 2**63 for s in seeds)


@pytest.mark.slow
def test_grpo_steps_with_selfspec_rollouts(tmp_path):
    from grpo.training.run import run_training

    ckpt_dir = build_text_checkpoint(tmp_path / "ckpt", hidden=64)
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    config = load_config(None, dict(
        model=str(ckpt_dir), pool=str(pool), tpf_every=0, output_dir=str(tmp_path / "run"), max_steps=2,
        save_steps=10, logging_steps=1, seed=0, per_device_train_batch_size=8, num_generations=4,
        max_completion_length=12, learning_rate=0.05, use_vllm=False, rollout_decoder="selfspec", bf16=False,
        use_cpu=True, gradient_checkpointing=False, report_to="none"))
    summary = run_training(config)
    steps = [e for e in summary["trainer"].state.log_history if "loss" in e]
    assert len(steps) == 2
    for entry in steps:
        assert entry["selfspec/tpf"] >= 1.0  # the self-speculative sampler made this step's rollouts
        assert 1 <= entry["completions/mean_length"] <= 12 and 0 <= entry["reward"] <= 1
