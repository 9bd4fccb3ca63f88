"""Formula reward: `sim(canon(pred), canon(ref)) * 0.3**v`, a rendering-free proxy for CDM (docs/spec.md §4).

`canon` is the formula normalization of the reward. It deliberately does not start from OmniDocBench's
`normalized_formula`, which lower-cases (`\\Pi` = `\\pi`) and deletes `\\left` as a substring (`\\leftarrow`
becomes `arrow`); that benchmark similarity is still reported, as the component `omnidoc_sim`.
`v` counts the well-formedness checks the reference passes and the prediction fails, on the raw strings.
"""
from __future__ import annotations

import re

from .normalize import normalize_formula
from .similarity import similarity

PENALTY_BASE = 0.3  # each failed well-formedness check multiplies the reward by 0.3

_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|\s+|.", re.DOTALL)
_DELIMITERS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))
_SPACING = frozenset({
    "\\,", "\\;", "\\:", "\\!", "\\>", "\\ ", "\\\n", "\\\t", "~", "\\quad", "\\qquad", "\\enspace",
    "\\thinspace", "\\medspace", "\\thickspace", "\\negthinspace", "\\negmedspace", "\\negthickspace",
    "\\space", "\\nobreakspace", "\\enskip", "\\hfill",
})
_SPACING_WITH_ARGUMENT = frozenset({"\\hspace", "\\vspace", "\\hskip", "\\vskip", "\\kern", "\\mkern",
                                    "\\mskip", "\\phantom", "\\hphantom", "\\vphantom"})
_FRACTIONS = frozenset({"\\dfrac", "\\tfrac"})
_SIZED_DELIMITERS = frozenset({"\\left", "\\right"})
_ENVIRONMENT = re.compile(r"\\\\|\\(begin|end)\s*\{([^{}]*)\}")


def strip_delimiters(latex: str) -> str:
    """Remove enclosing `$$…$$`, `\\[…\\]`, `\\(…\\)` and `$…$` (repeatedly) and surrounding space.
    Done on indices, so a flood of `$` is not copied once per pair."""
    text = latex.strip()
    start, end = 0, len(text)
    stripped = True
    while stripped:
        stripped = False
        for left, right in _DELIMITERS:
            if (end - start >= len(left) + len(right) and text.startswith(left, start, end)
                    and text.endswith(right, start, end)):
                start, end = start + len(left), end - len(right)
                while start < end and text[start].isspace():
                    start += 1
                while end > start and text[end - 1].isspace():
                    end -= 1
                stripped = True
                break
    return text[start:end]


def _skip_argument(tokens: list[str], start: int) -> int:
    """Index after the optional `*` and the `{…}` group (or single token) that follow position `start`."""
    i = start
    while i < len(tokens) and tokens[i].isspace():
        i += 1
    if i < len(tokens) and tokens[i] == "*":
        i += 1
    while i < len(tokens) and tokens[i].isspace():
        i += 1
    if i < len(tokens) and tokens[i] == "{":
        depth = 0
        while i < len(tokens):
            depth += {"{": 1, "}": -1}.get(tokens[i], 0)
            i += 1
            if depth == 0:
                break
        return i
    return i + 1 if i < len(tokens) else i


def canon(latex: str) -> str:
    """Canonical form: no delimiters, `\\dfrac`/`\\tfrac` → `\\frac`, no `\\left`/`\\right` (whole
    commands only: `\\leftarrow` stays) nor their `.` null delimiter, no spacing commands, braces or
    whitespace. Escaped braces `\\{ \\}` are kept.

    >>> canon(r"$$ \\left( \\dfrac{a}{b} \\right) \\, \\leftarrow x $$")
    '(\\\\fracab)\\\\leftarrowx'
    """
    tokens = _TOKEN.findall(strip_delimiters(latex))
    out = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token in _SIZED_DELIMITERS:
            while i < len(tokens) and tokens[i].isspace():
                i += 1
            if i < len(tokens) and tokens[i] == ".":
                i += 1
        elif token in _SPACING_WITH_ARGUMENT:
            i = _skip_argument(tokens, i)
        elif token in _SPACING or token in "{}" or token.isspace():
            continue
        else:
            out.append("\\frac" if token in _FRACTIONS else token)
    return "".join(out)


def _balanced(tokens: list[str], opening: str, closing: str) -> bool:
    depth = 0
    for token in tokens:
        if token == opening:
            depth += 1
        elif token == closing:
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def _environments_nested(latex: str) -> bool:
    stack = []
    for match in _ENVIRONMENT.finditer(latex):
        kind, name = match.group(1), (match.group(2) or "").strip()
        if kind == "begin":
            stack.append(name)
        elif kind == "end" and (not stack or stack.pop() != name):
            return False
    return not stack


def well_formedness(latex: str) -> dict[str, bool]:
    """The checks behind `v`: braces, ()/[] brackets, environments, `$` pairs, `\\left`/`\\right` pairs."""
    tokens = _TOKEN.findall(latex)
    return {
        "braces": _balanced(tokens, "{", "}"),
        "brackets": _balanced(tokens, "(", ")") and _balanced(tokens, "[", "]"),
        "environments": _environments_nested(latex),
        "dollars": tokens.count("$") % 2 == 0,
        "left_right": _balanced(tokens, "\\left", "\\right"),
    }


def violations(pred: str, ref: str) -> int:
    """`v`: how many checks the reference passes and the prediction fails."""
    pred_checks, ref_checks = well_formedness(pred), well_formedness(ref)
    return sum(ref_checks[name] and not pred_checks[name] for name in ref_checks)


def score_formula(pred: str, ref: str) -> tuple[float, dict[str, float]]:
    """Base reward (before the gate) and its components.

    >>> score_formula(r"\\frac{a}{b", r"\\frac{a}{b}")[0]
    0.3
    """
    sim = similarity(canon(pred), canon(ref))
    v = violations(pred, ref)
    omnidoc_sim = similarity(normalize_formula(pred), normalize_formula(ref))
    return sim * PENALTY_BASE ** v, {"sim": sim, "v": float(v), "omnidoc_sim": omnidoc_sim}
