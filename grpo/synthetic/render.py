"""The tiny world's crops for vision-language policies: every character in its own cell of a fixed grid.

A cell is `CELL` x `CELL` pixels, one merged image token of the tiny GLM-OCR (patch 4, merge 2), and holds one
glyph of DejaVu Sans Mono, the monospaced font file that ships inside matplotlib's wheel (no system font, nothing
downloaded). A blot is a grey cell: what it hides cannot be read. Every crop is `COLUMNS` cells wide, so the
decoder's offset between an output position and an image column is the same on every crop of a task (text
positions after an image start at its larger side); the height is one cell row per line. A line longer than the
canvas (a long formula) goes on in the next row.

Text and formulas are drawn as their lines, from the left edge; a training split may draw each line a random number
of cells in (`indent`), so that a decoder cannot find a line by its offset from the output position alone and has
to find it by what it has just written (docs/vlm.md). A table is a borderless grid of its serialized lines: each
column as wide as its longest cell plus `_GAP` cells, span marks `{rN}`/`{cN}` lengthening or widening the cell, so
a wrapped label reads as a line of its own, as in the serialization. These are the tiny world's crops only: a
user's own crops are read as they are (`grpo.crop_size`).

Example:
    >>> render_row({"prompt": "Text Recognition:\\nNorth river", "target": "North river", "task_type": "text"}).size
    (576, 8)
"""
from __future__ import annotations

import functools
import random
import re
from importlib import resources

from PIL import Image, ImageDraw, ImageFont

from grpo.synthetic.crops import BLOT
from grpo.synthetic.splits import generate

CELL = 8          # pixels per character cell, both ways: one merged image token
COLUMNS = 72      # cells per row of every crop (the tiny world's longest text line is 67 characters)
_GAP = 2          # empty cells after each table column
_SPAN = re.compile(r"^((?:\{[rc]\d\})*)(.*)$", re.S)


@functools.lru_cache(maxsize=1)
def _font() -> ImageFont.FreeTypeFont:
    path = resources.files("matplotlib") / "mpl-data" / "fonts" / "ttf" / "DejaVuSansMono.ttf"
    return ImageFont.truetype(str(path), 8)


@functools.lru_cache(maxsize=256)
def _glyph(char: str) -> Image.Image:
    """One cell with `char` drawn in it (grey for a blot), as a greyscale mask."""
    cell = Image.new("L", (CELL, CELL), 255)
    draw = ImageDraw.Draw(cell)
    if char == BLOT:
        draw.rectangle((0, 0, CELL - 1, CELL - 1), fill=110)
    elif char != " ":
        draw.text((CELL // 2, CELL - 2), char, fill=0, font=_font(), anchor="ms")  # descenders in the last 2 rows
    return cell


def _grid(cells: list[tuple[int, int, str]], rows: int) -> Image.Image:
    """A white canvas `COLUMNS` cells wide and `rows` high with text placed at (row, column) and wrapped at the
    right edge."""
    image = Image.new("L", (COLUMNS * CELL, rows * CELL), 255)
    for row, column, text in cells:
        for i, char in enumerate(text):
            r, c = divmod(column + i, COLUMNS)
            image.paste(_glyph(char), (c * CELL, (row + r) * CELL))
    return image.convert("RGB")


def _wrapped_rows(length: int) -> int:
    return max(1, -(-length // COLUMNS))


def _render_lines(lines: list[str], indent: int, rng: random.Random | None) -> Image.Image:
    """Each line from the left edge, or `indent` > 0: a line that fits drawn 0 to `indent` cells in (as far as it
    still fits), drawn from `rng`."""
    cells, row = [], 0
    for line in lines:
        room = min(indent, COLUMNS - len(line))
        cells.append((row, rng.randint(0, room) if room > 0 else 0, line))
        row += _wrapped_rows(len(line))
    return _grid(cells, row)


def _render_table(rows: list[str]) -> Image.Image:
    parsed = []
    for line in rows:
        cells = []
        for raw in line.split("|"):
            marks, text = _SPAN.match(raw).groups()
            rowspan = int(m.group(1)) if (m := re.search(r"\{r(\d)\}", marks)) else 1
            colspan = int(m.group(1)) if (m := re.search(r"\{c(\d)\}", marks)) else 1
            cells.append((text, rowspan, colspan))
        parsed.append(cells)
    placed, occupied = [], set()   # (row, first column, colspan, text)
    for r, row in enumerate(parsed):
        c = 0
        for text, rowspan, colspan in row:
            while (r, c) in occupied:
                c += 1
            occupied.update((r + dr, c + dc) for dr in range(rowspan) for dc in range(colspan))
            placed.append((r, c, colspan, text))
            c += colspan
    n_cols = max(c for _, c in occupied) + 1
    width = [1] * n_cols
    for _, c, colspan, text in sorted(placed, key=lambda p: p[2]):   # single cells first, then spans
        short = len(text) + _GAP - sum(width[c:c + colspan])
        if short > 0:
            width[c + colspan - 1] += short
    start = [sum(width[:c]) for c in range(n_cols + 1)]
    return _grid([(r, start[c], text) for r, c, _, text in placed], len(parsed))


def render_row(row: dict, indent: int = 0, rng: random.Random | None = None) -> Image.Image:
    """The crop image of a text-only row (its serialization after the task prompt); text and formula lines drawn
    up to `indent` cells in, at random from `rng` (tables as they are)."""
    source = row["prompt"].split("\n", 1)[1] if "\n" in row["prompt"] else row["target"]
    lines = source.split("\n")
    return _render_table(lines) if row["task_type"] == "table" else _render_lines(lines, indent, rng)


def build_image_split(name: str, n: int | None = None, indent: int = 0):
    """The built-in split `name` for a vision-language policy: an `image` column (the crop's rendering) and
    `prompt` the bare task prompt; `indent` > 0 draws text and formula lines up to that many cells in, the same
    for the same `name`."""
    import datasets

    rows = generate(name, n)
    rng = random.Random(f"{name} indent {indent}")
    for row in rows:
        row["image"] = render_row(row, indent, rng)
        row["prompt"] = row["prompt"].split("\n", 1)[0]
    features = datasets.Features({"prompt": datasets.Value("string"), "target": datasets.Value("string"),
                                  "task_type": datasets.Value("string"), "image": datasets.Image()})
    return datasets.Dataset.from_list(rows, features=features)
