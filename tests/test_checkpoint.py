"""Joint checkpoint format (docs/spec.md §2): load, validate, refuse with messages that name the file and field."""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from grpo.block_diffusion import BD_FILE, MASK_TOKEN, BlockDiffusionConfig
from grpo.checkpoint import load_checkpoint
from grpo.errors import CheckpointError
from grpo.joint.mask_token import add_mask_token, save_joint_checkpoint
from grpo.model_source import TINY_MODEL, resolve_model
from helpers_models import build_char_tokenizer, build_glmocr_checkpoint, build_text_checkpoint


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    return build_text_checkpoint(tmp_path_factory.mktemp("text"), bd_size=16)


@pytest.fixture
def copy_of(text_dir, tmp_path):
    def make():
        target = tmp_path / "ckpt"
        shutil.copytree(text_dir, target)
        return target
    return make


def test_text_checkpoint_round_trip(text_dir):
    ckpt = load_checkpoint(text_dir, need_drafter=True)
    tokenizer = ckpt.processor
    assert not ckpt.is_vlm and not ckpt.model.training
    assert ckpt.bd == BlockDiffusionConfig(bd_size=16, mask_id=tokenizer.convert_tokens_to_ids(MASK_TOKEN))
    assert ckpt.bd.mask_id == len(tokenizer) - 1
    assert ckpt.model.get_input_embeddings().num_embeddings == len(tokenizer)
    assert tokenizer.decode([ckpt.bd.mask_id]) == MASK_TOKEN
    assert json.loads((text_dir / BD_FILE).read_text()) == {
        "bd_size": 16, "mask_id": ckpt.bd.mask_id, "ar_loss_weight": 1.0, "mask_schedule": "uniform"}


def test_glmocr_checkpoint_loads_as_vlm(tmp_path):
    ckpt = load_checkpoint(build_glmocr_checkpoint(tmp_path, bd_size=4), need_drafter=True, dtype=torch.float32)
    assert ckpt.is_vlm and type(ckpt.model).__name__ == "GlmOcrForConditionalGeneration"
    assert ckpt.bd.bd_size == 4
    assert ckpt.bd.mask_id == ckpt.processor.convert_tokens_to_ids("<|mask|>")
    assert ckpt.bd.mask_id < ckpt.model.get_output_embeddings().weight.shape[0] == len(ckpt.processor)


def test_missing_block_diffusion_json(copy_of):
    path = copy_of()
    (path / BD_FILE).unlink()
    assert load_checkpoint(path).bd is None
    with pytest.raises(CheckpointError, match=f"{BD_FILE} is missing.*no block-diffusion drafter"):
        load_checkpoint(path, need_drafter=True)


@pytest.mark.parametrize("mask_id", [99, 10**6, -1])
def test_mask_id_out_of_vocabulary(copy_of, mask_id):
    path = copy_of()
    bd = json.loads((path / BD_FILE).read_text())
    (path / BD_FILE).write_text(json.dumps({**bd, "mask_id": mask_id}))
    with pytest.raises(CheckpointError, match=rf"{BD_FILE}: field 'mask_id' = {mask_id} is out of vocabulary"):
        load_checkpoint(path, need_drafter=True)
    assert load_checkpoint(path).bd is None  # the causal path alone (GRPO) still loads


@pytest.mark.parametrize("content, field", [
    ({"mask_id": 3}, "bd_size"),
    ({"bd_size": 0, "mask_id": 3}, "bd_size"),
    ({"bd_size": 8, "mask_id": "3"}, "mask_id"),
    ({"bd_size": 8, "mask_id": 3, "ar_loss_weight": -1}, "ar_loss_weight"),
])
def test_invalid_fields_are_named(tmp_path, content, field):
    (tmp_path / BD_FILE).write_text(json.dumps(content))
    with pytest.raises(CheckpointError, match=rf"{BD_FILE}.*'{field}'"):
        BlockDiffusionConfig.load(tmp_path)


def test_bad_json_names_the_file(tmp_path):
    (tmp_path / BD_FILE).write_text("{bd_size: 8")
    with pytest.raises(CheckpointError, match=f"{BD_FILE}: not JSON"):
        BlockDiffusionConfig.load(tmp_path)


def test_config_save_load(tmp_path):
    bd = BlockDiffusionConfig(bd_size=32, mask_id=7, ar_loss_weight=0.5)
    bd.save(tmp_path)
    assert BlockDiffusionConfig.load(tmp_path) == bd


def test_resolve_model(tmp_path, text_dir):
    assert resolve_model(str(text_dir)) == text_dir
    if (TINY_MODEL / "config.json").is_file():
        assert resolve_model("tiny") == TINY_MODEL
    else:
        with pytest.raises(CheckpointError, match="tiny default"):
            resolve_model("tiny")
    with pytest.raises(CheckpointError, match="no Hugging Face checkpoint"):
        resolve_model(tmp_path / "nowhere")


def test_add_mask_token_is_idempotent(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_char_tokenizer(tmp_path)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2))
    old = model.get_input_embeddings().weight.detach().clone()
    mask_id = add_mask_token(model, tokenizer)
    assert mask_id == old.shape[0] and tokenizer.convert_ids_to_tokens(mask_id) == MASK_TOKEN
    new = model.get_input_embeddings().weight
    assert new.shape[0] == old.shape[0] + 1 and torch.equal(new[:-1], old)
    assert add_mask_token(model, tokenizer) == mask_id
    assert model.get_input_embeddings().num_embeddings == old.shape[0] + 1
    assert tokenizer("a" + MASK_TOKEN)["input_ids"][-1] == mask_id  # never split into characters


def test_save_without_mask_token_is_refused(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_char_tokenizer(tmp_path / "tok")
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2))
    with pytest.raises(CheckpointError, match="call add_mask_token"):
        save_joint_checkpoint(model, tokenizer, tmp_path / "out", bd_size=8)


@pytest.mark.parametrize("layout", ["processor_config.json", "preprocessor_config.json"])
def test_glmocr_processor_reloads_from_either_file(tmp_path, layout):
    """transformers 5 saves a processor as processor_config.json; older saves (and hub checkpoints) have
    preprocessor_config.json. Either reloads as GLM-OCR's processor, not as a bare tokenizer."""
    pytest.importorskip("torchvision", reason="GLM-OCR's processor needs torchvision: run `make setup`")
    from transformers import AutoProcessor

    from helpers_models import build_vllm_glmocr

    path = build_vllm_glmocr(tmp_path / "glm", max_pixels=2048)
    assert (path / "processor_config.json").is_file() and not (path / "preprocessor_config.json").exists()
    if layout == "preprocessor_config.json":
        AutoProcessor.from_pretrained(path).image_processor.save_pretrained(path)
        (path / "processor_config.json").unlink()
    ckpt = load_checkpoint(path, need_drafter=True)
    assert type(ckpt.processor).__name__ == "Glm46VProcessor"
    assert ckpt.processor.image_processor.size.longest_edge == 2048
    assert ckpt.bd.mask_id == ckpt.processor.tokenizer.convert_tokens_to_ids(MASK_TOKEN)


_NEW_ROWS = """
import sys, torch
torch.set_num_threads(int(sys.argv[1]))
sys.path.insert(0, "tests")
from helpers_models import build_char_tokenizer
from transformers import LlamaConfig, LlamaForCausalLM
from grpo.joint.mask_token import add_mask_token
torch.manual_seed(0)
tokenizer = build_char_tokenizer(sys.argv[2])
model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=32,
                                     num_hidden_layers=1, num_attention_heads=2, tie_word_embeddings=False))
mask_id = add_mask_token(model, tokenizer)
torch.save([model.get_input_embeddings().weight[mask_id:].clone(),
            model.get_output_embeddings().weight[mask_id:].clone()], sys.argv[3])
"""


def test_add_mask_token_gives_bit_equal_rows_at_any_thread_count(tmp_path):
    """Issue 42: the new rows are the mean of the old ones in one fixed order, the same in two processes with
    1 and 2 threads, and equal to the float64 mean (transformers' mean_resizing draws them from a covariance)."""
    import subprocess
    import sys

    outs = []
    for threads in (1, 2):
        out = tmp_path / f"rows{threads}.pt"
        subprocess.run([sys.executable, "-c", _NEW_ROWS, str(threads), str(tmp_path / f"tok{threads}"), str(out)],
                       check=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
        outs.append(torch.load(out))
    assert all(torch.equal(a, b) for a, b in zip(*outs))
    assert outs[0][0].shape == (1, 64) and not torch.equal(outs[0][0], outs[0][1])  # untied: each table's mean

    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    tokenizer = build_char_tokenizer(tmp_path / "tok")
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, tie_word_embeddings=False))
    expected = model.get_input_embeddings().weight.detach().double().mean(0).float()
    assert torch.allclose(outs[0][0][0], expected, atol=1e-7)


def test_diff_loss_weight_is_read_and_keeps_the_ar_term(tmp_path):
    """GravityOCR's alpha form: a block_diffusion.json with diff_loss_weight and ar_loss_weight 0 trained its AR
    path (the load warning reads `ar_trained`); ar_loss_weight 0 alone did not."""
    bd = BlockDiffusionConfig(bd_size=32, mask_id=7, ar_loss_weight=0.0, diff_loss_weight=0.3)
    assert bd.ar_trained and not BlockDiffusionConfig(bd_size=32, mask_id=7, ar_loss_weight=0.0).ar_trained
    bd.save(tmp_path)
    assert BlockDiffusionConfig.load(tmp_path).diff_loss_weight == 0.3
    assert "diff_loss_weight" not in json.loads(BlockDiffusionConfig(bd_size=8, mask_id=3).save(tmp_path).read_text())
    with pytest.raises(CheckpointError, match="field 'diff_loss_weight' must be a number >= 0, got -1"):
        BlockDiffusionConfig(bd_size=8, mask_id=3, diff_loss_weight=-1)
