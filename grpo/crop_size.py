"""The one image preparation: reading a crop (`load_image`) and sizing it as setting `image_long_side` says
(`fit_long_side`). Every path that feeds crops to the policy goes through it: the training pool that TRL and
the vLLM rollouts read (`with_long_side`), mining, the TPF probe and `gravity-grpo tpf` (through
`grpo.prompting.encode_prompt`).

Values of `image_long_side` (`LONG_SIDES`, or any N in [1, `MAX_LONG_SIDE`]):
- `full`: crops as given, the published OmniDocBench evaluation of GravityOCR (`slurm/eval_omnidocbench.slurm`
  passes `--max_long_side 99999`, "never downscale");
- `768`: the default of GravityOCR's inference script (`src/infer_omnidocbench.py`, `MAX_LONG_SIDE`);
- `1344`: the default of its decode functions, which its forward bench (`tools/bench_forwards.py`) uses.
A crop whose long side is over the limit is resized to it (LANCZOS, the other side `int(side * scale)`).

Example:
    >>> fit_long_side(Image.new("RGB", (1536, 400)), "768").size      # doctest: +SKIP
    (768, 200)
"""
from __future__ import annotations

import dataclasses
import io
from typing import Any, Mapping

from grpo.limits import MAX_ASPECT_RATIO, MAX_LONG_SIDE

LONG_SIDES = {"full": None, "768": 768, "1344": 1344}
LONG_SIDE_VALUES = f"one of {', '.join(LONG_SIDES)} or a number of pixels in [1, {MAX_LONG_SIDE}]"  # what it must be
IMAGE_LONG_SIDE_HELP = ("Long side crops are resized to before the policy sees them, in rollouts, mining, the TPF "
                        "probe and `tpf` (grpo/crop_size.py): 'full' (as given, GravityOCR's published "
                        "evaluation), '768' (its inference default), '1344' (its forward bench) or any N >= 1.")


def long_side(value: Any) -> int | None:
    """The pixel limit `value` (a name of `LONG_SIDES`, or N in [1, MAX_LONG_SIDE]) names; None for `full`; a
    ValueError else."""
    text = str(value).strip()
    if text in LONG_SIDES:
        return LONG_SIDES[text]
    if text.isdigit() and len(text) <= 6 and 1 <= int(text) <= MAX_LONG_SIDE:
        return int(text)
    raise ValueError(f"image_long_side must be {LONG_SIDE_VALUES}, got {str(value)[:40]!r}")


def image_long_side_field(default: str = "full") -> Any:
    """The config field `image_long_side`, shared by the configs of train and mine."""
    return dataclasses.field(default=default, metadata={"help": IMAGE_LONG_SIDE_HELP})


def load_image(value: Any) -> Any:
    """A PIL RGB image from a PIL image, bytes, a path, or a `datasets` image dict ({'bytes', 'path'})."""
    from PIL import Image

    if isinstance(value, Mapping):
        value = value.get("bytes") or value.get("path")
    if isinstance(value, (bytes, bytearray)):
        value = Image.open(io.BytesIO(value))
    elif isinstance(value, str):
        value = Image.open(value)
    if not isinstance(value, Image.Image):
        raise ValueError(f"pool row field 'image': cannot read an image from {type(value).__name__}")
    return value.convert("RGB")


def fit_long_side(image: Any, side: str | int | None) -> Any:
    """`image` (PIL) resized so that its long side is at most `side` (`long_side`'s values); as given when it
    fits or `side` is `full`."""
    from PIL import Image

    size = fitted_size(image.size, side)
    return image if size == tuple(image.size) else image.resize(size, Image.LANCZOS)


def fitted_size(size: tuple[int, int], side: str | int | None) -> tuple[int, int]:
    """The (width, height) `fit_long_side` gives a crop of `size`: the other side `int(side * scale)`, as
    GravityOCR rounds, but never below 1 pixel (`image_long_side: 1` rounded a side down to 0)."""
    limit = long_side(side) if side is not None else None
    w, h = size
    if limit is None or max(w, h) <= limit:
        return w, h
    scale = limit / max(w, h)
    return max(1, int(w * scale)), max(1, int(h * scale))


def crop_problem(size: tuple[int, int], side: str | int | None = None) -> str | None:
    """Why a crop of `size` (width, height), fitted to `side`, cannot go to the image processor, or None."""
    w, h = fitted_size(size, side)
    if min(w, h) < 1:
        return f"image of {w}x{h} pixels is empty"
    if max(w, h) / min(w, h) > MAX_ASPECT_RATIO:
        fitted = f" (fitted to image_long_side {side}: {w}x{h})" if (w, h) != tuple(size) else ""
        return (f"image of {size[0]}x{size[1]} pixels{fitted} has an aspect ratio over {MAX_ASPECT_RATIO}, which "
                "the image processor refuses")
    return None


def with_long_side(ds: Any, side: str | int | None) -> Any:
    """The pool `ds` (a `datasets.Dataset`) with every `image` fitted to `side`; `ds` itself at `full` or
    without images."""
    if long_side(side) is None or "image" not in ds.column_names:
        return ds
    return ds.map(lambda row: {"image": fit_long_side(load_image(row["image"]), side)})
