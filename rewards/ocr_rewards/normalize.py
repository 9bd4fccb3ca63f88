"""OmniDocBench markup normalization of text, HTML tables and LaTeX formulas.

The behaviour follows OmniDocBench's `utils/data_preprocess.py` (functions `clean_string`,
`textblock2unicode`, `normalized_html_table`, `normalized_formula`), restated here from its observable
behaviour, quirks included, so that our scores are comparable with the benchmark's:

- text: inline math (`$…$`, `\\(…\\)`) holding `\\`, `^` or `_` becomes unicode through pylatexenc;
  then only word characters survive (`\\t`, `\\n` as two-character escapes and `/t`, `/n` are dropped too).
- tables: `th` becomes `td`; `thead` and `span` are unwrapped; `<math alttext=…>` becomes
  `$alttext$`; entities are unescaped; newlines are deleted (not turned into spaces); NFKC; only the text
  from the first `<table …>` to the last `</table>` is kept (two tables merge into one); `style`,
  `height`, `width`, `align` and `class` attributes go, then bare `<tbody>` tags; whitespace runs become
  one space, and none is left between two tags; bare `<sup>`, `<sub>`, `<span>`, `<div>`, `<p>` tags and
  `<colgroup>` blocks go; the rest is wrapped as `<html><body><table border="1" >…</table></body></html>`.
  A string without `<table` gives `""`.
- formulas: surrounding whitespace, `$` and newlines are stripped; the first `\\[…\\]` body is taken;
  `\\tag{…}`, `\\hspace{…}`, `\\begin{…}`, `\\end{…}` and `\\arraycolsep…}` go; surrounding dots are
  stripped; a list of font/spacing commands and all spaces are deleted as substrings, `$$`, `\\left`,
  `\\right` and `\\displaystyle` included (so `\\bm` also eats the start of `\\bmod` and `\\leftarrow`
  becomes `arrow`); the result is lower-cased.

The deliberate differences: only the first `MAX_INLINE_FORMULAS` inline formulas of a text are rendered, so
that no text takes seconds; and OmniDocBench re-serializes table HTML through BeautifulSoup before the
string steps; here the DOM edits are done on the string itself (same result on well-formed markup, and no
extra dependency). The anchors' TEDS, TEDS-struct and NED values are reproduced exactly.

Time is linear in the input: the lazy regexes of upstream (`\\[(.+?)\\]`, `\\tag{.*?}`, `<math>.*?</math>`, ...)
rescan the rest of the line from every opening that has no closing, which is quadratic on a flood of
openings (docs/errors.md has the measurements). Each is restated as a scan that gives the same result and stops at the
first opening that cannot close (`tests/test_rewards_normalize.py` checks each against its regex on
random markup).
"""
from __future__ import annotations

import functools
import html
import re
import unicodedata

# ---------------------------------------------------------------- text

_ESCAPED_SPECIAL = re.compile(r"\\[\\_&%^]")  # OmniDocBench deletes the backslash AND the character
_NOT_WORD = re.compile(r"[^\w\u4e00-\u9fff]")
_TEXT_DROPPED = ("\\t", "\\n", "\t", "\n", "/t", "/n")
# pylatexenc takes ~0.15 ms a formula: a flood of distinct inline formulas in 65,536 characters on both sides
# took 3.5 s. Far more than a page holds; beyond it formulas stay as written (the only change to upstream).
MAX_INLINE_FORMULAS = 1_000


@functools.cache
def _latex_converter():
    from pylatexenc.latex2text import LatexNodes2Text  # pure python, imported on first inline formula

    return LatexNodes2Text()


@functools.lru_cache(maxsize=4096)  # a page repeats its symbols; a flood of one formula renders it once
def _rendered(content: str) -> str | None:
    """pylatexenc's unicode rendering of one inline formula, stripped; None when it cannot parse it."""
    try:
        return _latex_converter().latex_to_text(content).strip()
    except Exception:  # noqa: BLE001 - OmniDocBench leaves unparseable formulas as they are
        return None


def _inline_math(text: str):
    """(start, end, content) of every `$…$` and `\\(…\\)` (each within one line), as `re.finditer` of
    `\\$(.*?)\\$|\\\\\\((.*?)\\\\\\)` finds them, in one pass: an opening with no closing later on its line
    ends the search for that kind on the line (no later one can close either)."""
    offset = 0
    for line in text.split("\n"):
        pos, found = 0, {}   # opening -> its next position at or after pos (found once, kept until passed)
        kinds = {"$": "$", "\\(": "\\)"}   # opening -> closing, for the kinds that can still match
        while kinds:
            for opening in list(kinds):
                if found.get(opening, -1) < pos:
                    found[opening] = line.find(opening, pos)
                    if found[opening] < 0:
                        del kinds[opening]
            if not kinds:
                break
            opening = min(kinds, key=found.__getitem__)
            start, closing = found[opening], kinds[opening]
            end = line.find(closing, start + len(opening))
            if end < 0:
                del kinds[opening]
                continue
            yield offset + start, offset + end + len(closing), line[start + len(opening):end]
            pos = end + len(closing)
        offset += len(line) + 1


def inline_math_to_unicode(text: str) -> str:
    """Replace inline formulas that contain `\\`, `^` or `_` by their pylatexenc unicode rendering (the first
    `MAX_INLINE_FORMULAS` of them; later ones stay as written)."""
    pieces, done, rendered_count = [], 0, 0
    for start, end, content in _inline_math(text):
        content = _ESCAPED_SPECIAL.sub("", content)
        if not any(ch in content for ch in "\\^_"):
            continue
        rendered_count += 1
        if rendered_count > MAX_INLINE_FORMULAS:
            break
        if content.endswith("\\"):
            content += " "
        rendered = _rendered(content)
        if rendered is None:
            continue
        pieces += [text[done:start], rendered]
        done = end
    return "".join(pieces) + text[done:]


def normalize_text(text: str) -> str:
    """OmniDocBench text normalization: inline math to unicode, then word characters only.

    >>> normalize_text("E = $m c^2$ , done.")
    'Emc2done'
    """
    text = inline_math_to_unicode(text)
    for dropped in _TEXT_DROPPED:
        text = text.replace(dropped, "")
    return _NOT_WORD.sub("", text)


# ---------------------------------------------------------------- tables

_TH = re.compile(r"<(/?)th(?=[\s/>])", re.IGNORECASE)
_UNWRAPPED = re.compile(r"</?(?:thead|span)(?:\s[^>]*)?/?>", re.IGNORECASE)
_MATH_OPEN = re.compile(r"<math\b", re.IGNORECASE)
_MATH_CLOSE = re.compile(r"</math\s*>", re.IGNORECASE)
_ALTTEXT = re.compile(r"""\balttext\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))""", re.IGNORECASE)
_TABLE_OPEN = re.compile(r"<table\b", re.IGNORECASE)
_TABLE_CLOSE = re.compile(r"</table>", re.IGNORECASE)
_DROPPED_ATTRS = [re.compile(f'( {name}=".*?")') for name in ("style", "height", "width", "align", "class")]
_TBODY = re.compile(r"</?tbody>")
_SPACES = re.compile(r"\s+")
_BETWEEN_TAGS = re.compile(r">\s+<")
_BARE_TAGS = ("<sup>", "</sup>", "<sub>", "</sub>", "<span>", "</span>", "<div>", "</div>", "<p>", "</p>",
              '<spandata-span-identity="">')
_COLGROUP = re.compile(r"<colgroup>.*?</colgroup>")
TABLE_PREFIX = '<html><body><table border="1" >'
TABLE_SUFFIX = "</table></body></html>"


def _alttext(attributes: str) -> str:
    found = _ALTTEXT.search(attributes)
    alttext = next((g for g in found.groups() if g is not None), "") if found else ""
    return f"${alttext}$"  # also "$$" when there is no alttext, as upstream


def _math_to_alttext(text: str) -> str:
    """`re.sub(r"<math\\b([^>]*)>.*?</math\\s*>", "$alttext$", text, flags=re.I | re.S)` in one pass: an
    opening whose `>` or closing tag is missing ends the search (no later opening can close either)."""
    pieces, done = [], 0
    for opening in _MATH_OPEN.finditer(text):
        if opening.start() < done:
            continue
        end = text.find(">", opening.end())
        closing = _MATH_CLOSE.search(text, end + 1) if end >= 0 else None
        if closing is None:
            break
        pieces += [text[done:opening.start()], _alttext(text[opening.end():end])]
        done = closing.end()
    return "".join(pieces) + text[done:]


def _table_body(text: str) -> str:
    """`"".join(re.findall(r"<table\\b[^>]*>(.*)</table>", text, flags=re.I | re.S))`: from the `>` of the
    first `<table` to the last `</table>` ("" when that closing comes first or is missing)."""
    opening = _TABLE_OPEN.search(text)
    end = text.find(">", opening.end()) if opening else -1
    last = None
    for last in _TABLE_CLOSE.finditer(text, end + 1 if end >= 0 else len(text)):
        pass
    return text[end + 1:last.start()] if last is not None else ""


def _sub_before_last(pattern: re.Pattern, closing: str, text: str) -> str:
    """`pattern.sub("", text)` for a pattern whose matches end with `closing`: only the text up to the last
    `closing` is searched, so an opening past it is not rescanned to the end of the text."""
    cut = text.rfind(closing) + len(closing) if closing in text else 0
    return pattern.sub("", text[:cut]) + text[cut:]


def has_table_tag(text: str) -> bool:
    """OmniDocBench's test for "this output holds an HTML table" (spaces inside `< table` ignored)."""
    return "<table" in text.replace(" ", "").replace("'", '"')


def normalize_table_html(text: str) -> str:
    """OmniDocBench table normalization; `""` when the string holds no `<table`.

    >>> normalize_table_html("<table><thead><tr><th>a</th></tr></thead></table>")
    '<html><body><table border="1" ><tr><td>a</td></tr></table></body></html>'
    """
    if not has_table_tag(text):
        return ""
    text = _TH.sub(r"<\1td", text)
    text = _sub_before_last(_UNWRAPPED, ">", text)
    text = _math_to_alttext(text)
    text = html.unescape(text).replace("\n", "")
    text = unicodedata.normalize("NFKC", text).strip()
    text = _table_body(text)
    for pattern in _DROPPED_ATTRS:
        text = _sub_before_last(pattern, '"', text)
    text = _TBODY.sub("", text)
    text = _BETWEEN_TAGS.sub("><", _SPACES.sub(" ", text))
    text = TABLE_PREFIX + text + TABLE_SUFFIX
    for tag in _BARE_TAGS:
        text = text.replace(tag, "")
    return _sub_before_last(_COLGROUP, "</colgroup>", text)


# ---------------------------------------------------------------- formulas

_FORMULA_DROPPED_PREFIXES = ("\\tag{", "\\hspace{", "\\begin{", "\\end{", "\\arraycolsep")  # each to its "}"
_FORMULA_DROPPED_SUBSTRINGS = (
    "\\mathbf", "\\mathrm", "\\mathnormal", "\\mathit", "\\mathbb", "\\mathcal", "\\mathscr", "\\mathfrak",
    "\\mathsf", "\\mathtt", "\\textbf", "\\text", "\\boldmath", "\\boldsymbol", "\\operatorname", "\\bm",
    "\\symbfit", "\\mathbfcal", "\\symbf", "\\scriptscriptstyle", "\\notag", "\\setlength", "\\coloneqq",
    "\\space", "\\thickspace", "\\thinspace", "\\medspace", "\\nobreakspace", "\\negmedspace", "\\quad",
    "\\qquad", "\\enspace", "\\substackw", " ", "$$", "\\left", "\\right", "\\displaystyle",
)


def _display_body(text: str) -> str | None:
    """The body of the first `\\[…\\]`, as `re.search(r"\\\\\\[(.+?)(?<!\\\\)\\\\\\]")` finds it: on one line,
    at least one character, a closing `\\]` not itself escaped; None when there is none."""
    for line in text.split("\n"):
        start = line.find("\\[")  # only the first opening of a line can match: it sees every closing
        if start < 0:
            continue
        end = line.find("\\]", start + 3)
        while end >= 0 and line[end - 1] == "\\":
            end = line.find("\\]", end + 1)
        if end >= 0:
            return line[start + 2:end]
    return None


def _drop_to_brace(text: str, prefix: str) -> str:
    """`re.sub(re.escape(prefix) + r".*?\\}", "", text)`: each `prefix` up to the next `}` on its line goes."""
    pieces, done, pos, line_end = [], 0, 0, -1
    while (start := text.find(prefix, pos)) >= 0:
        if line_end < start:  # the end of the line holding `start`, found once per line
            line_end = text.find("\n", start)
            line_end = len(text) if line_end < 0 else line_end
        close = text.find("}", start + len(prefix), line_end)
        if close < 0:  # no later prefix on this line can close either
            pos = line_end
            continue
        pieces.append(text[done:start])
        done = pos = close + 1
    return "".join(pieces) + text[done:]


def normalize_formula(text: str) -> str:
    """OmniDocBench formula normalization (used before the formula edit distance).

    >>> normalize_formula(r"\\[ \\mathbf{X}_{i} \\quad \\tag{1} \\]")
    '{x}_{i}'
    """
    text = text.strip().strip("$").strip("\n")
    body = _display_body(text)
    if body is not None:
        text = body.strip()
    for prefix in _FORMULA_DROPPED_PREFIXES:
        text = _drop_to_brace(text, prefix)
    text = text.strip(".")
    for dropped in _FORMULA_DROPPED_SUBSTRINGS:
        text = text.replace(dropped, "")
    return text.lower()
