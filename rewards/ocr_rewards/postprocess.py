"""GravityOCR's prediction post-processing, applied before scoring when `RewardSettings.postprocess` is
"gravityocr".

GravityOCR formats each decoded region before OmniDocBench scores its page (trillion-labs/GravityOCR at commit
df7d2cb, `src/infer_omnidocbench.py`: `clean_content` at lines 219-240, `clean_repeated_content` at 158-182,
`normalize_inline_formula` at 197-216, `format_content` at 247-291; ported there from GLM-OCR's
`glmocr/postprocess/result_formatter.py`). For a crop of task `text`, `table` or `formula` (a region whose
layout label is that task; the heading labels `doc_title` and `paragraph_title` are not crops of this package):

- clean (every task, except a table already wrapped in `<table …</table>` and a formula already wrapped in
  `$$ … $$`): leading and trailing runs of the two characters `\\t` not followed by a lower-case letter go,
  with the whitespace beside them; runs of three or more `.`, `·`, `_` and `\\_` become three; a text of 2,048
  characters or more is cut at its first repetition loop (`cut_repetition`); inline formulas `$ … $` lose their
  inner spaces and get one space from a letter or digit beside them; the result is stripped.
- formula: one leading `$$`, `\\[` or `\\(` and one trailing `$$`, `\\]` or `\\)` go, and the body is wrapped as
  `$$\\n…\\n$$`.
- text: an unclosed code fence is closed; a leading `·`, `•` or `* ` becomes `- `; a leading `(1)` or `1.`
  (a number or one letter) gets one space after it; every lone newline becomes two.

`POSTPROCESS_MODES` names the readings of `RewardSettings.postprocess`: "none" (score the text as decoded, the
default) and "gravityocr" (this module first).

Example:
    >>> gravityocr_postprocess("Name: ______ Date: .....", "text")
    'Name: ___ Date: ...'
    >>> gravityocr_postprocess("\\\\[ x^2 \\\\]", "formula")
    '$$\\nx^2\\n$$'
"""
from __future__ import annotations

import re
from collections import Counter

POSTPROCESS_MODES = ("none", "gravityocr")  # the default is `RewardSettings.postprocess`
LOOP_MIN_CHARS = 2_048     # a cleaned text this long or longer is checked for a repetition loop
UNIT_MIN, REPEATS = 10, 10  # a loop: a unit of >= UNIT_MIN characters repeated >= REPEATS times in a row
LINE_REPEATS, LINE_SHARE = 10, 0.8  # or one line making >= LINE_REPEATS and >= 80% of the non-empty lines

_TAB_HEAD = re.compile(r"^(?:\\t(?![a-z]))+")
_TAB_TAIL = re.compile(r"(?:\\t(?![a-z]))+$")
_RUNS = [(re.compile(r"\.{3,}"), "..."), (re.compile("·{3,}"), "···"), (re.compile("_{3,}"), "___"),
         (re.compile(r"(?:\\_){3,}"), "\\_" * 3)]
_INLINE = re.compile(r"(?<!\$)\$\s*((?:[^$\\]|\\.)+?)\s*\$(?!\$)")
_PAREN_ITEM = re.compile(r"^([(（])(\d+|[A-Za-z])([)）])(.*)$")
_DOT_ITEM = re.compile(r"^(\d+|[A-Za-z])([.)）])(.*)$")
_LONE_NEWLINE = re.compile(r"(?<!\n)\n(?!\n)")


def check_postprocess(mode: str) -> None:
    """Raise a ValueError naming the valid modes when `mode` is not one of them."""
    if mode not in POSTPROCESS_MODES:
        raise ValueError(f"unknown postprocess mode {mode!r}; valid modes: {', '.join(POSTPROCESS_MODES)}")


def _first_unit_loop(text: str) -> str | None:
    """`text` up to the end of the first unit of its leftmost loop, or None without one.

    A loop starts at i with unit length L (UNIT_MIN <= L <= len // REPEATS) when `text[i:i + L]` is repeated
    REPEATS times from i; the leftmost i wins, then the shortest L (the lazy regex GravityOCR searches with,
    `(.{10,M}?)\\1{9,}`). Equal characters L apart over 9L positions from i is that condition, and a prefix sum
    finds each L's first i in one pass, so the search is quadratic at worst, not the regex's cubic.
    """
    n = len(text)
    longest = n // REPEATS
    if n < UNIT_MIN * REPEATS or longest < UNIT_MIN:
        return None
    import numpy as np

    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)  # a lone surrogate too
    best = None
    for unit in range(UNIT_MIN, longest + 1):
        if best is not None and best[0] == 0:
            break
        differ = np.concatenate(([0], np.cumsum(codes[:-unit] != codes[unit:])))
        span = (REPEATS - 1) * unit
        starts = np.flatnonzero(differ[span:] == differ[:-span])
        if starts.size and (best is None or starts[0] < best[0]):
            best = (int(starts[0]), unit)
    return None if best is None else text[:best[0] + best[1]]


def cut_repetition(content: str) -> str:
    """`content` cut after the first unit of a repetition loop, or else, when one line dominates (LINE_REPEATS,
    LINE_SHARE), after the first line of its first run of three; unchanged without either."""
    stripped = content.strip()
    if not stripped:
        return content
    if len(stripped) > UNIT_MIN * REPEATS and (cut := _first_unit_loop(stripped)) is not None:
        return cut
    raw = content.split("\n")
    kept = [(index, line.strip()) for index, line in enumerate(raw) if line.strip()]
    if len(kept) < LINE_REPEATS:
        return content
    common, count = Counter(line for _, line in kept).most_common(1)[0]
    if count < LINE_REPEATS or count / len(kept) < LINE_SHARE:
        return content
    for k in range(len(kept)):
        if len(kept[k:k + 3]) == 3 and all(line == common for _, line in kept[k:k + 3]):
            return "\n".join(raw[:kept[k][0] + 1])
    return content


def _inline_formulas(content: str) -> str:
    """Inline `$ … $` formulas with their inner spaces stripped, one space from a letter or digit beside them."""
    if "$" not in content:
        return content
    out, done = [], 0
    for match in _INLINE.finditer(content):
        body = match.group(1).strip()
        if not body:
            continue
        before = content[done:match.start()]
        out.append(before + " " if before and before[-1].isalnum() else before)
        out.append(f"${body}$")
        if match.end() < len(content) and content[match.end()].isalnum():
            out.append(" ")
        done = match.end()
    return "".join(out) + content[done:] if out else content


def clean(content: str) -> str:
    """GravityOCR's `clean_content` (module docstring)."""
    content = _TAB_HEAD.sub("", content).lstrip()
    content = _TAB_TAIL.sub("", content).rstrip()
    for pattern, three in _RUNS:
        content = pattern.sub(lambda _: three, content)
    if len(content) >= LOOP_MIN_CHARS:
        content = cut_repetition(content)
    return _inline_formulas(content).strip()


def _format_text(content: str) -> str:
    if content.startswith("```") and not content.endswith("```"):
        content += "\n```"
    if content.startswith(("·", "•", "* ")):
        content = "- " + content[1:].lstrip()
    if match := _PAREN_ITEM.match(content):
        content = f"({match.group(2)}) {match.group(4).lstrip()}"
    if match := _DOT_ITEM.match(content):
        mark = ")" if match.group(2) == "）" else match.group(2)
        content = f"{match.group(1)}{mark} {match.group(3).lstrip()}"
    return _LONE_NEWLINE.sub("\n\n", content)


def _format_formula(content: str) -> str:
    if content.startswith(("$$", "\\[", "\\(")):
        content = content[2:].strip()
    if content.endswith(("$$", "\\]", "\\)")):
        content = content[:-2].strip()
    return "$$\n" + content + "\n$$"


def gravityocr_postprocess(pred: str, task: str) -> str:
    """`pred`, a crop's decoded text of `task`, as GravityOCR formats a region of that task before scoring."""
    if task == "table":
        return pred.strip() if pred.startswith("<table") and pred.endswith("</table>") else clean(pred)
    if task == "formula":
        wrapped = pred.startswith("$$") and pred.endswith("$$")
        return _format_formula(pred.strip() if wrapped else clean(pred))
    return _format_text(clean(pred))
