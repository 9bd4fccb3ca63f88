"""Multi-process GRPO on CPU (issue 13): `accelerate launch` with configs/accelerate/cpu_2proc.yaml (2 processes,
gloo), a colocated in-process vLLM engine on each rank, the tiny default; the same under DeepSpeed ZeRO-3 with its
CPU accelerator (configs/accelerate/cpu_zero3_2proc.yaml, zero3_init_flag true as in zero3.yaml). About 1-2 minutes
each on 2 cores. The launch config says MULTI_GPU with use_cpu: accelerate's MULTI_CPU on one machine starts a single
process. A launch that times out ends every process it started and fails naming each rank's start-up stage."""
from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from grpo.rollouts.engine import free_port
from grpo.training.run import STAGE_LINE
from helpers_env import child_env

ROOT = Path(__file__).resolve().parent.parent
STEPS, EVERY = 4, 2
PROBE_SIZE = 12  # 6 prompts per rank: the sharded probe is checked; the shipped 60 only cost time
LAUNCH_TIMEOUT = 600  # seconds; one run takes 1-3 minutes on 2 shared cores
_STAGE = re.compile(re.escape(STAGE_LINE).replace(r"\{rank\}", r"(?P<rank>\d+)").replace(r"\{pid\}", r"\d+")
                    .replace(r"\{stage\}", r"(?P<stage>.+)"))


def stages(log: str) -> dict[str, str]:
    """The last start-up stage each rank logged (`grpo.training.run.mark_stage`), by rank."""
    return {m["rank"]: m["stage"] for m in _STAGE.finditer(log)}


def end_tree(launcher: subprocess.Popen, grace: float = 30.0) -> None:
    """End the launcher and every process below it. torchrun starts each rank in a session of its own, so ending
    the launcher's process group would leave the ranks running: they are found as its descendants first, then
    each is ended by its id (SIGTERM, and SIGKILL after `grace` seconds)."""
    try:
        tree = [psutil.Process(launcher.pid), *psutil.Process(launcher.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for proc in tree:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    launcher.wait(timeout=grace)


def launch(cmd: list[str], log_path: Path, env: dict[str, str], timeout: float = LAUNCH_TIMEOUT) -> tuple[int, str]:
    """Run the multi-process launch `cmd` (output to `log_path`) in its own process group; on timeout end every
    process it started and fail naming the stage each rank stood at."""
    with log_path.open("w") as log:
        launcher = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        try:
            code = launcher.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            end_tree(launcher)
            text = log_path.read_text()
            where = stages(text) or {"all": "none logged: launch, rendezvous or DeepSpeed's op build (docs/grpo.md)"}
            pytest.fail(f"the launch timed out after {timeout:.0f} s; stage per rank: {where}\n{text[-3000:]}")
        finally:
            if launcher.poll() is None:  # an error in the test itself: leave nothing running
                end_tree(launcher)
    return code, log_path.read_text()


def test_the_gpu_zero3_configs_are_the_tested_one_on_more_processes():
    """zero3.yaml and zero3_multinode.yaml need CUDA and 8 or 16 processes; what runs here is
    cpu_zero3_2proc.yaml, so their DeepSpeed settings must be its own (the multi-node launcher aside)."""
    import yaml

    def deepspeed(name: str) -> dict:
        return yaml.safe_load((ROOT / "configs/accelerate" / name).read_text())["deepspeed_config"]

    tested = deepspeed("cpu_zero3_2proc.yaml")
    assert tested["zero3_init_flag"] is True
    assert deepspeed("zero3.yaml") == tested
    assert deepspeed("zero3_multinode.yaml") == {**tested, "deepspeed_multinode_launcher": "standard"}


@pytest.mark.slow
@pytest.mark.parametrize("launch_config, env_extra", [
    ("cpu_2proc.yaml", {}),                                 # DDP: a full policy copy per rank
    ("cpu_zero3_2proc.yaml", {"DS_ACCELERATOR": "cpu"}),    # ZeRO-3: sharded weights, gathered for sync and probe
])
@pytest.mark.timeout(900)  # two processes, each with its own engine, on shared cores
def test_two_process_grpo_with_a_vllm_engine_per_rank(tmp_path, launch_config, env_extra):
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent))
    if accelerate is None:
        pytest.skip("accelerate's launcher is not installed beside this python")
    out = tmp_path / "dist"
    env = child_env(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                    VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind",
                    # DeepSpeed's CPU start builds an op behind a lock file in this folder; a shared one can hold
                    # the lock of a build killed elsewhere, on which both ranks would sleep for good (docs/grpo.md)
                    TORCH_EXTENSIONS_DIR=str(tmp_path / "torch_extensions"), **env_extra)
    cmd = [accelerate, "launch", "--config_file", str(ROOT / "configs/accelerate" / launch_config),
           "--main_process_port", str(free_port()), "-m", "grpo.cli", "train",
           "--config", str(ROOT / "configs/tiny_cpu.yaml"), "--max-steps", str(STEPS),
           "--tpf-every", str(EVERY), "--output-dir", str(out), "--set", "save_steps=1000",
           "--set", f"probe_size={PROBE_SIZE}"]
    code, log = launch(cmd, tmp_path / "launch.log", env)
    assert code == 0, log[-4000:]
    assert set(stages(log).values()) == {"finished"} and set(stages(log)) == {"0", "1"}

    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [e["step"] for e in history if "reward" in e]
    assert steps == list(range(1, STEPS + 1))  # one writer: each step once
    config = json.loads((out / "run_config.json").read_text())
    assert config["per_device_train_batch_size"] == 32
    # rollouts came from engines holding the trained weights on both ranks (metrics are gathered over ranks)
    assert all(e["sampling/importance_sampling_ratio/min"] > 0.99 for e in history if "reward" in e)
    drift = [json.loads(line) for line in (out / "tpf_drift.jsonl").read_text().splitlines()]
    assert [d["step"] for d in drift] == [0, EVERY, STEPS]
    assert all(d["ranks"] == 2 and d["n"] == PROBE_SIZE for d in drift)  # each rank decoded a shard
