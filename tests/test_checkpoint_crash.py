"""Crash-safe checkpoints (grpo.training.checkpoints): a real tiny run interrupted by SIGINT in the middle of a
save leaves the earlier checkpoint whole and the new one hidden; `--resume` names the incomplete folder, picks the
last complete checkpoint and finishes the run."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from grpo.cli import main

RECIPE = str(Path(__file__).resolve().parents[1] / "configs" / "tiny_cpu.yaml")
SMALL = ["use_vllm=false", "tpf_every=0", "per_device_train_batch_size=4", "num_generations=4",
         "max_completion_length=8", "save_steps=1", "probe_size=2", "logging_steps=1"]


def test_ctrl_c_inside_a_save_leaves_the_last_complete_checkpoint_and_resume_goes_on(tmp_path, capsys, caplog, monkeypatch):
    from grpo.training import checkpoints

    monkeypatch.chdir(tmp_path)
    argv = ["train", "--config", RECIPE, "--out", "run", "--max-steps", "2",
            *(arg for value in SMALL for arg in ("--set", value))]

    def interrupt(folder: Path) -> None:
        assert folder.name == "checkpoint-2" or folder.name == "checkpoint-1"
        assert folder.parent.name.endswith(".saving")  # written aside, not yet visible
        if folder.name == "checkpoint-2":
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: the weights are written, the trainer state not yet

    monkeypatch.setattr(checkpoints, "INSIDE_SAVE", [interrupt])
    # Ctrl-C as a user's shell delivers it to a fresh process: Python's own handler, installed again here since
    # an engine an earlier test started in this process may have put its own in place
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert main(argv) == 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)  # None: set outside Python
    run = tmp_path / "run"
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-1"]
    assert checkpoints.is_complete(run / "checkpoint-1")
    (hidden,) = run.glob(".checkpoint-2.*.saving")
    assert not checkpoints.is_complete(hidden / "checkpoint-2")
    capsys.readouterr()

    monkeypatch.setattr(checkpoints, "INSIDE_SAVE", [])
    for extra in (["--dry-run"], []):  # the dry run and the run name the folder they skip
        caplog.clear()
        assert main([*argv, "--resume", *extra]) == 0
        assert f"skipping incomplete checkpoint folders (an interrupted save, left as they are): run/{hidden.name}" \
            in caplog.text
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    state = json.loads((run / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    trained = [e["step"] for e in state["log_history"] if "loss" in e]
    assert trained == [1, 2]  # step 1 restored from checkpoint-1, step 2 trained once after the resume
    assert hidden.is_dir()  # left as it was: resume removes nothing


def test_resume_refuses_a_run_without_a_complete_checkpoint(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    (run / "checkpoint-3").mkdir(parents=True)
    (run / "checkpoint-3" / "config.json").write_text("{}")  # a save cut short: no weights, no trainer state
    (run / "run_config.json").write_text(json.dumps({"output_dir": "run", "model": "tiny"}))
    (tmp_path / "notrun").mkdir()
    for extra, culprit in ((["--resume"], "holds no checkpoint-N folder to resume from (only incomplete ones: "
                                          "checkpoint-3)"),
                           (["--resume", "notrun"], "resume: notrun is not a complete checkpoint")):
        assert main(["train", "--config", RECIPE, "--out", "run", "--dry-run", *extra]) == 2
        assert culprit in capsys.readouterr().err
