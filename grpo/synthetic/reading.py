"""Does a GLM-OCR checkpoint read its crops? Greedy reward on fresh image probes, paired with the same rows
shown a blank crop of the same size (docs/vlm.md; `benchmarks/vlm_reads.py` prints it).

A model that writes the split's language from the task prompt scores the same on both; one that reads scores
higher on the real crop. The probes are `tiny-probe@SEED` rendered by `build_image_split`, so a seed never
seen in training gives crops whose words, numbers and cells are new.

Example:
    >>> report = read_check(ckpt.model, ckpt.processor, ckpt.bd, seeds=[11], rows=12)   # doctest: +SKIP
    >>> report["all"]["diff"] > 0.35                                                    # doctest: +SKIP
"""
from __future__ import annotations

from typing import Any

from grpo.synthetic.render import build_image_split


def fresh_image_probe(seed: int, rows: int | None = None):
    """The first `rows` crops (all 60 if None) of the fresh probe `tiny-probe@seed`, rendered."""
    return build_image_split(f"tiny-probe@{seed}", rows)


def blanked(ds):
    """`ds` with every crop replaced by a white image of the same size."""
    from PIL import Image

    return ds.map(lambda row: {"image": Image.new("RGB", row["image"].size, "white")})


def drafts_by_line(output_ids: list[int], accepted: list[int], decode) -> list[tuple[int, int]]:
    """(output line, drafts accepted) of each verified round of a self-speculative decode (docs/spec.md §5: the
    prefill gives x0, a round commits a0, its accepted drafts and the verifier's next token). A round's line counts
    the line breaks written up to its a0, the line its drafts start on (0: the first). `decode`: ids -> text."""
    out, end = [], 1                       # tokens[:end] are committed before the round's a0
    for a in accepted:
        out.append((decode(output_ids[: end + 1]).count("\n"), a))
        end += a + 2
    return out


def grouped(rows: list[dict]) -> dict[str, list[int]]:
    """The report groups of probe rows, `all` first, then each task, then each task by its crop's lines (`text/4
    lines`), each with the indices of its rows. A row's lines are its crop's cell rows (`image`, or the crop
    `render_row` draws for a text-only row): one per text line or table row; a formula longer than a row wraps."""
    from grpo.synthetic.render import CELL, render_row

    names = []
    for row in rows:
        lines = (row["image"] if "image" in row else render_row(row)).height // CELL
        names.append({"all", row["task_type"], f"{row['task_type']}/{lines} line{'s' * (lines > 1)}"})
    return {name: [i for i, n in enumerate(names) if name in n]
            for name in sorted(set().union(*names), key=lambda g: (g != "all", g))}


def read_check(model: Any, processor: Any, bd: Any, seeds: list[int], rows: int | None = None,
               max_new_tokens: int = 512, compare_ar: bool = True) -> dict:
    """Per group (`all`, each task, each task by its crop's lines, e.g. `text/4 lines`): the paired greedy reward
    on real vs blank crops of the fresh probes of `seeds` (`grpo.evaluation.stats.paired_interval`: `after` real,
    `before` blank, `diff`, its 95% `low`/`high`), and for the real crops TPF, the AR-equal share (`tpf`,
    `ar_equal`) and `drafts_by_line`: per output line (0: the first), [verified rounds, mean drafts accepted]."""
    from grpo.checkpoint import tokenizer_of
    from grpo.decoding.tpf import measure_tpf, tpf_of
    from grpo.evaluation.stats import paired_interval

    real, blank, probes = [], [], []
    for seed in seeds:
        probe = fresh_image_probe(seed, rows)
        for ds, out, compare in ((probe, real, compare_ar), (blanked(probe), blank, False)):
            stats = measure_tpf(model, processor, ds, bd, is_vlm=True, max_new_tokens=max_new_tokens,
                                compare_ar=compare, score=True, batch_size=8)
            out.extend(stats["rows"])
        probes.extend(probe)
    decode = tokenizer_of(processor).decode
    rounds = [drafts_by_line(r["output_ids"], r["accepted"], decode) for r in real]   # once per crop, not per group
    report = {}
    for group, pick in grouped(probes).items():
        report[group] = paired_interval([blank[i]["reward"] for i in pick], [real[i]["reward"] for i in pick])
        report[group]["tpf"] = tpf_of([real[i] for i in pick])
        if compare_ar:
            report[group]["ar_equal"] = sum(bool(real[i]["ar_equal"]) for i in pick) / len(pick)
        by_line: dict[int, list[int]] = {}
        for i in pick:
            for line, a in rounds[i]:
                by_line.setdefault(line, []).append(a)
        report[group]["drafts_by_line"] = {n: [len(v), sum(v) / len(v)] for n, v in sorted(by_line.items())}
    return report
