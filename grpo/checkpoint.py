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
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from grpo.builtin import MODELS, model_folder
from grpo.errors import UserError
from ocr_rewards.jsonl import read_json_object

logger = logging.getLogger(__name__)

MASK_TOKEN = "<|mask|>"
BD_FILE = "block_diffusion.json"
MAX_BD_SIZE = 4096  # draft block size B: recipes use 4 to 32; a block past any output cap is a typo
TINY_MODEL = model_folder("tiny")  # the tiny default's folder (grpo.builtin)
VLM_MODEL_TYPES = ("glm_ocr",)
ADAPTER_CONFIG = "adapter_config.json"  # a LoRA checkpoint (peft): adapters only, merged into the base on load
HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")  # owner/name, as the hub spells repository ids
# What a saved checkpoint carries from its source besides the weights (GRPO writes weights and config.json):
# drafter metadata, generation config, chat template, processor and tokenizer files. The first two are copied
# as written even where a save wrote its own; the others only where the save wrote none.
VERBATIM_FILES = (BD_FILE, "generation_config.json")
METADATA_FILES = VERBATIM_FILES + (
    "chat_template.jinja", "chat_template.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json", "tokenizer.model", "vocab.json", "merges.txt",
    "processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json")


class CheckpointError(UserError, ValueError):
    """A checkpoint folder that cannot serve the requested use; the message names the file and field."""


@dataclass
class BlockDiffusionConfig:
    """Contents of `block_diffusion.json`: draft block size B, the `<|mask|>` id and the joint-training settings."""

    bd_size: int
    mask_id: int
    ar_loss_weight: float = 1.0
    # GravityOCR's alpha form (src/models/glm_ocr_dllm.py, GlmOcrBlockDiffusion.__init__): L = (L_AR + alpha L_diff)
    # / (1 + alpha), the same mix as ar_loss_weight = 1 / alpha; given, it decides and the AR term is always kept
    diff_loss_weight: float | None = None
    mask_schedule: str = "uniform"  # as docs/spec.md §2 writes it; nothing reads it (grpo.joint: t ~ U(0,1) per block)
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
                f"grpo.checkpoint.add_mask_token + save_joint_checkpoint (or `gravity-grpo joint`).")
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


@dataclass
class Checkpoint:
    """A loaded checkpoint: `processor` is the tokenizer for text-only models, the HF processor for GLM-OCR."""

    model: Any
    processor: Any
    bd: BlockDiffusionConfig | None
    is_vlm: bool
    path: Path
    source: ModelSource | None = None  # where it was found (`locate`); describe() says what was loaded


@dataclass(frozen=True)
class ModelSource:
    """Where the checkpoint a user named lies, without loading it.

    `folder`: the local folder named, or the hub cache's snapshot of a hub id; `base`: for a LoRA checkpoint
    (`adapter_config.json`, no `config.json`) the folder of the base model its adapter config names, else None.
    Metadata (`block_diffusion.json`, processor, tokenizer, generation config) is read from `folder` first, then
    from `base`.
    """

    spec: str
    folder: Path
    base: Path | None = None
    hub: bool = False

    @property
    def model_dir(self) -> Path:
        """The folder with `config.json` and the (base) weights: what `from_pretrained` and vLLM read."""
        return self.base or self.folder

    def file(self, name: str) -> Path | None:
        """`name` in `folder`, else in `base`; None where neither holds it."""
        return next((d / name for d in (self.folder, self.base) if d is not None and (d / name).is_file()), None)

    def folder_with(self, name: str) -> Path:
        """The folder holding `name` (`folder` first), else `folder`: where a missing file is reported."""
        found = self.file(name)
        return found.parent if found is not None else self.folder

    def describe(self) -> str:
        """One line saying what was loaded, e.g. `acme/x (hub cache: /home/u/.cache/...)`."""
        where = f"hub cache: {self.folder}" if self.hub else str(self.folder)
        text = self.spec if self.spec == str(self.folder) else f"{self.spec} ({where})"
        return f"LoRA adapters {text} merged into {self.base}" if self.base else text


def locate(spec: str | Path) -> ModelSource:
    """The one resolver of a model argument: a local folder (a full or a LoRA checkpoint), a built-in name
    (`tiny`, the tiny default; `tiny-vlm`, the tiny GLM-OCR: `grpo.builtin.MODELS`) where no folder has that
    name, or a hub id (`owner/name`) fetched through `huggingface_hub`, which honours its cache, `HF_HOME` and
    `HF_HUB_OFFLINE`. A LoRA checkpoint's base is located the same way."""
    text = str(spec)
    path = Path(spec)
    if not path.exists() and text in MODELS:
        path = model_folder(text)
    hub = not path.exists() and HUB_ID.fullmatch(text) is not None and not text.startswith(".")
    if hub:
        path = _from_hub(text)
    from grpo.paths import check_tree_readable

    check_tree_readable(path, f"model {text}")  # a FIFO among its files would hang the loaders
    if not (path / "config.json").is_file():
        if (path / ADAPTER_CONFIG).is_file():
            check_weights(path)
            source = ModelSource(text, path, base=_lora_base(path).model_dir, hub=hub)
            _refuse_looped(source)
            return source
        hint = f" (the built-in names: {', '.join(MODELS)})" if text in MODELS else ""
        raise CheckpointError(f"model {text!r}: no Hugging Face checkpoint at {path} (config.json missing){hint}")
    _check_config(path / "config.json")  # a damaged one is named before any loader reads it
    check_weights(path)
    source = ModelSource(text, path, hub=hub)
    _refuse_looped(source)
    return source


def resolve_model(spec: str | Path) -> Path:
    """The folder with `config.json` of the checkpoint `spec` names (`locate(spec).model_dir`)."""
    return locate(spec).model_dir


def _from_hub(repo_id: str) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id))
    except (HFValidationError, HfHubHTTPError, LocalEntryNotFoundError, OSError) as err:
        offline = " (HF_HUB_OFFLINE is set: only the cache is read)" if constants.HF_HUB_OFFLINE else ""
        raise CheckpointError(f"model {repo_id!r}: no local folder of that name, and the hub id cannot be fetched "
                              f"into {constants.HF_HUB_CACHE}{offline}: {type(err).__name__}: "
                              f"{str(err).splitlines()[0]}") from None


def _check_config(path: Path) -> None:
    """A `config.json` that is a JSON object holding no NaN or infinity (JSON has neither; a loader would take
    them as numbers and compute garbage), else a `CheckpointError` naming the file and the field."""
    import math

    def walk(value, where: str) -> str | None:
        if isinstance(value, float) and not math.isfinite(value):
            return where
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        return next((w for k, v in items if (w := walk(v, f"{where}.{k}" if where else str(k)))), None)

    bad = walk(read_json_object(path, CheckpointError), "")
    if bad:
        raise CheckpointError(f"{path}: field {bad!r} is not a finite number (NaN or infinity)")


def check_weights(folder: Path) -> None:
    """Every `*.safetensors` file in `folder` whole: its header parses and its tensors end where the file does
    (a truncated download or copy is named before a loader fails on it)."""
    for path in sorted(folder.glob("*.safetensors")):
        size = path.stat().st_size
        try:
            with open(path, "rb") as f:
                length = int.from_bytes(f.read(8), "little")
                if size < 8 or length > size - 8:
                    raise ValueError("the header runs past the end of the file")
                header = json.loads(f.read(length))
            ends = [t["data_offsets"][1] for name, t in header.items() if name != "__metadata__"]
        except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError, RecursionError) as err:
            raise CheckpointError(f"{path}: damaged weights file (not a readable safetensors header: "
                                  f"{str(err)[:80]})") from None
        if 8 + length + max(ends, default=0) != size:
            raise CheckpointError(f"{path}: damaged weights file ({size:,} bytes, its header describes "
                                  f"{8 + length + max(ends, default=0):,}: truncated or padded)")


def _lora_base(folder: Path) -> ModelSource:
    path = folder / ADAPTER_CONFIG
    base = read_json_object(path, CheckpointError).get("base_model_name_or_path")
    if not base or not isinstance(base, str):
        raise CheckpointError(f"{path}: field 'base_model_name_or_path' is empty: the LoRA adapters name no base "
                              "model to merge into")
    base_path = TINY_MODEL if base == "tiny" else Path(base)
    if not (base_path / "config.json").is_file() and (base_path / ADAPTER_CONFIG).is_file():
        itself = base_path.resolve() == folder.resolve()
        raise CheckpointError(f"{path}: the base {base!r} is " + ("this adapter folder itself" if itself else
                              "itself a LoRA checkpoint; merge it first"))
    source = locate(base)
    if source.base is not None:
        raise CheckpointError(f"{path}: the base {base!r} is itself a LoRA checkpoint; merge it first")
    return source


def _refuse_looped(source: ModelSource) -> None:
    path = source.file(BD_FILE)
    if path is None:
        return
    try:
        raw = read_json_object(path, CheckpointError)
    except CheckpointError:
        return  # named by BlockDiffusionConfig.load where the drafter is read
    check_not_looped(raw, path)


def copy_metadata(source: ModelSource | str | Path, out_dir: str | Path) -> list[str]:
    """Carry `source`'s metadata into the saved checkpoint `out_dir` (`METADATA_FILES`): `block_diffusion.json`
    and the generation config byte for byte, the others where the save wrote none. Returns the names copied."""
    if not isinstance(source, ModelSource):
        source = locate(source)
    out, copied = Path(out_dir), []
    for name in METADATA_FILES:
        found = source.file(name)
        if found is not None and (name in VERBATIM_FILES or not (out / name).exists()):
            shutil.copyfile(found, out / name)
            copied.append(name)
    return copied


def tokenizer_of(processor: Any) -> Any:
    """The tokenizer inside a processor (or the tokenizer itself)."""
    return getattr(processor, "tokenizer", processor)


# Where a saved processor keeps its image settings: transformers 5 writes processor_config.json (all parts in
# one file), earlier versions and many hub checkpoints preprocessor_config.json.
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


LAYER = re.compile(r"^(.*?layers)\.(\d+)\.")  # `model.layers.11.mlp...`: the prefix and the layer's index


def _layer_counts(names: Any) -> dict[str, int]:
    """Per `...layers` prefix, the layers the parameter `names` hold (highest index + 1)."""
    counts: dict[str, int] = {}
    for name in names:
        if (m := LAYER.match(name)):
            counts[m.group(1)] = max(counts.get(m.group(1), 0), int(m.group(2)) + 1)
    return counts


def _check_shapes(folder: Path, config: Any, vlm: bool) -> None:
    """The weights of `folder` (their safetensors headers) against the model its `config.json` describes (built
    on the meta device, no memory): a tensor of another shape, or fewer layers than the config lists, is named
    before any loader fills the gap with random weights. Names that only one side has (renamed on load) are not
    compared."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.modeling_utils import set_zero3_state

    saved: dict[str, list[int]] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with open(path, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        saved.update({name: t["shape"] for name, t in header.items() if name != "__metadata__"})
    if not saved:
        return
    auto = AutoModelForImageTextToText if vlm else AutoModelForCausalLM
    try:
        with torch.device("meta"), set_zero3_state():  # no ZeRO-3 partitioning of the meta model under DeepSpeed
            expected = {name: list(t.shape) for name, t in auto.from_config(config).state_dict().items()}
    except (ValueError, KeyError, TypeError, RuntimeError, AttributeError) as err:
        raise CheckpointError(f"{folder / 'config.json'}: describes no model this transformers can build "
                              f"({str(err).splitlines()[0][:160]})") from None
    for name, shape in expected.items():
        if name in saved and saved[name] != shape:
            raise CheckpointError(f"{folder}: weight {name!r} has shape {saved[name]} but config.json describes "
                                  f"{shape}; the weights and the config disagree")
    have = _layer_counts(saved)
    for prefix, count in _layer_counts(expected).items():
        if prefix in have and have[prefix] < count:
            raise CheckpointError(f"{folder}: config.json lists {count} layers under {prefix}, the weights hold "
                                  f"{have[prefix]}; the weights and the config disagree")


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
    _check_shapes(source.model_dir, config, vlm)
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
