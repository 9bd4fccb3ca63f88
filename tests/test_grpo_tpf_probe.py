"""The TPF probe's bookkeeping without a model: metrics from `measure_tpf` stats, drift records from a log
history, the drift files, and the tpf_floor rule."""
from __future__ import annotations

import json
import logging

import pytest
from transformers import TrainerControl

from grpo.training.config import load_config
from grpo.evaluation.drift import drift_records, held_out_change, probe_metrics
from grpo.evaluation.stats import paired_interval
from grpo.evaluation.run_dir import DRIFT_JSONL, DRIFT_PNG, RunDir
from grpo.evaluation.probe import TpfProbeCallback

STATS = {"tpf": 3.2, "tpf_bench": 3.0, "accepted_per_round": 4.5, "ar_equal_rate": 1.0, "ar_compared": 6, "n": 6,
         "truncated": 0, "reward": 0.8, "exact_rate": 0.5,
         "by_task": {"text": {"tpf": 2.5, "reward": 0.7}, "table": {"tpf": 4.0, "reward": 0.9},
                     "formula": {"tpf": 3.0, "reward": None}}}
HISTORY = [
    {"step": 0, "tpf/mean": 3.2, "tpf/bench": 3.0, "tpf/sampled": 2.1, "tpf_sampled/text": 1.9,
     "tpf/accepted_per_round": 4.5, "tpf/ar_equal_rate": 1.0, "tpf/ar_compared": 6.0, "tpf/text": 2.5,
     "tpf/table": 4.0, "tpf/n": 6.0, "tpf/ranks": 2.0, "tpf/truncated": 0.0, "eval/reward": 0.8,
     "eval/text/reward": 0.7, "eval/table/reward": 0.9, "eval/exact": 0.5},
    {"step": 1, "loss": 0.1, "reward": 0.55},
    {"step": 2, "loss": 0.2, "reward": 0.61, "tpf/mean": 3.1, "tpf/accepted_per_round": 4.2, "tpf/text": 2.4},
    {"step": 3, "loss": 0.1, "reward": 0.64},
]


def test_probe_metrics_names_and_drops_missing():
    sampled = {"tpf": 2.1, "by_task": {"text": {"tpf": 1.9}, "table": {"tpf": None}}}
    assert probe_metrics(STATS, ranks=2, sampled=sampled) == {
        "tpf/mean": 3.2, "tpf/bench": 3.0, "tpf/accepted_per_round": 4.5, "tpf/ar_equal_rate": 1.0,
        "tpf/ar_compared": 6.0, "tpf/truncated": 0.0,
        "tpf/n": 6.0, "tpf/ranks": 2.0, "tpf/text": 2.5, "tpf/table": 4.0, "tpf/formula": 3.0,
        "eval/reward": 0.8, "eval/exact": 0.5, "eval/text/reward": 0.7, "eval/table/reward": 0.9,
        "tpf/sampled": 2.1, "tpf_sampled/text": 1.9}
    assert "tpf/ar_equal_rate" not in probe_metrics({**STATS, "ar_equal_rate": None})  # compare_ar off


def test_drift_records_carry_tpf_held_out_reward_and_the_training_reward_logged_with_or_before_the_probe():
    settings = {"preset": "cpu", "dtype": "float32"}
    assert drift_records(HISTORY, settings) == [
        {"step": 0, "tpf": 3.2, "tpf_by_task": {"table": 4.0, "text": 2.5}, "tpf_bench": 3.0, "tpf_sampled": 2.1,
         "tpf_sampled_by_task": {"text": 1.9}, "accepted_per_round": 4.5,
         "ar_equal_rate": 1.0, "ar_compared": 6, "eval_reward": 0.8, "eval_reward_low": None,
         "eval_reward_high": None, "eval_reward_by_task": {"table": 0.9, "text": 0.7},
         "eval_exact": 0.5, "n": 6, "ranks": 2, "truncated": 0, "reward": None, "settings": settings},
        {"step": 2, "tpf": 3.1, "tpf_by_task": {"text": 2.4}, "tpf_bench": None, "tpf_sampled": None,
         "tpf_sampled_by_task": {}, "accepted_per_round": 4.2, "ar_equal_rate": None, "ar_compared": None,
         "eval_reward": None, "eval_reward_low": None, "eval_reward_high": None, "eval_reward_by_task": {},
         "eval_exact": None, "n": None, "ranks": None,
         "truncated": None, "reward": 0.61, "settings": settings},
    ]


def test_write_drift_rewrites_the_files(tmp_path):
    (tmp_path / DRIFT_JSONL).write_text('{"step": 99, "tpf": 1.0}\n')  # stale lines of an earlier attempt
    png = RunDir(tmp_path).write_drift(drift_records(HISTORY))
    lines = [json.loads(line) for line in (tmp_path / DRIFT_JSONL).open()]
    assert [r["step"] for r in lines] == [0, 2]
    assert png == tmp_path / DRIFT_PNG and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_metrics_file_appends_then_rewrites_on_a_new_process(tmp_path):
    run = RunDir(tmp_path)
    written = run.write_metrics(HISTORY[:1], -1)
    written = run.write_metrics(HISTORY[:2], written)
    assert run.read_metrics() == HISTORY[:2] and written == 2
    run.write_metrics(HISTORY, -1)  # a resumed process writes the whole restored history
    assert run.read_metrics() == HISTORY


def test_paired_interval_of_a_constant_gain_is_that_gain():
    c = paired_interval([0.5, 0.6, 0.7], [0.55, 0.65, 0.75])
    assert c["diff"] == pytest.approx(0.05) and c["low"] == pytest.approx(0.05) and c["high"] == pytest.approx(0.05)
    c = paired_interval([0.0] * 50 + [1.0] * 50, [1.0] * 50 + [0.0] * 50)  # no mean change, wide spread
    assert c["diff"] == 0 and c["low"] < -0.1 and c["high"] > 0.1
    with pytest.raises(ValueError, match="paired"):
        paired_interval([0.1], [0.1, 0.2])


def test_held_out_change_pairs_the_first_and_last_probe_by_prompt(tmp_path):
    run = RunDir(tmp_path)
    row = {"tokens": 8, "forwards": 2, "rounds": 1, "accepted": [6], "truncated": False, "ar_equal": True,
           "exact": False}
    run.write_probe_rows(0, [dict(row, index=i, task="text" if i % 2 else "table", reward=0.5) for i in range(4)])
    run.write_probe_rows(5, [dict(row, index=i, task="text", reward=0.1) for i in range(4)])
    run.write_probe_rows(5, [dict(row, index=i, task="text" if i % 2 else "table", reward=0.5 + 0.1 * (i % 2),
                                  forwards=4) for i in range(4)])  # a rerun of step 5 replaces it
    change = held_out_change(run)
    assert change["steps"] == (0, 5) and len(run.read_probe_rows()) == 2
    assert change["all"]["diff"] == pytest.approx(0.05) and change["all"]["n"] == 4
    assert change["text"]["diff"] == pytest.approx(0.1) and change["table"]["diff"] == pytest.approx(0.0)
    assert change["all"]["tpf"] == (7 / 2, 7 / 4)  # 8 - 1 output tokens after x0 over 2, then 4 forwards


def _floor(tmp_path, action, tpfs):
    config = load_config(None, {"output_dir": str(tmp_path), "use_cpu": True, "tpf_floor": 0.1,
                                "tpf_floor_action": action})
    callback = TpfProbeCallback(trainer=None, rows=[], bd=None)
    control = TrainerControl()
    records = [{"step": 10 * i, "tpf": tpf} for i, tpf in enumerate(tpfs)]
    callback._check_floor(config, control, records)
    return callback, control


@pytest.mark.parametrize("tpfs", [[4.0], [4.0, 3.6], [4.0, 4.4]])  # 3.6 = exactly 90%: not below the floor
def test_floor_not_reached(tmp_path, tpfs, caplog):
    with caplog.at_level(logging.WARNING):
        callback, control = _floor(tmp_path, "stop", tpfs)
    assert not control.should_training_stop and not control.should_save and callback.stopped_at is None
    assert not caplog.records


def test_floor_warns(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        callback, control = _floor(tmp_path, "warn", [4.0, 3.9, 3.5])
    assert not control.should_training_stop and not control.should_save and callback.stopped_at is None
    assert "TPF 3.500 at step 20 is below the floor 3.600" in caplog.text


def test_floor_stops_with_a_checkpoint(tmp_path, caplog):
    with caplog.at_level(logging.ERROR):
        callback, control = _floor(tmp_path, "stop", [4.0, 3.5])
    assert control.should_training_stop and control.should_save and callback.stopped_at == 10
    assert "saving a checkpoint and stopping" in caplog.text


def test_floor_is_relative_to_step_0_not_the_previous_probe(tmp_path):
    _, control = _floor(tmp_path, "stop", [4.0, 3.7, 3.5])  # 3.5 is 95% of 3.7 but 87.5% of 4.0
    assert control.should_training_stop


@pytest.mark.parametrize("mode, at_0, at_5", [("always", True, True), ("first", True, False), ("never", False, False)])
def test_probe_compares_every_prompt_or_none(tmp_path, mode, at_0, at_5):
    config = load_config(None, {"output_dir": str(tmp_path), "use_cpu": True, "tpf_compare_ar": mode})
    callback = TpfProbeCallback(trainer=None, rows=list(range(10)), bd=None)
    assert (callback._compared(config, 0), callback._compared(config, 5)) == (at_0, at_5)
    assert config.ar_compared_prompts(5, 10) == (10 if at_5 else 0)


def test_probe_compares_the_same_fixed_sample_at_every_probe(tmp_path):
    config = load_config(None, {"output_dir": str(tmp_path), "use_cpu": True, "tpf_compare_ar": "sample",
                                "tpf_compare_ar_k": 3})
    callback = TpfProbeCallback(trainer=None, rows=list(range(10)), bd=None)
    sample = callback._compared(config, 0)
    assert len(sample) == 3 and sample == sorted(set(sample)) and all(0 <= i < 10 for i in sample)
    assert callback._compared(config, 50) == sample and config.ar_compared_prompts(50, 10) == 3
    assert TpfProbeCallback(trainer=None, rows=[0, 1], bd=None)._compared(config, 0) == [0, 1]  # k > prompts


def test_probe_settings_are_checked(tmp_path):
    from grpo.training.config import ConfigError

    for key, value in (("tpf_batch_size", 0), ("tpf_compare_ar_k", 0), ("tpf_samples", -1)):
        with pytest.raises(ConfigError, match=key):
            load_config(None, {"output_dir": str(tmp_path), "use_cpu": True, key: value})
