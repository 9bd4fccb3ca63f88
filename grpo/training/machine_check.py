"""The machine a run needs: the accelerate launch config and DeepSpeed, this machine's CUDA devices and bf16,
the rollout engine (vLLM installed and able to serve the checkpoint; in server mode, a server that answers
and serves it), and what the training code supports there (QLoRA, the drafter loss, self-speculative rollouts). Each check appends its problems to a `grpo.training.report.PreflightReport`.

Example:
    >>> read_accelerate_config("zero3")["num_processes"]      # doctest: +SKIP
    8
"""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from grpo.errors import quoted
from grpo.limits import MAX_PROCESSES
from grpo.training.report import PreflightReport
from grpo.yaml_config import ConfigError, yaml_problem

# accelerate's launcher sets these in every process it starts.
_ACCELERATE_DEEPSPEED_ENV = "ACCELERATE_USE_DEEPSPEED"
_ACCELERATE_CONFIG_ENV = "ACCELERATE_CONFIG_FILE"


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
        raise ConfigError(f"accelerate config {path}: not readable ({yaml_problem(err)})") from None
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"accelerate config {path}: a {type(raw).__name__}, expected a mapping of launch settings "
                          "(num_processes: 2, ...)")
    processes = (raw or {}).get("num_processes")
    if processes is not None and (isinstance(processes, bool) or not isinstance(processes, int)
                                  or not 1 <= processes <= MAX_PROCESSES):
        raise ConfigError(f"accelerate config {path}: num_processes {processes!r:.40} is not an integer in "
                          f"[1, {MAX_PROCESSES}]")
    return raw or {}


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


def check_engine(cfg: Any, is_vlm: bool | None, report: PreflightReport) -> None:
    """The rollout engine the run would use, and whether it can serve the checkpoint here."""
    if not cfg.use_vllm:
        report.facts["rollouts"] = "TRL's HF generate"
        return
    if importlib.util.find_spec("vllm") is None:
        report.problems.append("engine: use_vllm is set but vLLM is not installed (the cpu or gpu extra)")
        return
    if is_vlm:
        from grpo.errors import CheckpointError
        from grpo.model_source import resolve_model
        from grpo.rollouts.engine import check_vlm_for_vllm, torchvision_hint

        if hint := torchvision_hint():
            report.problems.append(f"engine: vLLM cannot load GLM-OCR here{hint}; or set use_vllm: false")
            return
        try:
            check_vlm_for_vllm(resolve_model(cfg.model))
        except CheckpointError as err:
            report.problems.append(f"engine: {err}")
            return
    from grpo.hardware import vllm_on_cpu

    drafted = ", self-drafted" if cfg.vllm_self_speculation else ""
    report.facts["rollouts"] = f"vLLM, {cfg.vllm_mode} ({'CPU' if vllm_on_cpu() else 'CUDA'}){drafted}"


# Seconds the run check waits for a vLLM server's answer (TRL then waits vllm_server_timeout at its own start).
SERVER_ANSWER_TIMEOUT = 10.0


def server_url(cfg: Any) -> str:
    """The base URL TRL's client would use for `vllm_mode: server` (`vllm_server_base_url`, else host and port)."""
    return (cfg.vllm_server_base_url or f"http://{cfg.vllm_server_host}:{cfg.vllm_server_port}").rstrip("/")


def url_problem(url: str) -> str | None:
    """Why `url` is no http(s) URL a client can open (a host with a space, a bad port, no scheme), or None."""
    from urllib.parse import urlsplit

    if any(c.isspace() or not c.isprintable() for c in url):
        return "it holds a space or a control character"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError as err:
        return str(err)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "give http://HOST:PORT"
    return None


def served_model(url: str, timeout: float = SERVER_ANSWER_TIMEOUT) -> dict:
    """The model a vLLM server at `url` serves (its `/health`, then the first entry of `/v1/models`: `id`, and
    `max_model_len`, the tokens a sequence may hold there); OSError or ValueError when it does not answer as
    `trl vllm-serve` does."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/health", timeout=timeout) as response:
        if response.status != 200:
            raise ValueError(f"/health answered {response.status}")
    with urllib.request.urlopen(f"{url}/v1/models", timeout=timeout) as response:
        entry = json.loads(response.read())["data"][0]
    if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
        raise ValueError("/v1/models names no model")
    return entry


def check_server(cfg: Any, on_cpu: bool, report: PreflightReport) -> None:
    """`vllm_mode: server`: the server answers and serves the checkpoint this run trains; and training is refused
    on CPU, where TRL's weight sync to the server cannot run (its NCCL weight transfer needs CUDA)."""
    if not (cfg.use_vllm and cfg.vllm_mode == "server"):
        return
    if on_cpu:
        report.problems.append("engine: vllm_mode 'server' needs CUDA to train: TRL pushes the weights to the server "
                               "over NCCL (VLLMClient.init_communicator); on CPU use vllm_mode: colocate")
    import http.client

    url = server_url(cfg)
    problem = url_problem(url)
    if problem:
        setting = "vllm_server_base_url" if cfg.vllm_server_base_url else "vllm_server_host"
        report.problems.append(f"engine: {setting}: {quoted(url)} is not a server URL ({problem})")
        return
    try:
        entry = served_model(url)
    except (OSError, ValueError, KeyError, IndexError, http.client.HTTPException) as err:
        report.problems.append(f"engine: no vLLM server answers at {url} ({err}); start it first "
                               "(trl vllm-serve --model MODEL --host HOST --port PORT, docs/grpo.md)")
        return
    served, limit = entry["id"], entry.get("max_model_len")
    if isinstance(limit, int) and cfg.max_completion_length >= limit:  # vLLM would cut every completion short
        report.problems.append(f"engine: the vLLM server at {url} holds {limit} tokens per sequence (its "
                               f"--max_model_len), which max_completion_length {cfg.max_completion_length} and a "
                               "prompt do not fit in; serve with a larger --max_model_len")
    from grpo.errors import CheckpointError
    from grpo.model_source import resolve_model

    try:
        folder = resolve_model(cfg.model).resolve()
    except (CheckpointError, OSError):
        return  # named by the checkpoint check
    if served not in (str(cfg.model), str(folder)) and Path(served).resolve() != folder:
        report.problems.append(f"engine: the vLLM server at {url} serves {served!r}, but this run trains "
                               f"{cfg.model} ({folder}); serve that checkpoint")
    else:
        report.facts["vLLM server"] = f"{url} serves {served}"


def check_training(cfg: Any, found: Any, on_cpu: bool, report: PreflightReport) -> None:
    """What the training code supports: QLoRA only on CUDA and from full weights, the drafter loss and
    self-speculative rollouts only on text checkpoints (`found`: the checkpoint as inspected, or None)."""
    is_vlm = found.is_vlm if found is not None else None
    if cfg.model_args.load_in_4bit and on_cpu:
        report.problems.append("training: load_in_4bit (QLoRA) needs CUDA: bitsandbytes' 4-bit layers run on "
                               "GPUs; drop load_in_4bit to train LoRA on full-precision weights here")
    if cfg.model_args.load_in_4bit and found is not None and found.source.base is not None:
        report.problems.append(f"model {found.source.folder}: QLoRA (load_in_4bit) loads the weights from a folder, "
                               "and a LoRA checkpoint's folder holds adapters only; save the merged model first "
                               "(peft merge_and_unload + save_pretrained) and train from it")
    if is_vlm and cfg.rollout_decoder == "selfspec":
        report.problems.append("training: rollout_decoder 'selfspec' decodes text policies only; set it to 'hf'")
