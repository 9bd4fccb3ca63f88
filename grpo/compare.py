"""Multi-seed A/B of GRPO recipes (`gravity-grpo compare`): arms x seeds, each final checkpoint on a probe set.

Each run is `gravity-grpo train` in its own process (one at a time: the vLLM engine and the CPU threads are
the run's alone) into `OUT/<arm>/seed-<S>`; its last checkpoint is then decoded on the probe set by the
self-speculative decoder with AR greedy beside it (`grpo.decoding.tpf.measure_tpf`, as `gravity-grpo tpf
--compare-ar --score`), and the rows land in `eval.json`. The starting model is evaluated once (`start.json`).
A run with `eval.json` is skipped, so an interrupted comparison resumes where it stopped; a finished
training (`wall_time.json`) without it is only evaluated; an unfinished run folder is trained again from scratch
when `train`'s marker proves `train` made it, and refused otherwise (a user's folder is never removed). Arm names
become folder names, so each is checked as one (`grpo.paths.check_name`). Every run of a comparison starts from the
model files its first call found (`start_models.json`): a model rebuilt in place, e.g. a built-in name's folder,
is refused rather than mixed into the seeds (`start_models`).
On a probe other than the default one (`DEFAULT_PROBE`) every evaluation and report file carries the probe
in its name (`eval.tiny-probe@7-60-192.json`, `compare.tiny-probe@7-60-192.json`), so the same command with
another `--probe-set` re-evaluates a finished comparison on it without training anything.

The first arm is the reference: every other arm is paired with it (`grpo.evaluation.stats`), and every
arm with the starting model (held-out change). On a built-in synthetic probe set the report also gives that
change by task and by the crop's lines (`by_group`), and counts, per error kind of
`grpo.synthetic.mislabels.MISLABELS`, the probe decision points where greedy output errs that way, before and
after (McNemar), and the outputs with more lines / rows / closing braces than their target.

Example:
    >>> arms = [Arm("plain", "configs/tiny_cpu.yaml", {"drafter_loss_weight": 0}),
    ...         Arm("drafter", "configs/tiny_drafter.yaml")]
    >>> report = run_comparison(arms, seeds=[2, 3], out="runs/cmp")          # doctest: +SKIP
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from grpo.evaluation import stats as compare_stats
from grpo.evaluation.run_dir import RunDir
from grpo.errors import UserError
from grpo.outputs import atomic_write, mark, owns_folder
from grpo.paths import check_name

EVAL_FILE, START_FILE, REPORT_FILE, PLOT_FILE = "eval.json", "start.json", "compare.json", "compare.png"
START_MODELS_FILE = "start_models.json"  # each arm's start model and the digest of its files, from the first call
STAMP = "gravity-grpo compare"  # the marker of a comparison folder (grpo.outputs)
TRAINED_FILE = "wall_time.json"  # the trainer writes it once training has finished
DEFAULT_PROBE = {"probe_set": "tiny-probe", "probe_size": 60, "max_new_tokens": 192, "postprocess": "none"}


def probe_named(file: str, probe: dict) -> str:
    """`file` itself for `DEFAULT_PROBE`; `stem.<probe set>-<size>-<max new tokens>[-<scoring mode>].suffix` for
    any other (the scoring mode named where it is not "none")."""
    probe = {**DEFAULT_PROBE, **probe}
    if probe == DEFAULT_PROBE:
        return file
    name = re.sub(r"[^\w@.-]+", "_", str(probe["probe_set"])).strip("_")
    mode = "" if probe["postprocess"] == "none" else f"-{probe['postprocess']}"
    stem, suffix = file.rsplit(".", 1)
    return f"{stem}.{name}-{probe['probe_size']}-{probe['max_new_tokens']}{mode}.{suffix}"


@dataclass(frozen=True)
class Arm:
    """One recipe: a config file plus overrides (config keys)."""

    name: str
    config: str
    overrides: dict = field(default_factory=dict)


def train_command(arm: Arm, seed: int, folder: Path, common: dict) -> list[str]:
    """`gravity-grpo train` for one run: the arm's config, the common then the arm's overrides, the seed."""
    values = {**common, **arm.overrides, "seed": seed, "output_dir": str(folder)}
    command = [sys.executable, "-m", "grpo.cli", "train", "--config", arm.config]
    for key, value in values.items():
        command += ["--set", f"{key}={json.dumps(value) if not isinstance(value, str) else value}"]
    return command


class CompareError(UserError):
    """A run of the comparison that cannot go on (its training failed, or it saved nothing); names the run."""


def final_checkpoint(folder: Path) -> Path:
    """The run's last `checkpoint-N` folder."""
    points = RunDir(folder).checkpoints()
    if not points:
        raise CompareError(f"{folder}: the run saved no checkpoint to evaluate (set save_steps or max_steps so "
                           "that it saves one)")
    return Path(points[-1][1])


def evaluate(model: str | Path, probe_set: str, probe_size: int, max_new_tokens: int,
             postprocess: str = "none") -> list[dict]:
    """Probe rows of one checkpoint: tokens, forwards, reward (held out, in the scoring mode `postprocess`),
    AR-equality and the output text, by prompt."""
    from grpo.pool import load_pool
    from grpo.checkpoint import load_checkpoint, tokenizer_of
    from grpo.decoding.tpf import measure_tpf
    from ocr_rewards.settings import HELD_OUT

    ckpt = load_checkpoint(model, need_drafter=True)  # LoRA checkpoints: merged into the base their config names
    rows = load_pool(probe_set, images=ckpt.is_vlm)
    rows = rows.select(range(min(probe_size, len(rows))))
    logging.getLogger(__name__).info("evaluating %s", ckpt.source.describe())
    stats = measure_tpf(ckpt.model, ckpt.processor, rows, ckpt.bd, is_vlm=ckpt.is_vlm,
                        max_new_tokens=max_new_tokens, compare_ar=True, score=True, progress=False,
                        reward_settings=HELD_OUT.replace(postprocess=postprocess))
    tok = tokenizer_of(ckpt.processor)
    return [{"index": r["index"], "task": r["task"], "tokens": r["tokens"], "forwards": r["forwards"],
             "reward": r["reward"], "ar_equal": r["ar_equal"], "truncated": r["truncated"],
             "text": tok.decode(r["output_ids"], skip_special_tokens=True)} for r in stats["rows"]]


def _write(path: Path, value: Any) -> None:
    atomic_write(path, json.dumps(value, indent=1) + "\n")  # a file that exists is complete: resuming trusts it


def _last_error(log_file: Path) -> str:
    """The run's own `error:` line from its log, or ''."""
    lines = log_file.read_text(errors="replace").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    if not starts:
        return ""
    text = " ".join(line.strip() for line in lines[starts[-1]:starts[-1] + 3])  # a list's first problems too
    return f": {text.removeprefix('error: ')[:300]}"


def run_one(arm: Arm, seed: int, out: Path, common: dict, probe: dict, log: Callable[[str], None],
            models: dict | None = None) -> list[dict]:
    """Train and evaluate one run, or read its `eval.json` when it already finished. `models`: the comparison's
    start models (`start_models`), kept in `START_MODELS_FILE` before the run trains."""
    folder = out / arm.name / f"seed-{seed}"
    done = folder / probe_named(EVAL_FILE, probe)
    if done.is_file():
        log(f"{arm.name} seed {seed}: done, skipped")
        return json.loads(done.read_text())
    if not (folder / TRAINED_FILE).is_file():
        from grpo.evaluation.run_dir import RUN_STAMP

        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            raise CompareError(f"{folder} is in the way of the run (a link, or not a folder); move it away")
        if folder.is_dir() and any(folder.iterdir()):
            if not owns_folder(folder, RUN_STAMP):
                raise CompareError(f"{folder} holds no finished run and was not made by gravity-grpo train; it is "
                                   "kept: move it away, or choose another --out")
            shutil.rmtree(folder)  # an interrupted run of this comparison: train again from scratch
        if models is not None:
            _write(out / START_MODELS_FILE, models)
        folder.parent.mkdir(parents=True, exist_ok=True)
        train_log = folder.with_name(f"{folder.name}.train.log")  # beside the run folder, which train creates
        log(f"{arm.name} seed {seed}: training ({train_log})")
        with open(train_log, "w") as stream:
            result = subprocess.run(train_command(arm, seed, folder, common), stdout=stream,
                                    stderr=subprocess.STDOUT, env=os.environ.copy())
        if result.returncode:
            raise CompareError(f"arm {arm.name} seed {seed}: training failed (exit {result.returncode})"
                               f"{_last_error(train_log)}; see its log {train_log}")
    log(f"{arm.name} seed {seed}: evaluating the last checkpoint")
    rows = evaluate(final_checkpoint(folder), **probe)
    _write(done, rows)
    return rows


def _digest(folders: list[Path]) -> str:
    """sha256 over the names and bytes of the files in model folders (weights, config, tokenizer, drafter)."""
    total = hashlib.sha256()
    for folder in folders:
        for path in sorted(p for p in folder.iterdir() if p.is_file()):
            with open(path, "rb") as stream:
                total.update(path.name.encode() + b"\0" + hashlib.file_digest(stream, "sha256").digest())
    return total.hexdigest()


def start_models(arms: list[Arm], common: dict, out: Path) -> dict:
    """The record of `START_MODELS_FILE` (spec -> folder and `_digest`) with this call's start models added;
    `CompareError` where a kept model's files changed since (its seeds would start from two models, and
    `start.json` from either). Each arm's model is located as `train` locates it (`locate`: a folder, a built-in
    name, a LoRA checkpoint and its base)."""
    from grpo.model_source import locate
    from grpo.training.config import load_config

    path = out / START_MODELS_FILE
    kept = json.loads(path.read_text()) if path.is_file() else {}
    found = {}
    for arm in arms:
        spec = str(load_config(arm.config, {**common, **arm.overrides}).model)
        try:
            source = locate(spec)
        except UserError:
            continue  # its run refuses it, naming the arm and the run's log
        found[spec] = {"folder": str(source.folder), "sha256": _digest([source.folder, *filter(None, [source.base])])}
        if spec in kept and kept[spec]["sha256"] != found[spec]["sha256"]:
            raise CompareError(f"model {spec!r} ({source.folder}) is not the one this comparison's runs in {out} "
                               f"started from (its files changed since; {START_MODELS_FILE}): finish it with those "
                               "files, or start another --out (a copy pinned with --set model=PATH stays put)")
    return {**kept, **found}


def start_rows(model: str, out: Path, probe: dict) -> list[dict]:
    """The starting model's probe rows (`start.json`, evaluated once)."""
    path = out / probe_named(START_FILE, probe)
    if not path.is_file():
        _write(path, evaluate(model, **probe))
    return json.loads(path.read_text())


def error_kinds(rows: list[dict], start: list[dict], runs: dict[int, list[dict]]) -> dict:
    """Per error kind of `grpo.synthetic.mislabels.MISLABELS`: decision points of the synthetic probe `rows` that
    greedy gets wrong at the start and after training (pooled over seeds, McNemar), and over-generation counts."""
    from grpo.synthetic.crops import Example
    from grpo.synthetic.mislabels import MISLABELS, UNITS, wrong_at

    kinds: dict[str, dict] = {}
    for task, table in MISLABELS.items():
        for kind, applies in table.items():
            before, after = [], []
            for i, row in enumerate(rows):
                crop = row["prompt"].split("\n", 1)[1]
                if row["task_type"] != task or applies(Example(task, crop, row["target"])) is None:
                    continue
                for seed_rows in runs.values():
                    before.append(wrong_at(task, kind, start[i]["text"], row["target"]))
                    after.append(wrong_at(task, kind, seed_rows[i]["text"], row["target"]))
            kinds[f"{task}/{kind}"] = compare_stats.mcnemar(before, after)

    def over(outputs: list[dict]) -> int:
        return sum(o["text"].count(UNITS[r["task_type"]]) > r["target"].count(UNITS[r["task_type"]])
                   for o, r in zip(outputs, rows))

    return {"kinds": kinds, "over_generated_start": over(start),
            "over_generated_after": {seed: over(seed_rows) for seed, seed_rows in runs.items()},
            "prompts": len(rows), "seeds": len(runs)}


def by_group(groups: dict[str, list[int]], start: list[dict], runs: dict[int, list[dict]]) -> dict:
    """Per group of probe prompts (`grpo.synthetic.reading.grouped`: all, each task, each task by its crop's
    lines): the prompts, the start's mean reward and the change from it (`change_from_start` on those prompts)."""
    report = {}
    for name, pick in groups.items():
        change = compare_stats.change_from_start([start[i] for i in pick],
                                                 {s: [rows[i] for i in pick] for s, rows in runs.items()})
        report[name] = {"prompts": len(pick), "start": sum(start[i]["reward"] for i in pick) / len(pick),
                        "change": change["reward_diff"], "interval": change["reward_diff_interval"]}
    return report


def summarize(arms: list[Arm], results: dict[str, dict[int, list[dict]]], start: list[dict],
              probe: dict) -> dict[str, Any]:
    """The report: each arm against the start (all prompts, and by task and lines on a built-in probe), each later
    arm against the first, AR-equality, error kinds (on a built-in probe; None on another)."""
    from grpo.synthetic.reading import grouped
    from grpo.synthetic.splits import generate, is_builtin

    reference = arms[0].name
    report: dict[str, Any] = {"reference": reference, "probe": probe, "arms": {}}
    rows = generate(probe["probe_set"], probe["probe_size"]) if is_builtin(probe["probe_set"]) else None
    groups = grouped(rows) if rows else None
    for arm in arms:
        runs = results[arm.name]
        outputs = [r for seed_rows in runs.values() for r in seed_rows]
        entry = {"config": arm.config, "overrides": arm.overrides, "seeds": sorted(runs),
                 "ar_equal_rate": sum(bool(r["ar_equal"]) for r in outputs) / len(outputs),
                 "vs_start": compare_stats.change_from_start(start, runs),
                 "errors": error_kinds(rows, start, runs) if rows else None,
                 "by_group": by_group(groups, start, runs) if groups else None}
        if arm.name != reference:
            entry["vs_reference"] = compare_stats.paired_summary(results[reference], runs)
        report["arms"][arm.name] = entry
    report["start_reward"] = sum(r["reward"] for r in start) / len(start)
    return report


def run_comparison(arms: list[Arm], seeds: list[int], out: str | Path, *, common: dict | None = None,
                   probe: dict | None = None, report_only: bool = False,
                   log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every (arm, seed) run, one at a time (finished ones skipped), then the report (`compare.json`) and
    its plot (`compare.png`) in `out`, both named after the probe (`probe_named`; keys of `DEFAULT_PROBE`).
    `report_only`: no training, the report of the seeds that every arm has finished (a partial
    comparison, while it still runs)."""
    if len({a.name for a in arms}) != len(arms) or not arms:
        raise ValueError("arms need distinct names")
    for arm in arms:
        check_name(arm.name, "arm name")
    out = Path(out)
    models = start_models(arms, common or {}, out)  # refused before anything is written
    mark(out, STAMP)  # `grpo.outputs.output_folder` knows it as this command's own, to resume
    probe = {**DEFAULT_PROBE, **(probe or {})}
    results: dict[str, dict[int, list[dict]]] = {a.name: {} for a in arms}
    if report_only:
        done = probe_named(EVAL_FILE, probe)
        seeds = [s for s in seeds if all((out / a.name / f"seed-{s}" / done).is_file() for a in arms)]
        if not seeds:
            raise ValueError(f"{out}: no seed finished in every arm yet")
    for seed in seeds:  # seed-major: a partial comparison already pairs the arms on its first seeds
        for arm in arms:
            results[arm.name][seed] = run_one(arm, seed, out, common or {}, probe, log, models)
    from grpo.training.config import load_config

    _write(out / START_MODELS_FILE, start_models(arms, common or {}, out))  # a model rebuilt while the runs trained
    model = load_config(arms[0].config, {**(common or {}), **arms[0].overrides}).model
    report = summarize(arms, results, start_rows(model, out, probe), probe)
    _write(out / probe_named(REPORT_FILE, probe), report)
    plot_comparison(report, out / probe_named(PLOT_FILE, probe))
    return report


def plot_comparison(report: dict, path: Path) -> Path:
    """Per-seed TPF ratio and reward difference against the reference arm, with the bootstrap intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = list(report["arms"])
    for x, name in enumerate(names):
        entry = report["arms"][name]
        change = entry["vs_start"]
        right.errorbar([x], [change["reward_diff"]], fmt="o", color="tab:green",
                       yerr=[[change["reward_diff"] - change["reward_diff_interval"][0]],
                             [change["reward_diff_interval"][1] - change["reward_diff"]]], capsize=4)
        right.scatter([x] * len(change["per_seed_reward_diff"]), change["per_seed_reward_diff"], s=10, color="gray")
        if "vs_reference" in entry:
            pair = entry["vs_reference"]
            left.errorbar([x], [pair["tpf_ratio"]], fmt="o", color="tab:blue", capsize=4,
                          yerr=[[pair["tpf_ratio"] - pair["tpf_ratio_interval"][0]],
                                [pair["tpf_ratio_interval"][1] - pair["tpf_ratio"]]])
            left.scatter([x] * len(pair["per_seed_tpf_ratio"]), pair["per_seed_tpf_ratio"], s=10, color="gray")
    left.axhline(1.0, color="black", lw=0.8)
    right.axhline(0.0, color="black", lw=0.8)
    for ax in (left, right):
        ax.set_xticks(range(len(names)), names)
    left.set_title(f"TPF ratio vs {report['reference']} (geo. mean, 95%)")
    right.set_title("held-out reward change vs start (95%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
