"""PIL renderings of synthetic crops for vision-language policies (PIL's built-in font, nothing downloaded).

Text and formulas are drawn as their lines (a blot as a dark box); a table as a borderless grid of its
serialized lines (span marks `{rN}`/`{cN}` widen or lengthen the cell), so a wrapped label reads as a line
of its own, as in the serialization.

Example:
    >>> build_image_split("tiny-probe", 2)[0]["image"].mode
    'RGB'
"""
from __future__ import annotations

import re

from PIL import Image, ImageDraw, ImageFont

from grpo.synthetic.crops import BLOT
from grpo.synthetic.splits import generate

_PAD, _LINE_H, _CHAR_W, _CELL_W = 6, 16, 7, 90
_SPAN = re.compile(r"^((?:\{[rc]\d\})*)(.*)$", re.S)
_RUNS = re.compile(f"{BLOT}+|[^{BLOT}]+")


def _font():
    return ImageFont.load_default()


def _draw(draw: ImageDraw.ImageDraw, x: float, y: float, text: str) -> None:
    """`text` at (x, y), each run of blots as a dark box (the smudge hides what is under it)."""
    for run in _RUNS.findall(text):
        if run[0] == BLOT:
            width = len(run) * _CHAR_W
            draw.rectangle((x, y, x + width, y + _LINE_H - 4), fill="dimgray")
        else:
            draw.text((x, y), run, fill="black", font=_font())
            width = draw.textlength(run, font=_font())
        x += width


def _render_lines(lines: list[str]) -> Image.Image:
    width = max(len(line) for line in lines) * _CHAR_W + 2 * _PAD
    image = Image.new("RGB", (max(width, 32), len(lines) * _LINE_H + 2 * _PAD), "white")
    draw = ImageDraw.Draw(image)
    for i, line in enumerate(lines):
        _draw(draw, _PAD, _PAD + i * _LINE_H, line)
    return image


def _render_table(rows: list[str]) -> Image.Image:
    parsed = []
    for row in rows:
        cells = []
        for cell in row.split("|"):
            marks, text = _SPAN.match(cell).groups()
            rowspan = int(m.group(1)) if (m := re.search(r"\{r(\d)\}", marks)) else 1
            colspan = int(m.group(1)) if (m := re.search(r"\{c(\d)\}", marks)) else 1
            cells.append((text, rowspan, colspan))
        parsed.append(cells)
    n_cols = max(sum(c for _, _, c in row) for row in parsed)
    image = Image.new("RGB", (n_cols * _CELL_W + 2 * _PAD, len(parsed) * 2 * _LINE_H + 2 * _PAD), "white")
    draw = ImageDraw.Draw(image)
    occupied: set[tuple[int, int]] = set()
    for r, row in enumerate(parsed):
        c = 0
        for text, rowspan, colspan in row:
            while (r, c) in occupied:
                c += 1
            occupied.update((r + dr, c + dc) for dr in range(rowspan) for dc in range(colspan))
            x0, y0 = _PAD + c * _CELL_W, _PAD + r * 2 * _LINE_H
            _draw(draw, x0 + 4, y0 + _LINE_H // 2, text)
            c += colspan
    return image


def render_row(row: dict) -> Image.Image:
    """The crop image of a text-only row (its serialization after the task prompt)."""
    source = row["prompt"].split("\n", 1)[1] if "\n" in row["prompt"] else row["target"]
    lines = source.split("\n")
    return _render_table(lines) if row["task_type"] == "table" else _render_lines(lines)


def build_image_split(name: str, n: int | None = None):
    """The built-in split `name` for a vision-language policy: an `image` column (the crop's rendering) and
    `prompt` the bare task prompt."""
    import datasets

    rows = generate(name, n)
    for row in rows:
        row["image"] = render_row(row)
        row["prompt"] = row["prompt"].split("\n", 1)[0]
    features = datasets.Features({"prompt": datasets.Value("string"), "target": datasets.Value("string"),
                                  "task_type": datasets.Value("string"), "image": datasets.Image()})
    return datasets.Dataset.from_list(rows, features=features)
