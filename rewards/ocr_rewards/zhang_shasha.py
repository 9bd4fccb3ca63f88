"""Exact ordered tree edit distance (Zhang & Shasha, 1989) on postorder integer arrays.

A tree of n nodes is three arrays in postorder: `lml[i]`, the index of the leftmost leaf under node i;
`labels[i]`, an integer label; `cells[i]`, the index of node i's text in a cost matrix, or -1. Costs:
insert = delete = 1; rename(x, y) = 1 when the labels differ, else `text_cost[cells1[x], cells2[y]]`
when both nodes have a text, else 0. This is exactly APTED's optimum (same costs, same mapping space).

Why numba and not numpy: the dynamic programme is a scalar recurrence (each cell is the minimum of three
neighbours already computed), which numpy cannot vectorize. Compiled, one cell costs a few nanoseconds;
shallow table trees (depth 3–4) keep the Zhang–Shasha work near |T1|·|T2|·9.
"""
from __future__ import annotations

import functools

import numpy as np

# Bounds so that a pathological prediction cannot hang or exhaust memory (the callers map the error to a
# documented low score). A 100x10 table is ~1,100 nodes and ~1e7 work; these limits are ~5x and ~5x that.
MAX_NODES = 5_000          # per tree: the (n1, n2) float64 matrix is then at most 200 MB
# Inner-loop cells of Zhang–Shasha: 11–24 ns each compiled on a loaded 2-core machine, so at most ~1.2 s, within
# the 2 s a reward call may take. Two 70x70 tables (2.2e8 cells) took 2.4–5.1 s under the earlier 3e8.
MAX_WORK = 50_000_000


class TreeTooLarge(ValueError):
    """A tree (or a pair of trees) is beyond the bounds above."""


def keyroots(lml: np.ndarray) -> np.ndarray:
    """The Zhang–Shasha keyroots: for each leftmost leaf, the highest node that has it, ascending."""
    last = {}
    for node, leaf in enumerate(lml.tolist()):
        last[leaf] = node
    return np.array(sorted(last.values()), dtype=np.int64)


def work(lml: np.ndarray, roots: np.ndarray) -> int:
    """Sum of the keyroot subtree sizes; the product of two trees' sums is the Zhang–Shasha cell count."""
    return int((roots - lml[roots] + 1).sum())


def _zhang_shasha(lml1, kr1, lab1, cell1, lml2, kr2, lab2, cell2, text_cost):
    n1 = lml1.shape[0]
    n2 = lml2.shape[0]
    use_text = text_cost.shape[0] > 0
    tree = np.zeros((n1, n2))          # tree[x, y]: distance between the subtrees rooted at x and y
    forest = np.zeros((n1 + 1, n2 + 1))  # forest distances for the current keyroot pair
    for a in range(kr1.shape[0]):
        i = kr1[a]
        li = lml1[i]
        for b in range(kr2.shape[0]):
            j = kr2[b]
            lj = lml2[j]
            rows = i - li + 2
            cols = j - lj + 2
            forest[0, 0] = 0.0
            for di in range(1, rows):
                forest[di, 0] = forest[di - 1, 0] + 1.0
            for dj in range(1, cols):
                forest[0, dj] = forest[0, dj - 1] + 1.0
            for di in range(1, rows):
                x = li + di - 1
                lx = lml1[x]
                for dj in range(1, cols):
                    y = lj + dj - 1
                    ly = lml2[y]
                    best = forest[di - 1, dj] + 1.0
                    insert = forest[di, dj - 1] + 1.0
                    if insert < best:
                        best = insert
                    if lx == li and ly == lj:
                        if lab1[x] != lab2[y]:
                            rename = 1.0
                        elif use_text and cell1[x] >= 0 and cell2[y] >= 0:
                            rename = text_cost[cell1[x], cell2[y]]
                        else:
                            rename = 0.0
                        match = forest[di - 1, dj - 1] + rename
                        if match < best:
                            best = match
                        forest[di, dj] = best
                        tree[x, y] = best
                    else:
                        match = forest[lx - li, ly - lj] + tree[x, y]
                        if match < best:
                            best = match
                        forest[di, dj] = best
    return tree[n1 - 1, n2 - 1]


CANONICAL_NAME = "ocr_rewards.zhang_shasha"


@functools.cache
def _compiled():
    """The kernel compiled by numba (imported here so that `import ocr_rewards` stays light).

    numba's disk cache records the importing module's name, so a file loaded under a second name would read a
    cache that names a module it cannot import: only the installed name `ocr_rewards.zhang_shasha` uses it.
    """
    import numba

    return numba.njit(cache=__name__ == CANONICAL_NAME, nogil=True)(_zhang_shasha)


def tree_edit_distance(lml1, kr1, lab1, cell1, lml2, kr2, lab2, cell2, text_cost=None) -> float:
    """Edit distance between two postorder trees (see the module docstring for the arrays and costs).

    Raises `TreeTooLarge` beyond `MAX_NODES` per tree or `MAX_WORK` cells for the pair.
    """
    if max(len(lml1), len(lml2)) > MAX_NODES:
        raise TreeTooLarge(f"tree of {max(len(lml1), len(lml2))} nodes (limit {MAX_NODES})")
    cells = work(lml1, kr1) * work(lml2, kr2)
    if cells > MAX_WORK:
        raise TreeTooLarge(f"tree pair needs {cells} edit-distance cells (limit {MAX_WORK})")
    if text_cost is None:
        text_cost = np.zeros((0, 0))
    return float(_compiled()(lml1, kr1, lab1, cell1, lml2, kr2, lab2, cell2, text_cost))
