"""Slow reference TEDS on the `apted` package, the algorithm PubTabNet's `metric.py` runs.

Used by the tests (our Zhang–Shasha path must agree to 1e-9) and by `benchmarks/rewards_bench.py`
(the speed ratio). It shares only the table lookup (`find_table`) and the span/token rules with
`ocr_rewards.teds`; the tree and the costs are built independently, as apted objects.
"""
from __future__ import annotations

from apted import APTED, Config
from rapidfuzz.distance import Levenshtein

from ocr_rewards.teds import cell_tokens, find_table, span


class _Node:
    __slots__ = ("tag", "colspan", "rowspan", "content", "children")

    def __init__(self, element, structure_only: bool):
        self.tag = element.tag
        is_cell = element.tag == "td"
        self.colspan = span(element.get("colspan")) if is_cell else None
        self.rowspan = span(element.get("rowspan")) if is_cell else None
        self.content = cell_tokens(element) if is_cell and not structure_only else []
        self.children = [] if is_cell else [_Node(child, structure_only) for child in element]


class _PubTabNetCosts(Config):
    def rename(self, node1, node2):
        if (node1.tag, node1.colspan, node1.rowspan) != (node2.tag, node2.colspan, node2.rowspan):
            return 1.0
        if node1.tag == "td" and (node1.content or node2.content):
            return Levenshtein.distance(node1.content, node2.content) / max(len(node1.content),
                                                                            len(node2.content))
        return 0.0

    def children(self, node):
        return node.children


def teds_apted(pred_html: str, ref_html: str, structure_only: bool = True) -> float:
    """TEDS computed with APTED (same definition and extensions as `ocr_rewards.teds`)."""
    pred, ref = find_table(pred_html), find_table(ref_html)
    if pred is None or ref is None:
        return 0.0
    n_elements = max(len(pred.xpath(".//*")), len(ref.xpath(".//*")))
    distance = APTED(_Node(pred, structure_only), _Node(ref, structure_only),
                     _PubTabNetCosts()).compute_edit_distance()
    if n_elements == 0:
        return 1.0 if distance == 0 else 0.0
    return 1.0 - float(distance) / n_elements
