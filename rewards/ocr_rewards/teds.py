"""PubTabNet's TEDS (tree-edit-distance similarity) between two HTML tables.

Definition (PubTabNet `src/metric.py`): the HTML is parsed by lxml's HTML parser (comments removed) and
the table is `body/table`. Every element from `<table>` down is a tree node labelled by its tag; a `td`
also carries its `colspan` and `rowspan` (integers, default 1) and is a leaf. Insert and delete cost 1;
a rename costs 1 when tag, colspan or rowspan differ, otherwise 0 for the structure-only TEDS, and for
the full TEDS, between two `td`, the Levenshtein distance of their content tokens divided by the longer
length (0 when both are empty). Content tokens: the cell text character by character, and for each
element inside the cell `<tag>`, its text, its children, `</tag>` and its tail. Then
`TEDS = 1 - distance / max(n_pred, n_ref)`, n counting every element below `<table>`, those inside
cells included, as upstream does (a TEDS can thus fall below 0 on absurd trees; the table reward clips).

Our extensions: a bare `<table>` fragment (or text around one table) is accepted where upstream returns 0,
two empty tables score 1 where upstream divides by zero, an unparsable span attribute is a label of its
own where upstream raises. Parsed trees are cached, so a reference is parsed once per process.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from lxml import etree
from rapidfuzz.distance import Levenshtein
from rapidfuzz.process import cdist

from .zhang_shasha import keyroots, tree_edit_distance

# the parser of PubTabNet's metric.py; plain lxml elements (lxml.html's element classes cost a Python
# lookup per node and change nothing here)
_PARSER = etree.HTMLParser(remove_comments=True, encoding="utf-8")
_LABELS: dict[tuple, int] = {}   # (tag, colspan, rowspan) -> label id, shared by all trees of this process
_TOKENS: dict[str, str] = {}     # content token -> one character, so cell contents are plain strings
_SURROGATES = range(0xD800, 0xE000)


@dataclass(frozen=True)
class TableTree:
    """A table as postorder arrays for `ocr_rewards.zhang_shasha`, plus what TEDS needs around them."""

    lml: np.ndarray        # (n,) leftmost-leaf index of each node
    keyroots: np.ndarray   # (k,) Zhang–Shasha keyroots
    labels: np.ndarray     # (n,) label id of (tag, colspan, rowspan)
    cells: np.ndarray      # (n,) index into `texts` for `td` nodes, -1 otherwise
    texts: tuple[str, ...]  # one string per `td` (a character per content token); empty when structure-only
    n_elements: int        # elements below <table>, PubTabNet's node count


def find_table(markup: str) -> etree._Element | None:
    """The `<table>` element PubTabNet would score: `body/table` (libxml2 puts a fragment's top-level
    elements under `html/body` too, so a bare `<table>` is found the same way)."""
    if not markup:
        return None
    try:
        root = etree.fromstring(markup, _PARSER)
    except (etree.ParserError, ValueError, TypeError):
        return None
    return None if root is None else root.find("body/table")


def span(value: str | None):
    """A `colspan`/`rowspan` attribute as PubTabNet reads it: `int(value)`, default 1.

    Values that `int` refuses stay as strings (a label of their own) instead of raising.
    """
    if value is None:
        return 1
    try:
        return int(value)
    except ValueError:
        return value


def _label(node: etree._Element) -> int:
    if node.tag == "td":
        key = ("td", span(node.get("colspan")), span(node.get("rowspan")))
    else:
        key = (node.tag, None, None)
    return _LABELS.setdefault(key, len(_LABELS))


def _token_char(token: str) -> str:
    char = _TOKENS.get(token)
    if char is None:
        code = len(_TOKENS)
        code += len(_SURROGATES) if code >= _SURROGATES.start else 0
        char = _TOKENS[token] = chr(code)
    return char


def cell_tokens(td: etree._Element) -> list[str]:
    """PubTabNet's content tokens of a cell (see the module docstring); iterative, any depth."""
    tokens = list(td.text or "")
    stack = [(child, False) for child in reversed(td)]
    while stack:
        node, closing = stack.pop()
        if closing:
            if node.tag != "unk":
                tokens.append("</%s>" % node.tag)
            if node.tag != "td" and node.tail:
                tokens.extend(node.tail)
            continue
        tokens.append("<%s>" % node.tag)
        tokens.extend(node.text or "")
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(node))
    return tokens


def build_tree(table: etree._Element, structure_only: bool = True) -> TableTree:
    """Postorder arrays of the PubTabNet tree rooted at `table` (cells are leaves)."""
    labels, lml, cells, texts = [], [], [], []
    # stack entries: [element, iterator over its children, leftmost leaf index of its first child]
    stack = [[table, iter(table), None]]
    while stack:
        top = stack[-1]
        child = None if top[0].tag == "td" else next(top[1], None)
        if child is not None:
            stack.append([child, iter(child), None])
            continue
        stack.pop()
        node, index = top[0], len(labels)
        leftmost = index if top[2] is None else top[2]
        labels.append(_label(node))
        lml.append(leftmost)
        if node.tag == "td":
            cells.append(len(texts) if not structure_only else -1)
            if not structure_only:
                texts.append("".join(map(_token_char, cell_tokens(node))))
        else:
            cells.append(-1)
        if stack and stack[-1][2] is None:
            stack[-1][2] = leftmost
    lml_array = np.array(lml, dtype=np.int64)
    n_elements = sum(1 for _ in table.iterdescendants(etree.Element))
    return TableTree(lml_array, keyroots(lml_array), np.array(labels, dtype=np.int64),
                     np.array(cells, dtype=np.int64), tuple(texts), n_elements)


def _text_costs(texts1: tuple[str, ...], texts2: tuple[str, ...]) -> np.ndarray:
    """(len(texts1), len(texts2)) normalized Levenshtein distances, 0 where both texts are empty."""
    if not texts1 or not texts2:
        return np.zeros((0, 0))
    distance = cdist(texts1, texts2, scorer=Levenshtein.distance, dtype=np.int64).astype(np.float64)
    longest = np.maximum.outer(np.array([len(t) for t in texts1]), np.array([len(t) for t in texts2]))
    return np.divide(distance, longest, out=np.zeros_like(distance), where=longest > 0)


def tree_similarity(pred: TableTree, ref: TableTree) -> float:
    """TEDS between two built trees (full when both carry cell texts, else structure-only).

    Raises `ocr_rewards.zhang_shasha.TreeTooLarge` on trees beyond its bounds.
    """
    n_elements = max(pred.n_elements, ref.n_elements)
    if pred.texts == ref.texts and all(np.array_equal(getattr(pred, f), getattr(ref, f))
                                       for f in ("lml", "labels", "cells")):
        return 1.0  # the same tree: distance 0, found in linear time (a large table of the right shape)
    text_cost = _text_costs(pred.texts, ref.texts)
    distance = tree_edit_distance(pred.lml, pred.keyroots, pred.labels, pred.cells,
                                  ref.lml, ref.keyroots, ref.labels, ref.cells, text_cost)
    if n_elements == 0:  # two empty tables
        return 1.0 if distance == 0 else 0.0
    return 1.0 - distance / n_elements


@functools.lru_cache(maxsize=4096)
def parse_tree(markup: str, structure_only: bool = True) -> TableTree | None:
    """`build_tree(find_table(markup))`, cached; None when the string holds no table."""
    table = find_table(markup)
    return None if table is None else build_tree(table, structure_only)


def teds(pred_html: str, ref_html: str, structure_only: bool = True) -> float:
    """PubTabNet TEDS of two HTML strings as given (no OmniDocBench normalization); 0 without a table.

    >>> teds("<table><tr><td>a</td></tr></table>", "<table><tr><td>a</td><td>b</td></tr></table>")
    0.6666666666666667
    """
    pred = parse_tree(pred_html, structure_only)
    ref = parse_tree(ref_html, structure_only)
    if pred is None or ref is None:
        return 0.0
    return tree_similarity(pred, ref)
