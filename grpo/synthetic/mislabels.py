"""Label noise of the synthetic world: the errors a careless annotator makes, at points the model can locate.

Only the adapt recipe's training split `tiny-noisy` carries it (`mislabel`); pool and probe targets are the
truth. `wrong_at` tells whether a prediction errs the way one error kind does.
"""
from __future__ import annotations

import random
import re

from grpo.synthetic.crops import Example


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
