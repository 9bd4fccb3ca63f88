"""The GPU check's runner and report (docs/gpu.md), on CPU: its steps, the report's shape, a failing install that
hides no step, and the wheel list against what the device image lacks."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from grpo.gpu_check.__main__ import main
from grpo.gpu_check.steps import ALONE, STEPS

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "gpu"))
from rehearsal import outside_image  # noqa: E402
from wheels import pinned  # noqa: E402

# what the issue asks the check to cover, in the report's order
ISSUE_STEPS = ["environment", "vlm_forward", "tpf_tiny_default", "tpf_tiny_glm_ocr", "grpo_tiny_default",
               "grpo_tiny_glm_ocr", "selfspec_rollouts", "drafter_loss_bf16", "lora", "checkpoint_resume",
               "speed_table"]


def test_list_names_every_step_once_in_order(capsys):
    assert main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ISSUE_STEPS == list(STEPS)
    assert all(len(line.split(": ", 1)[1]) > 20 for line in lines)
    assert ALONE == {"speed_table"}


def test_an_unknown_step_is_one_error_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--device", "cpu", "--only", "environment", "speed"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        "error: unknown step(s) speed; the steps are: " + ", ".join(ISSUE_STEPS))


def test_report_shape_and_a_failed_install_hides_no_step(tmp_path):
    """An install with no wheels fails, the step still runs in its own process and is reported whole."""
    empty, out = tmp_path / "no-wheels", tmp_path / "out"
    empty.mkdir()
    done = subprocess.run([sys.executable, "-m", "grpo.gpu_check", "--device", "cpu", "--only", "environment",
                           "--wheels", str(empty), "--out", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stdout.strip().endswith(f"failed: install; {json.loads((out / 'report.json').read_text())['seconds']} "
                                        f"s; report in {out / 'report.json'}")
    report = json.loads((out / "report.json").read_text())
    assert set(report) == {"device", "started", "settings", "install", "steps", "seconds", "ok"}
    assert report["ok"] is False and report["install"]["ok"] is False and "make gpu-wheels" in report["install"]["error"]
    [step] = report["steps"]
    assert set(step) == {"name", "ok", "seconds", "figures", "error", "log_tail"}
    assert (step["name"], step["ok"], step["error"]) == ("environment", True, None)
    assert step["figures"]["trl"]["version"] == "1.16.0" and step["figures"]["cuda"] is None
    assert "===== environment (ok," in (out / "steps.log").read_text()


def test_the_wheels_carry_every_need_the_device_image_lacks(tmp_path):
    """Without wheels, what the two distributions need beyond the image is exactly the top of gpu/wheels.txt."""
    assert set(outside_image(tmp_path)) == {"trl", "datasets", "rapidfuzz", "pylatexenc"} <= set(pinned())
