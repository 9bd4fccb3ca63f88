"""Joint AR / block-diffusion checkpoints (docs/spec.md §2), read: inspected without weights
(`inspect_checkpoint`) and loaded (`load_checkpoint`).

A joint checkpoint is an ordinary Hugging Face folder (a `GlmOcrForConditionalGeneration` with its processor,
or any `AutoModelForCausalLM` with its tokenizer) whose tokenizer holds `<|mask|>` and which carries
`block_diffusion.json` beside the weights (`grpo.block_diffusion`). Where it lies and its files' checks are
`grpo.model_source` and `grpo.weights`; making one from a plain checkpoint is `grpo.joint.mask_token`.

Example:
    >>> ckpt = load_checkpoint("tiny", need_drafter=True)   # or a folder
    >>> ckpt.is_vlm, ckpt.bd.mask_id == ckpt.processor.convert_tokens_to_ids("<|mask|>")
    (False, True)
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpo.block_diffusion import BD_FILE, MASK_TOKEN, BlockDiffusionConfig
from grpo.errors import CheckpointError
from grpo.model_source import ModelSource, locate, resolve_model
from grpo.weights import check_shapes
from ocr_rewards.jsonl import read_json_object

logger = logging.getLogger(__name__)

VLM_MODEL_TYPES = ("glm_ocr",)


@dataclass
class Checkpoint:
    """A loaded checkpoint: `processor` is the tokenizer for text-only models, the HF processor for GLM-OCR."""

    model: Any
    processor: Any
    bd: BlockDiffusionConfig | None
    is_vlm: bool
    path: Path
    source: ModelSource | None = None  # where it was found (`locate`); describe() says what was loaded


def tokenizer_of(processor: Any) -> Any:
    """The tokenizer inside a processor (or the tokenizer itself)."""
    return getattr(processor, "tokenizer", processor)


# Where a saved processor keeps its image settings: transformers 5 writes processor_config.json (all parts in
# one file), earlier versions and many hub checkpoints preprocessor_config.json.
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def processor_dir(source: ModelSource) -> Path:
    """The folder whose tokenizer (and processor) belong to `source`: the LoRA folder when it holds one."""
    return source.folder if (source.folder / "tokenizer_config.json").is_file() else source.model_dir


def _load_processor(path: Path, is_vlm: bool) -> Any:
    from transformers import AutoProcessor, AutoTokenizer

    if is_vlm and any((path / name).is_file() for name in PROCESSOR_FILES):
        try:
            return AutoProcessor.from_pretrained(path)
        except (ImportError, AttributeError) as err:  # GLM's processor needs torchvision for its video part
            raise CheckpointError(f"{path}: cannot build the GLM-OCR processor ({err!r}); it needs torchvision "
                                  "installed beside torch") from err
    return AutoTokenizer.from_pretrained(path)


def is_vlm(config: Any) -> bool:
    """True for a vision-language model config (GLM-OCR): the one VLM test of the package."""
    return getattr(config, "model_type", None) in VLM_MODEL_TYPES


def is_vlm_checkpoint(path: str | Path) -> bool:
    """`is_vlm` of the checkpoint folder `path` (its config only, no weights)."""
    from transformers import AutoConfig

    return is_vlm(AutoConfig.from_pretrained(resolve_model(path)))


def check_mask_id(bd: BlockDiffusionConfig, n_embed: int | None, processor: Any, path: Path) -> None:
    """Refuse a `mask_id` outside the embedding matrix (`n_embed` rows; None: unknown) or the tokenizer's
    vocabulary, other than the id of the tokenizer's `MASK_TOKEN`, or (without one) a special token such as EOS:
    a draft of EOS masks would read as a finished output."""
    tokenizer = tokenizer_of(processor)
    n_vocab = len(tokenizer)
    where = f"{path / BD_FILE}: field 'mask_id' = {bd.mask_id}"
    if not 0 <= bd.mask_id < min(n_vocab, n_embed or n_vocab):
        raise CheckpointError(f"{where} is out of vocabulary (tokenizer has {n_vocab} tokens, embedding matrix "
                              f"{n_embed} rows)")
    mask = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    if mask is not None and mask != tokenizer.unk_token_id:
        if bd.mask_id != mask:
            raise CheckpointError(f"{where} is not the id of the tokenizer's {MASK_TOKEN} ({mask})")
    elif bd.mask_id in tokenizer.all_special_ids:
        raise CheckpointError(f"{where} is the special token {tokenizer.convert_ids_to_tokens(bd.mask_id)!r}, "
                              f"not a mask token")


def context_length(config: Any) -> int | None:
    """The positions of the model's text decoder (`max_position_embeddings`); None when its config does not say."""
    return getattr(config.get_text_config(), "max_position_embeddings", None)


@dataclass(frozen=True)
class Inspection:
    """A checkpoint read without its weights: what the dry run reports and loading builds on."""

    source: ModelSource
    config: Any                      # the transformers config
    is_vlm: bool
    processor: Any
    bd: BlockDiffusionConfig | None  # None: no drafter file, or an unusable one where the drafter is not needed
    drafter_note: str | None = None  # why a present drafter file is left unused


def inspect_checkpoint(spec: str | Path, need_drafter: bool = False) -> Inspection:
    """Config, tokenizer/processor and `block_diffusion.json` of what `spec` names (`locate`), no weights: the one
    checkpoint inspection of the dry run and of `load_checkpoint`.

    With `need_drafter=True` a missing or invalid `block_diffusion.json`, or a `mask_id` out of vocabulary,
    raises `CheckpointError`; otherwise an absent file gives `bd=None`, and an out-of-vocabulary `mask_id`
    `bd=None` with the reason in `drafter_note`. A malformed file is refused either way.
    """
    from transformers import AutoConfig

    source = locate(spec)
    bd = BlockDiffusionConfig.load(source.folder_with(BD_FILE)) \
        if need_drafter or source.file(BD_FILE) is not None else None
    config_file = source.model_dir / "config.json"
    try:
        config = AutoConfig.from_pretrained(source.model_dir)
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        kind = read_json_object(config_file, CheckpointError).get("model_type")
        raise CheckpointError(f"{config_file}: model_type {kind!r} is no architecture this transformers knows, or "
                              f"its fields do not fit it ({str(err).splitlines()[0][:160]})") from None
    vlm = is_vlm(config)
    check_shapes(source.model_dir, config, vlm)
    try:
        processor = _load_processor(processor_dir(source), vlm)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
        if isinstance(err, CheckpointError):
            raise
        raise CheckpointError(f"{processor_dir(source)}: no usable tokenizer files (tokenizer.json, "
                              f"tokenizer_config.json, ...): {str(err).splitlines()[0][:160]}") from None
    note = None
    if bd is not None:
        try:
            check_mask_id(bd, getattr(config.get_text_config(), "vocab_size", None), processor, bd.source.parent)
        except CheckpointError as err:
            if need_drafter:
                raise
            bd, note = None, f"{err} (the drafter is not needed here; continuing without it)"
    return Inspection(source, config, vlm, processor, bd, note)


def load_checkpoint(spec: str | Path, need_drafter: bool = False,
                    dtype: torch.dtype = torch.float32) -> Checkpoint:
    """Load model + tokenizer/processor + block-diffusion config of what `spec` names (`inspect_checkpoint`), in
    eval mode; a LoRA checkpoint is merged into its base."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    found = inspect_checkpoint(spec, need_drafter)
    if found.drafter_note:
        logger.warning("%s", found.drafter_note)
    if found.bd is not None and need_drafter and not found.bd.ar_trained:
        logger.warning("%s: ar_loss_weight is 0 and no diff_loss_weight is given: the AR path was not trained to "
                       "verify drafts", found.bd.source)
    source = found.source
    auto = AutoModelForImageTextToText if found.is_vlm else AutoModelForCausalLM
    model = auto.from_pretrained(source.model_dir, dtype=dtype)
    if source.base is not None:
        from peft import PeftModel

        # merged weights, trainable as a plain load's (peft freezes the base it loads adapters into)
        model = PeftModel.from_pretrained(model, source.folder).merge_and_unload().requires_grad_(True)
    return Checkpoint(model=model.eval(), processor=found.processor, bd=found.bd, is_vlm=found.is_vlm,
                      path=source.folder, source=source)
