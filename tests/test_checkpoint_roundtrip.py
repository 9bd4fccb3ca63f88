"""A checkpoint GRPO saved is a checkpoint every command takes (issue 24, checks `lora-roundtrip` and
`checkpoint-lossless`): a 2-step LoRA run on the tiny default, started from a copy whose block_diffusion.json has
keys the package does not read and whose tokenizer has a chat template; its checkpoint keeps them byte for byte,
`tpf --compare-ar` decodes it AR-equal, `train --model` trains from it, `tpf-drift` re-measures the run."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from grpo.block_diffusion import BD_FILE
from grpo.model_source import TINY_MODEL
from grpo.cli import main

pytestmark = pytest.mark.slow

TINY_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "tiny_cpu.yaml"
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
SHORT = ["--set", "per_device_train_batch_size=8", "--set", "num_generations=4", "--set", "max_completion_length=48",
         "--set", "tpf_every=0", "--set", "save_steps=2", "--max-steps", "2"]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("roundtrip")
    source = root / "source"
    shutil.copytree(TINY_MODEL, source)
    bd = json.loads((source / BD_FILE).read_text())
    (source / BD_FILE).write_text(json.dumps({**bd, "loop_enabled": False, "loop_smax": 8, "trained_on": "tiny"},
                                             indent=1) + "\n")
    tokenizer_config = json.loads((source / "tokenizer_config.json").read_text())
    (source / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "chat_template": TEMPLATE}))
    run = root / "lora"
    assert main(["train", "--config", str(TINY_CONFIG), "--model", str(source), "--output-dir", str(run),
                 "--set", "use_peft=true", "--set", "lora_r=8", "--set", "lora_alpha=16", *SHORT]) == 0
    return source, run


def test_checkpoint_lossless(lora_run):
    from transformers import AutoTokenizer

    source, run = lora_run
    saved = run / "checkpoint-2"
    assert (saved / "adapter_config.json").is_file()
    assert (saved / BD_FILE).read_bytes() == (source / BD_FILE).read_bytes()
    assert (saved / "generation_config.json").read_bytes() == (source / "generation_config.json").read_bytes()
    assert AutoTokenizer.from_pretrained(saved).chat_template == TEMPLATE


def test_lora_roundtrip(lora_run, tmp_path, capsys):
    source, run = lora_run
    saved = run / "checkpoint-2"
    out = tmp_path / "tpf.json"
    assert main(["tpf", "--model", str(saved), "--pool", "tiny-probe", "--limit", "4", "--compare-ar",
                 "--max-new-tokens", "96", "--out", str(out)]) == 0
    assert f"LoRA adapters {saved} merged into {source}" in " ".join(capsys.readouterr().out.split())
    assert json.loads(out.read_text())["ar_equal_rate"] == 1.0

    again = tmp_path / "again"  # a full fine-tune from the merged LoRA checkpoint
    assert main(["train", "--config", str(TINY_CONFIG), "--model", str(saved), "--output-dir", str(again),
                 *SHORT]) == 0
    assert (again / "checkpoint-2" / "config.json").is_file()
    assert (again / "checkpoint-2" / BD_FILE).read_bytes() == (source / BD_FILE).read_bytes()

    assert main(["tpf-drift", str(run), "--probe-size", "4", "--max-new-tokens", "96"]) == 0
    records = [json.loads(line) for line in (run / "tpf_drift_checkpoints.jsonl").open()]
    assert [r["step"] for r in records] == [0, 2] and all(r["ar_equal_rate"] == 1.0 for r in records)
