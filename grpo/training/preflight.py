"""The one run check of a GRPO run: config, prompt pool, checkpoint, engine, launcher, hardware and what training
supports. `train --dry-run` runs it (`preflight`) without training; training runs it first (`require_runnable`,
from `grpo.training.trainer.prepare_run`), so both refuse the same runs with the same messages.

Every check runs, problems are collected, and `PreflightReport.raise_for_problems` raises one `ConfigError`
listing them all. The batch geometry is TRL's own: `GRPOConfig.__post_init__` runs as if `num_processes`
processes were launched (its `world_size` is the only thing faked), so the divisibility rules for
`generation_batch_size`, `num_generations` and `steps_per_generation` are exactly the ones training applies.

Example:
    >>> report = preflight("configs/gravityocr_grpo.yaml", num_processes=8)   # doctest: +SKIP
    >>> report.facts["per optimizer step"]                                     # doctest: +SKIP
    '24 prompts x 28 generations = 672 completions'
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from grpo.yaml_config import ConfigError, _yaml_problem

# Tokens per forward assumed for the probe-cost estimate: the paper's TPF before GRPO at B = 32 (docs/spec.md §5).
ASSUMED_TPF = 9.61
# accelerate's launcher sets these in every process it starts.
_ACCELERATE_DEEPSPEED_ENV = "ACCELERATE_USE_DEEPSPEED"
_ACCELERATE_CONFIG_ENV = "ACCELERATE_CONFIG_FILE"


@dataclass
class PreflightReport:
    """What a run would do (`facts`, label -> text, in print order), what is skipped and why (`notes`),
    what stops it from starting (`problems`), and the pools as read (`pools`, by label: training reads
    them from here, so each is loaded once)."""

    facts: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    pools: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_for_problems(self) -> None:
        if self.problems:
            lines = "\n".join(f"  - {p}" for p in self.problems)
            raise ConfigError(f"the run would not start ({len(self.problems)} problem(s)):\n{lines}")


def read_accelerate_config(path: str | Path | None) -> dict[str, Any]:
    """The accelerate launch config at `path` (a file, or a shipped config's name: `zero3`), or the one the
    launcher was given, from its environment."""
    import yaml

    from grpo.builtin import ACCELERATE, recipe, recipes

    path = path or os.environ.get(_ACCELERATE_CONFIG_ENV)
    if not path:
        return {}
    path = recipe(path, ACCELERATE)
    if not path.is_file():
        raise ConfigError(f"accelerate config {path} does not exist (the shipped ones: "
                          f"{', '.join(recipes(ACCELERATE))})" if not path.exists() else
                          f"accelerate config {path} is not a regular file (a folder or a device)")
    try:  # a damaged or non-mapping file is a ConfigError naming it
        text = path.read_text(encoding="utf-8-sig")
        raw = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError, RecursionError) as err:
        raise ConfigError(f"accelerate config {path}: not readable ({_yaml_problem(err)})") from None
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"accelerate config {path}: a {type(raw).__name__}, expected a mapping of launch settings "
                          "(num_processes: 2, ...)")
    processes = (raw or {}).get("num_processes")
    if processes is not None and (isinstance(processes, bool) or not isinstance(processes, int) or processes < 1):
        raise ConfigError(f"accelerate config {path}: num_processes {processes!r:.40} is not an integer >= 1")
    return raw or {}


def build_as_launched(values: dict[str, Any], num_processes: int, local_hardware: bool, source: str = "config"):
    """`build_config(values, source)` as `num_processes` launched processes would build it.

    With `local_hardware` False (a run for another cluster) the bf16 capability check of transformers is
    answered yes, since this machine's GPU is not the one that will train.
    """
    from grpo.training.config import GravityGRPOConfig, build_config

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(GravityGRPOConfig, "world_size",
                                              new_callable=mock.PropertyMock, return_value=num_processes))
        if not local_hardware:
            stack.enter_context(mock.patch("transformers.training_args.is_torch_bf16_gpu_available",
                                           return_value=True))
        return build_config(values, source)


def steps_per_epoch(cfg: Any, num_processes: int, pool_rows: int) -> int:
    """Optimizer steps in one pass over `pool_rows` prompts (TRL's sampler arithmetic)."""
    # TRL's RepeatSampler: whole groups of generation_batch_size / g prompts, each seen num_iterations x
    # steps_per_generation times over micro-batches of per_device x processes completions.
    g = cfg.num_generations
    prompts = cfg.generation_batch_size // g
    samples = (pool_rows // prompts) * prompts * g * cfg.num_iterations * cfg.steps_per_generation
    return samples // (cfg.per_device_train_batch_size * num_processes * cfg.gradient_accumulation_steps)


def batch_facts(cfg: Any, num_processes: int, pool_rows: int | None) -> dict[str, str]:
    """Completions per optimizer step and per generation, steps per epoch (TRL's sampler arithmetic)."""
    g = cfg.num_generations
    per_step = cfg.per_device_train_batch_size * num_processes * cfg.gradient_accumulation_steps
    facts = {"processes": str(num_processes),
             "per optimizer step": f"{per_step // g} prompts x {g} generations = {per_step} completions "
                                   f"({cfg.per_device_train_batch_size} per device x {num_processes} processes "
                                   f"x {cfg.gradient_accumulation_steps} accumulation steps)"}
    if cfg.generation_batch_size != per_step:
        facts["per generation"] = (f"{cfg.generation_batch_size // g} prompts x {g} = {cfg.generation_batch_size} "
                                   f"completions, every {cfg.steps_per_generation} micro-batches")
    if pool_rows is not None:
        steps = steps_per_epoch(cfg, num_processes, pool_rows)
        facts["steps per epoch"] = f"{steps} ({pool_rows} pool rows)"
        if cfg.max_steps > 0:
            facts["epochs"] = f"{cfg.max_steps / max(steps, 1):.2f} for max_steps {cfg.max_steps}"
    return facts


def probe_facts(cfg: Any, num_processes: int, tpf: float = ASSUMED_TPF) -> dict[str, str]:
    """Forwards per TPF probe, upper bound (every output runs to `tpf_max_new_tokens`) at `tpf` tokens per
    forward: greedy self-spec, sampled self-spec (`tpf_samples` per prompt), and one forward per token of the
    prompts compared with AR greedy (`tpf_compare_ar`); batched forwards decode `tpf_batch_size` rows each."""
    if not cfg.probe_on:
        return {"TPF probe": "off (tpf_every 0)"}
    tokens = cfg.probe_size * cfg.tpf_max_new_tokens
    selfspec = math.ceil(tokens / tpf) * (1 + cfg.tpf_samples)
    first, later = (selfspec + cfg.ar_compared_prompts(step, cfg.probe_size) * cfg.tpf_max_new_tokens
                    for step in (0, cfg.tpf_every))
    probes = cfg.probe_count(cfg.max_steps)
    rows = min(cfg.tpf_batch_size, math.ceil(cfg.probe_size / num_processes))  # a rank's shard fills no more
    batched = math.ceil(later / num_processes / rows)
    return {"TPF probe cost": (f"<= {first:,} batch-1 forwards at step 0 and {later:,} per later probe "
                               f"({cfg.probe_size} prompts x {cfg.tpf_max_new_tokens} tokens / TPF {tpf}, the "
                               f"paper's at B = 32, greedy + {cfg.tpf_samples} sampled = {selfspec:,} self-spec, + "
                               f"one per token where AR greedy is compared: tpf_compare_ar {cfg.tpf_compare_ar}), "
                               f"~{batched:,} batched forwards per rank ({rows} row(s) per forward: tpf_batch_size "
                               f"{cfg.tpf_batch_size}, {cfg.probe_size} prompts over {num_processes}); {probes} probes in {cfg.max_steps} steps")}


def check_pool(spec: str, is_vlm: bool | None, report: PreflightReport, label: str = "pool",
               skip_bad: bool = False) -> int | None:
    """Read and validate a prompt pool as training does (every bad row listed by line or index, or left out
    with `skip_bad`); return its row count."""
    from grpo.pool import load_pool, policy_mismatch
    from grpo.errors import UserError

    try:
        ds = load_pool(spec, skip_bad=skip_bad)
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
    from grpo.checkpoint import BD_FILE, CheckpointError, inspect_checkpoint
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
    from grpo.prompting import rows_over_context

    limits = [n for n in (context_length(found.config),
                          cfg.vllm_max_model_length if cfg.use_vllm else None) if n is not None]
    for label, ds in pools.items():
        over = rows_over_context(found.processor, ds, found.is_vlm, min(limits, default=None),
                                 cfg.max_completion_length)
        if over:
            report.problems.append(f"{label}: {len(over)} row(s) longer than the context with max_completion_length "
                                   f"{cfg.max_completion_length}: {'; '.join(over[:5])}")


RUN_STAMP = "gravity-grpo train"  # the marker a run folder carries (grpo.outputs.mark)
MAX_SEED = 2**32 - 1  # numpy's and the samplers' seeds are 32-bit; torch takes more, numpy refuses it
MAX_NUM_GENERATIONS = 1024  # completions per prompt: recipes use 8 to 64; more is a typo, not a group
MAX_GENERATION_BATCH = 65_536  # completions held at once per generation (texts, logits' rows, rewards)


def is_own_run(folder: Path) -> bool:
    """True when `folder` is a run folder `train` wrote: its marker, or (runs from before the marker) a
    `run_config.json` that parses to a config naming its `output_dir`."""
    from grpo.evaluation.run_dir import RunDir
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
    from grpo.evaluation.run_dir import RunDir
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


def check_values(cfg: Any, report: PreflightReport) -> None:
    """Numbers the run would trip over: every number finite, and the ranges training and the samplers accept
    (seed, learning rate, temperature, clipping, steps, group and batch sizes), named by key."""
    from grpo.errors import quoted

    bad = report.problems.append
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name, None)
        if isinstance(value, float) and not math.isfinite(value):
            bad(f"{f.name} must be a finite number, got {value}")
    ranges = [("learning_rate", cfg.learning_rate >= 0, "a number >= 0"),
              ("temperature", cfg.temperature > 0, "a number > 0 (GRPO samples its groups)"),
              ("epsilon", cfg.epsilon >= 0, "a number >= 0"),
              ("epsilon_high", cfg.epsilon_high is None or cfg.epsilon_high >= 0, "a number >= 0"),
              ("top_p", cfg.top_p is None or 0 < cfg.top_p <= 1, "a number in (0, 1]"),
              ("max_steps", cfg.max_steps == -1 or cfg.max_steps >= 1, "an integer >= 1 (or -1: by epochs)"),
              ("num_train_epochs", cfg.num_train_epochs > 0, "a number > 0"),
              ("seed", 0 <= cfg.seed <= MAX_SEED, f"an integer in [0, {MAX_SEED}]"),
              ("num_generations", 2 <= cfg.num_generations <= MAX_NUM_GENERATIONS,
               f"an integer in [2, {MAX_NUM_GENERATIONS}]"),
              ("generation_batch_size", (cfg.generation_batch_size or 0) <= MAX_GENERATION_BATCH,
               f"at most {MAX_GENERATION_BATCH:,}")]
    for key, fine, wanted in ranges:
        value = getattr(cfg, key)
        if isinstance(value, float) and not math.isfinite(value):
            continue  # named above
        if not fine:
            bad(f"{key} must be {wanted}, got {quoted(value)}")


def check_launch(accelerate: dict[str, Any], report: PreflightReport) -> None:
    """DeepSpeed installed when the launch config (or the launcher's environment) asks for it."""
    wants = (str(accelerate.get("distributed_type", "")).upper() == "DEEPSPEED"
             or os.environ.get(_ACCELERATE_DEEPSPEED_ENV, "").lower() == "true")
    if wants:
        stage = (accelerate.get("deepspeed_config") or {}).get("zero_stage", "?")
        if importlib.util.find_spec("deepspeed") is None:
            report.problems.append(f"launcher: the accelerate config uses DeepSpeed (ZeRO-{stage}) but deepspeed "
                                   "is not installed: install the gpu extra (pip install -e '.[gpu]')")
        else:
            report.facts["launcher"] = f"DeepSpeed ZeRO-{stage}"


def check_engine(cfg: Any, is_vlm: bool | None, on_cpu: bool, report: PreflightReport) -> None:
    """The rollout engine the run would use, and whether it can serve the checkpoint here."""
    if not cfg.use_vllm:
        report.facts["rollouts"] = "TRL's HF generate"
        return
    if importlib.util.find_spec("vllm") is None:
        report.problems.append("engine: use_vllm is set but vLLM is not installed (the cpu or gpu extra)")
        return
    if is_vlm:
        from grpo.checkpoint import CheckpointError, resolve_model
        from grpo.rollouts.engine import check_vlm_for_vllm, torchvision_hint

        if hint := torchvision_hint():
            report.problems.append(f"engine: vLLM cannot load GLM-OCR here{hint}; or set use_vllm: false")
            return
        try:
            check_vlm_for_vllm(resolve_model(cfg.model))
        except CheckpointError as err:
            report.problems.append(f"engine: {err}")
            return
    drafted = ", self-drafted" if cfg.vllm_self_speculation else ""
    report.facts["rollouts"] = f"vLLM, {cfg.vllm_mode} ({'CPU' if on_cpu else 'CUDA'}){drafted}"


# Seconds the run check waits for a vLLM server's answer (TRL then waits vllm_server_timeout at its own start).
SERVER_ANSWER_TIMEOUT = 10.0


def server_url(cfg: Any) -> str:
    """The base URL TRL's client would use for `vllm_mode: server` (`vllm_server_base_url`, else host and port)."""
    return (cfg.vllm_server_base_url or f"http://{cfg.vllm_server_host}:{cfg.vllm_server_port}").rstrip("/")


def served_model(url: str, timeout: float = SERVER_ANSWER_TIMEOUT) -> str:
    """The model a vLLM server at `url` serves (its `/health`, then the first id of `/v1/models`); OSError or
    ValueError when it does not answer as `trl vllm-serve` does."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/health", timeout=timeout) as response:
        if response.status != 200:
            raise ValueError(f"/health answered {response.status}")
    with urllib.request.urlopen(f"{url}/v1/models", timeout=timeout) as response:
        return json.loads(response.read())["data"][0]["id"]


def check_server(cfg: Any, on_cpu: bool, report: PreflightReport) -> None:
    """`vllm_mode: server`: the server answers and serves the checkpoint this run trains; and training is refused
    on CPU, where TRL's weight sync to the server cannot run (its NCCL weight transfer needs CUDA)."""
    if not (cfg.use_vllm and cfg.vllm_mode == "server"):
        return
    if on_cpu:
        report.problems.append("engine: vllm_mode 'server' needs CUDA to train: TRL pushes the weights to the server "
                               "over NCCL (VLLMClient.init_communicator); on CPU use vllm_mode: colocate")
    url = server_url(cfg)
    try:
        served = served_model(url)
    except (OSError, ValueError, KeyError, IndexError) as err:
        report.problems.append(f"engine: no vLLM server answers at {url} ({err}); start it first "
                               "(trl vllm-serve --model MODEL --host HOST --port PORT, docs/grpo.md)")
        return
    from grpo.checkpoint import CheckpointError, resolve_model

    try:
        folder = resolve_model(cfg.model).resolve()
    except (CheckpointError, OSError):
        return  # named by the checkpoint check
    if served not in (str(cfg.model), str(folder)) and Path(served).resolve() != folder:
        report.problems.append(f"engine: the vLLM server at {url} serves {served!r}, but this run trains "
                               f"{cfg.model} ({folder}); serve that checkpoint")
    else:
        report.facts["vLLM server"] = f"{url} serves {served}"


def check_training(cfg: Any, is_vlm: bool | None, on_cpu: bool, report: PreflightReport) -> None:
    """What the training code supports: QLoRA only on CUDA, the drafter loss and self-speculative rollouts only
    on text checkpoints."""
    if cfg.model_args.load_in_4bit and on_cpu:
        report.problems.append("training: load_in_4bit (QLoRA) needs CUDA: bitsandbytes' 4-bit layers run on "
                               "GPUs; drop load_in_4bit to train LoRA on full-precision weights here")
    if is_vlm and cfg.rollout_decoder == "selfspec":
        report.problems.append("training: rollout_decoder 'selfspec' decodes text policies only; set it to 'hf'")
    if is_vlm and cfg.drafter_loss_weight > 0:
        report.problems.append("training: drafter_loss_weight > 0 is implemented for text checkpoints only "
                               "(grpo.joint.streams builds 1-D positions and no image inputs); set it to 0")


def check_hardware(cfg: Any, num_processes: int, report: PreflightReport) -> None:
    """CUDA devices and bf16 on this machine for a GPU run of `num_processes` processes (those of this machine:
    the launcher's `LOCAL_WORLD_SIZE` when set)."""
    import torch

    from grpo.hardware import torch_on_cpu

    if cfg.use_cpu:
        report.facts["hardware"] = f"CPU, {num_processes} process(es)"
        return
    if torch_on_cpu():
        report.problems.append("hardware: the config trains on GPU (use_cpu is false) but this machine has no "
                               "CUDA device; set use_cpu: true, or check a run for another cluster with its "
                               "process count")
        return
    count = torch.cuda.device_count()
    local = int(os.environ.get("LOCAL_WORLD_SIZE") or num_processes)
    if local > count:
        report.problems.append(f"hardware: {local} processes but {count} CUDA device(s) here")
    if cfg.bf16 and not torch.cuda.is_bf16_supported():
        report.problems.append(f"hardware: bf16 is set but {torch.cuda.get_device_name(0)} has no bf16 support")
    report.facts["hardware"] = f"{count} x {torch.cuda.get_device_name(0)}"


def check_run(cfg: Any, num_processes: int, *, local_hardware: bool = True, accelerate: dict | None = None,
              report: PreflightReport | None = None, get: Any = None, resume: str | bool | None = None,
              overwrite: bool = False) -> PreflightReport:
    """The one run check: checkpoint, pools, launcher, hardware, engine and training support of `cfg` (a
    `GravityGRPOConfig`, or None when it could not be built; `get(name)` then reads the raw values).

    Training calls it through `require_runnable` and the dry run through `preflight`, so both refuse the
    same runs with the same messages.
    """
    from grpo.hardware import torch_on_cpu
    from grpo.prompting import handles_images
    from grpo.training.config import needs_drafter

    report = report if report is not None else PreflightReport()
    get = get or (lambda name: getattr(cfg, name))
    drafter = needs_drafter(get("tpf_every"), get("drafter_loss_weight"), get("rollout_decoder"),
                            get("vllm_self_speculation"))
    found = check_checkpoint(str(get("model")), drafter, report)
    is_vlm = found.is_vlm if found is not None else None
    pool_rows = check_pool(str(get("pool")), is_vlm, report, skip_bad=get("skip_bad"))
    probe_rows = check_pool(str(get("probe_set")), is_vlm, report, label="probe set") if get("tpf_every") > 0 \
        else None
    check_launch(accelerate or {}, report)
    if cfg is None:
        return report
    if probe_rows is not None and probe_rows < cfg.probe_size:
        report.problems.append(f"probe set {cfg.probe_set}: {probe_rows} rows, fewer than probe_size {cfg.probe_size}")
    if pool_rows is not None and steps_per_epoch(cfg, num_processes, pool_rows) == 0:
        report.problems.append(f"pool {cfg.pool}: {pool_rows} rows make 0 optimizer steps per epoch at "
                               f"{cfg.generation_batch_size // cfg.num_generations} prompts per generation")
    if found is not None and (not found.is_vlm or handles_images(found.processor)):  # else named above
        check_lengths(cfg, found, report.pools, report)
    check_values(cfg, report)
    check_outputs(cfg, report, resume, overwrite)
    cpu = torch_on_cpu(cfg.use_cpu, local=local_hardware)
    if local_hardware:
        check_hardware(cfg, num_processes, report)
    check_engine(cfg, is_vlm, cpu, report)
    check_server(cfg, cpu, report)
    check_training(cfg, is_vlm, cpu, report)
    report.facts.update(batch_facts(cfg, num_processes, pool_rows))
    report.facts.update(probe_facts(cfg, num_processes))
    return report


def require_runnable(cfg: Any, resume: str | bool | None = None, overwrite: bool = False) -> PreflightReport:
    """Training's side of `check_run`, on this machine with the launcher's processes: one `ConfigError`
    listing every problem, as the dry run reports them; the report otherwise."""
    report = check_run(cfg, cfg.world_size, accelerate=read_accelerate_config(None), resume=resume,
                       overwrite=overwrite)
    report.raise_for_problems()
    return report


def preflight(config_path: str | Path | None = None, overrides: dict[str, Any] | None = None, *,
              num_processes: int | None = None, accelerate_config: str | Path | None = None,
              resume: str | bool | None = None, overwrite: bool = False) -> PreflightReport:
    """Run every check of a training run; see the module docstring.

    `num_processes` None takes the launch config's `num_processes` (or the launcher's `WORLD_SIZE`, else 1)
    and checks this machine's hardware; a given `num_processes` is a run for another cluster: the local
    GPU and bf16 checks are skipped, with a note.
    """
    from grpo.training.config import field_default, fields
    from grpo.yaml_config import read_recipe

    report = PreflightReport()
    values: dict[str, Any] = {}
    problems = []
    config_unread = False
    try:
        if config_path is not None:
            values = fields().values(read_recipe(config_path), str(config_path), problems)
    except ConfigError as err:
        problems.append(str(err))
        config_unread = True
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    values.update(fields().values(given, "command line", problems))
    report.problems.extend(f"config: {p}" for p in problems)
    try:
        accelerate = read_accelerate_config(accelerate_config)
    except (ConfigError, ValueError) as err:
        report.problems.append(f"launcher: {err}")
        accelerate = {}
    local_hardware = num_processes is None
    n = num_processes or int(accelerate.get("num_processes") or os.environ.get("WORLD_SIZE") or 1)
    if not local_hardware:
        report.notes.append(f"run for {n} processes elsewhere: this machine's GPU and bf16 are not checked")
    values.setdefault("output_dir", values.get("output_dir") or "runs/preflight")

    cfg = None
    try:  # a config that could not be read is not built from defaults (no spurious complaints)
        if not config_unread:
            cfg = build_as_launched(values, n, local_hardware,
                                    f"config{f' {config_path}' if config_path else ''} with {n} process(es)")
    except ConfigError as err:  # TRL's and our own __post_init__ checks
        report.problems.append(str(err))

    get = None if cfg is not None else (lambda name: values.get(name, field_default(name)))
    return check_run(cfg, n, local_hardware=local_hardware, accelerate=accelerate, report=report, get=get,
                     resume=resume, overwrite=overwrite)
