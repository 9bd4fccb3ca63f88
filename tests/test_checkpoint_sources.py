"""Any checkpoint a user has (issue 24): a hub id from the hub cache, a LoRA checkpoint merged into the base its
adapter config names, metadata carried into saves byte for byte, and LoopMDM checkpoints refused by name."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from grpo.block_diffusion import BD_FILE
from grpo.checkpoint import load_checkpoint
from grpo.errors import CheckpointError
from grpo.model_source import TINY_MODEL, copy_metadata, locate, resolve_model
from helpers_cli import refused
from helpers_env import child_env

HUB_ID = "acme/tiny-gravity"
RECIPE = TINY_MODEL.parents[2] / "configs" / "tiny_cpu.yaml"  # a CPU recipe: the dry run checks this machine
COMMIT = "0" * 40


def hub_cache_copy(home, repo_id: str = HUB_ID):
    """`home` as an HF_HOME whose hub cache holds the tiny default as `repo_id` (the layout huggingface_hub
    writes: blobs are not needed, a snapshot folder and refs/main suffice)."""
    repo = home / "hub" / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(TINY_MODEL, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return repo / "snapshots" / COMMIT


def test_hub_id_from_the_cache_offline(tmp_path):
    """Check `hub-id`: `tpf --model acme/tiny-gravity` and `train --model acme/tiny-gravity --dry-run` exit 0
    with HF_HOME holding a hub-cache copy and HF_HUB_OFFLINE=1; each says what it loaded."""
    snapshot = hub_cache_copy(tmp_path / "hf")
    env = child_env(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1", COLUMNS="200")
    commands = (["tpf", "--model", HUB_ID, "--pool", "tiny-probe", "--limit", "2", "--max-new-tokens", "16"],
                ["train", "--config", str(RECIPE), "--model", HUB_ID, "--dry-run"])
    for argv in commands:
        done = subprocess.run([sys.executable, "-m", "grpo.cli", *argv], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"{HUB_ID} (hub cache: {snapshot}" in " ".join(done.stdout.split()), done.stdout


def test_unknown_hub_id_offline_is_named(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(CheckpointError, match=r"model 'acme/nowhere': no local folder of that name.*HF_HUB_OFFLINE"):
        locate("acme/nowhere")
    with pytest.raises(CheckpointError, match="no Hugging Face checkpoint"):
        locate(tmp_path / "no" / "such" / "folder")  # a path, not an id: never sent to the hub


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory):
    """LoRA adapters on the tiny default with non-zero B matrices, saved as GRPO saves them: adapters,
    tokenizer and the source's metadata; the base named by its absolute path."""
    from peft import LoraConfig, get_peft_model

    folder = tmp_path_factory.mktemp("lora")
    base = load_checkpoint("tiny")
    model = get_peft_model(base.model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    model.save_pretrained(folder)
    base.processor.save_pretrained(folder)
    copy_metadata(TINY_MODEL, folder)
    return folder


def test_lora_checkpoint_loads_merged(lora_dir):
    from peft import PeftModel

    source = locate(lora_dir)
    assert source.base == TINY_MODEL and resolve_model(lora_dir) == TINY_MODEL
    assert source.describe() == f"LoRA adapters {lora_dir} merged into {TINY_MODEL}"
    ckpt = load_checkpoint(lora_dir, need_drafter=True)
    expected = PeftModel.from_pretrained(load_checkpoint("tiny").model, lora_dir).merge_and_unload().state_dict()
    got = ckpt.model.state_dict()
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in got)
    assert not all(torch.equal(got[k], v) for k, v in load_checkpoint("tiny").model.state_dict().items())
    assert ckpt.bd.source == lora_dir / BD_FILE


def test_lora_without_base_is_named(lora_dir, tmp_path):
    folder = tmp_path / "adapter"
    shutil.copytree(lora_dir, folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": None}))
    with pytest.raises(CheckpointError, match=r"adapter_config.json: field 'base_model_name_or_path' is empty"):
        load_checkpoint(folder)


def test_copy_metadata_keeps_every_key_as_written(tmp_path):
    source = tmp_path / "source"
    shutil.copytree(TINY_MODEL, source)
    text = '{"bd_size": 16, "mask_id": 2, "loop_smax": 8, "draft_steps": 1,\n "note": "kept"}\n'
    (source / BD_FILE).write_text(text)
    (source / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    out = tmp_path / "out"
    out.mkdir()
    (out / "tokenizer.json").write_text("written by the save")
    (out / "generation_config.json").write_text("{}")
    copied = copy_metadata(source, out)
    assert (out / BD_FILE).read_text() == text
    assert (out / "generation_config.json").read_bytes() == (source / "generation_config.json").read_bytes()
    assert (out / "chat_template.jinja").read_text() == "{{ messages[0]['content'] }}"
    assert (out / "tokenizer.json").read_text() == "written by the save"  # the save's own file stays
    assert "tokenizer.json" not in copied and BD_FILE in copied
    assert load_checkpoint(source, need_drafter=True).bd.bd_size == 16


def _looped(tmp_path):
    folder = tmp_path / "looped"
    shutil.copytree(TINY_MODEL, folder)
    bd = json.loads((folder / BD_FILE).read_text())
    (folder / BD_FILE).write_text(json.dumps({**bd, "loop_enabled": True, "loop_start": 2, "loop_smax": 8}))
    return folder


def test_loop_enabled_is_refused_wherever_a_checkpoint_is_loaded(tmp_path, lora_dir, capsys):
    folder = _looped(tmp_path)
    for load in (locate, resolve_model, load_checkpoint, lambda f: load_checkpoint(f, need_drafter=True)):
        with pytest.raises(CheckpointError, match=rf"{BD_FILE}: field 'loop_enabled' is true \(LoopMDM"):
            load(folder)
    adapter = tmp_path / "looped_lora"  # beside LoRA adapters too
    shutil.copytree(lora_dir, adapter)
    shutil.copyfile(folder / BD_FILE, adapter / BD_FILE)
    with pytest.raises(CheckpointError, match="loop_enabled"):
        load_checkpoint(adapter)
    refused(capsys, ["train", "--model", str(folder), "--dry-run"], f"{folder / BD_FILE}", "loop_enabled")
    refused(capsys, ["tpf", "--model", str(folder), "--pool", "tiny-probe"], f"{folder / BD_FILE}", "loop_enabled")
