"""Joint AR / block-diffusion checkpoints (docs/spec.md §2): load, validate, and make them.

A joint checkpoint is an ordinary Hugging Face folder (a `GlmOcrForConditionalGeneration` with its processor,
or any `AutoModelForCausalLM` with its tokenizer) whose tokenizer holds `<|mask|>` and which carries
`block_diffusion.json` beside the weights.

Example:
    >>> ckpt = load_checkpoint("tiny", need_drafter=True)   # or a folder
    >>> ckpt.is_vlm, ckpt.bd.mask_id == ckpt.processor.convert_tokens_to_ids("<|mask|>")
    (False, True)
"""
from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpo.errors import UserError
from ocr_rewards.jsonl import read_json_object

logger = logging.getLogger(__name__)

MASK_TOKEN = "<|mask|>"
BD_FILE = "block_diffusion.json"
TINY_MODEL = Path(__file__).resolve().parents[1] / "data" / "tiny" / "model"  # in the checkout (docs/spec.md)
VLM_MODEL_TYPES = ("glm_ocr",)


class CheckpointError(UserError, ValueError):
    """A checkpoint folder that cannot serve the requested use; the message names the file and field."""


@dataclass
class BlockDiffusionConfig:
    """Contents of `block_diffusion.json`: draft block size B, the `<|mask|>` id and the joint-training settings."""

    bd_size: int
    mask_id: int
    ar_loss_weight: float = 1.0
    mask_schedule: str = "uniform"  # as docs/spec.md §2 writes it; nothing reads it (grpo.joint: t ~ U(0,1) per block)

    def __post_init__(self) -> None:
        for name, kind in (("bd_size", int), ("mask_id", int)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, kind):
                raise CheckpointError(f"{BD_FILE}: field {name!r} must be an integer, got {value!r}")
        if self.bd_size < 1:
            raise CheckpointError(f"{BD_FILE}: field 'bd_size' must be >= 1, got {self.bd_size}")
        if isinstance(self.ar_loss_weight, bool) or not isinstance(self.ar_loss_weight, (int, float)) \
                or self.ar_loss_weight < 0:
            raise CheckpointError(
                f"{BD_FILE}: field 'ar_loss_weight' must be a number >= 0, got {self.ar_loss_weight!r}")

    @classmethod
    def load(cls, directory: str | Path) -> "BlockDiffusionConfig":
        path = Path(directory) / BD_FILE
        if not path.is_file():
            raise CheckpointError(
                f"{path} is missing: this checkpoint has no block-diffusion drafter. Make a joint checkpoint with "
                f"grpo.checkpoint.add_mask_token + save_joint_checkpoint (or `gravity-grpo joint`).")
        raw = read_json_object(path, CheckpointError)
        known = {f.name for f in dataclasses.fields(cls)}
        for key in ("bd_size", "mask_id"):
            if key not in raw:
                raise CheckpointError(f"{path}: required field {key!r} is missing")
        unknown = sorted(set(raw) - known)
        if unknown:
            logger.warning("%s: ignoring unknown fields %s", path, unknown)
        try:
            return cls(**{k: v for k, v in raw.items() if k in known})
        except CheckpointError as err:
            raise CheckpointError(f"{path}: {err}") from err

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / BD_FILE
        path.write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")
        return path


@dataclass
class Checkpoint:
    """A loaded checkpoint: `processor` is the tokenizer for text-only models, the HF processor for GLM-OCR."""

    model: Any
    processor: Any
    bd: BlockDiffusionConfig | None
    is_vlm: bool
    path: Path


def resolve_model(spec: str | Path) -> Path:
    """`"tiny"` -> the committed tiny default checkpoint (`data/tiny/model`); anything else is a folder."""
    path = TINY_MODEL if str(spec) == "tiny" else Path(spec)
    if not (path / "config.json").is_file():
        hint = " (the tiny default is built by the joint-training stage)" if str(spec) == "tiny" else ""
        raise CheckpointError(f"model {spec!r}: no Hugging Face checkpoint at {path} (config.json missing){hint}")
    read_json_object(path / "config.json", CheckpointError)  # a damaged one is named before any loader reads it
    return path


def tokenizer_of(processor: Any) -> Any:
    """The tokenizer inside a processor (or the tokenizer itself)."""
    return getattr(processor, "tokenizer", processor)


# Where a saved processor keeps its image settings: transformers 5 writes processor_config.json (all parts in
# one file), earlier versions and many hub checkpoints preprocessor_config.json.
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


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

    return is_vlm(AutoConfig.from_pretrained(path))


def check_mask_id(bd: BlockDiffusionConfig, n_embed: int | None, processor: Any, path: Path) -> None:
    """Refuse a `mask_id` outside the embedding matrix (`n_embed` rows; None: unknown) or the tokenizer's
    vocabulary."""
    n_vocab = len(tokenizer_of(processor))
    if not 0 <= bd.mask_id < min(n_vocab, n_embed or n_vocab):
        raise CheckpointError(
            f"{path / BD_FILE}: field 'mask_id' = {bd.mask_id} is out of vocabulary "
            f"(tokenizer has {n_vocab} tokens, embedding matrix {n_embed} rows)")


def load_checkpoint(spec: str | Path, need_drafter: bool = False,
                    dtype: torch.dtype = torch.float32) -> Checkpoint:
    """Load model + tokenizer/processor + block-diffusion config from a folder (or `"tiny"`), in eval mode.

    With `need_drafter=True` a missing or invalid `block_diffusion.json` raises `CheckpointError`; otherwise an
    absent file gives `bd=None`, and a `mask_id` out of vocabulary only a warning and `bd=None`.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    path = resolve_model(spec)
    bd = BlockDiffusionConfig.load(path) if need_drafter or (path / BD_FILE).is_file() else None
    config = AutoConfig.from_pretrained(path)
    vlm = is_vlm(config)
    auto = AutoModelForImageTextToText if vlm else AutoModelForCausalLM
    model = auto.from_pretrained(path, dtype=dtype).eval()
    processor = _load_processor(path, vlm)
    if bd is not None:
        try:
            check_mask_id(bd, model.get_input_embeddings().num_embeddings, processor, path)
        except CheckpointError as err:
            if need_drafter:
                raise
            logger.warning("%s (the drafter is not needed here; continuing without it)", err)
            bd = None
    if bd is not None and need_drafter and bd.ar_loss_weight == 0:
        logger.warning("%s: ar_loss_weight is 0, the AR path was not trained to verify drafts", path / BD_FILE)
    return Checkpoint(model=model, processor=processor, bd=bd, is_vlm=vlm, path=path)


def add_mask_token(model: Any, tokenizer: Any) -> int:
    """Add `<|mask|>` to the tokenizer (a processor is accepted too) and give it an embedding row; return its id.

    The new row (and the output row of an untied head) is initialised to the mean of the existing rows.
    Idempotent: a tokenizer that already holds the token keeps its id.
    """
    tokenizer = tokenizer_of(tokenizer)
    if MASK_TOKEN not in tokenizer.get_vocab():
        tokenizer.add_tokens([MASK_TOKEN], special_tokens=True)
    mask_id = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    if mask_id >= model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    return mask_id


def save_joint_checkpoint(model: Any, processor: Any, out_dir: str | Path, bd_size: int,
                          ar_loss_weight: float = 1.0) -> BlockDiffusionConfig:
    """Write weights, tokenizer/processor and `block_diffusion.json` to `out_dir`; return the written config."""
    mask_id = tokenizer_of(processor).convert_tokens_to_ids(MASK_TOKEN)
    unk = tokenizer_of(processor).unk_token_id
    if mask_id is None or (unk is not None and mask_id == unk):
        raise CheckpointError(f"the tokenizer has no {MASK_TOKEN} token: call add_mask_token(model, tokenizer) first")
    bd = BlockDiffusionConfig(bd_size=bd_size, mask_id=mask_id, ar_loss_weight=ar_loss_weight)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    check_mask_id(bd, model.get_input_embeddings().num_embeddings, processor, out)
    bd.save(out)
    return bd
