"""`mine --model` takes a LoRA checkpoint (issue 24): the vLLM engine starts on the base its adapter config names
and serves the merged weights, so greedy mining equals HF greedy of the merged model."""
from __future__ import annotations

import pytest
import torch

from grpo.checkpoint import load_checkpoint
from grpo.model_source import copy_metadata
from grpo.mining.miner import MineConfig, MiningStore, mine
from helpers_models import build_text_checkpoint

pytestmark = pytest.mark.slow


def test_lora_checkpoint_mines_with_its_merged_weights(tmp_path):
    from peft import LoraConfig, get_peft_model

    from grpo.pool import load_pool

    base = build_text_checkpoint(tmp_path / "base", hidden=128)  # vLLM's CPU attention: head_dim 32
    ckpt = load_checkpoint(base)
    model = get_peft_model(ckpt.model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
    adapter = tmp_path / "lora"
    model.save_pretrained(adapter)
    ckpt.processor.save_pretrained(adapter)
    copy_metadata(base, adapter)
    pool = tmp_path / "pool.jsonl"
    load_pool("tiny").select(range(4)).to_json(str(pool))

    def records(model, out, **kw):
        mine(MineConfig(model=str(model), pool=str(pool), output_dir=str(out), num_generations=2,
                        max_completion_length=16, dtype="float32", temperature=0.0, progress=False, **kw))
        return {i: (r["rewards"], r["completion_tokens_mean"]) for i, r in MiningStore(out).read_parts().items()}

    served = records(adapter, tmp_path / "vllm")
    assert served == records(adapter, tmp_path / "hf", hf_generate=True)  # HF greedy of the merged model
    assert served != records(base, tmp_path / "mined_base", hf_generate=True)  # the adapters change what is decoded
