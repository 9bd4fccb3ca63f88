"""Table reward (docs/spec.md §4), on OmniDocBench-normalized HTML, with `base = (0.45*TEDS_s + 0.55*s_cell) *
(1 - p_row) * (1 - p_loop)` and the shape bonus `b = 0.05*[R^ = R] + 0.05*[C^ = C]` read one of two ways
(`table_bonus`):

- `clipped` (the formula as published): `clip01(base + b)`. An imperfect table of the right shape with
  base >= 0.9 scores exactly 1.0, tied with a perfect one: its group advantage vanishes;
- `scaled`: `(clip01(base) + b) / 1.1`. A perfect table still scores 1.0, and every imperfect one less.

- a prediction whose last `<table` has no later `</table>` scores 0 (checked on the raw string, since
  parsers close tables silently);
- a prediction without a table that has rows scores `0.15 * (1 - NED)` of the OmniDocBench-normalized
  texts (a table's text being its cells); against a reference without such a table (a mislabelled row)
  every prediction scores that text similarity, without the 0.15 factor;
- TEDS_s bounded by `ocr_rewards.zhang_shasha` (a tree beyond `MAX_NODES` / `MAX_WORK`) counts as 0, flagged
  `teds_bounded`.
"""
from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass

from .normalize import normalize_table_html, normalize_text
from .similarity import similarity
from .zhang_shasha import TreeTooLarge
from .teds import TableTree, build_tree, find_table, span, tree_similarity

W_TEDS, W_CELL = 0.45, 0.55
SHAPE_BONUS = 0.05       # each of "same row count" and "same column count"
NO_TABLE_FACTOR = 0.15   # share of the text similarity a table-less output keeps
MAX_COLSPAN = 1000       # a larger colspan counts as this many columns
CELL_SEPARATOR = "\t"    # between cells in s_cell and in row keys (cell texts have no tabs)
TABLE_BONUS = ("clipped", "scaled")  # readings of the shape bonus (module docstring); default: `RewardSettings`


@dataclass(frozen=True)
class ParsedTable:
    """A normalized table, parsed once: its TEDS tree and the cell texts row by row."""

    normalized: str
    tree: TableTree
    rows: tuple[tuple[str, ...], ...]
    n_cols: int

    @property
    def cell_text(self) -> str:
        return CELL_SEPARATOR.join(cell for row in self.rows for cell in row)

    @property
    def row_keys(self) -> Counter:
        return Counter(CELL_SEPARATOR.join(row) for row in self.rows)


def is_unclosed(raw: str) -> bool:
    """True when the last `<table` of the raw string has no `</table>` after it."""
    lowered = raw.lower()
    last_open = lowered.rfind("<table")
    return last_open >= 0 and lowered.find("</table>", last_open) < 0


def _colspan(td) -> int:
    value = span(td.get("colspan"))
    return min(max(value, 1), MAX_COLSPAN) if isinstance(value, int) else 1


@functools.lru_cache(maxsize=4096)
def parse_table(raw: str) -> ParsedTable | None:
    """Normalize and parse a raw output (cached: a reference is parsed once per process).

    None when it holds no table with at least one row.
    """
    normalized = normalize_table_html(raw)
    table = find_table(normalized) if normalized else None
    if table is None:
        return None
    rows, n_cols = [], 0
    for tr in table.iter("tr"):
        cells = [td for td in tr if td.tag == "td"]
        rows.append(tuple(" ".join("".join(td.itertext()).split()) for td in cells))
        n_cols = max(n_cols, sum(_colspan(td) for td in cells))
    if not rows:
        return None
    return ParsedTable(normalized, build_tree(table, structure_only=True), tuple(rows), n_cols)


def loop_excess(pred_keys: Counter, ref_keys: Counter) -> int:
    """Rows the prediction repeats beyond what the reference has (at least once) of each row key."""
    return sum(max(0, count - max(ref_keys[key], 1)) for key, count in pred_keys.items() if count >= 2)


def _visible_text(raw: str, parsed: ParsedTable | None) -> str:
    return normalize_text(" ".join(cell for row in parsed.rows for cell in row) if parsed else raw)


def check_table_bonus(table_bonus: str) -> None:
    """Raise a ValueError naming the valid readings when `table_bonus` is not one of them."""
    if table_bonus not in TABLE_BONUS:
        raise ValueError(f"unknown table_bonus {table_bonus!r}; valid: {', '.join(TABLE_BONUS)}")


def score_table(pred: str, ref: str, table_bonus: str) -> tuple[float, dict[str, float]]:
    """Reward before the gate, with the shape bonus read as `table_bonus`, and its components.

    >>> score_table("<table><tr><td>1</td><td>2</td></tr>", "<table><tr><td>1</td></tr></table>", "clipped")
    (0.0, {'unclosed': 1.0})
    """
    if is_unclosed(pred):
        return 0.0, {"unclosed": 1.0}
    pred_table, ref_table = parse_table(pred), parse_table(ref)
    if pred_table is None or ref_table is None:
        sim = similarity(_visible_text(pred, pred_table), _visible_text(ref, ref_table))
        if ref_table is None:
            return sim, {"no_table_ref": 1.0, "sim": sim}
        return NO_TABLE_FACTOR * sim, {"no_table": 1.0, "sim": sim}

    components = {}
    if pred_table.normalized == ref_table.normalized:
        teds_s = 1.0
    else:
        try:
            teds_s = min(1.0, max(0.0, tree_similarity(pred_table.tree, ref_table.tree)))
        except TreeTooLarge:
            teds_s, components["teds_bounded"] = 0.0, 1.0
    s_cell = similarity(pred_table.cell_text, ref_table.cell_text)
    n_rows, ref_rows = len(pred_table.rows), len(ref_table.rows)
    p_row = min(1.0, abs(n_rows - ref_rows) / max(ref_rows, 1))
    p_loop = min(1.0, loop_excess(pred_table.row_keys, ref_table.row_keys) / max(ref_rows, 1))
    bonus_rows = SHAPE_BONUS * (n_rows == ref_rows)
    bonus_cols = SHAPE_BONUS * (pred_table.n_cols == ref_table.n_cols)
    base = (W_TEDS * teds_s + W_CELL * s_cell) * (1 - p_row) * (1 - p_loop)
    if table_bonus == "clipped":
        value = base + bonus_rows + bonus_cols
    else:
        value = (min(1.0, max(0.0, base)) + bonus_rows + bonus_cols) / (1 + 2 * SHAPE_BONUS)
    components.update(teds_s=teds_s, s_cell=s_cell, p_row=p_row, p_loop=p_loop,
                      bonus_rows=bonus_rows, bonus_cols=bonus_cols,
                      rows=float(n_rows), rows_ref=float(ref_rows),
                      cols=float(pred_table.n_cols), cols_ref=float(ref_table.n_cols))
    return min(1.0, max(0.0, value)), components
