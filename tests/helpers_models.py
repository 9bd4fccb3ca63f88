"""Tiny random joint checkpoints built locally (no downloads), for tests.

- `build_text_checkpoint(dir)`: a Llama-family causal LM with a character-level tokenizer
  (`tokenizers` WordLevel wrapped in PreTrainedTokenizerFast, saved and reloaded), made joint with
  `add_mask_token` + `save_joint_checkpoint`. (Llama, not Qwen2: transformers 5 loads any `qwen2`
  checkpoint's tokenizer as Qwen2Tokenizer, which rebuilds a byte-level BPE and ignores a custom
  tokenizer.json.)
- `build_glmocr_checkpoint(dir)`: a tiny `GlmOcrForConditionalGeneration` (vision tower + M-RoPE text
  decoder) with the same kind of tokenizer plus GLM-OCR's image tokens.
- `glmocr_inputs(model, tokenizer, text, grid)`: prompt inputs with one image, built directly (the real
  processor needs torchvision).
"""
from __future__ import annotations

import string
from pathlib import Path

import torch

EOS = "<|endoftext|>"
IMAGE_TOKENS = ("<|image|>", "<|begin_of_image|>", "<|end_of_image|>", "<|video|>",
                "<|begin_of_video|>", "<|end_of_video|>")
CHARS = string.ascii_letters + string.digits + string.punctuation + " \n"


def build_char_tokenizer(out_dir: Path, extra_special: tuple[str, ...] = ()):
    """A character-level fast tokenizer (no BOS), saved to `out_dir` and reloaded with AutoTokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    specials = [EOS, "<unk>", *extra_special]
    vocab = {tok: i for i, tok in enumerate(specials + list(CHARS))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=EOS, unk_token="<unk>", pad_token=EOS)
    if extra_special:
        tok.add_tokens(list(extra_special), special_tokens=True)
    tok.save_pretrained(out_dir)
    return AutoTokenizer.from_pretrained(out_dir)


def build_text_checkpoint(out_dir: Path, bd_size: int = 8, seed: int = 0, hidden: int = 64,
                          layers: int = 2, init_std: float = 0.2) -> Path:
    """Random Llama-family causal LM + `<|mask|>` + block_diffusion.json in `out_dir` (fp32).

    A large `init_std` makes the random logits peaky, so greedy argmax margins dwarf fp32 noise.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpo.checkpoint import add_mask_token, save_joint_checkpoint

    out_dir = Path(out_dir)
    tok = build_char_tokenizer(out_dir / "_tokenizer")
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, initializer_range=init_std, tie_word_embeddings=True,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    add_mask_token(model, tok)
    save_joint_checkpoint(model, tok, out_dir, bd_size=bd_size)
    return out_dir


def build_glmocr_checkpoint(out_dir: Path, bd_size: int = 8, seed: int = 0, init_std: float = 0.2) -> Path:
    """Random tiny GlmOcrForConditionalGeneration + tokenizer with image tokens + `<|mask|>`, joint format."""
    from transformers import GlmOcrConfig, GlmOcrForConditionalGeneration

    from grpo.checkpoint import add_mask_token, save_joint_checkpoint

    out_dir = Path(out_dir)
    tok = build_char_tokenizer(out_dir / "_tokenizer", extra_special=IMAGE_TOKENS)
    ids = dict(zip(IMAGE_TOKENS, tok.convert_tokens_to_ids(list(IMAGE_TOKENS))))
    torch.manual_seed(seed)
    head_dim = 16  # mrope_section sums to head_dim / 2
    config = GlmOcrConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
                         max_position_embeddings=4096, initializer_range=init_std,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                          "mrope_section": [2, 3, 3], "partial_rotary_factor": 1.0},
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id),
        vision_config=dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64,
                           patch_size=2, temporal_patch_size=1, spatial_merge_size=2, image_size=16),
        image_token_id=ids["<|image|>"], video_token_id=ids["<|video|>"],
        image_start_token_id=ids["<|begin_of_image|>"], image_end_token_id=ids["<|end_of_image|>"],
        video_start_token_id=ids["<|begin_of_video|>"], video_end_token_id=ids["<|end_of_video|>"],
        tie_word_embeddings=False, initializer_range=init_std)
    model = GlmOcrForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    add_mask_token(model, tok)
    save_joint_checkpoint(model, tok, out_dir, bd_size=bd_size)
    return out_dir


def glmocr_inputs(model, tokenizer, text: str, grid: tuple[int, int] = (4, 6), seed: int = 0) -> dict:
    """Inputs for one prompt `<|begin_of_image|><|image|>×n<|end_of_image|>{text}` with a random image.

    `grid` is the (height, width) in patches; n = h·w / merge². Pixel rows are flattened patches of
    C·T·P·P values, as the GLM image processor emits them.
    """
    vision = model.config.vision_config
    h, w = grid
    n_image = h * w // vision.spatial_merge_size ** 2
    image_ids = tokenizer.convert_tokens_to_ids(["<|begin_of_image|>"] + ["<|image|>"] * n_image
                                                + ["<|end_of_image|>"])
    ids = image_ids + tokenizer(text)["input_ids"]
    gen = torch.Generator().manual_seed(seed)
    patch = vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2
    pixel_values = torch.randn(h * w, patch, generator=gen)
    types = [1 if i == model.config.image_token_id else 0 for i in ids]
    return {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
            "pixel_values": pixel_values, "image_grid_thw": torch.tensor([[1, h, w]]),
            "mm_token_type_ids": torch.tensor([types])}
