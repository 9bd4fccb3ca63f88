"""The weights files of a checkpoint folder (`*.safetensors`), checked from their headers before any loader reads
them: each file whole (`check_weights`), and their tensors of the shapes and layer counts its `config.json`
describes (`check_shapes`).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from grpo.errors import CheckpointError


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


LAYER = re.compile(r"^(.*?layers)\.(\d+)\.")  # `model.layers.11.mlp...`: the prefix and the layer's index


def _layer_counts(names: Any) -> dict[str, int]:
    """Per `...layers` prefix, the layers the parameter `names` hold (highest index + 1)."""
    counts: dict[str, int] = {}
    for name in names:
        if (m := LAYER.match(name)):
            counts[m.group(1)] = max(counts.get(m.group(1), 0), int(m.group(2)) + 1)
    return counts


def check_shapes(folder: Path, config: Any, vlm: bool) -> None:
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
