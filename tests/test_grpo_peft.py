"""`use_peft: true`: LoRA GRPO with the colocated vLLM engine on CPU; the base weights stay frozen, the engine
serves the adapted policy, and the TPF probe measures the adapted weights."""
from __future__ import annotations

import json

import pytest
import torch

from helpers_models import build_text_checkpoint

pytestmark = pytest.mark.slow

ROWS = [
    {"prompt": "Text Recognition:\nthe north road", "target": "the north road", "task_type": "text"},
    {"prompt": "Formula Recognition:\na_1 + b", "target": "a_{1}+b", "task_type": "formula"},
]


def test_lora_grpo_engine_and_probe_use_the_adapted_weights(tmp_path):
    from peft import PeftModel
    from vllm import SamplingParams

    from grpo.checkpoint import load_checkpoint
    from grpo.training.config import load_config
    from grpo.decoding.tpf import measure_tpf
    from grpo.training.run import run_training

    ckpt_dir = build_text_checkpoint(tmp_path / "ckpt", hidden=128)
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    config = load_config(None, dict(
        model=str(ckpt_dir), pool=str(pool), probe_set=str(pool), probe_size=2, tpf_every=2, tpf_max_new_tokens=16,
        output_dir=str(tmp_path / "run"), max_steps=2, save_steps=2, logging_steps=1, seed=0,
        per_device_train_batch_size=8, num_generations=4, max_completion_length=16, learning_rate=0.05,
        use_peft=True, lora_r=8, lora_alpha=16, lora_dropout=0.0, use_vllm=True, vllm_max_model_length=256,
        bf16=False, use_cpu=True, gradient_checkpointing=False, report_to="none"))
    summary = run_training(config)
    trainer = summary["trainer"]
    model = trainer.model
    assert isinstance(model, PeftModel)

    base = load_checkpoint(ckpt_dir).model.state_dict()
    frozen = {name.removeprefix("base_model.model.").replace(".base_layer", ""): p
              for name, p in model.state_dict().items() if "lora_" not in name}
    assert all(torch.equal(frozen[name], base[name]) for name in base)  # LoRA: base weights untouched
    merged = load_checkpoint(summary["output_dir"] / "checkpoint-2")  # saved adapters merged into their base
    assert any(not torch.equal(p, base[name]) for name, p in merged.model.state_dict().items())

    # the engine serves the adapted policy after a sync (vLLM gets a merged copy)
    prompts = [r["prompt"] for r in ROWS]
    trainer.vllm_generation.sync_weights()
    served = trainer.vllm_generation.llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16),
                                                  use_tqdm=False)
    tokenizer = trainer.processing_class
    for prompt, output in zip(prompts, served):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        expected = merged.model.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                                         pad_token_id=tokenizer.pad_token_id)[0, ids.shape[1]:].tolist()
        assert list(output.outputs[0].token_ids) == expected[:len(output.outputs[0].token_ids)]

    # the live probe at step 2 measured the adapted weights: the merged checkpoint decodes to the same TPF
    rows = [dict(r) for r in ROWS]
    stats = measure_tpf(merged.model, merged.processor, rows, merged.bd, max_new_tokens=16, progress=False)
    live = {r["step"]: r["tpf"] for r in summary["tpf"]}
    assert sorted(live) == [0, 2]
    assert stats["tpf"] == pytest.approx(live[2])
    assert (summary["output_dir"] / "checkpoint-2" / "adapter_config.json").is_file()
    assert (summary["output_dir"] / "checkpoint-2" / "block_diffusion.json").is_file()
