"""The vision-language path on CPU: GRPO on a tiny random GlmOcrForConditionalGeneration with image + task
prompts, rollouts from TRL's HF generation, and the TPF probe decoding with images; what vLLM is refused
for, and the BOS case of TRL's two tokenizations (through vLLM: tests/test_vlm_vllm.py).

GLM-OCR's processor (`Glm46VProcessor`) requires a video processor, which needs torchvision; the image path
does not. `ImageOnlyGlmProcessor` is that same transformers class without the video slot, with
transformers' own PIL-backed GLM image processor: the real image preprocessing and image-token expansion.
"""
from __future__ import annotations


import pytest
import torch

from grpo.errors import UserError
from helpers_models import GLM_SPECIAL_TOKENS, IMAGE_TOKENS, build_glmocr_checkpoint, write_image_pool

pytestmark = pytest.mark.slow

# one user turn: the image (as GLM-OCR places it) then the task prompt
CHAT_TEMPLATE = (
    "{%- for m in messages -%}{%- if m.content is string -%}{{ m.content }}{%- else -%}"
    "{%- for p in m.content -%}{%- if p.type == 'image' -%}<|begin_of_image|><|image|><|end_of_image|>"
    "{%- elif p.type == 'text' -%}{{ p.text }}{%- endif -%}{%- endfor -%}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}\n{%- endif -%}")


def image_only_processor(tokenizer):
    from transformers.models.glm46v.image_processing_pil_glm46v import Glm46VImageProcessorPil
    from transformers.models.glm46v.processing_glm46v import Glm46VProcessor

    class ImageOnlyGlmProcessor(Glm46VProcessor):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    # the tiny vision tower: 2-pixel patches, 2x2 merge, one frame
    images = Glm46VImageProcessorPil(patch_size=2, temporal_patch_size=1, merge_size=2,
                                     size={"shortest_edge": 64, "longest_edge": 1024})
    return ImageOnlyGlmProcessor(image_processor=images, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm")
    ckpt_dir = build_glmocr_checkpoint(root / "ckpt")
    pool = write_image_pool(root)
    return ckpt_dir, pool, root


def test_vlm_grpo_with_hf_generation_and_image_probe(vlm):
    from grpo.pool import as_prompts, load_pool
    from grpo.checkpoint import load_checkpoint
    from grpo.training.config import load_config
    from grpo.evaluation.probe import TpfProbeCallback
    from grpo.rollouts.backend import RolloutBackend
    from grpo.training.trainer import GravityGRPOTrainer
    from ocr_rewards import ocr_reward

    ckpt_dir, pool_path, root = vlm
    ckpt = load_checkpoint(ckpt_dir, need_drafter=True)
    assert ckpt.is_vlm
    processor = image_only_processor(ckpt.processor)
    before = {k: v.clone() for k, v in ckpt.model.state_dict().items()}
    pool = load_pool(str(pool_path))
    # A random model emits any token; an image token inside a completion breaks GLM-OCR's 3D positions
    # (a trained model never writes one or another template token), so the rollouts may not sample them.
    template_tokens = processor.tokenizer.convert_tokens_to_ids(list(GLM_SPECIAL_TOKENS))
    config = load_config(None, dict(generation_kwargs={"suppress_tokens": template_tokens},
        output_dir=str(root / "run"), max_steps=2, per_device_train_batch_size=6, num_generations=2,
        max_completion_length=8, use_vllm=False, logging_steps=1, learning_rate=1e-2, tpf_every=1,
        tpf_max_new_tokens=8, bf16=False, use_cpu=True, gradient_checkpointing=False, save_strategy="no",
        report_to="none", seed=0))
    trainer = GravityGRPOTrainer(model=ckpt.model, reward_funcs=ocr_reward, args=config,
                                 train_dataset=as_prompts(pool, is_vlm=True), processing_class=processor,
                                 rollouts=RolloutBackend(config, ckpt), block_diffusion=ckpt.bd)
    trainer.add_callback(TpfProbeCallback(trainer, pool, ckpt.bd, is_vlm=True))
    trainer.train()

    history = trainer.state.log_history
    trained = [e for e in history if "loss" in e]
    assert [e["step"] for e in trained] == [1, 2]
    assert all(0 <= e["reward"] <= 1 for e in trained)
    assert {"ocr/table/reward", "ocr/text/reward", "ocr/formula/reward"} <= {k for e in trained for k in e}
    assert [e["step"] for e in history if "tpf/mean" in e] == [0, 1, 2]
    assert all(e["tpf/ar_equal_rate"] == 1.0 for e in history if "tpf/mean" in e)  # fp32 self-spec == AR
    assert any(e["grad_norm"] > 0 for e in trained), trained  # a step whose groups all tie has none
    assert any(not torch.equal(v, before[k]) for k, v in trainer.model.state_dict().items())


def test_vllm_refuses_a_glm_ocr_it_would_load_wrong_with_the_reason(vlm, tmp_path):
    """The tiny model here has a 128-wide text MLP and a 192-wide vision merger: vLLM would size the merger
    by the first (grpo.rollouts.engine.check_vlm_for_vllm). Without torchvision the reason is torchvision."""
    import importlib.util

    from grpo.training.config import ConfigError, load_config
    from grpo.training.run import build_trainer

    ckpt_dir, pool_path, _ = vlm
    config = load_config(None, dict(model=str(ckpt_dir), pool=str(pool_path), probe_set=str(pool_path),
                                    output_dir=str(tmp_path), use_vllm=True, bf16=False, use_cpu=True,
                                    per_device_train_batch_size=2, num_generations=2))
    if importlib.util.find_spec("torchvision") is None:
        with pytest.raises(ConfigError, match="vLLM cannot load GLM-OCR here; torchvision does not import.*make setup"):
            build_trainer(config)
    else:
        with pytest.raises(UserError, match=r"config.json: text_config.intermediate_size = 128 but .* = 192"):
            build_trainer(config)


def _bos_processor(folder, template_bos: bool, tokenizer_bos: bool):
    """GLM's processor over a character tokenizer whose post-processor may add `<bos>`, with a chat template
    that may start with it."""
    from tokenizers import processors

    from helpers_models import GLM_CHAT_TEMPLATE, build_char_tokenizer, build_glm_processor

    tok = build_char_tokenizer(folder, extra_special=("<bos>", *IMAGE_TOKENS))
    if tokenizer_bos:
        bos = tok.convert_tokens_to_ids("<bos>")
        tok._tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A",
                                                                      special_tokens=[("<bos>", bos)])
        tok.bos_token = "<bos>"
        assert tok("ab")["input_ids"][0] == bos
    processor = build_glm_processor(tok)
    processor.chat_template = ("<bos>" if template_bos else "") + GLM_CHAT_TEMPLATE
    return processor


@pytest.mark.parametrize("template_bos, tokenizer_bos, aligned", [
    (True, True, False),    # the template writes BOS and the tokenizer adds it again on TRL's second call
    (False, False, True),   # GLM-OCR's case: "[gMASK]<sop>" in the template, nothing added
    (True, False, True),
])
def test_prompt_ids_and_mm_token_type_ids_agree_or_are_refused(tmp_path, template_bos, tokenizer_bos, aligned):
    from grpo.prompting import user_turn
    from grpo.rollouts.image_prompts import PromptAlignmentError, check_prompt_alignment
    from helpers_models import random_image

    processor = _bos_processor(tmp_path, template_bos, tokenizer_bos)
    row = {"prompt": user_turn("Text Recognition:"), "image": random_image(torch.Generator().manual_seed(0), 16, 16)}
    if aligned:
        check_prompt_alignment(processor, row)
    else:
        with pytest.raises(PromptAlignmentError, match=r"to (\d+) ids through its chat template but to (?!\1)\d+ .*"
                                                       r"adds \['<bos>'\] \(BOS token '<bos>'\)"):
            check_prompt_alignment(processor, row)


def test_committed_tiny_vlm_speaks_glm_ocrs_template(tmp_path):
    """data/tiny/vlm/model: GLM-OCR's chat template (the generation prompt ends `<|assistant|>` and a newline) and
    added tokens, one token each, special where GLM-OCR's tokenizer marks them (`<think>`, `<|image|>`, `<|video|>`,
    `<|begin_of_video|>`, the box and the tool tags are not); `enable_thinking=False` adds `/nothink` to the user
    turn and an empty think block to the generation prompt; TRL's two tokenizations agree on it; a tokenizer that also adds `[gMASK]<sop>` on plain text is
    refused with the fix."""
    from tokenizers import processors

    from grpo.checkpoint import load_checkpoint
    from grpo.model_source import TINY_MODEL
    from grpo.prompting import user_turn
    from grpo.rollouts.image_prompts import PromptAlignmentError, check_prompt_alignment
    from helpers_models import GLM_CHAT_TEMPLATE, GLM_PLAIN_TOKENS, random_image

    processor = load_checkpoint(TINY_MODEL.parent / "vlm" / "model").processor
    tok = processor.tokenizer
    assert processor.chat_template == GLM_CHAT_TEMPLATE
    assert all(len(tok(t, add_special_tokens=False)["input_ids"]) == 1 for t in GLM_SPECIAL_TOKENS)
    special = {t.content: t.special for t in tok.added_tokens_decoder.values()}
    assert {t for t in GLM_SPECIAL_TOKENS if not special[t]} == GLM_PLAIN_TOKENS == {
        "<think>", "</think>", "<|image|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
        "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<|video|>", "<|begin_of_video|>",
        "<|begin_of_box|>", "<|end_of_box|>"}
    think = tok("<think>\n</think>\nHi", add_special_tokens=False)["input_ids"]
    assert tok.decode(think + [tok.eos_token_id], skip_special_tokens=True) == "<think>\n</think>\nHi"
    image = random_image(torch.Generator().manual_seed(0), 16, 16)
    text = processor.apply_chat_template([user_turn("Text Recognition:", image)], add_generation_prompt=True,
                                         tokenize=False)
    assert text == ["[gMASK]<sop><|user|>\n<|begin_of_image|><|image|><|end_of_image|>Text Recognition:<|assistant|>\n"]
    quiet = processor.apply_chat_template([user_turn("Text Recognition:", image)], add_generation_prompt=True,
                                          tokenize=False, enable_thinking=False)
    assert quiet == [text[0].replace("Recognition:<|assistant|>\n",
                                     "Recognition:/nothink<|assistant|>\n<think></think>\n")]
    ids = processor.apply_chat_template([user_turn("Text Recognition:", image)], add_generation_prompt=True,
                                        tokenize=True)[0]
    assert tok.convert_ids_to_tokens(ids[-2:]) == ["<|assistant|>", "\n"]
    row = {"prompt": user_turn("Text Recognition:"), "image": image}
    check_prompt_alignment(processor, row)

    prefix = tok.convert_tokens_to_ids(["[gMASK]", "<sop>"])
    tok._tokenizer.post_processor = processors.TemplateProcessing(
        single="[gMASK] <sop> $A", special_tokens=list(zip(["[gMASK]", "<sop>"], prefix)))
    with pytest.raises(PromptAlignmentError, match=r"writes \['\[gMASK\]', '<sop>'\] and the tokenizer adds them "
                                                   r"again.*starts with them twice.*post_processor"):
        check_prompt_alignment(processor, row)


@pytest.mark.parametrize("text, vision, message", [
    ({"intermediate_size": 128}, {"out_hidden_size": 64, "in_channels": 3, "temporal_patch_size": 2},
     r"text_config.intermediate_size = 128 but vision_config.out_hidden_size x in_channels = 192"),
    ({"intermediate_size": 192}, {"out_hidden_size": 64, "in_channels": 3, "temporal_patch_size": 1},
     r"vision_config.temporal_patch_size = 1; vLLM's GLM-OCR code needs 2"),
])
def test_configs_vllm_would_serve_wrong_are_refused_by_name(tmp_path, text, vision, message):
    import json

    from grpo.errors import CheckpointError
    from grpo.rollouts.engine import check_vlm_for_vllm

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "glm_ocr", "text_config": text,
                                                      "vision_config": vision}))
    with pytest.raises(CheckpointError, match=rf"config.json: {message}"):
        check_vlm_for_vllm(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "glm_ocr", "text_config": {
        **text, "intermediate_size": 192}, "vision_config": {**vision, "temporal_patch_size": 2}}))
    check_vlm_for_vllm(tmp_path)  # GLM-OCR's shape: accepted
