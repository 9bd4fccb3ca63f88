"""Decode presets: the settings that shape a TPF figure, named once, each with the GravityOCR path it follows.

Sources are trillion-labs/GravityOCR at commit df7d2cb (docs/tpf.md, "Presets", has the table):

- `cpu` (the default): the tiny world's settings; fp32, one output cap for every task (the caller's), crops as
  given, stop at the generation config's and the tokenizer's EOS ids. It follows no GravityOCR path.
- `gravityocr`: the published OmniDocBench evaluation, `slurm/eval_omnidocbench.slurm` with its defaults
  (`FAST=1 BS=8`, `LONGSIDE=99999`), i.e. `src/infer_omnidocbench.py --fast --batch_size 8`: its batched path
  (`ocr_regions_batched` -> `src/fast_sampling_batched.py` `generate_cached_batched`). bf16; caps
  `MAX_NEW_TOKENS` `{text: 512, table: 4096, formula: 4096}` (`infer_omnidocbench.py:96`), 512 for any other
  task (`MAX_NEW_TOKENS.get(task_type, 512)` in `ocr_regions_batched`); crops as given (`full`); stop at the
  generation config's EOS ids and the tokenizer's (`fast_sampling_batched.py:117-123`: GLM-OCR's
  `[59246, 59253]` with the tokenizer's 59246). That path decodes by block diffusion; this preset takes its caps,
  crops and stop set, and decodes with this package's self-speculative round.
- `gravityocr-bench`: the forward bench (`tools/bench_forwards.py`, its `spec_natcache_ds1` arm, batch 1):
  `src/fast_sampling.py` `generate_speculative_natcache`. bf16; caps `{text: 256, table: 768}` and 256 for any
  other task, formula included (the bench's `256 if text else (768 if table else 256)`); crops fitted to a 1344
  long side (the decode function's `max_long_side=1344`, which the bench does not change); stop at the
  tokenizer's EOS alone (`eos_id = model.tokenizer.eos_token_id`, the only id its loop and cut test); and its
  round layout (`round: gravityocr`, `grpo.decoding.selfspec.GravityRoundDecoder`; batch 1, greedy). Its
  `tpf_bench` is the bench's tokens per forward, counted line for line (docs/spec.md §5).

GravityOCR's batch-1 speculative paths of `infer_omnidocbench.py` (`--spec`, `--spec_natcache`,
`--spec_uncached`) stop on the tokenizer's EOS as the bench does; only its batched path adds the generation
config's. The block size is the checkpoint's (`block_diffusion.json`), and the self-speculative round is the
full-draft one GravityOCR runs by default (boundary token plus B masks, every mask logit used, the verifier's
bonus token on a full accept) in this package's layout (`round: package`) except in `gravityocr-bench`.

Every `tpf` JSON and drift record carries `settings_record(...)`: preset, dtype, caps per task, block size, stop
ids, `image_long_side` (the preset's unless the run or command sets it; `grpo.crop_size`), batch
size and the TPF conventions.

Example:
    >>> PRESETS["gravityocr"].cap("table", 64), PRESETS["gravityocr-bench"].cap("formula", 64)
    (4096, 256)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

# GravityOCR's published TPF before GRPO (9.68 after 500 steps; paper §3.2): the bench count of `gravityocr-bench`
# (docs/spec.md §5), at B = 32. The dry run's probe cost and the GPU check's modelled speed-up assume it.
PAPER_TPF = 9.61
FULL_DRAFT_ROUND = "full draft: boundary token + B masks, every mask logit used, bonus token on a full accept"
# The round layouts (docs/spec.md §5, "Round layouts"): what the `round` of a settings record says.
ROUNDS = {
    "package": f"{FULL_DRAFT_ROUND}; x0 from the prefill; no verify when a0 ends the output; output cut at the cap",
    "gravityocr": f"{FULL_DRAFT_ROUND}; first round drafts B masks with x0 from the prefill; every round "
                  "verified; the last round may run past the cap (GravityOCR's generate_speculative_natcache)",
}


@dataclass(frozen=True)
class DecodePreset:
    """One named set of decode settings (module docstring)."""

    name: str
    dtype: str                               # torch dtype name the model is loaded in
    max_new_tokens: Mapping[str, int] | None  # cap per task; None: the caller's one cap for every task
    other_cap: int | None                    # cap of a task `max_new_tokens` does not name; None: the caller's
    image_long_side: str                     # crops fitted to it (grpo.crop_size.fit_long_side)
    stop: str                                # "eos+generation_config" or "tokenizer_eos"
    round: str = "package"                   # a key of ROUNDS
    path: str = ""                           # the GravityOCR decode path it follows (module docstring)

    def cap(self, task: str, default: int) -> int:
        """The output cap of `task` (`default` where the preset has none for it)."""
        other = default if self.other_cap is None else self.other_cap
        return (self.max_new_tokens or {}).get(task, other)

    def stop_ids(self, model: Any, tokenizer: Any) -> frozenset[int]:
        """The token ids decoding stops at."""
        from grpo.decoding.kv_session import stop_token_ids

        if self.stop == "tokenizer_eos":
            return frozenset({tokenizer.eos_token_id})
        return stop_token_ids(model, tokenizer)


PRESETS = {
    "cpu": DecodePreset("cpu", "float32", None, None, "full", "eos+generation_config", path="none (the tiny world)"),
    "gravityocr": DecodePreset(
        "gravityocr", "bfloat16", {"text": 512, "table": 4096, "formula": 4096}, 512, "full",
        "eos+generation_config",
        path="slurm/eval_omnidocbench.slurm defaults: src/infer_omnidocbench.py --fast --batch_size 8 "
             "(fast_sampling_batched.generate_cached_batched)"),
    "gravityocr-bench": DecodePreset(
        "gravityocr-bench", "bfloat16", {"text": 256, "table": 768, "formula": 256}, 256, "1344", "tokenizer_eos",
        "gravityocr",
        path="tools/bench_forwards.py spec_natcache_ds1 (fast_sampling.generate_speculative_natcache, batch 1)"),
}


def preset_named(name: str) -> DecodePreset:
    """The preset `name`; an unknown one raises a `ValueError` listing the valid names."""
    if name not in PRESETS:
        raise ValueError(f"unknown decode preset {name!r}; valid: {', '.join(PRESETS)}")
    return PRESETS[name]


def settings_record(preset: DecodePreset, *, dtype: str, max_new_tokens: int, tasks: list[str], bd_size: int,
                    stop_ids: frozenset[int], batch_size: int, conventions: Mapping[str, str],
                    image_long_side: str | None = None) -> dict:
    """The `settings` object of a TPF figure: what shaped it, with the caps of the tasks measured
    (`image_long_side` None: the preset's)."""
    return {"preset": preset.name, "gravityocr_path": preset.path, "dtype": dtype,
            "max_new_tokens": {task: preset.cap(task, max_new_tokens) for task in sorted(tasks)},
            "bd_size": bd_size, "stop_token_ids": sorted(stop_ids),
            "image_long_side": str(preset.image_long_side if image_long_side is None else image_long_side),
            "round": ROUNDS[preset.round], "batch_size": batch_size, "tpf_convention": dict(conventions)}
