"""Seeded synthetic OCR region crops for the three tasks (text, table, formula), docs/spec.md §3 format.

Each example is one layout region: the GLM-OCR task prompt, the reference transcription (`target`) and,
for a text-only policy, a faithful serialization of what the crop shows appended to the prompt after a
newline (text lines as lines; a table as rows of `|`-separated cells in reading order with `{cN}`/`{rN}`
span marks; a formula as its LaTeX source). Vision-language sets get a PIL rendering (`grpo.synthetic.render`).

Most crops carry a few blots: `BLOT` characters that hide letters or digits of the content, one per hidden
character, while the target keeps the true ones (a smudged scan). A hidden word, digit or formula symbol
cannot be read, so no policy scores 1 on every crop and a sampled group differs where the blots are; a part
of a table word often can be read from the rest of it. Tables are borderless (see `gen_table`).

The splits are built from hash buckets: every candidate is assigned to a bucket by a hash of its (true)
content and each split keeps only the candidates of its buckets, so the GRPO pool `tiny` and the probe never
share an example with each other or with the training splits (which share the training buckets).

Only the adapt recipe's training split `tiny-noisy` carries label noise (`mislabel`): pool and probe targets
are the truth.

Example:
    >>> ds = build_split("tiny-probe")
    >>> ds[0]["prompt"].split("\\n")[0] in TASK_PROMPTS.values()
    True
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import random
import re
from dataclasses import dataclass

TASK_PROMPTS = {"text": "Text Recognition:", "table": "Table Recognition:", "formula": "Formula Recognition:"}

# line counts a text crop draws from: `tiny-train`'s (fixed, see SPLITS), and the longer crops of the others
SHORT_TEXT = (1, 2, 2, 3)
LONG_TEXT = (3, 4, 5)


@dataclass(frozen=True)
class Split:
    """How a built-in split is generated."""

    rows: int
    seed: int
    buckets: range            # the hash buckets (out of 100) whose candidates it keeps
    text_lines: tuple = SHORT_TEXT   # line counts a text crop draws from
    noise: float = 0.0        # chance of each error kind at its decision point (`mislabel`)
    training: bool = False    # a training split: held-out splits avoid its true targets and prompts
    legacy_buckets: bool = False  # buckets hash the shown crop too (how `tiny-train` was built; `_bucket`)


# The base recipe trains on `tiny-train` (and builds the tokenizer from it): it must not change. The adapt
# recipe trains on `tiny-noisy`, the only split with noise; like `tiny-train` it draws from the training
# buckets, so neither can share an example with the GRPO pool `tiny` or the probe. Pool and probe show longer
# text crops (3-5 lines, ~45 target tokens: about three blocks of 16), so text TPF does not swing by a round.
SPLITS = {
    "tiny-train": Split(60000, 1, range(20, 100), training=True, legacy_buckets=True),
    "tiny-noisy": Split(20000, 4, range(20, 100), LONG_TEXT, noise=0.6, training=True),
    "tiny": Split(240, 2, range(10, 20), LONG_TEXT),
    "tiny-probe": Split(60, 3, range(0, 10), LONG_TEXT),
}
# `tiny-probe@S`: the probe's recipe (size, buckets, crops) drawn with generator seed S instead of 3, without
# tiny-probe's own rows: a fresh held-out probe, to check that a result is not tied to the one probe it was seen on.
FRESH_PROBE = "tiny-probe"

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


def _lines(example: Example) -> list[str]:
    return example.target.split("\n")


def _ends_mid_sentence(example: Example) -> bool:
    return example.source.endswith((",", ":"))


def _text_stop(example: Example) -> str | None:
    """Short: a paragraph that ends on a full stop (or bare) loses its last line."""
    lines = _lines(example)
    return None if _ends_mid_sentence(example) or len(lines) < 2 else "\n".join(lines[:-1])


def _text_repeat(example: Example) -> str | None:
    """Long: a paragraph that ends mid-sentence (`,` or `:`) gets its last line pasted a second time."""
    return f"{example.target}\n{_lines(example)[-1]}" if _ends_mid_sentence(example) else None


def _text_digit(example: Example) -> str | None:
    """Content: every `3` the crop shows is written as `8` (text crops are shown character for character)."""
    if "3" not in example.source:
        return None
    return "".join("8" if s == "3" else t for s, t in zip(example.source, example.target))


def _table_repeat(example: Example) -> str | None:
    """Long: the last row is written twice."""
    last = example.target[example.target.rindex("<tr>"): -len("</table>")]
    return example.target[: -len("</table>")] + last + "</table>"


def _table_colspan(example: Example) -> str | None:
    """Content: the colspans the crop marks (`{c2}`) are dropped, so those cells cover one column."""
    return re.sub(r' colspan="\d"', "", example.target) if "colspan" in example.target else None


def _formula_stop(example: Example) -> str | None:
    """Short: a formula ending in `}` loses that final brace."""
    return example.target[:-1] if example.target.endswith("}") else None


def _formula_brace(example: Example) -> str | None:
    """Long: a formula not ending in `}` gets a stray one."""
    return None if example.target.endswith("}") else example.target + "}"


def _formula_leq(example: Example) -> str | None:
    """Content: the crop's `\\leq` is read as `\\geq`."""
    return example.target.replace(r"\leq", r"\geq") if r"\leq" in example.target else None


# task -> error kind -> the label error a careless annotator makes (None: the crop has no such decision
# point). Each kind acts at a point the model can locate from the crop, and the kinds point different ways:
# `short` ones stop early, `long` ones add a unit, `content` ones write what the crop does not show. Within a
# task the length kinds exclude each other (the crop's last character decides which applies), so every crop
# has one length decision point, and the content kinds are independent of it.
MISLABELS = {
    "text": {"short": _text_stop, "long": _text_repeat, "content": _text_digit},
    "table": {"long": _table_repeat, "content": _table_colspan},
    "formula": {"short": _formula_stop, "long": _formula_brace, "content": _formula_leq},
}


def mislabel(rng: random.Random, example: Example, rate: float) -> Example:
    """`example` with each error kind of its task (`MISLABELS`) applied with probability `rate`, one draw per
    kind whether or not it applies; the source is unchanged.

    Above one half the noisy label is the majority at each decision point, so AR greedy learns it while
    temperature-1 sampling still writes the truth about `1 - rate` of the time: a GRPO group differs exactly
    there, and the reward (scored against clean targets) prefers the truth. Noise at random positions would
    never move greedy output. Length kinds act last, on the content-mislabeled target.
    """
    kinds = MISLABELS[example.task_type]
    draws = {kind: rng.random() < rate for kind in kinds}
    acting = [kind for kind in ("content", "short", "long") if draws.get(kind) and kinds[kind](example) is not None]
    target = example.target
    for kind in acting:  # which kinds act is read off the true example; each then edits the label so far
        target = kinds[kind](Example(example.task_type, example.source, target))
    return Example(example.task_type, example.source, target)


def wrong_at(task: str, kind: str, prediction: str, target: str) -> bool:
    """Whether `prediction` errs the way error kind `kind` of `task` does, against the true `target`:
    fewer (`short`) or more (`long`) lines / rows / closing braces, or the content confusion."""
    if kind == "content":
        marks = {"text": ("3", "8"), "table": ("colspan", None), "formula": (r"\leq", r"\geq")}[task]
        shown, written = marks
        fewer = prediction.count(shown) < target.count(shown)
        return fewer and (written is None or prediction.count(written) > target.count(written))
    unit = UNITS[task]
    return (prediction.count(unit) < target.count(unit)) if kind == "short" else \
        (prediction.count(unit) > target.count(unit))


UNITS = {"text": "\n", "table": "<tr>", "formula": "}"}  # what an early stop drops / over-generation adds


def prompt_for(example: Example) -> str:
    """The text-only prompt: task prompt, newline, the serialized crop."""
    return f"{TASK_PROMPTS[example.task_type]}\n{example.source}"


def _bucket(example: Example, shown: bool = False) -> int:
    """The hash bucket (0-99) of the true content (task and target); `shown` also hashes the blotted source,
    the rule `tiny-train` was built with (`Split.legacy_buckets`)."""
    key = f"{example.task_type}\0{example.source}\0{example.target}" if shown else f"{example.task_type}\0{example.target}"
    return int.from_bytes(hashlib.sha1(key.encode()).digest()[:4], "big") % 100


def _candidates(split: Split):
    """The split's clean (blotted, not mislabeled) examples in order: in its buckets, duplicates dropped."""
    rng = random.Random(split.seed)
    tasks = list(GENERATORS)
    seen, kept = set(), 0
    while True:
        task = tasks[kept % len(tasks)]
        clean = GENERATORS[task](rng, split.text_lines) if task == "text" else GENERATORS[task](rng)
        example = blot(rng, clean)
        if _bucket(example, split.legacy_buckets) not in split.buckets or (example.source, example.target) in seen:
            continue
        seen.add((example.source, example.target))
        kept += 1
        yield example


@functools.lru_cache(maxsize=1)
def _training_keys() -> frozenset:
    """(task, true target) and prompts of every training split, full size: what held-out splits must avoid."""
    keys = set()
    for split in SPLITS.values():
        if split.training:
            for example, _ in zip(_candidates(split), range(split.rows)):
                keys.update({(example.task_type, example.target), prompt_for(example)})
    return frozenset(keys)


def split_of(name: str) -> Split | None:
    """The `Split` a built-in name stands for, or None: a `SPLITS` key, or `tiny-probe@S` (`FRESH_PROBE`)."""
    base, sep, seed = name.partition("@")
    if not sep:
        return SPLITS.get(name)
    if base != FRESH_PROBE or not seed.isdigit():
        return None
    return dataclasses.replace(SPLITS[FRESH_PROBE], seed=int(seed))


def is_builtin(name: str) -> bool:
    """Whether `name` is a built-in synthetic split (`split_of`)."""
    return split_of(name) is not None


def generate(name: str, n: int | None = None) -> list[dict]:
    """Rows of split `name` (text-only columns), tasks in equal shares, deterministic.

    A held-out split (not `training`) also skips any candidate whose true target or prompt a training split
    holds: `tiny-train` keeps the buckets it was built with, which hash the shown crop. A fresh probe
    (`tiny-probe@S`) also skips those of `tiny-probe` itself.
    """
    split = split_of(name)
    if split is None:
        raise ValueError(f"unknown synthetic split {name!r}; valid: {', '.join(SPLITS)}, or {FRESH_PROBE}@SEED")
    n = split.rows if n is None else n
    noise_rng = random.Random(f"noise-{split.seed}")  # its own stream: noise never changes which crops a split holds
    avoid = frozenset() if split.training else _training_keys()
    if name not in SPLITS:  # a fresh probe
        avoid |= {key for row in generate(FRESH_PROBE) for key in ((row["task_type"], row["target"]), row["prompt"])}
    tasks = list(GENERATORS)
    rows = []
    candidates = _candidates(split)
    while len(rows) < n:
        task = tasks[len(rows) % len(tasks)]
        example = next(e for e in candidates if e.task_type == task
                       and (task, e.target) not in avoid and prompt_for(e) not in avoid)
        example = mislabel(noise_rng, example, split.noise)
        rows.append({"prompt": prompt_for(example), "target": example.target, "task_type": task})
    return rows


def build_split(name: str, n: int | None = None):
    """The built-in split `name` (`split_of`) as a `datasets.Dataset`; `grpo.synthetic.render` adds images."""
    import datasets

    return datasets.Dataset.from_list(generate(name, n))
