"""Tiny random joint checkpoints built locally (no downloads), for tests.

- `build_text_checkpoint(dir)`: a Llama-family causal LM with a character-level tokenizer
  (`tokenizers` WordLevel wrapped in PreTrainedTokenizerFast, saved and reloaded), made joint with
  `add_mask_token` + `save_joint_checkpoint`. (Llama, not Qwen2: transformers 5 loads any `qwen2`
  checkpoint's tokenizer as Qwen2Tokenizer, which rebuilds a byte-level BPE and ignores a custom
  tokenizer.json.)
- `build_glmocr_checkpoint(dir)`: a tiny `GlmOcrForConditionalGeneration` (vision tower + M-RoPE text
  decoder) with the same kind of tokenizer plus GLM-OCR's image tokens.
- `build_vllm_glmocr(dir)`: that model shaped so vLLM serves it as transformers runs it, with the full
  torchvision-backed processor; `build_tiny_vlm(root)` the committed data/tiny/vlm (model, pool, probe).
- `build_glm_processor(tokenizer)`: GLM-OCR's real `Glm46VProcessor` around the PIL image processor and
  GLM-OCR's chat template (tests/glm_ocr_chat_template.jinja), for `encode_prompt`.
"""
from __future__ import annotations

import string
from pathlib import Path
from unittest import mock

import torch

EOS = "<|endoftext|>"
IMAGE_TOKENS = ("<|image|>", "<|begin_of_image|>", "<|end_of_image|>", "<|video|>",
                "<|begin_of_video|>", "<|end_of_video|>")
# GLM-OCR's special tokens (its tokenizer_config.json `extra_special_tokens`, after `<|endoftext|>`): the
# prompt prefix, role, image/video, audio, code, reasoning, tool and box tokens.
GLM_SPECIAL_TOKENS = (
    "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
    "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>", "<|begin_of_audio|>",
    "<|end_of_audio|>", "<|begin_of_transcription|>", "<|end_of_transcription|>", "<|code_prefix|>",
    "<|code_middle|>", "<|code_suffix|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
    "</tool_response>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "/nothink", "<|begin_of_box|>",
    "<|end_of_box|>", "<|image|>", "<|video|>")
# Of those, the ones GLM-OCR's tokenizer does not mark special (`skip_special_tokens` keeps them in decoded text;
# its tokenizer_config.json `added_tokens_decoder`, `"special": false`).
GLM_PLAIN_TOKENS = frozenset({"<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
                              "</tool_response>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
                              "<|image|>", "<|video|>", "<|begin_of_video|>", "<|begin_of_box|>", "<|end_of_box|>"})
# GLM-OCR's chat template (GLM-4.6V family): `[gMASK]<sop>`, `<|user|>` then the image as
# `<|begin_of_image|><|image|><|end_of_image|>` and the task prompt, then `<|assistant|>` and a newline.
GLM_CHAT_TEMPLATE = (Path(__file__).parent / "glm_ocr_chat_template.jinja").read_text()
CHARS = string.ascii_letters + string.digits + string.punctuation + " \n"


def build_char_tokenizer(out_dir: Path, extra_special: tuple[str, ...] = (), plain: frozenset = frozenset()):
    """A character-level fast tokenizer (no BOS), saved to `out_dir` and reloaded with AutoTokenizer.

    `extra_special` are added tokens, marked special except those in `plain`."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    specials = [EOS, "<unk>", *extra_special]
    vocab = {tok: i for i, tok in enumerate(specials + list(CHARS))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=EOS, unk_token="<unk>", pad_token=EOS)
    for token in extra_special:
        tok.add_tokens([AddedToken(token, special=token not in plain, normalized=False)],
                       special_tokens=token not in plain)
    tok.save_pretrained(out_dir)
    return AutoTokenizer.from_pretrained(out_dir)


def build_text_checkpoint(out_dir: Path, bd_size: int = 8, seed: int = 0, hidden: int = 64,
                          layers: int = 2, init_std: float = 0.2) -> Path:
    """Random Llama-family causal LM + `<|mask|>` + block_diffusion.json in `out_dir` (fp32).

    A large `init_std` makes the random logits peaky, so greedy argmax margins dwarf fp32 noise.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir = Path(out_dir)
    tok = build_char_tokenizer(out_dir / "_tokenizer")
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, initializer_range=init_std, tie_word_embeddings=True,
                         eos_token_id=tok.eos_token_id, bos_token_id=None)  # no pad id: its row would be zeros
    model = LlamaForCausalLM(config).eval()
    return _save_joint(model, tok, out_dir, bd_size)


def build_glmocr_checkpoint(out_dir: Path, bd_size: int = 8, seed: int = 0, init_std: float = 0.2,
                            head_dim: int = 16, temporal_patch_size: int = 1, patch_size: int = 2,
                            intermediate_size: int = 128, head_std: float | None = None, hidden: int = 64,
                            layers: int = 2, vision_depth: int = 1, vision_hidden: int = 32,
                            vision_std: float | None = None, rope_theta: float = 10000.0,
                            mrope_section: tuple[int, int, int] | None = None) -> Path:
    """Random tiny GlmOcrForConditionalGeneration + tokenizer with GLM-OCR's special tokens + `<|mask|>`, joint
    format. The vocabulary is built at its final size (`<|mask|>` included, its embedding and output rows zero),
    so no embedding resize draws rows: the weights are the same on any CPU.
    For vLLM: `head_dim` 32, 64 or 80 (its CPU attention's sizes; 32 or more for CUDA) and
    `temporal_patch_size` 2 (vLLM's GLM-4.1V code sizes images with two frames, as the real GLM-OCR has) and
    `intermediate_size` 192 (vLLM sizes the vision merger's MLP by the text MLP width, HF by 3 x the vision
    output width, 3 x 64; the real GLM-OCR has both equal, see `grpo.rollouts.engine.check_vlm_for_vllm`).
    `head_std` set: the output rows are redrawn with that std and the image tokens' rows are zero, so, as in a
    trained GLM-OCR, the image tokens get almost no probability (logit 0 among logits of std ~8 x head_std).
    `vision_std` set: every vision weight matrix is redrawn with std `vision_std / sqrt(fan-in)` (a small uniform
    std makes the patch features of a crop nearly equal, and the decoder learns to ignore them).
    `mrope_section`: rotary pairs of (temporal, height, width), summing to head_dim / 2 (None: GLM's 1:1.5:2.5)."""
    from transformers import GlmOcrConfig, GlmOcrForConditionalGeneration

    from grpo.block_diffusion import MASK_TOKEN

    out_dir = Path(out_dir)
    tok = build_char_tokenizer(out_dir / "_tokenizer", extra_special=(*GLM_SPECIAL_TOKENS, MASK_TOKEN),
                               plain=GLM_PLAIN_TOKENS)
    ids = dict(zip(IMAGE_TOKENS, tok.convert_tokens_to_ids(list(IMAGE_TOKENS))))
    torch.manual_seed(seed)
    if mrope_section is None:
        mrope_section = (head_dim // 8, 3 * head_dim // 16, head_dim // 2 - head_dim // 8 - 3 * head_dim // 16)
    config = GlmOcrConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=intermediate_size,
                         num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
                         max_position_embeddings=4096, initializer_range=init_std,
                         rope_parameters={"rope_type": "default", "rope_theta": rope_theta,
                                          "mrope_section": list(mrope_section), "partial_rotary_factor": 1.0},
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id),
        vision_config=dict(depth=vision_depth, hidden_size=vision_hidden, num_heads=2,
                           intermediate_size=2 * vision_hidden, out_hidden_size=hidden,
                           patch_size=patch_size, temporal_patch_size=temporal_patch_size, spatial_merge_size=2,
                           image_size=16),
        image_token_id=ids["<|image|>"], video_token_id=ids["<|video|>"],
        image_start_token_id=ids["<|begin_of_image|>"], image_end_token_id=ids["<|end_of_image|>"],
        video_start_token_id=ids["<|begin_of_video|>"], video_end_token_id=ids["<|end_of_video|>"],
        tie_word_embeddings=False, initializer_range=init_std)
    model = GlmOcrForConditionalGeneration(config).eval()
    mask_id = tok.convert_tokens_to_ids(MASK_TOKEN)
    with torch.no_grad():
        if vision_std is not None:
            for weight in (p for p in model.model.visual.parameters() if p.dim() > 1):
                weight.normal_(0.0, vision_std / weight[0].numel() ** 0.5)
        if head_std is not None:
            model.lm_head.weight.normal_(0.0, head_std)
            model.lm_head.weight[list(ids.values())] = 0.0
        model.get_input_embeddings().weight[mask_id] = 0.0
        model.lm_head.weight[mask_id] = 0.0
    return _save_joint(model, tok, out_dir, bd_size)


def build_glm_processor(tokenizer):
    """`Glm46VProcessor` (GLM-OCR's processor class) with the PIL image processor sized for the tiny model.

    Without torchvision, transformers cannot resolve the processor's video-processor class to type-check
    its arguments; only that check is skipped, while building. Encoding runs the real code.
    """
    from transformers import Glm46VProcessor
    from transformers.models.glm46v.image_processing_pil_glm46v import Glm46VImageProcessorPil
    from transformers.processing_utils import ProcessorMixin

    images = Glm46VImageProcessorPil(patch_size=2, temporal_patch_size=1, merge_size=2,
                                     size={"shortest_edge": 16, "longest_edge": 64 * 64})
    with mock.patch.object(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: None):
        return Glm46VProcessor(image_processor=images, tokenizer=tokenizer, video_processor=None,
                               chat_template=GLM_CHAT_TEMPLATE)


def save_full_glm_processor(ckpt_dir: Path, max_pixels: int = 1024, patch_size: int = 2,
                            temporal_patch_size: int = 2) -> None:
    """Save GLM-OCR's full `Glm46VProcessor` (torchvision-backed image and video processors, as the real
    checkpoint has) beside a `build_glmocr_checkpoint` model; needs torchvision (`make setup` provides it).
    `max_pixels` caps a crop's area after resizing: at most max_pixels / (2 * patch_size)**2 image tokens."""
    from transformers import AutoTokenizer, Glm46VImageProcessor, Glm46VProcessor
    from transformers.models.glm46v.video_processing_glm46v import Glm46VVideoProcessor

    tokenizer = AutoTokenizer.from_pretrained(ckpt_dir)
    factor = 2 * patch_size
    sizes = dict(patch_size=patch_size, temporal_patch_size=temporal_patch_size, merge_size=2)
    images = Glm46VImageProcessor(**sizes, size={"shortest_edge": factor * factor, "longest_edge": max_pixels})
    videos = Glm46VVideoProcessor(**sizes)
    Glm46VProcessor(image_processor=images, tokenizer=tokenizer, video_processor=videos,
                    chat_template=GLM_CHAT_TEMPLATE).save_pretrained(ckpt_dir)


def build_vllm_glmocr(out_dir: Path, max_pixels: int = 1024, patch_size: int = 2, intermediate_size: int = 192,
                      **kwargs) -> Path:
    """A tiny GLM-OCR joint checkpoint that vLLM serves as transformers runs it (CPU and CUDA), with the full
    processor: text head_dim 32, temporal_patch_size 2, text MLP width = vision merger width (3 x the text width),
    and image tokens that take almost no probability: vLLM bans them from rollouts
    (`RolloutBackend.generation_kwargs`), and a model that gives them mass p is scored by the loss on another
    distribution (sampling_logp_difference -log(1 - p) per token; measured up to 0.32 on a random head,
    docs/vlm.md)."""
    import shutil

    out_dir = build_glmocr_checkpoint(out_dir, head_dim=32, temporal_patch_size=2, patch_size=patch_size,
                                      intermediate_size=intermediate_size, head_std=0.6, **kwargs)
    shutil.rmtree(out_dir / "_tokenizer")
    save_full_glm_processor(out_dir, max_pixels=max_pixels, patch_size=patch_size)
    return out_dir


# The tiny GLM-OCR that reads (docs/vlm.md): one merged image token (patch 4 x merge 2 = 8 pixels) per character
# cell of the tiny world's renderer, and a pixel budget (two frames) that lets its tallest crop through
# unresized; a vision tower drawn at 1/sqrt(fan-in), so patch features differ from the first step; rope theta
# 100 with most rotary pairs on the column axis, so neighbouring columns are far apart in angle.
READING_ROWS = 12   # cell rows the budget admits unresized (the tiny world's crops take at most 8)
_READING_SHAPE = dict(patch_size=4, init_std=0.02, hidden=128, intermediate_size=384, layers=2, vision_hidden=64,
                      vision_std=1.0, rope_theta=100.0, mrope_section=(1, 1, 14), bd_size=16)


def build_reading_glmocr(out_dir: Path) -> Path:
    """The tiny GLM-OCR's init (data/tiny/vlm/model-init): `build_vllm_glmocr` in the reading shape."""
    from grpo.synthetic.render import CELL, COLUMNS

    return build_vllm_glmocr(out_dir, max_pixels=2 * COLUMNS * CELL * READING_ROWS * CELL, **_READING_SHAPE)


def build_tiny_vlm(root: Path, pool_rows: int = 24, probe_rows: int = 6) -> Path:
    """The committed tiny VLM recipe data (data/tiny/vlm, configs/tiny_vlm_smoke.yaml): `model-init/`
    (`build_reading_glmocr`; the `joint` recipes train it into `model/`), and
    `pool/` and `probe/`, rendered crops (grpo/synthetic/render.py) of the first rows of the built-in splits `tiny`
    and `tiny-probe`, saved with `save_to_disk`. Rebuild:
    `PYTHONPATH=tests python -c "from helpers_models import build_tiny_vlm; build_tiny_vlm('data/tiny/vlm')"`."""
    from grpo.synthetic.render import build_image_split

    root = Path(root)
    build_reading_glmocr(root / "model-init")
    build_image_split("tiny", pool_rows).save_to_disk(str(root / "pool"))
    build_image_split("tiny-probe", probe_rows).save_to_disk(str(root / "probe"))
    return root


def _save_joint(model, tok, out_dir: Path, bd_size: int) -> Path:
    """Stop generation at the tokenizer's EOS, add `<|mask|>` and save in the joint format."""
    from grpo.joint.mask_token import add_mask_token, save_joint_checkpoint

    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    add_mask_token(model, tok)
    save_joint_checkpoint(model, tok, out_dir, bd_size=bd_size)
    return out_dir


# (task, prompt, target) of the image pools the VLM tests train on
VLM_POOL_ROWS = (("table", "Table Recognition:", "<table><tr><td>1</td><td>2</td></tr></table>"),
                 ("text", "Text Recognition:", "north"),
                 ("formula", "Formula Recognition:", "x^{2}"))


def write_image_pool(folder: Path) -> Path:
    """`folder/pool.jsonl` over VLM_POOL_ROWS, each with its own small crop PNG (a path relative to the file)."""
    import json

    from PIL import Image, ImageDraw

    rows = []
    for i, (task, prompt, target) in enumerate(VLM_POOL_ROWS):
        image = Image.new("RGB", (24, 16), "white")
        ImageDraw.Draw(image).rectangle([2 + 4 * i, 2, 10 + 4 * i, 12], fill="black")
        image.save(Path(folder) / f"crop{i}.png")
        rows.append({"image": f"crop{i}.png", "prompt": prompt, "target": target, "task_type": task})
    pool = Path(folder) / "pool.jsonl"
    pool.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return pool


def random_image(gen: torch.Generator, width: int, height: int):
    """A PIL image of uniform random pixels."""
    from PIL import Image

    pixels = torch.randint(0, 256, (height, width, 3), generator=gen, dtype=torch.uint8).numpy()
    return Image.fromarray(pixels)


def glm_with_image_rows(folder: Path, prompts: list[str], seed: int = 0, model_seed: int = 0):
    """(loaded tiny GLM-OCR joint checkpoint drawn with `model_seed`, its GLM processor, one row per prompt with a
    random crop of 4 to 21 image tokens)."""
    from grpo.checkpoint import load_checkpoint

    ckpt = load_checkpoint(build_glmocr_checkpoint(folder, seed=model_seed), need_drafter=True)
    gen = torch.Generator().manual_seed(seed)
    rows = [{"prompt": prompt, "image": random_image(gen, 8 + 4 * (i % 5), 8 + 4 * (i % 3))}
            for i, prompt in enumerate(prompts)]
    return ckpt, build_glm_processor(ckpt.processor), rows


def sampled_logprobs(model, outs):
    """(the engine's logprobs, the policy's own) of every sampled completion in vLLM outputs `outs`, as tensors
    over the completion's tokens; the engine must have been asked for `logprobs=0`."""
    for out in outs:
        for sample in out.outputs:
            ids = torch.tensor([list(out.prompt_token_ids) + list(sample.token_ids)])
            with torch.no_grad():
                logp = model(ids).logits[0, len(out.prompt_token_ids) - 1:-1].log_softmax(-1)
            expected = logp[torch.arange(len(sample.token_ids)), list(sample.token_ids)]
            yield torch.tensor([lp[t].logprob for lp, t in zip(sample.logprobs, sample.token_ids)]), expected
