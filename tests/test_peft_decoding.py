"""The decoders through a LoRA-wrapped GLM-OCR (issue 13, item 2): 3-D rope positions are found under peft's
wrappers, so self-speculative and AR decoding of a fresh adapter (weights equal to the base) give the base
model's AR greedy output token for token."""
from __future__ import annotations

import pytest
import torch

from grpo.decoding.kv_session import Session, stop_token_ids
from grpo.decoding.selfspec import SelfSpecDecoder, ar_generate
from grpo.prompting import encode_prompt
from helpers_models import glm_with_image_rows

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword")

MAX_NEW = 32


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    prompts = [("Text Recognition:", "Table Recognition:")[i % 2] for i in range(4)]
    ckpt, processor, rows = glm_with_image_rows(tmp_path_factory.mktemp("vlm"), prompts, seed=1)
    return ckpt, [encode_prompt(processor, row, True) for row in rows]


def _lora(model):
    """A fresh LoRA on every linear layer of the language model; peft's B = 0 init leaves the weights equal."""
    import copy

    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                        task_type="CAUSAL_LM", init_lora_weights=True)
    return get_peft_model(copy.deepcopy(model), config).eval()


def test_session_finds_mrope_under_peft(glm):
    ckpt, _ = glm
    peft_model = _lora(ckpt.model)
    assert Session(ckpt.model).mrope and Session(peft_model).mrope


@torch.inference_mode()
def test_selfspec_through_peft_equals_base_ar_greedy(glm):
    ckpt, inputs = glm
    stops = stop_token_ids(ckpt.model, ckpt.processor)
    peft_model = _lora(ckpt.model)
    decoder = SelfSpecDecoder(peft_model, ckpt.bd.mask_id, ckpt.bd.bd_size, stops, MAX_NEW)
    varied = set()
    for x in inputs:
        reference = ar_generate(ckpt.model, x, stops, MAX_NEW).tokens
        varied.add(tuple(reference))
        assert ar_generate(peft_model, x, stops, MAX_NEW).tokens == reference
        assert decoder.generate(x).tokens == reference
    assert len(varied) > 1  # the images matter: a 1-D position bug would show on some of them
