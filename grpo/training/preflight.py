"""The one run check of a GRPO run: what the world must hold for a config to run (the checkpoint, the prompt
pools and their lengths, the output folder, the launcher, the hardware, the engine, what training supports).
The values of the config are checked where it is built (`grpo.training.config`, one list of problems).

`train --dry-run` runs it (`preflight`) without training; training runs it first (`require_runnable`, from
`grpo.training.run`), so both refuse the same runs with the same messages. Every check runs, problems are
collected, and `PreflightReport.raise_for_problems` raises one `ConfigProblems` listing them all. A config
whose values are refused is checked too, on its values as given (`GivenValues`): a check that reads a refused
value is skipped, since that value's problem is listed already. The batch geometry is TRL's own:
`GRPOConfig.__post_init__` runs as if `num_processes` processes were launched (its `world_size` is the only thing
faked).

Example:
    >>> report = preflight("configs/gravityocr_grpo.yaml", num_processes=8)   # doctest: +SKIP
    >>> report.facts["per optimizer step"]                                     # doctest: +SKIP
    '24 prompts x 28 generations = 672 completions'
"""
from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable
from unittest import mock

from grpo.training import machine_check as machine
from grpo.limits import MAX_PROCESSES
from grpo.training.config import (ConfigProblems, GravityGRPOConfig, build_config, default_output_dir, field_default,
                                  fields, needs_drafter, read_values, refused_keys)
from grpo.training.report import PreflightReport, batch_facts, probe_facts, steps_per_epoch
from grpo.yaml_config import ConfigError

RAW_OUTPUT_KEYS = ("output_dir", "pool", "probe_set", "model", "report_to")  # what the output check reads


class Refused(Exception):
    """A check read a value the config refuses (`GivenValues`): the check is skipped, the value's problem is listed."""


class GivenValues:
    """A config's values as given, unset ones at their defaults, for the checks of a config that cannot be built:
    reading a refused value (`refused`, e.g. `grpo.training.config.refused_keys`) raises `Refused`. The
    LoRA/quantization keys are read as `model_args.KEY`, as on a built config."""

    def __init__(self, values: dict[str, Any], refused: set[str]):
        self._values, self._refused = values, refused

    def __getattr__(self, name: str) -> Any:
        if name == "model_args":
            return self
        if name in self._refused:
            raise Refused(name)
        try:
            return self._values[name] if name in self._values else field_default(name)
        except KeyError:
            raise AttributeError(name) from None

    def value(self, name: str) -> Any:
        """The value of `name` as given, refused or not (for the checks that take any value of its type)."""
        return self._values.get(name, field_default(name))


def build_as_launched(values: dict[str, Any], num_processes: int, local_hardware: bool, source: str = "config",
                      problems: list[str] | None = None):
    """`build_config(values, source, problems)` as `num_processes` launched processes would build it.

    With `local_hardware` False (a run for another cluster) the bf16 capability check of transformers is
    answered yes, since this machine's GPU is not the one that will train.
    """
    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(GravityGRPOConfig, "world_size",
                                              new_callable=mock.PropertyMock, return_value=num_processes))
        if not local_hardware:
            stack.enter_context(mock.patch("transformers.training_args.is_torch_bf16_gpu_available",
                                           return_value=True))
        return build_config(values, source, problems)


def check_pool(spec: str, is_vlm: bool | None, report: PreflightReport, label: str = "pool",
               skip_bad: bool = False) -> int | None:
    """Read and validate a prompt pool as training does (every bad row listed by line or index, or left out
    with `skip_bad`); return its row count."""
    from grpo.pool import load_pool, policy_mismatch
    from grpo.errors import UserError

    try:
        ds = load_pool(spec, skip_bad=skip_bad, images=bool(is_vlm))
    except (UserError, OSError) as err:  # an unreadable file or folder is a UserError too
        report.problems.append(f"{label}: {err}")
        return None
    problem = policy_mismatch(ds, spec, is_vlm) if is_vlm is not None else None
    if problem:
        report.problems.append(f"{label} {problem}")
    report.facts[label] = f"{spec}: {len(ds)} rows"
    report.pools[label] = ds
    return len(ds)


def check_checkpoint(spec: str, need_drafter: bool, report: PreflightReport):
    """The checkpoint as loading reads it (`grpo.checkpoint.inspect_checkpoint`, no weights); returned, or None
    when it cannot be read."""
    from grpo.block_diffusion import BD_FILE
    from grpo.checkpoint import inspect_checkpoint
    from grpo.errors import CheckpointError
    from grpo.prompting import handles_images

    try:
        found = inspect_checkpoint(spec, need_drafter)
    except (CheckpointError, OSError, ValueError) as err:
        report.problems.append(f"model: {err}")
        return None
    source, vlm = found.source, found.is_vlm
    if vlm and not handles_images(found.processor):
        report.problems.append(f"model {source.folder}: no GLM-OCR processor (processor_config.json or "
                               "preprocessor_config.json missing?); GRPO on images needs it")
    report.facts["model"] = f"{source.describe()} ({found.config.model_type}{', vision-language' if vlm else ''})"
    if found.drafter_note:
        report.notes.append(f"model: {found.drafter_note}")
    elif found.bd is None:
        report.notes.append(f"model {source.folder}: no {BD_FILE}; fine without the TPF probe and the drafter loss")
    else:
        report.facts["drafter"] = f"B = {found.bd.bd_size}, mask_id {found.bd.mask_id}"
    return found


def check_lengths(cfg: Any, found: Any, pools: dict[str, Any], report: PreflightReport) -> None:
    """Rows whose prompt and `max_completion_length` do not fit in the model's positions (or vLLM's
    `vllm_max_model_length`), named per pool (`grpo.prompting.rows_over_context`)."""
    from grpo.checkpoint import context_length
    from grpo.prompting import prompt_problems, rows_over_context

    limits = [n for n in (context_length(found.config),
                          cfg.vllm_max_model_length if cfg.use_vllm else None) if n is not None]
    if cfg.vllm_self_speculation and found.bd is not None and limits:
        from grpo.rollouts.engine_selfspec import draft_length

        drafted = draft_length(found.bd.bd_size, cfg.vllm_draft_length)
        if drafted >= min(limits):  # vLLM asserts on it once the engine has loaded
            report.problems.append(f"vllm_draft_length: {drafted} drafted tokens per round do not fit in the "
                                   f"context of {min(limits)} positions; draft fewer")
    for label, ds in pools.items():
        bad = prompt_problems(found.processor, ds, found.is_vlm, cfg.image_long_side)
        if bad:
            report.problems.append(f"{label}: {len(bad)} row(s) the model's processor cannot take: "
                                   f"{'; '.join(bad[:5])}")
            continue
        over = rows_over_context(found.processor, ds, found.is_vlm, min(limits, default=None),
                                 cfg.max_completion_length)
        if over:
            report.problems.append(f"{label}: {len(over)} row(s) longer than the context with max_completion_length "
                                   f"{cfg.max_completion_length}: {'; '.join(over[:5])}")


def check_alignment(cfg: Any, found: Any, pool: Any, report: PreflightReport) -> None:
    """For a GLM-OCR checkpoint, TRL's two tokenizations of the first pool row as training feeds it (its crop
    fitted to `image_long_side`) agree (`grpo.rollouts.image_prompts.check_prompt_alignment`)."""
    from grpo.crop_size import with_long_side
    from grpo.pool import as_prompts
    from grpo.prompting import prompt_problems
    from grpo.rollouts.image_prompts import PromptAlignmentError, check_prompt_alignment

    if pool is None or not len(pool) or "image" not in pool.column_names or \
            prompt_problems(found.processor, pool.select([0]), True, cfg.image_long_side):
        return  # named by the pool check or by `check_lengths`
    row = with_long_side(as_prompts(pool.select([0]), True), cfg.image_long_side)[0]
    try:
        check_prompt_alignment(found.processor, row)
    except PromptAlignmentError as err:
        report.problems.append(f"model {found.source.folder}: {err}")


def is_own_run(folder: Path) -> bool:
    """True when `folder` is a run folder `train` wrote: its marker, or (runs from before the marker) a
    `run_config.json` that parses to a config naming its `output_dir`."""
    from grpo.evaluation.run_dir import RUN_STAMP, RunDir
    from grpo.outputs import owns_folder

    if owns_folder(folder, RUN_STAMP):
        return True
    try:
        return "output_dir" in RunDir(folder).read_config()
    except ConfigError:
        return False


def check_output_dir(cfg: Any, resume: str | bool | None = None, overwrite: bool = False) -> None:
    """The run folder (`grpo.outputs.output_folder`): not a file, a link, an input or inside one, a dataset or
    a checkpoint; an existing non-empty folder only to `resume` it or, when it is a run of ours, to
    `overwrite` it; a checkpoint to resume from that exists. Raises a `UserError` naming the problem."""
    from grpo.outputs import output_folder

    if resume and overwrite:
        raise ConfigError("resume continues the run in output_dir and overwrite replaces it: choose one",
                          setting="overwrite")
    folder = Path(cfg.output_dir)
    # the main process judges what the folder holds; the others would see what it has written meanwhile
    judged = getattr(cfg, "process_index", 0) == 0 and not resume  # a resumed folder must hold checkpoints
    if judged and not overwrite and folder.is_dir() and not folder.is_symlink() and is_own_run(folder):
        raise ConfigError(f"output_dir {cfg.output_dir} holds an earlier run: resume it, overwrite it (nothing of "
                          "it is kept), or choose a new folder", setting="overwrite")
    out = output_folder(cfg.output_dir, "output_dir", kind="GRPO run (no run_config.json)",
                        is_own=is_own_run if judged else (lambda folder: True),
                        inputs=[cfg.pool, cfg.probe_set, cfg.model], overwrite=overwrite if judged else None,
                        setting="output_dir")
    from grpo.training.checkpoints import resume_point

    resume_point(out, resume)  # the last complete checkpoint, as the run picks it


def check_outputs(cfg: Any, report: PreflightReport, resume: str | bool | None = None,
                  overwrite: bool = False) -> None:
    """The output folder (`check_output_dir`); and every `report_to` backend installed."""
    from transformers.integrations import get_available_reporting_integrations

    from grpo.errors import UserError

    try:
        check_output_dir(cfg, resume, overwrite)
    except UserError as err:
        report.problems.append(str(err))
    wanted = [cfg.report_to] if isinstance(cfg.report_to, str) else list(cfg.report_to or [])
    missing = sorted(set(wanted) - set(get_available_reporting_integrations()) - {"none", "all"})
    if missing:
        report.problems.append(f"report_to: {', '.join(missing)} not installed here (pip install it, or drop it)")


def unless_refused(check: Callable[..., None], *args: Any) -> None:
    """`check(*args)`, skipped where it reads a value the config refuses (`Refused`: that problem is listed)."""
    try:
        check(*args)
    except Refused:
        pass


def check_probe_size(cfg: Any, probe_rows: int | None, report: PreflightReport) -> None:
    """The probe set holds `probe_size` rows (`probe_rows`: its rows, None without the probe)."""
    if probe_rows is not None and probe_rows < cfg.probe_size:
        report.problems.append(f"probe set {cfg.probe_set}: {probe_rows} rows, fewer than probe_size {cfg.probe_size}")


def check_run(cfg: Any, num_processes: int, *, local_hardware: bool = True, accelerate: dict | None = None,
              report: PreflightReport | None = None, resume: str | bool | None = None,
              overwrite: bool = False) -> PreflightReport:
    """The one run check: checkpoint, pools, launcher, hardware, engine and training support of `cfg` (a
    `GravityGRPOConfig`, or the `GivenValues` of one that could not be built: the checkpoint, the pools and the
    output folder are then checked on the values as given, and each later check is skipped where it reads a
    refused value; the batch geometry and the probe's cost need the built config).

    Training calls it through `require_runnable` and the dry run through `preflight`, so both refuse the
    same runs with the same messages.
    """
    from grpo.hardware import torch_on_cpu
    from grpo.prompting import handles_images

    report = report if report is not None else PreflightReport()
    built = isinstance(cfg, GravityGRPOConfig)
    get = (lambda name: getattr(cfg, name)) if built else cfg.value
    drafter = needs_drafter(get("tpf_every"), get("drafter_loss_weight"), get("rollout_decoder"),
                            get("vllm_self_speculation"))
    found = check_checkpoint(str(get("model")), drafter, report)
    is_vlm = found.is_vlm if found is not None else None
    pool_rows = check_pool(str(get("pool")), is_vlm, report, skip_bad=get("skip_bad"))
    probe_rows = check_pool(str(get("probe_set")), is_vlm, report, label="probe set") if get("tpf_every") > 0 \
        else None
    machine.check_launch(accelerate or {}, report)
    check_outputs(cfg if built else SimpleNamespace(**{k: get(k) for k in RAW_OUTPUT_KEYS}), report, resume,
                  overwrite)
    unless_refused(check_probe_size, cfg, probe_rows, report)
    if built and pool_rows is not None and steps_per_epoch(cfg, num_processes, pool_rows) == 0:
        report.problems.append(f"pool {cfg.pool}: {pool_rows} rows make 0 optimizer steps per epoch at "
                               f"{cfg.generation_batch_size // cfg.num_generations} prompts per generation")
    if found is not None and (not found.is_vlm or handles_images(found.processor)):  # else named above
        unless_refused(check_lengths, cfg, found, report.pools, report)
        if found.is_vlm:
            unless_refused(check_alignment, cfg, found, report.pools.get("pool"), report)
    try:
        cpu = torch_on_cpu(cfg.use_cpu, local=local_hardware)
    except Refused:  # where the run trains is not known: the machine's checks wait for use_cpu
        return report
    if local_hardware:
        unless_refused(machine.check_hardware, cfg, num_processes, report)
    unless_refused(machine.check_engine, cfg, is_vlm, report)
    unless_refused(machine.check_server, cfg, cpu, report)
    unless_refused(machine.check_training, cfg, found, cpu, report)
    if built:
        report.facts.update(batch_facts(cfg, num_processes, pool_rows))
        report.facts.update(probe_facts(cfg, num_processes))
    return report


def require_runnable(cfg: Any, resume: str | bool | None = None, overwrite: bool = False) -> PreflightReport:
    """Training's side of `check_run`, on this machine with the launcher's processes: one `ConfigProblems`
    listing every problem, as the dry run reports them; the report otherwise."""
    report = check_run(cfg, cfg.world_size, accelerate=machine.read_accelerate_config(None), resume=resume,
                       overwrite=overwrite)
    report.raise_for_problems()
    return report


def preflight(config_path: str | Path | None = None, overrides: dict[str, Any] | None = None, *,
              num_processes: int | None = None, accelerate_config: str | Path | None = None,
              resume: str | bool | None = None, overwrite: bool = False,
              problems: list[str] | None = None) -> PreflightReport:
    """Run every check of a training run, after the `problems` found already (bad flags); see the module
    docstring.

    `num_processes` None takes the launch config's `num_processes` (or the launcher's `WORLD_SIZE`, else 1)
    and checks this machine's hardware; a given `num_processes` is a run for another cluster: the local
    GPU and bf16 checks are skipped, with a note.
    """
    report = PreflightReport()
    problems = list(problems or [])
    if num_processes is not None and not 1 <= num_processes <= MAX_PROCESSES:
        problems.append(f"num_processes must be an integer in [1, {MAX_PROCESSES}], got {num_processes}")
        num_processes = 1
    unread = False
    try:
        values = read_values(config_path, overrides, problems)
    except ConfigError as err:  # an unreadable recipe: not built from defaults (no spurious complaints)
        problems.append(str(err))
        values, unread = {"output_dir": default_output_dir(config_path)}, True
    try:
        accelerate = machine.read_accelerate_config(accelerate_config)
    except (ConfigError, ValueError) as err:
        problems.append(f"launcher: {err}")
        accelerate = {}
    local_hardware = num_processes is None
    n = num_processes or int(accelerate.get("num_processes") or os.environ.get("WORLD_SIZE") or 1)
    if not local_hardware:
        report.notes.append(f"run for {n} processes elsewhere: this machine's GPU and bf16 are not checked")
    cfg = GivenValues(values, set(fields().owner))  # an unread recipe: no value is known
    try:
        if not unread:
            cfg = build_as_launched(values, n, local_hardware, str(config_path or "config"), problems)
    except ConfigProblems as err:  # the values' problems, with those found before
        problems = err.problems
        cfg = GivenValues(values, refused_keys(problems))
    report.problems.extend(problems)
    return check_run(cfg, n, local_hardware=local_hardware, accelerate=accelerate, report=report, resume=resume,
                     overwrite=overwrite)
