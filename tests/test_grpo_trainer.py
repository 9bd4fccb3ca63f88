"""GRPO with a colocated vLLM engine on a tiny random joint checkpoint: a run interrupted after step 3,
resumed to step 4; what it logs and writes; the engine serving the trained policy after a weight sync."""
from __future__ import annotations

import json
import math

import pytest
import torch

from helpers_models import build_text_checkpoint

pytestmark = pytest.mark.slow

ROWS = [
    {"prompt": "Text Recognition:\nthe river runs north", "target": "the river runs north", "task_type": "text"},
    {"prompt": "Table Recognition:\n| a | 1 |\n| b | 2 |",
     "target": "<table><tr><td>a</td><td>1</td></tr><tr><td>b</td><td>2</td></tr></table>", "task_type": "table"},
    {"prompt": "Formula Recognition:\nx^2 + y", "target": "x^{2}+y", "task_type": "formula"},
    {"prompt": "Text Recognition:\nmean rate 42", "target": "mean rate 42", "task_type": "text"},
]
MAX_STEPS, LR = 4, 0.05  # a high rate, so that four steps change the greedy policy


class Interrupt(Exception):
    pass


def _interrupt_after(step: int):
    from transformers import TrainerCallback

    class InterruptAfter(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == step:
                raise Interrupt

    return InterruptAfter()


def _greedy_hf(model, tokenizer, prompts, n=24):
    model.eval()
    outputs = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)
        tokens = out[0, ids.shape[1]:].tolist()
        outputs.append(tokens[:tokens.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in tokens
                       else tokens)
    return outputs


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(config, interrupted-run files, resumed-run summary, initial greedy outputs)."""
    from grpo.checkpoint import load_checkpoint
    from grpo.training.config import load_config
    from grpo.training.run import build_trainer, run_training

    root = tmp_path_factory.mktemp("grpo")
    ckpt_dir = build_text_checkpoint(root / "ckpt", hidden=128)  # head_dim 32: vLLM CPU serves it
    pool = root / "pool.jsonl"
    pool.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    config = load_config(None, dict(
        model=str(ckpt_dir), pool=str(pool), probe_set=str(pool), probe_size=3, tpf_every=2, tpf_max_new_tokens=16,
        output_dir=str(root / "run"), max_steps=MAX_STEPS, save_steps=2, logging_steps=1, seed=0,
        per_device_train_batch_size=8, num_generations=4, max_completion_length=16, learning_rate=LR,
        lr_scheduler_type="cosine", beta=1e-3, epsilon_high=0.28, use_vllm=True, vllm_max_model_length=256,
        bf16=False, use_cpu=True, gradient_checkpointing=False, report_to="none"))
    initial = load_checkpoint(str(ckpt_dir))
    prompts = [r["prompt"] for r in ROWS]
    greedy_initial = _greedy_hf(initial.model, initial.processor, prompts)

    trainer = build_trainer(config)
    trainer.add_callback(_interrupt_after(3))
    with pytest.raises(Interrupt):
        trainer.train()
    out = root / "run"
    interrupted = {"checkpoints": sorted(p.name for p in out.glob("checkpoint-*")),
                   "drift_steps": [json.loads(line)["step"] for line in (out / "tpf_drift.jsonl").open()]}
    del trainer

    summary = run_training(config, resume=True)
    return config, interrupted, summary, greedy_initial


def test_interrupted_run_left_step_2(run):
    _, interrupted, _, _ = run
    assert interrupted == {"checkpoints": ["checkpoint-2"], "drift_steps": [0, 2]}


def test_resume_continues_from_saved_step(run):
    config, _, summary, _ = run
    trainer, out = summary["trainer"], summary["output_dir"]
    assert summary["steps"] == MAX_STEPS
    history = trainer.state.log_history
    assert [e["step"] for e in history if "loss" in e] == [1, 2, 3, 4]  # 1-2 restored, 3-4 trained, once each
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").open()] == [e["step"] for e in history]
    # scheduler restored: step 3 ran at the cosine rate after 2 of 4 scheduler steps (a fresh one: LR)
    lr3 = next(e["learning_rate"] for e in history if e["step"] == 3 and "loss" in e)
    assert lr3 == pytest.approx(LR * 0.5 * (1 + math.cos(math.pi * 2 / MAX_STEPS)), rel=1e-6)
    # optimizer restored: Adam's step counter went on from the checkpoint's 2
    steps = {int(s["step"]) for s in trainer.optimizer.state.values()}
    assert steps == {MAX_STEPS}
    # TPF history survives: step 0 and 2 from before the interruption, 4 after
    assert [r["step"] for r in summary["tpf"]] == [0, 2, 4]
    assert [json.loads(line)["step"] for line in (out / "tpf_drift.jsonl").open()] == [0, 2, 4]


def test_run_logs_rewards_components_and_tpf(run):
    _, _, summary, _ = run
    history = summary["trainer"].state.log_history
    trained = [e for e in history if "loss" in e]
    for entry in trained:
        assert 0 <= entry["reward"] <= 1
        assert "rewards/ocr_reward/mean" in entry
    keys = {k for e in trained for k in e}
    for task in ("text", "table", "formula"):
        assert f"ocr/{task}/reward" in keys
        assert any(k.startswith(f"ocr/{task}/") and k != f"ocr/{task}/reward" for k in keys), task
    probes = [e for e in history if "tpf/mean" in e]
    assert [e["step"] for e in probes] == [0, 2, 4]
    for entry in probes:
        assert entry["tpf/mean"] >= 1.0  # each round commits >= 2 tokens for 2 forwards
        assert 0 <= entry["tpf/ar_equal_rate"] <= 1
        assert {"tpf/accepted_per_round", "tpf/text", "tpf/table", "tpf/formula"} <= set(entry)
        assert 0 <= entry["eval/reward"] <= 1 and entry["tpf/n"] == 3 and entry["tpf/ranks"] == 1
        assert {"eval/exact", "eval/text/reward", "eval/table/reward", "eval/formula/reward"} <= set(entry)
    # the held-out figures come from the probe rows kept in the run folder: step 0 against the last probe
    change = summary["held_out"]
    assert change["steps"] == (0, MAX_STEPS) and change["all"]["n"] == 3
    assert change["all"]["before"] == pytest.approx(probes[0]["eval/reward"])
    assert change["all"]["after"] == pytest.approx(probes[-1]["eval/reward"])
    drift = [json.loads(line) for line in (summary["output_dir"] / "tpf_drift.jsonl").open()]
    assert [d["eval_reward"] for d in drift] == [e["eval/reward"] for e in probes]
    record = summary["tpf"][-1]
    assert record["reward"] == trained[-1]["reward"]  # the drift record carries its step's mean reward
    for name, path in summary["files"].items():
        assert path.is_file() and path.stat().st_size > 0, name


def test_wall_time_split_nests_the_timers(run):
    """Each derived phase is one timer minus those nested in it: none comes out negative, and a run without
    the drafter loss has no drafter time."""
    _, _, summary, _ = run
    split = summary["wall_time"]
    phases = ("generation", "reward", "logprobs", "backward", "tpf_probe", "other")
    assert all(split[p] >= 0 for p in phases), split
    assert split["generation"] > 0 and split["tpf_probe"] > 0 and split["backward"] > 0
    assert split["drafter"] == 0
    assert json.loads((summary["output_dir"] / "wall_time.json").read_text()) == pytest.approx(split)


def test_checkpoints_are_joint_checkpoints(run):
    from grpo.checkpoint import load_checkpoint

    config, _, summary, _ = run
    initial = load_checkpoint(config.model, need_drafter=True)
    saved = load_checkpoint(summary["output_dir"] / f"checkpoint-{MAX_STEPS}", need_drafter=True)
    assert saved.bd == initial.bd
    changed = [name for name, p in saved.model.state_dict().items()
               if not torch.equal(p, initial.model.state_dict()[name])]
    assert changed  # GRPO moved the weights


def test_engine_serves_the_trained_policy_after_sync(run):
    from vllm import SamplingParams

    _, _, summary, greedy_initial = run
    trainer = summary["trainer"]
    tokenizer = trainer.processing_class
    prompts = [r["prompt"] for r in ROWS]
    greedy_policy = _greedy_hf(trainer.model, tokenizer, prompts)
    assert greedy_policy != greedy_initial  # training changed the greedy outputs: the check below can fail
    trainer.vllm_generation.sync_weights()
    outputs = trainer.vllm_generation.llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24),
                                                   use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == greedy_policy


def test_tpf_drift_remeasures_the_saved_checkpoints(run):
    """`gravity-grpo tpf-drift` on the finished run: fp32 decoding of the saved weights gives exactly the
    TPF the live probe logged at the same steps."""
    from grpo.cli import main

    _, _, summary, _ = run
    out = summary["output_dir"]
    assert main(["tpf-drift", str(out), "--out", str(out / "drift")]) == 0
    records = [json.loads(line) for line in (out / "drift" / "tpf_drift_checkpoints.jsonl").open()]
    live = {r["step"]: r for r in summary["tpf"]}
    assert [r["step"] for r in records] == [0, 2, 4]
    for record in records:
        assert record["tpf"] == live[record["step"]]["tpf"]
        assert record["tpf_by_task"] == live[record["step"]]["tpf_by_task"]
        assert record["reward"] == live[record["step"]]["reward"]
    assert (out / "drift" / "tpf_drift_checkpoints.png").stat().st_size > 0
