"""Multi-process GRPO on CPU (issue 13): `accelerate launch` with configs/accelerate/cpu_2proc.yaml (2 processes,
gloo), a colocated in-process vLLM engine on each rank, the tiny default; the same under DeepSpeed ZeRO-3 with its
CPU accelerator (configs/accelerate/cpu_zero3_2proc.yaml). About 1 minute each on 2 cores.
The launch config says MULTI_GPU with use_cpu: accelerate's MULTI_CPU on one machine starts a single process."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from grpo.rollouts.engine import free_port
from helpers_env import child_env

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
STEPS, EVERY = 4, 2
PROBE_SIZE = 12  # 6 prompts per rank: the sharded probe is checked; the shipped 60 only cost time


@pytest.mark.parametrize("launch, env_extra", [
    ("cpu_2proc.yaml", {}),                                 # DDP: a full policy copy per rank
    ("cpu_zero3_2proc.yaml", {"DS_ACCELERATOR": "cpu"}),    # ZeRO-3: sharded weights, gathered for sync and probe
])
@pytest.mark.timeout(900)  # two processes, each with its own engine, on shared cores
def test_two_process_grpo_with_a_vllm_engine_per_rank(tmp_path, launch, env_extra):
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent))
    if accelerate is None:
        pytest.skip("accelerate's launcher is not installed beside this python")
    out = tmp_path / "dist"
    env = child_env(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                    VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind",
                    **env_extra)
    cmd = [accelerate, "launch", "--config_file", str(ROOT / "configs/accelerate" / launch),
           "--main_process_port", str(free_port()), "-m", "grpo.cli", "train",
           "--config", str(ROOT / "configs/tiny_cpu.yaml"), "--max-steps", str(STEPS),
           "--tpf-every", str(EVERY), "--output-dir", str(out), "--set", "save_steps=1000",
           "--set", f"probe_size={PROBE_SIZE}"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]

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
