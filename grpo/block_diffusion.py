"""`block_diffusion.json`, the drafter's file of a joint checkpoint (docs/spec.md §2): draft block size B, the
`<|mask|>` id and the joint-training settings, read and checked (`BlockDiffusionConfig`) and written.

Example:
    >>> BlockDiffusionConfig.load("data/tiny/model").bd_size      # doctest: +SKIP
    4
"""
from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from grpo.errors import CheckpointError
from grpo.limits import MAX_BD_SIZE
from ocr_rewards.jsonl import read_json_object

logger = logging.getLogger(__name__)

MASK_TOKEN = "<|mask|>"
BD_FILE = "block_diffusion.json"


@dataclass
class BlockDiffusionConfig:
    """Contents of `block_diffusion.json`: draft block size B, the `<|mask|>` id and the joint-training settings."""

    bd_size: int
    mask_id: int
    ar_loss_weight: float = 1.0
    # GravityOCR's alpha form (src/models/glm_ocr_dllm.py, GlmOcrBlockDiffusion.__init__): L = (L_AR + alpha L_diff)
    # / (1 + alpha), the same mix as ar_loss_weight = 1 / alpha; given, it decides and the AR term is always kept
    diff_loss_weight: float | None = None
    mask_schedule: str = "uniform"  # as docs/spec.md §2 writes it; nothing reads it (grpo.joint writes its schedule)
    source: Path | None = field(default=None, compare=False, repr=False)  # the file read; saves copy it as written

    def __post_init__(self) -> None:
        for name, kind in (("bd_size", int), ("mask_id", int)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, kind):
                raise CheckpointError(f"{BD_FILE}: field {name!r} must be an integer, got {value!r}")
        if not 1 <= self.bd_size <= MAX_BD_SIZE:
            raise CheckpointError(f"{BD_FILE}: field 'bd_size' must be in [1, {MAX_BD_SIZE:,}], got {self.bd_size}")
        for name in ("ar_loss_weight", "diff_loss_weight"):
            value = getattr(self, name)
            if (value is not None or name == "ar_loss_weight") and (
                    isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                raise CheckpointError(f"{BD_FILE}: field {name!r} must be a number >= 0, got {value!r}")

    @property
    def ar_trained(self) -> bool:
        """Whether the joint loss had an AR term: always in the alpha form, else when `ar_loss_weight` > 0."""
        return self.diff_loss_weight is not None or self.ar_loss_weight > 0

    @classmethod
    def load(cls, directory: str | Path) -> "BlockDiffusionConfig":
        path = Path(directory) / BD_FILE
        if not path.is_file():
            raise CheckpointError(
                f"{path} is missing: this checkpoint has no block-diffusion drafter. Make a joint checkpoint with "
                f"grpo.joint.mask_token.add_mask_token + save_joint_checkpoint (or `gravity-grpo joint`).")
        raw = read_json_object(path, CheckpointError)
        check_not_looped(raw, path)
        known = {f.name for f in dataclasses.fields(cls)} - {"source"}
        for key in ("bd_size", "mask_id"):
            if key not in raw:
                raise CheckpointError(f"{path}: required field {key!r} is missing")
        unknown = sorted(set(raw) - known)
        if unknown:  # kept in the file: a save copies it as written
            logger.info("%s: fields %s are not read here (kept on save)", path, unknown)
        try:
            return cls(**{k: v for k, v in raw.items() if k in known}, source=path)
        except CheckpointError as err:
            raise CheckpointError(f"{path}: {err}") from err

    def save(self, directory: str | Path) -> Path:
        """Write a new `block_diffusion.json` (a checkpoint made here); saves of a loaded one copy its file."""
        path = Path(directory) / BD_FILE
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name != "source" and getattr(self, f.name) is not None}
        path.write_text(json.dumps(fields, indent=2) + "\n")
        return path


def check_not_looped(raw: dict, path: Path) -> None:
    """Refuse a LoopMDM checkpoint (`loop_enabled: true`): a mid-block of decoder layers runs several times
    with shared weights, a forward that neither transformers' GLM-OCR nor vLLM computes."""
    if raw.get("loop_enabled"):
        raise CheckpointError(
            f"{path}: field 'loop_enabled' is true (LoopMDM: layers {raw.get('loop_start', '?')}.. looped up to "
            f"{raw.get('loop_smax', '?')} times with shared weights); transformers and vLLM run each layer once, "
            "so this package would train and measure another model: use a checkpoint trained without loop_enabled")
