"""Where the checkpoint a user named lies (`locate`: a folder, a built-in name, a hub id, a LoRA checkpoint and
its base), its files checked before any loader reads them (`config.json`, the weights, no LoopMDM drafter), and
the metadata a saved checkpoint carries over from it (`copy_metadata`).

Example:
    >>> locate("tiny").describe()      # doctest: +SKIP
    'tiny (/.../data/tiny/model)'
"""
from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from grpo.block_diffusion import BD_FILE, check_not_looped
from grpo.builtin import MODELS, model_folder
from grpo.errors import CheckpointError
from grpo.weights import check_weights
from ocr_rewards.jsonl import read_json_object

TINY_MODEL = model_folder("tiny")  # the tiny default's folder (grpo.builtin)
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
