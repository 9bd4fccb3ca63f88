"""The decoders through a LoRA-wrapped GLM-OCR (issue 13, item 2): 3-D rope positions are found under peft's
wrappers, so self-speculative and AR decoding of a fresh adapter (weights equal to the base) give the base
model's AR greedy output token for token."""
from __future__ import annotations

import pytest
import torch
from PIL import Image

from grpo.checkpoint import load_checkpoint
from grpo.decoding.kv_session import Session, stop_token_ids
from grpo.decoding.selfspec import SelfSpecDecoder, ar_generate
from grpo.prompting import encode_prompt
from helpers_models import build_glm_processor, build_glmocr_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword")

MAX_NEW = 32


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    ckpt = load_checkpoint(build_glmocr_checkpoint(tmp_path_factory.mktemp("vlm")), need_drafter=True)
    processor = build_glm_processor(ckpt.processor)
    gen = torch.Generator().manual_seed(1)
    inputs = []
    for i in range(4):
        size = (8 + 4 * i, 12)
        pixels = torch.randint(0, 256, (size[1], size[0], 3), generator=gen, dtype=torch.uint8).numpy()
        row = {"prompt": ("Text Recognition:", "Table Recognition:")[i % 2], "image": Image.fromarray(pixels)}
        inputs.append(encode_prompt(processor, row, True))
    return ckpt, inputs


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
