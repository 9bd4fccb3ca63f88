"""The TPF probe's bookkeeping without a model: metrics from `measure_tpf` stats, drift records from a log
history, the drift files, and the tpf_floor rule."""
from __future__ import annotations

import json
import logging

import pytest
from transformers import TrainerControl

from grpo.training.config import load_config
from grpo.training.tpf_probe import DRIFT_JSONL, DRIFT_PNG, TpfProbeCallback, drift_records, probe_metrics, write_drift

STATS = {"tpf": 3.2, "accepted_per_round": 4.5, "ar_equal_rate": 1.0, "n": 6,
         "by_task": {"text": {"tpf": 2.5}, "table": {"tpf": 4.0}, "formula": {"tpf": 3.0}}}
HISTORY = [
    {"step": 0, "tpf/mean": 3.2, "tpf/accepted_per_round": 4.5, "tpf/ar_equal_rate": 1.0, "tpf/text": 2.5,
     "tpf/table": 4.0},
    {"step": 1, "loss": 0.1, "reward": 0.55},
    {"step": 2, "loss": 0.2, "reward": 0.61, "tpf/mean": 3.1, "tpf/accepted_per_round": 4.2, "tpf/text": 2.4},
    {"step": 3, "loss": 0.1, "reward": 0.64},
]


def test_probe_metrics_names_and_drops_missing():
    assert probe_metrics(STATS) == {"tpf/mean": 3.2, "tpf/accepted_per_round": 4.5, "tpf/ar_equal_rate": 1.0,
                                    "tpf/text": 2.5, "tpf/table": 4.0, "tpf/formula": 3.0}
    assert "tpf/ar_equal_rate" not in probe_metrics({**STATS, "ar_equal_rate": None})  # compare_ar off


def test_drift_records_carry_the_reward_logged_with_or_before_the_probe():
    assert drift_records(HISTORY) == [
        {"step": 0, "tpf": 3.2, "accepted_per_round": 4.5, "ar_equal_rate": 1.0,
         "tpf_by_task": {"text": 2.5, "table": 4.0}, "reward": None},
        {"step": 2, "tpf": 3.1, "accepted_per_round": 4.2, "ar_equal_rate": None,
         "tpf_by_task": {"text": 2.4}, "reward": 0.61},
    ]


def test_write_drift_rewrites_the_files(tmp_path):
    (tmp_path / DRIFT_JSONL).write_text('{"step": 99, "tpf": 1.0}\n')  # stale lines of an earlier attempt
    png = write_drift(drift_records(HISTORY), HISTORY, tmp_path)
    lines = [json.loads(line) for line in (tmp_path / DRIFT_JSONL).open()]
    assert [r["step"] for r in lines] == [0, 2]
    assert png == tmp_path / DRIFT_PNG and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
