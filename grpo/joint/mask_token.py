"""A joint checkpoint made from a plain one (docs/spec.md §2): the `<|mask|>` token and its embedding row
(`add_mask_token`), then the save with `block_diffusion.json` beside the weights (`save_joint_checkpoint`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from grpo.block_diffusion import MASK_TOKEN, BlockDiffusionConfig
from grpo.checkpoint import check_mask_id, tokenizer_of
from grpo.errors import CheckpointError


def _mean_row(weight: Any, rows: int) -> Any:
    """The mean of the first `rows` rows of `weight`, summed row by row in float64 by numpy (one order on every
    host and thread count), in `weight`'s dtype."""
    import numpy as np

    total = np.zeros(weight.shape[1], dtype=np.float64)
    for start in range(0, rows, 4096):  # a float64 copy of 4,096 rows at a time
        for row in weight[start:min(start + 4096, rows)].detach().to("cpu", torch.float64).numpy():
            total += row
    return torch.from_numpy(total / rows).to(weight.dtype)


def add_mask_token(model: Any, tokenizer: Any) -> int:
    """Add `<|mask|>` to the tokenizer (a processor is accepted too) and give it an embedding row; return its id.

    The new row (and the output row of an untied head) is the mean of the existing rows, computed in one fixed
    order (`_mean_row`), so the same checkpoint gets bit-equal rows on any host; transformers' own
    `mean_resizing` draws from a covariance instead, whose last bits vary with the host.
    Idempotent: a tokenizer that already holds the token keeps its id.
    """
    tokenizer = tokenizer_of(tokenizer)
    added = MASK_TOKEN not in tokenizer.get_vocab()
    if added:
        tokenizer.add_tokens([MASK_TOKEN], special_tokens=True)
    mask_id = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    old = model.get_input_embeddings().num_embeddings
    if added or mask_id >= old:
        # the mean of the rows of the tokens before it; a model with spare rows past its tokenizer (GLM-OCR has
        # 59,392) gives the token one of them, which would otherwise keep whatever that spare row holds
        tables = [model.get_input_embeddings().weight, getattr(model.get_output_embeddings(), "weight", None)]
        means = [None if w is None else _mean_row(w, min(mask_id, old)) for w in tables]
        if mask_id >= old:
            model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
        rows = slice(min(mask_id, old), None) if mask_id >= old else slice(mask_id, mask_id + 1)
        resized = [model.get_input_embeddings().weight, getattr(model.get_output_embeddings(), "weight", None)]
        with torch.no_grad():
            for weight, mean in zip(resized, means):
                if weight is not None and mean is not None:
                    weight[rows] = mean.to(weight.device)
    return mask_id


def save_joint_checkpoint(model: Any, processor: Any, out_dir: str | Path, bd_size: int,
                          ar_loss_weight: float = 1.0, mask_schedule: str = "uniform") -> BlockDiffusionConfig:
    """Write weights, tokenizer/processor and `block_diffusion.json` to `out_dir`; return the written config."""
    mask_id = tokenizer_of(processor).convert_tokens_to_ids(MASK_TOKEN)
    unk = tokenizer_of(processor).unk_token_id
    if mask_id is None or (unk is not None and mask_id == unk):
        raise CheckpointError(f"the tokenizer has no {MASK_TOKEN} token: call add_mask_token(model, tokenizer) first")
    bd = BlockDiffusionConfig(bd_size=bd_size, mask_id=mask_id, ar_loss_weight=ar_loss_weight,
                              mask_schedule=mask_schedule)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    check_mask_id(bd, model.get_input_embeddings().num_embeddings, processor, out)
    bd.save(out)
    return bd
