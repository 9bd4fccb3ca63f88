"""Prompt messages and model inputs for one prompt-pool row (docs/spec.md §3): the only place that builds them.

Text-only policies: the tokenizer applied to `row["prompt"]` as plain text with its default special tokens,
which is what vLLM `LLM.generate(str)` and TRL do with a plain-string prompt. GLM-OCR: the processor's chat
template with the image then the task prompt, as TRL renders a conversational VLM prompt.

Example:
    >>> sorted(encode_prompt(tokenizer, {"prompt": "Text Recognition:\\nhello"}, is_vlm=False))
    ['attention_mask', 'input_ids']
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from grpo.crop_size import fit_long_side, load_image

# The image inputs GLM-OCR's processor gives one prompt (one image each): concatenated over rows in a batch, where
# every other input is per token.
IMAGE_INPUTS = ("pixel_values", "image_grid_thw")


def _field(row: Mapping[str, Any], name: str) -> Any:
    if name not in row or row[name] is None:
        raise ValueError(f"pool row has no {name!r} field (fields: {sorted(row)})")
    return row[name]


def user_turn(prompt: str, image: Any = None, image_part: str = "image") -> list[dict]:
    """The one builder of prompt messages: a single user turn with the task prompt, after the crop if any.

    With an image, the content is `[{"type": image_part, image_part: image}, {"type": "text", ...}]`: the HF
    chat template takes part type "image", vLLM's `LLM.chat` a PIL image as "image_pil". Without one, the
    content is the plain prompt string, the conversational prompt TRL expects (it inserts the row's image).
    """
    if image is None:
        return [{"role": "user", "content": prompt}]
    return [{"role": "user", "content": [{"type": image_part, image_part: image}, {"type": "text", "text": prompt}]}]


def handles_images(processor: Any) -> bool:
    """Whether `processor` turns images into model inputs (a GLM-OCR processor, not a bare tokenizer)."""
    return hasattr(processor, "image_processor")


def encode_prompt(processor: Any, row: Mapping[str, Any], is_vlm: bool,
                  image_long_side: str | int | None = None) -> dict[str, torch.Tensor]:
    """Model inputs (batch of one, tensors) for one pool row, its crop fitted to `image_long_side`
    (`grpo.crop_size.fit_long_side`; None or 'full': as given)."""
    prompt = _field(row, "prompt")
    if not isinstance(prompt, str):
        raise ValueError(f"pool row field 'prompt' must be a string, got {type(prompt).__name__}")
    if not is_vlm:
        tokenizer = getattr(processor, "tokenizer", processor)
        return dict(tokenizer(prompt, return_tensors="pt"))
    if not handles_images(processor):
        raise ValueError("encoding an image prompt needs the model's processor (with its image processor), "
                         f"got {type(processor).__name__}")
    messages = user_turn(prompt, fit_long_side(load_image(_field(row, "image")), image_long_side))
    return dict(processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=True, return_tensors="pt"))


def image_tokens(processor: Any) -> list[str]:
    """The tokens a GLM-OCR chat template writes around and for a crop (`<|image|>`, `<|begin_of_image|>`, ...):
    a prompt that holds one gives the processor a second image place, with no image for it."""
    tokenizer = getattr(processor, "tokenizer", processor)
    added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
    named = [getattr(processor, name, None) for name in ("image_token", "video_token")]
    return sorted({t for t in [*added, *named] if isinstance(t, str) and ("image" in t or "video" in t)})


def prompt_problems(processor: Any, rows: Any, is_vlm: bool, image_long_side: str | int | None = None) -> list[str]:
    """`row N: why` for each row the processor would crash on, checked before it sees any: for a
    vision-language policy, a prompt holding one of the template's image tokens (`image_tokens`), or a crop
    that, fitted to `image_long_side`, the image processor refuses (`grpo.crop_size.crop_problem`)."""
    from grpo.crop_size import crop_problem

    if not is_vlm:
        return []
    tokens = image_tokens(processor)
    out = []
    for index, row in enumerate(rows):
        held = [t for t in tokens if t in str(row.get("prompt"))]
        problem = (f"the prompt holds the chat template's image token {held[0]} (the template adds the crop's own)"
                   if held else crop_problem(load_image(_field(row, "image")).size, image_long_side))
        if problem:
            out.append(f"row {index}: {problem}")
    return out


def rows_over_context(processor: Any, rows: Any, is_vlm: bool, positions: int | None, max_new_tokens: int) -> list[str]:
    """`row N: T prompt tokens + M new > P positions` for each row whose prompt and output cap do not fit in the
    model's `positions` (None: unknown, nothing to check); the one check of prompt length, for `tpf` and the
    dry run."""
    if positions is None:
        return []
    over = []
    for index, row in enumerate(rows):
        length = encode_prompt(processor, row, is_vlm)["input_ids"].shape[-1]
        if length + max_new_tokens > positions:
            over.append(f"row {index}: {length} prompt tokens + {max_new_tokens} new > {positions} positions")
    return over
