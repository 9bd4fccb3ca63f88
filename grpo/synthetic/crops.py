"""Seeded synthetic OCR region crops for the three tasks (text, table, formula), docs/spec.md §3 format.

Each example is one layout region: the reference transcription (`target`) and, for a text-only policy, a
faithful serialization of what the crop shows (`source`: text lines as lines; a table as rows of `|`-separated
cells in reading order with `{cN}`/`{rN}` span marks; a formula as its LaTeX source). Vision-language sets
get a PIL rendering (`grpo.synthetic.render`).

Most crops carry a few blots: `BLOT` characters that hide letters or digits of the content, one per hidden
character, while the target keeps the true ones (a smudged scan). A hidden word, digit or formula symbol
cannot be read, so no policy scores 1 on every crop and a sampled group differs where the blots are; a part
of a table word often can be read from the rest of it. Tables are borderless (see `gen_table`).
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

# line counts a text crop draws from: `tiny-train`'s (fixed, `grpo.synthetic.splits`), and the longer crops
SHORT_TEXT = (1, 2, 2, 3)
LONG_TEXT = (3, 4, 5)

_WORDS = (
    "the of and to in is was for on that with as by at from it this be are or an which his her their "
    "model data table value total mean rate time year city river north south east west group sample "
    "result method test level price cost sales store order number page line text image paper figure "
    "report energy water power light heat field force mass speed space point range area volume weight "
    "first second third last new old small large high low long short early late main local public "
    "private general special common simple clear open closed full empty final annual daily monthly "
    "study review growth change trend share market bank fund loan debt cash asset income profit loss "
    "school student class course grade score exam teacher board member office staff team project plan "
    "house road street bridge station train plant farm food crop seed tree leaf flower stone metal "
    "glass paper cloth color shape size form state region country nation world people family child "
    "doctor patient health care drug dose trial cell gene protein blood heart brain lung bone skin "
    "shows gives takes makes finds keeps holds moves turns grows falls rises runs reads writes uses "
    "under over above below between after before during within without across along around through "
    "Table Figure Section Chapter Note Source Total Mean Year Group Model Method Result Value Rate"
).split()
_NAMES = "Alpha Beta Gamma Delta Omega Paris London Berlin Tokyo Lima Oslo Rome Cairo Delhi Seoul".split()
_UNITS = ("", "", "%", " kg", " m", " s", " $")

_LATEX_VARS = list("abcdxyzntkmpqr") + [r"\alpha", r"\beta", r"\gamma", r"\theta", r"\lambda", r"\mu",
                                        r"\sigma", r"\pi", r"\phi", r"\omega"]
_LATEX_BINOPS = ["+", "-", "=", r"\cdot", r"\times", r"\leq", r"\geq", r"\approx", ","]
_LATEX_FUNCS = [r"\sin", r"\cos", r"\log", r"\exp", r"\ln"]


BLOT = "░"
# task -> (blot count per crop, drawn uniformly; what a blot may hide; whole unit or a part of it). Each blot
# is a point where drafter and verifier may guess differently, so blots cost TPF: text blots hide whole words
# (what costs the most reward per guess) and tables carry few, as their reward hardly sees cell text.
_BLOTS = {
    "text": ((0, 1, 1, 2), re.compile(r"[A-Za-z0-9]+"), True),
    # cell content only: never the letters and digits of the `{rN}`/`{cN}` span marks
    "table": ((0, 1, 1, 2), re.compile(r"(?<![{A-Za-z0-9])[A-Za-z0-9]+"), False),
    # a whole symbol: a Greek letter, a lone Latin letter (not part of a command or environment name), a number
    "formula": ((0, 1, 1, 2, 2, 3), re.compile(
        "|".join(re.escape(v) + "(?![A-Za-z])" for v in _LATEX_VARS if v.startswith("\\"))
        + r"|(?<![\\A-Za-z])[A-Za-z](?![A-Za-z])|\d+"), True),
}


@dataclass(frozen=True)
class Example:
    task_type: str
    source: str   # what the crop shows, serialized for a text-only policy
    target: str   # the reference transcription


def _number(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.4:
        return str(rng.randint(0, 999))
    if kind < 0.8:
        return f"{rng.uniform(0, 100):.{rng.randint(1, 2)}f}"
    return f"{rng.randint(1, 99)}{rng.choice(_UNITS)}"


def _words(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        r = rng.random()
        out.append(_number(rng) if r < 0.1 else rng.choice(_NAMES) if r < 0.15 else rng.choice(_WORDS))
    return out


def gen_text(rng: random.Random, line_counts: tuple = SHORT_TEXT) -> Example:
    """A text line or a paragraph of `rng.choice(line_counts)` lines; the target keeps the line breaks."""
    lines = []
    for _ in range(rng.choice(line_counts)):
        words = _words(rng, rng.randint(4, 10))
        words[0] = words[0][:1].upper() + words[0][1:]
        line = " ".join(words)
        lines.append(line + rng.choice(("", ".", ".", ",", ":")))
    text = "\n".join(lines)
    return Example("text", text, text)


def _table_grid(rng: random.Random) -> list[list[tuple[str, int, int]]]:
    """Rows of (cell text, rowspan, colspan), already omitting the slots covered by spans (never a whole row)."""
    n_rows, n_cols = rng.randint(2, 4), rng.randint(2, 4)
    covered = set()
    rows = []
    for r in range(n_rows):
        row = []
        for c in range(n_cols):
            if (r, c) in covered:
                continue
            rowspan = 2 if r == 1 and r + 1 < n_rows and c + 1 < n_cols and rng.random() < 0.15 else 1
            colspan = 2 if r == 0 and c + 1 < n_cols and rng.random() < 0.2 else 1
            for dr in range(rowspan):
                for dc in range(colspan):
                    covered.add((r + dr, c + dc))
            if r == 0:
                text = rng.choice(_WORDS[-14:] + _NAMES) if rng.random() < 0.5 else rng.choice(_WORDS)
            elif c == 0:
                text = " ".join(_words(rng, rng.randint(1, 2)))
            else:
                text = "" if rng.random() < 0.1 else _number(rng)
            row.append((text, rowspan, colspan))
        rows.append(row)
    return rows


def _cased(text: str, capital: bool) -> str:
    return (text[:1].upper() if capital else text[:1].lower()) + text[1:]


def gen_table(rng: random.Random) -> Example:
    """An HTML table with a header row, numbers, empty cells and the odd colspan/rowspan, borderless.

    Without rules a row label wrapped onto a second line (`rest||`) looks like a section row (a label
    and empty cells). Capitalization hints which one it is, and is right 70% of the time: a wrapped
    label goes on in lower case, a section row starts with a capital.
    """
    grid = _table_grid(rng)
    n_cols = sum(colspan for _, _, colspan in grid[0])

    def plain(row):  # a full row without spans, so a line can follow it without cutting a rowspan
        return len(row) == n_cols and all(rowspan == 1 for _, rowspan, _ in row)

    after = [r for r, row in enumerate(grid) if r == 0 or plain(row)]
    section_after = rng.choice(after) if rng.random() < 0.35 else None
    lines, html = [], ["<table>"]

    def emit(shown: list[tuple[str, int, int]], texts: list[str]) -> None:
        cells, tags = [], ["<tr>"]
        for (shown_text, rowspan, colspan), text in zip(shown, texts):
            marks = (f"{{r{rowspan}}}" if rowspan > 1 else "") + (f"{{c{colspan}}}" if colspan > 1 else "")
            cells.append(marks + shown_text)
            attrs = (f' rowspan="{rowspan}"' if rowspan > 1 else "") + (f' colspan="{colspan}"' if colspan > 1 else "")
            tags.append((f"<td{attrs}>" if attrs else "<td>") + text + "</td>")
        lines.append("|".join(cells))
        html.extend(tags + ["</tr>"])

    for r, row in enumerate(grid):
        texts = [text for text, _, _ in row]
        wrap = None
        if r > 0 and plain(row) and rng.random() < 0.35:
            wrap = _cased(" ".join(_words(rng, rng.randint(1, 2))), rng.random() < 0.3)
            texts[0] += " " + wrap
        emit(row, texts)
        if wrap is not None:
            lines.append(wrap + "|" * (n_cols - 1))
        if r == section_after:
            label = rng.choice(_WORDS[-14:] + _NAMES) if rng.random() < 0.7 else rng.choice(_WORDS[:-14])
            emit([(label, 1, 1)] + [("", 1, 1)] * (n_cols - 1), [label] + [""] * (n_cols - 1))
    html.append("</table>")
    return Example("table", "\n".join(lines), "".join(html))


def _atom(rng: random.Random, depth: int) -> str:
    r = rng.random()
    if depth < 2 and r < 0.15:
        return rf"\frac{{{_expr(rng, depth + 1, 3)}}}{{{_expr(rng, depth + 1, 3)}}}"
    if depth < 2 and r < 0.22:
        return rf"\sqrt{{{_expr(rng, depth + 1, 3)}}}"
    if r < 0.3:
        return rf"{rng.choice(_LATEX_FUNCS)} {rng.choice(_LATEX_VARS)}"
    base = rng.choice(_LATEX_VARS) if rng.random() < 0.75 else str(rng.randint(0, 99))
    if r < 0.45:
        base += f"_{{{rng.choice(_LATEX_VARS[:14] + ['0', '1', '2', 'i', 'j'])}}}"
    if r > 0.85:
        base += f"^{{{rng.choice(['2', '3', 'n', 'k', '-1', 'T'])}}}"
    return base


def _expr(rng: random.Random, depth: int, max_atoms: int) -> str:
    parts = [_atom(rng, depth)]
    for _ in range(rng.randint(0, max_atoms - 1)):
        parts += [rng.choice(_LATEX_BINOPS), _atom(rng, depth)]
    return " ".join(parts)


def gen_formula(rng: random.Random) -> Example:
    """A LaTeX formula: fractions, roots, sub/superscripts, parentheses, now and then an environment."""
    r = rng.random()
    if r < 0.1:
        rows = [" & ".join(_atom(rng, 2) for _ in range(2)) for _ in range(2)]
        latex = r"\begin{pmatrix} " + r" \\ ".join(rows) + r" \end{pmatrix}"
    elif r < 0.2:
        latex = rf"\left( {_expr(rng, 1, 3)} \right) {rng.choice(_LATEX_BINOPS[:3])} {_expr(rng, 1, 2)}"
    else:
        latex = _expr(rng, 0, rng.randint(2, 5))
    return Example("formula", latex, latex)


GENERATORS = {"text": gen_text, "table": gen_table, "formula": gen_formula}


def blot(rng: random.Random, example: Example) -> Example:
    """`example` with a few blots in its source: each hides one character; the target is unchanged."""
    counts, unit, whole = _BLOTS[example.task_type]
    spans = [m.span() for m in unit.finditer(example.source)]
    source = list(example.source)
    for start, end in rng.sample(spans, min(rng.choice(counts), len(spans) // 2)):  # never most of a crop
        if not whole:
            length = rng.randint(1, end - start)
            start = rng.randint(start, end - length)
            end = start + length
        source[start:end] = BLOT * (end - start)
    return Example(example.task_type, "".join(source), example.target)
