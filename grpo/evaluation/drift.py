"""TPF and held-out reward across GRPO steps: the probe's one decode routine (`probe_decode`, used by the live
probe and by re-measuring a finished run's checkpoints), its logged metrics, the drift records read back from a
log history, and the paired before/after comparison.

The probe scores its greedy self-speculative outputs against their targets, a held-out evaluation of what was
decoded (docs/spec.md §7: equal to AR greedy where `tpf/ar_equal_rate` says so): `eval/reward`, `eval/<task>/reward`,
`eval/exact` ride beside `tpf/*`; `tpf/sampled` and `tpf_sampled/<task>` are TPF at the rollout temperature.

Example:
    >>> records = drift_records(RunDir("runs/demo").read_metrics())          # doctest: +SKIP
    >>> records[-1]["tpf"], records[-1]["eval_reward"]                       # doctest: +SKIP
    >>> held_out_change(RunDir("runs/demo"))["all"]                          # doctest: +SKIP
    {'before': 0.84, 'after': 0.89, 'diff': 0.05, 'low': 0.03, 'high': 0.07, 'n': 60}
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from grpo.evaluation.stats import paired_interval
from grpo.evaluation.run_dir import RunDir
from ocr_rewards.postprocess import POSTPROCESS_MODES
from ocr_rewards.settings import HELD_OUT, RewardSettings


@dataclass(frozen=True)
class ProbeSettings:
    """What the probe decodes with, read from a run's config: the live probe's and tpf-drift's one source."""

    max_new_tokens: int
    batch_size: int
    temperature: float   # the sampled probe's: the rollout temperature
    samples: int         # sampled draws per prompt (0: greedy only)
    preset: str = "cpu"  # grpo.decoding.presets: caps per task, stop ids
    image_long_side: str = "full"  # the run's, as its rollouts see crops (grpo.crop_size)
    postprocess: str = "none"  # the held-out reward's scoring mode (ocr_rewards.postprocess)

    CONFIG_FIELDS = {"max_new_tokens": "tpf_max_new_tokens", "batch_size": "tpf_batch_size",
                     "temperature": "temperature", "samples": "tpf_samples", "preset": "tpf_preset",
                     "image_long_side": "image_long_side", "postprocess": "eval_postprocess"}

    def __post_init__(self):
        """Refuse values no decoder takes (a `run_config.json` edited by hand, say), naming the config field."""
        from grpo.yaml_config import ConfigError

        problems = probe_problems(self.__dict__)
        if problems:
            raise ConfigError(problems[0])

    @classmethod
    def of(cls, read: Callable[[str], Any]) -> ProbeSettings:
        """The settings from `read(config_field)` (a config's attribute, or a `run_config.json` value)."""
        return cls(**{name: read(field) for name, field in cls.CONFIG_FIELDS.items()})


def _decode(values: Mapping[str, Any], sampled: bool) -> Any:
    """The `DecodeSettings` of the probe's greedy decode, or of its sampled one (at the rollout temperature)."""
    from grpo.decoding.presets import PRESETS
    from grpo.decoding.tpf import DecodeSettings

    sampling = {"temperature": values["temperature"], "samples": values["samples"]} if sampled else {}
    return DecodeSettings(max_new_tokens=values["max_new_tokens"], batch_size=values["batch_size"],
                          preset=PRESETS[values["preset"]], image_long_side=values["image_long_side"],
                          progress=False, **sampling)


def probe_problems(values: Mapping[str, Any]) -> list[str]:
    """Every problem of the probe settings `values` (`ProbeSettings` field -> value), one line each, named by
    config key: the decode settings' own bounds and rules (`DecodeSettings`, of the greedy and of the sampled
    decode), the preset's name and the held-out scoring mode."""
    from grpo.decoding.presets import PRESETS
    from grpo.decoding.tpf import DecodeSettingsError
    from grpo.errors import quoted
    from grpo.limits import MAX_SAMPLES, whole_in

    if not isinstance(values["preset"], str) or values["preset"] not in PRESETS:
        return [f"tpf_preset must be one of {', '.join(PRESETS)}, got {quoted(values['preset'])}"]
    out = [] if values["postprocess"] in POSTPROCESS_MODES else [
        f"eval_postprocess must be one of {', '.join(POSTPROCESS_MODES)}, got {quoted(values['postprocess'])}"]
    samples = values["samples"]
    bad_samples = not whole_in(samples, 0, MAX_SAMPLES)  # 0 is the probe's own value (greedy only), no decoder's
    if bad_samples:
        out.append(f"tpf_samples must be an integer in [0, {MAX_SAMPLES}] (0: greedy only), got {quoted(samples)}")
    for sampled in (False, True) if samples and not bad_samples else (False,):
        try:
            _decode(values, sampled)
        except DecodeSettingsError as err:
            out.extend(err.worded(ProbeSettings.CONFIG_FIELDS))
    return list(dict.fromkeys(out))


def probe_decode(model: Any, processor: Any, rows: list, bd: Any, settings: ProbeSettings, *, step: int,
                 is_vlm: bool, compare_ar: bool | list[int], indices: range | None = None,
                 reward_settings: RewardSettings = HELD_OUT) -> tuple[list[dict], list[dict]]:
    """The probe at `step` on `rows`: greedy self-speculative records scored against their targets (AR greedy
    compared where `compare_ar` says), and, with `settings.samples`, records sampled at the rollout temperature
    from a generator seeded with the step (`grpo.decoding.tpf.decode_rows`; none without samples). The held-out
    reward is `reward_settings` in the scoring mode `settings.postprocess`."""
    from grpo.decoding.tpf import decode_rows

    values = settings.__dict__
    greedy = decode_rows(model, processor, rows, bd, dataclasses.replace(
        _decode(values, False), compare_ar=compare_ar, score=True, reward_settings=reward_settings.replace(
            postprocess=settings.postprocess)), indices=indices, is_vlm=is_vlm)
    sampled = []
    if settings.samples:
        sampled = decode_rows(model, processor, rows, bd, dataclasses.replace(_decode(values, True), seed=step),
                              indices=indices, is_vlm=is_vlm)
    return greedy, sampled


def probe_metrics(stats: dict, ranks: int = 1, sampled: dict | None = None) -> dict[str, float]:
    """The logged `tpf/*` and `eval/*` metrics of one greedy `grpo.decoding.tpf.tpf_stats` result, and
    `tpf/sampled`, `tpf_sampled/<task>` of a sampled one (None left out)."""
    metrics = {"tpf/mean": stats["tpf"], "tpf/bench": stats.get("tpf_bench"),
               "tpf/accepted_per_round": stats["accepted_per_round"],
               "tpf/ar_equal_rate": stats["ar_equal_rate"], "tpf/ar_compared": stats.get("ar_compared"),
               "tpf/truncated": stats["truncated"],
               "tpf/n": stats["n"], "tpf/ranks": ranks,
               "eval/reward": stats["reward"], "eval/exact": stats["exact_rate"]}
    if stats.get("reward_interval"):
        metrics["eval/reward_low"], metrics["eval/reward_high"] = stats["reward_interval"]
    for task, s in stats["by_task"].items():
        metrics[f"tpf/{task}"] = s["tpf"]
        metrics[f"eval/{task}/reward"] = s["reward"]
    if sampled is not None:
        metrics["tpf/sampled"] = sampled["tpf"]
        metrics.update({f"tpf_sampled/{task}": s["tpf"] for task, s in sampled["by_task"].items()})
    return {k: float(v) for k, v in metrics.items() if v is not None}


_NOT_TASKS = {"mean", "bench", "sampled", "accepted_per_round", "ar_equal_rate", "ar_compared", "truncated", "n",
              "ranks"}


def probe_settings(settings: ProbeSettings, model: Any, processor: Any, bd: Any, tasks: list[str],
                   autocast: str | None = None) -> dict:
    """The `settings` object of the probe's figures (`grpo.decoding.presets.settings_record`) for `model`;
    `autocast` names the dtype its forwards compute in when that is not its weights' (a `bf16: true` run keeps
    float32 weights under bf16 autocast): `dtype` then says it, `weights_dtype` the weights'."""
    from grpo.checkpoint import tokenizer_of
    from grpo.decoding.presets import preset_named, settings_record
    from grpo.decoding.tpf import TPF_CONVENTION

    preset = preset_named(settings.preset)
    weights = str(next(model.parameters()).dtype).removeprefix("torch.")
    record = settings_record(preset, dtype=autocast or weights,
                             max_new_tokens=settings.max_new_tokens, tasks=tasks, bd_size=bd.bd_size,
                             stop_ids=preset.stop_ids(model, tokenizer_of(processor)), batch_size=settings.batch_size,
                             conventions=TPF_CONVENTION, image_long_side=settings.image_long_side)
    if autocast and autocast != weights:
        record["weights_dtype"] = weights
    return {"eval_postprocess": settings.postprocess} | record


def drift_records(log_history: list[dict], settings: dict | None = None) -> list[dict]:
    """One record per probe in a trainer log history, each with the probe's `settings` object (`probe_settings`).

    Keys: `step`, `tpf`, `tpf_by_task`, `tpf_bench`, `tpf_sampled`, `tpf_sampled_by_task`,
    `accepted_per_round`, `ar_equal_rate`, `ar_compared`, `eval_reward` (of the self-speculative output),
    `eval_reward_low` and `eval_reward_high` (its 95% interval), `eval_reward_by_task`, `eval_exact`, `n` (probe prompts), `ranks` (processes that decoded a shard),
    `truncated`, and `reward`: the training reward of the last logged step (None before the first).
    """
    records, reward = [], None
    for entry in sorted(log_history, key=lambda e: e.get("step", 0)):  # stable: a step's reward log comes first
        if "reward" in entry:
            reward = entry["reward"]
        if "tpf/mean" not in entry:
            continue
        tasks = {k.split("/")[1] for k in entry if k.startswith("tpf/")} - _NOT_TASKS
        records.append({
            "step": entry["step"], "tpf": entry["tpf/mean"],
            "tpf_by_task": {t: entry[f"tpf/{t}"] for t in sorted(tasks)},
            "tpf_bench": entry.get("tpf/bench"), "tpf_sampled": entry.get("tpf/sampled"),
            "tpf_sampled_by_task": {k.split("/")[1]: v for k, v in sorted(entry.items())
                                    if k.startswith("tpf_sampled/")},
            "accepted_per_round": entry.get("tpf/accepted_per_round"),
            "ar_equal_rate": entry.get("tpf/ar_equal_rate"), "ar_compared": _int(entry.get("tpf/ar_compared")),
            "eval_reward": entry.get("eval/reward"), "eval_reward_low": entry.get("eval/reward_low"),
            "eval_reward_high": entry.get("eval/reward_high"),
            "eval_reward_by_task": {t: entry[f"eval/{t}/reward"] for t in sorted(tasks)
                                    if f"eval/{t}/reward" in entry},
            "eval_exact": entry.get("eval/exact"),
            "n": _int(entry.get("tpf/n")), "ranks": _int(entry.get("tpf/ranks")),
            "truncated": _int(entry.get("tpf/truncated")), "reward": reward, "settings": settings})
    return records


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def reward_points(log_history: list[dict], key: str = "reward") -> list[tuple[int, float]]:
    """(step, value) of every log entry holding `key`."""
    return [(e["step"], e[key]) for e in log_history if e.get(key) is not None]


def held_out_change(run: RunDir) -> dict[str, Any] | None:
    """Held-out greedy reward at the first and the last probe of `run`, paired over prompts, overall and per
    task, plus `tpf` (before, after) from the same two probes; None with fewer than two probes."""
    probes = run.read_probe_rows()
    if len(probes) < 2:
        return None
    first, last = probes[0], probes[-1]
    before = {r["index"]: r for r in first["rows"]}
    after = {r["index"]: r for r in last["rows"]}
    common = sorted(set(before) & set(after))
    groups = {"all": common}
    for i in common:
        groups.setdefault(before[i]["task"], []).append(i)

    from grpo.decoding.tpf import tpf_of

    change = {"steps": (first["step"], last["step"])}
    for name, indices in groups.items():
        change[name] = paired_interval([before[i]["reward"] for i in indices], [after[i]["reward"] for i in indices])
        change[name]["tpf"] = (tpf_of(before[i] for i in indices), tpf_of(after[i] for i in indices))
    return change
