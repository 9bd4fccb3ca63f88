"""Image rows for joint training of a GLM-OCR checkpoint: each prompt encoded as rollouts and the probe encode it.

A row's prompt is the processor's chat template over the crop and the task prompt (`grpo.prompting.encode_prompt`),
its positions GLM-OCR's M-RoPE index of that prompt (the same call the decoders make,
`grpo.decoding.kv_session.Session.prefill`), and its image inputs travel with the example to the forward
(`grpo.joint.streams.collate`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo.decoding.kv_session import prompt_positions, rope_model
from grpo.prompting import IMAGE_INPUTS


@dataclass(frozen=True)
class ImageRow:
    """One encoded image row: prompt ids, target ids, M-RoPE prompt positions (3, P), image inputs, and the crop's
    lines (its rows of merged image tokens)."""

    prompt_ids: list[int]
    target_ids: list[int]
    positions: torch.Tensor
    images: dict[str, torch.Tensor]
    lines: int


def encode_image_rows(rows, model, processor, max_target_tokens: int,
                      targets: list[list[int] | None] | None = None, pool: str = "training rows") -> list[ImageRow]:
    """`ImageRow` per row whose target has at most `max_target_tokens` tokens; a row without a readable image
    raises `PoolError` naming `pool` and the row.
    `targets` (ids per row, None: leave the row out) replace the rows' own."""
    from grpo.pool import PoolError
    from grpo.prompting import encode_prompt

    tokenizer = processor.tokenizer
    rope = rope_model(model)
    encoded = []
    for index, row in enumerate(rows):
        target = tokenizer(row["target"], add_special_tokens=False).input_ids if targets is None else targets[index]
        if target is None or len(target) > max_target_tokens:
            continue
        try:
            inputs = encode_prompt(processor, row, is_vlm=True)
        except ValueError as err:
            raise PoolError(pool, f"row {index}: {err}") from err
        with torch.no_grad():
            positions, _ = prompt_positions(rope, inputs)
        lines = int(inputs["image_grid_thw"][0, 1]) // processor.image_processor.merge_size
        encoded.append(ImageRow(inputs["input_ids"][0].tolist(), target, positions[:, 0],
                                {key: inputs[key] for key in IMAGE_INPUTS}, lines))
    if not encoded:
        raise ValueError(f"no training row has a target of <= {max_target_tokens} tokens")
    return encoded
