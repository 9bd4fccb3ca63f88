"""The model card (`README.md`) of a finished GRPO run folder, which holds the final model at its root.

It names what a reader of the folder asks first: which checkpoint was trained, with which recipe and rewards,
and what the run measured on the held-out probe set (greedy reward and TPF at the first and the last probe,
paired over prompts). Every figure comes from the run's probe records; without two probes the card says so.

Example:
    >>> card = model_card(source="tiny (data/tiny/model)", recipe="tiny_cpu", steps=2,
    ...                   rewards="OcrReward(gate='relative', table_bonus='scaled')", held_out=None)
    >>> card.splitlines()[0]
    '# GRPO run: tiny (data/tiny/model), 2 steps'
"""
from __future__ import annotations

from typing import Any


def _held_out_rows(held_out: dict[str, Any]) -> list[str]:
    """A markdown table of the before/after change per group (as `grpo.evaluation.drift.held_out_change`)."""
    first, last = held_out["steps"]
    rows = [f"Held-out greedy reward and TPF, step {first} → step {last}, paired over prompts (95% interval):",
            "",
            "| group | n | reward before | reward after | difference [95% CI] | TPF before | TPF after |",
            "|---|---|---|---|---|---|---|"]
    for name, c in held_out.items():
        if name != "steps":
            rows.append(f"| {name} | {c['n']} | {c['before']:.3f} | {c['after']:.3f} | "
                        f"{c['diff']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}] | {c['tpf'][0]:.2f} | "
                        f"{c['tpf'][1]:.2f} |")
    return rows


def model_card(*, source: str, recipe: str | None, steps: int, rewards: str,
               held_out: dict[str, Any] | None) -> str:
    """The card's markdown: source checkpoint, recipe, rewards, the held-out change, and how to load it."""
    lines = [f"# GRPO run: {source}, {steps} steps", "",
             "GRPO (TRL's `GRPOTrainer` through the causal AR path, `gravity-grpo train`) of a joint AR / "
             "block-diffusion checkpoint. The model at the root of this folder is the final one; `checkpoint-N/` "
             "are the saved steps.", "",
             f"- source checkpoint: `{source}`",
             f"- recipe: `{recipe or 'defaults and command-line keys only'}` (every key: `run_config.json`)",
             f"- rewards: `{rewards}`", ""]
    if held_out is None:
        lines.append("The run probed the held-out set fewer than twice, so it reports no before/after change "
                     "(`tpf_every`).")
    else:
        lines += _held_out_rows(held_out)
    lines += ["", "Load it as any checkpoint of this package (`--model` of `tpf`, `tpf-drift`, `mine`, `train`), or "
              "with transformers' `AutoModelForCausalLM.from_pretrained` (text) / "
              "`AutoModelForImageTextToText.from_pretrained` (GLM-OCR) on this folder.", ""]
    return "\n".join(lines)
