"""`gravity-grpo train --dry-run` (grpo.training.preflight): every check runs without training; problems are
collected into one ConfigError; TRL's batch rules apply as for N launched processes."""
from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers_cli import refused
from helpers_env import child_env

from grpo.training.preflight import preflight
from grpo.yaml_config import ConfigError

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "configs" / "tiny_cpu.yaml"
PAPER = ROOT / "configs" / "gravityocr_grpo.yaml"


def test_tiny_demo_would_start():
    report = preflight(TINY)
    assert report.ok, report.problems
    assert report.facts["per optimizer step"].startswith("4 prompts x 8 generations = 32 completions")
    assert report.facts["steps per epoch"].startswith("60 ")  # 240 rows / 4 prompts per step
    assert "TPF probe cost" in report.facts
    report.raise_for_problems()  # no-op


def test_indivisible_num_generations_names_the_key():
    report = preflight(TINY, {"num_generations": 7})
    assert not report.ok
    assert any("num_generations (7)" in p for p in report.problems)
    with pytest.raises(ConfigError, match="num_generations"):
        report.raise_for_problems()


def test_paper_recipe_on_8_processes_shows_672_and_lists_the_placeholders():
    report = preflight(PAPER, num_processes=8)
    assert report.facts["per optimizer step"].startswith("24 prompts x 28 generations = 672 completions")
    assert "8 processes" in report.notes[0]  # local GPU / bf16 not checked for another cluster
    text = "\n".join(report.problems)
    assert "checkpoints/gravityocr-joint" in text and "pools/mined" in text and "pools/tpf-probe" in text
    assert "bf16" not in text and "CUDA" not in text


def test_divisibility_follows_the_process_count():
    # 12 per device x 1 accumulation step: 12 completions per step on 1 process cannot hold groups of 24,
    # 96 on 8 processes can (TRL's rule: generation_batch_size % num_generations == 0).
    values = {"num_generations": 24, "gradient_accumulation_steps": 1}
    one = preflight(PAPER, values, num_processes=1)
    eight = preflight(PAPER, values, num_processes=8)
    assert any("num_generations (24)" in p for p in one.problems)
    assert not any("num_generations" in p for p in eight.problems)
    assert eight.facts["per optimizer step"].startswith("4 prompts x 24 generations = 96")


def test_pool_with_an_unknown_task_names_the_row(tmp_path):
    rows = [{"prompt": "Text Recognition:", "target": "a", "task_type": "text"},
            {"prompt": "Text Recognition:", "target": "b", "task_type": "poetry"},
            {"prompt": "Table Recognition:", "target": "<table></table>", "task_type": "table"}]
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = preflight(TINY, {"pool": str(pool)})
    [problem] = report.problems
    assert "line 2: unknown task_type 'poetry'" in problem  # a jsonl row is named by its file line (issue 17)


def test_deepspeed_launch_config_needs_deepspeed():
    report = preflight(TINY, accelerate_config=ROOT / "configs" / "accelerate" / "zero3.yaml")
    if importlib.util.find_spec("deepspeed") is None:
        assert any("deepspeed is not installed" in p for p in report.problems)
    else:
        assert report.facts["launcher"] == "DeepSpeed ZeRO-3"


def test_vllm_for_a_glm_ocr_it_would_load_wrong_is_refused(tmp_path):
    from helpers_models import build_glmocr_checkpoint

    ckpt = build_glmocr_checkpoint(tmp_path / "glm")  # text MLP 128 wide, vision merger 192: vLLM loads it wrong
    report = preflight(TINY, {"model": str(ckpt), "tpf_every": 0})
    expected = ("torchvision does not import" if importlib.util.find_spec("torchvision") is None
                else "text_config.intermediate_size = 128 but vision_config.out_hidden_size x in_channels = 192")
    assert any(p.startswith("engine: ") and expected in p for p in report.problems), report.problems


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = child_env(HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "grpo.cli", "train", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cli_dry_run_exit_codes():
    ok = _cli("--config", str(TINY), "--dry-run")
    assert ok.returncode == 0, ok.stderr
    assert "4 prompts x 8 generations = 32 completions" in ok.stdout
    bad = _cli("--config", str(TINY), "--dry-run", "--set", "num_generations=7")
    assert bad.returncode == 2
    assert "num_generations" in bad.stdout + bad.stderr and "Traceback" not in bad.stderr
    paper = _cli("--config", str(PAPER), "--dry-run", "--num-processes", "8")
    assert paper.returncode == 2 and "24 prompts x 28 generations = 672 completions" in paper.stdout


def _closed_port() -> int:
    """A local port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_dry_run_and_run_name_a_bad_value_and_the_machine_problems_at_once(tmp_path, capsys):
    """Check `dry-run-all`: the demo recipe (use_cpu: true) with server mode, QLoRA and a negative learning rate
    names all four problems in one refusal, exit 2; the run refuses with the same lines and writes nothing."""
    argv = ["train", "--config", str(TINY), "--output-dir", str(tmp_path / "run"), "--learning-rate", "-1",
            "--set", "vllm_mode=server", "--set", "vllm_server_host=127.0.0.1", "--set",
            f"vllm_server_port={_closed_port()}", "--set", "use_peft=true", "--set", "load_in_4bit=true"]
    culprits = ("the run would not start (4 problem(s))", "learning_rate must be a number >= 0, got -1.0",
                "engine: vllm_mode 'server' needs CUDA to train", "engine: no vLLM server answers at http://127.0.0.1:",
                "training: load_in_4bit (QLoRA) needs CUDA")
    dry = refused(capsys, [*argv, "--dry-run"], *culprits)
    assert refused(capsys, argv, *culprits) == dry
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("values, named, skipped", [
    ({"vllm_mode": "server", "vllm_server_host": "127.0.0.1", "vllm_server_port": 70_000},
     "vllm_server_port must be an integer in [1, 65535]", "is not a server URL"),
    ({"max_completion_length": 10 ** 6}, "max_completion_length must be an integer in [1, ",
     "longer than the context"),
    ({"vllm_self_speculation": True, "vllm_max_model_length": 0}, "vllm_max_model_length must be an integer in [1, ",
     "do not fit in the context"),
])
def test_a_check_that_reads_a_refused_value_is_skipped_and_the_others_run(values, named, skipped):
    """A refused value is named once: the check that reads it is skipped (it would name it again, differently),
    while every check that does not read it still runs (here: QLoRA on CPU)."""
    report = preflight(TINY, {**values, "use_peft": True, "load_in_4bit": True})
    assert any(named in p for p in report.problems), report.problems
    assert not any(skipped in p for p in report.problems), report.problems
    assert any(p.startswith("training: load_in_4bit (QLoRA) needs CUDA") for p in report.problems), report.problems


@pytest.mark.parametrize("compare, first, later", [("always", 2 + 8, 2 + 8), ("first", 2 + 8, 2), ("never", 2, 2),
                                                   ("sample", 2 + 6, 2 + 6)])
def test_probe_cost_counts_the_ar_check_only_where_it_runs(compare, first, later):
    """4 prompts x 2 tokens at TPF 4: 2 self-spec forwards; AR greedy adds 8 where tpf_compare_ar runs it (6 for
    the 3 prompts of 'sample')."""
    from grpo.training.config import load_config
    from grpo.training.report import probe_facts

    cfg = load_config(None, {"output_dir": "/tmp/unused", "use_cpu": True, "probe_size": 4, "tpf_max_new_tokens": 2,
                             "tpf_every": 5, "max_steps": 10, "tpf_compare_ar": compare, "tpf_compare_ar_k": 3,
                             "tpf_samples": 0})
    text = probe_facts(cfg, 1, tpf=4.0)["TPF probe cost"]
    assert text.startswith(f"<= {first} batch-1 forwards at step 0 and {later} per later probe")


def test_engine_self_speculation_passes_the_run_check_on_text_and_glm_ocr():
    for config in (TINY, ROOT / "configs" / "tiny_vlm_cpu.yaml"):
        report = preflight(config, {"vllm_self_speculation": True})
        assert not any("vllm_self_speculation" in p for p in report.problems), report.problems
