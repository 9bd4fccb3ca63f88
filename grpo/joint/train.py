"""Joint AR / block-diffusion training (docs/spec.md §6, paper 3.1 and appendix A): how joint checkpoints are made.

The streams, their attention and labels are `grpo.joint.streams`; this module holds the config, the tiny
model, the optimizer loop and saving.

An optional AR-only warm-up stage trains the clean stream alone (one stream, about 3x cheaper per example),
which lets a model trained from scratch learn to copy before the drafter objective is added.

Example:
    >>> cfg = load_config("configs/joint_tiny.yaml")
    >>> train_joint(cfg)  # writes cfg.output_dir (weights, tokenizer, block_diffusion.json)
"""
from __future__ import annotations

import functools
import logging
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from grpo.joint.streams import build_example, collate, combine, greedy_relabel, joint_losses, verifier_sources
from grpo.synthetic.render import COLUMNS
from grpo.synthetic.splits import is_builtin
from grpo.yaml_config import ConfigError, Fields, build

logger = logging.getLogger(__name__)


@dataclass
class JointConfig:
    """Settings of `gravity-grpo joint`; YAML keys are these field names."""

    output_dir: str = field(default="data/tiny/model", metadata={"help": "where the final checkpoint goes"})
    model: str | None = field(default=None, metadata={
        "help": "plain AR (or joint) checkpoint folder to start from; None builds the tiny model from scratch"})
    pool: str = field(default="tiny-train", metadata={
        "help": "training rows: a built-in split (rendered as crops for a GLM-OCR model) or a pool path"})
    pool_rows: int = field(default=0, metadata={"help": "train on the pool's first N rows (0: all)"})
    indent: int = field(default=0, metadata={
        "help": "a built-in pool's crops draw each text and formula line 0 to N cells in from the left edge, so "
                "a line is found by what was written, not by its offset (0: from the edge; docs/vlm.md)"})
    targets: str = field(default="pool", metadata={
        "help": "'pool': the rows' targets; 'greedy': the start model's own AR greedy outputs (self-distillation: "
                "the drafter learns what the verifier writes; grpo/joint/distill.py)"})
    drafter_targets: str = field(default="target", metadata={
        "help": "what the drafter's masked tokens are trained to be: 'target' (the row's target, as the AR path) or "
                "'greedy' (the verifier's argmax at each place, read off the clean stream of the same forward: "
                "drafts are accepted when they equal it; docs/joint.md)"})
    bd_size: int = field(default=16, metadata={"help": "block size B (drafting window)"})
    ar_loss_weight: float = field(default=1.0, metadata={"help": "w in (L_diff + w L_AR) / (1 + w)"})
    full_mask_share: float = field(default=0.0, metadata={
        "help": "share of blocks whose first corrupted stream is masked whole (t = 1), the one condition a draft "
                "meets; the others draw t ~ U(0,1) (0: the uniform schedule of docs/spec.md §6; docs/joint.md)"})
    ar_steps: int = field(default=0, metadata={"help": "AR-only warm-up steps before the joint stage"})
    curriculum: list[int] = field(default_factory=list, metadata={
        "help": "steps on rows of at most 1, 2, ... lines, in turn, from the first step on; then every row (a "
                "crop's lines are its rows of merged image tokens, a text row's its target lines; docs/joint.md)"})
    joint_steps: int = field(default=1000, metadata={"help": "joint AR + diffusion steps"})
    batch_size: int = field(default=16, metadata={"help": "examples per step"})
    length_buckets: int = field(default=0, metadata={
        "help": "draw each batch from N x batch_size rows of similar length (less padding; 0: from all rows)"})
    learning_rate: float = field(default=1e-3, metadata={
        "help": "peak AdamW learning rate (each stage: warm-up, cosine)"})
    min_lr_ratio: float = field(default=0.1, metadata={"help": "final learning rate / peak"})
    warmup_steps: int = field(default=50, metadata={"help": "linear warm-up steps of each stage"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})
    grad_clip: float = field(default=1.0, metadata={"help": "gradient-norm clip"})
    max_target_tokens: int = field(default=128, metadata={"help": "longer training targets are skipped"})
    seed: int = field(default=0, metadata={"help": "seed of sampling, masking and initialisation"})
    cpu_threads: int = field(default=2, metadata={"help": "torch CPU threads"})
    stop_at_step: int = field(default=0, metadata={
        "help": "end the run after this many steps in all (0: both stages to the end); the learning-rate "
                "schedules still assume the full stage lengths, so this is an intermediate checkpoint of the full run"})
    save_every: int = field(default=0, metadata={"help": "intermediate checkpoint every N steps (0: none)"})
    checkpoint_dir: str = field(default="runs/joint", metadata={"help": "where intermediate checkpoints go"})
    # architecture of the from-scratch tiny model (Qwen2-style block; head_dim 32 so vLLM CPU serves it)
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 4
    head_dim: int = 32
    intermediate_size: int = 384
    max_position_embeddings: int = 2048

    def __post_init__(self) -> None:
        if self.targets not in ("pool", "greedy"):
            raise ConfigError(f"targets must be 'pool' or 'greedy', got {self.targets!r}")
        if self.drafter_targets not in ("target", "greedy"):
            raise ConfigError(f"drafter_targets must be 'target' or 'greedy', got {self.drafter_targets!r}",
                              setting="drafter_targets")
        if self.pool_rows < 0:
            raise ConfigError(f"pool_rows must be >= 0, got {self.pool_rows}")
        if not 0 <= self.indent < COLUMNS:
            raise ConfigError(f"indent must be in [0, {COLUMNS - 1}] cells, got {self.indent}", setting="indent")
        if self.indent and not is_builtin(self.pool):
            raise ConfigError(f"indent draws a built-in split's crops; pool {self.pool!r} is a pool path, its images "
                              "are read as they are", setting="indent")
        if self.length_buckets < 0:
            raise ConfigError(f"length_buckets must be >= 0, got {self.length_buckets}")
        for name in ("bd_size", "batch_size", "cpu_threads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.ar_loss_weight < 0:
            raise ConfigError(f"ar_loss_weight must be >= 0, got {self.ar_loss_weight}")
        if not 0 <= self.full_mask_share <= 1:
            raise ConfigError(f"full_mask_share must be in [0, 1], got {self.full_mask_share}",
                              setting="full_mask_share")
        if self.ar_steps < 0 or self.joint_steps < 0 or self.ar_steps + self.joint_steps == 0:
            raise ConfigError("ar_steps and joint_steps must be >= 0 and not both 0")
        if any(not isinstance(n, int) or n < 0 for n in self.curriculum) or sum(self.curriculum) > \
                self.ar_steps + self.joint_steps:
            raise ConfigError(f"curriculum must be step counts >= 0 that add up to at most ar_steps + joint_steps, "
                              f"got {self.curriculum}", setting="curriculum")
        if self.stop_at_step < 0 or self.stop_at_step > self.ar_steps + self.joint_steps:
            raise ConfigError(f"stop_at_step must be in [0, ar_steps + joint_steps], got {self.stop_at_step}")
        for name in ("learning_rate", "min_lr_ratio", "weight_decay", "grad_clip", "ar_loss_weight"):
            if not 0 <= getattr(self, name) < math.inf or (name == "learning_rate" and not self.learning_rate):
                raise ConfigError(f"{name} must be a finite number {'> 0' if name == 'learning_rate' else '>= 0'}, "
                                  f"got {getattr(self, name)}", setting=name)
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                     "max_position_embeddings", "max_target_tokens"):
            if not 1 <= getattr(self, name) <= 1 << 20:
                raise ConfigError(f"{name} must be an integer in [1, {1 << 20:,}], got {getattr(self, name)}",
                                  setting=name)
        if self.head_dim * self.num_heads != self.hidden_size and self.model is None:
            logger.info("head_dim * num_heads (%d) differs from hidden_size (%d)",
                        self.head_dim * self.num_heads, self.hidden_size)


# Old key -> new key: the names `train` uses for the same things (one deprecation line each).
ALIASES = {"out_dir": "output_dir", "out": "output_dir", "init": "model", "data": "pool", "lr": "learning_rate",
           "threads": "cpu_threads"}


@functools.cache
def fields() -> Fields:
    """The keys of `JointConfig` (and their old names), typed by transformers' HfArgumentParser."""
    return Fields(JointConfig, aliases=ALIASES)


def load_config(path: str | Path | None = None, **overrides) -> JointConfig:
    """`path`'s keys (a recipe, `extends` followed), then `overrides` (non-None values), into a JointConfig."""
    given = {k: v for k, v in overrides.items() if v is not None}
    return build(JointConfig, fields().load(path, fields().values(given, "command line")), str(path or "config"))


# ----------------------------------------------------------------------------------------------- model


def build_tiny_model(cfg: JointConfig, tokenizer):
    """A Qwen2-style causal LM from scratch over `tokenizer`: tied embeddings, biased attention, no BOS.

    It is a `LlamaForCausalLM` with `attention_bias=True` (the Qwen2 block, plus an output-projection bias):
    transformers forces its Qwen2 tokenizer class on any `qwen2` checkpoint, which would replace our
    tokenizer's pre-tokenization on reload, while a `llama` checkpoint keeps the saved `tokenizer.json`.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=True,
        attention_bias=True, rope_theta=10000.0, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model


def load_start(cfg: JointConfig):
    """(model, tokenizer or GLM-OCR processor, mask_id): from `cfg.model` (adds `<|mask|>` if absent) or the tiny
    model from scratch."""
    from grpo.checkpoint import is_vlm_checkpoint, load_checkpoint
    from grpo.joint.mask_token import add_mask_token

    if cfg.model and is_vlm_checkpoint(cfg.model):
        ckpt = load_checkpoint(cfg.model)
        return ckpt.model, ckpt.processor, add_mask_token(ckpt.model, ckpt.processor)
    if cfg.model:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(cfg.model)
        model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32, attn_implementation="sdpa")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
    else:
        from grpo.synthetic.tokenizer import build_tokenizer

        tokenizer = build_tokenizer()
        model = build_tiny_model(cfg, tokenizer)
    return model, tokenizer, add_mask_token(model, tokenizer)


def tokenize_rows(rows, tokenizer, max_target_tokens: int,
                  targets: list[list[int] | None] | None = None) -> list[tuple[list[int], list[int]]]:
    """(prompt ids with the tokenizer's default special tokens, target ids without) per row; `targets` (ids per
    row, None: leave the row out) replace the rows' own."""
    prompts = tokenizer(list(rows["prompt"])).input_ids
    if targets is None:
        targets = tokenizer(list(rows["target"]), add_special_tokens=False).input_ids
    pairs = [(p, t) for p, t in zip(prompts, targets) if t is not None and 1 <= len(t) <= max_target_tokens]
    if not pairs:  # a row without target tokens gives the drafter nothing to learn
        raise ConfigError(f"no training row has a target of 1 to {max_target_tokens} tokens (max_target_tokens)")
    return pairs


def _training_rows(spec: str, n: int, images: bool, indent: int):
    """The first `n` rows (0: all) of a built-in split (rendered crops if `images`, lines up to `indent` cells in)
    or a pool path."""
    from grpo.pool import builtin_rows, load_pool

    if is_builtin(spec):
        if indent and not images:
            raise ConfigError("indent draws crops: the model is a text model, its rows have no image",
                              setting="indent")
        return builtin_rows(spec, images, n or None, indent)

    rows = load_pool(spec)
    return rows.select(range(min(n, len(rows)))) if n else rows


def _lr_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _example(prompt_ids, target_ids, image_row, cfg: JointConfig, mask_id: int, eos_id: int,
             gen: torch.Generator, ar_only: bool) -> dict:
    """`build_example` of one pair; an image row adds its M-RoPE positions and image inputs."""
    positions = image_row.positions if image_row is not None else None
    example = build_example(prompt_ids, target_ids, bd_size=cfg.bd_size, mask_id=mask_id, eos_id=eos_id, gen=gen,
                            ar_only=ar_only, full_share=cfg.full_mask_share, prompt_positions=positions)
    if cfg.drafter_targets == "greedy" and not ar_only:
        example["greedy_src"] = verifier_sources(example, len(prompt_ids), len(target_ids), cfg.bd_size)
    return example if image_row is None else {**example, **image_row.images}


def curriculum_pools(pairs: list, lines: list[int], curriculum: list[int]) -> list[tuple[float, list]]:
    """(first step after it, pairs drawn from) per phase of `curriculum` (steps on rows of at most 1, 2, ...
    `lines`, in turn), then every pair to the end."""
    pools, end = [], 0
    for limit, steps in enumerate(curriculum, start=1):
        within = [pair for pair, n in zip(pairs, lines) if n <= limit]
        if steps and not within:
            raise ConfigError(f"curriculum: no training row has at most {limit} lines", setting="curriculum")
        end += steps
        pools.append((end, within))
    return pools + [(math.inf, pairs)]


def _batch(pairs: list, cfg: JointConfig, rng: random.Random) -> list:
    """`cfg.batch_size` random pairs; with `length_buckets` (pairs sorted by length) from one random window of
    that many batches' worth of neighbours."""
    if not cfg.length_buckets:
        return [rng.choice(pairs) for _ in range(cfg.batch_size)]
    width = min(len(pairs), cfg.length_buckets * cfg.batch_size)
    start = rng.randrange(len(pairs) - width + 1)
    return [rng.choice(pairs[start:start + width]) for _ in range(cfg.batch_size)]


def save(model, tokenizer, out_dir: str | Path, cfg: JointConfig) -> Path:
    from grpo.joint.mask_token import save_joint_checkpoint

    share = cfg.full_mask_share
    schedule = {0: "uniform", 1: "full"}.get(share, f"uniform, {share:g} of blocks full")
    save_joint_checkpoint(model, tokenizer, out_dir, bd_size=cfg.bd_size, ar_loss_weight=cfg.ar_loss_weight,
                          mask_schedule=schedule)
    return Path(out_dir)


def train_joint(cfg: JointConfig, progress: bool = True) -> Path:
    """Run the AR warm-up (if any) then the joint stage; save the final checkpoint to `cfg.output_dir`."""
    from tqdm.auto import tqdm

    from grpo.checkpoint import is_vlm, tokenizer_of
    from grpo.joint.distill import greedy_targets
    from grpo.joint.images import encode_image_rows

    torch.set_num_threads(cfg.cpu_threads)
    model, processor, mask_id = load_start(cfg)
    tokenizer = tokenizer_of(processor)
    model.config._attn_implementation = "sdpa"
    images = is_vlm(model.config)
    rows = _training_rows(cfg.pool, cfg.pool_rows, images, cfg.indent)
    targets = None
    if cfg.targets == "greedy":
        targets = greedy_targets(model, processor, rows, images, cfg.max_target_tokens)
        logger.info("greedy targets: %d of %d rows stop within %d tokens", sum(t is not None for t in targets),
                    len(targets), cfg.max_target_tokens)
    if images:
        pairs = [(row.prompt_ids, row.target_ids, row) for row in
                 encode_image_rows(rows, model, processor, cfg.max_target_tokens, targets, cfg.pool)]
    else:
        pairs = [(*pair, None) for pair in tokenize_rows(rows, tokenizer, cfg.max_target_tokens, targets)]
    if cfg.length_buckets:
        pairs.sort(key=lambda pair: len(pair[0]) + len(pair[1]))
    lines = [row.lines if row is not None else tokenizer.decode(target).count("\n") + 1 for _, target, row in pairs]
    pools = curriculum_pools(pairs, lines, cfg.curriculum)
    n_params = sum(p.numel() for p in model.parameters())
    logger.info("joint training: %d params, %d rows, B=%d, mask id %d", n_params, len(pairs), cfg.bd_size, mask_id)
    rng = random.Random(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    model.train()
    stages = [("ar", cfg.ar_steps), ("joint", cfg.joint_steps)]
    stop = cfg.stop_at_step or cfg.ar_steps + cfg.joint_steps
    done = 0
    for stage, steps in stages:
        if steps == 0 or done >= stop:
            continue
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
        bar = tqdm(range(steps), desc=stage, disable=not progress, mininterval=5)
        for step in bar:
            for group in opt.param_groups:
                group["lr"] = cfg.learning_rate * _lr_factor(step, steps, cfg.warmup_steps, cfg.min_lr_ratio)
            examples = [_example(*pair, cfg, mask_id, tokenizer.eos_token_id, gen, stage == "ar")
                        for pair in _batch(next(p for end, p in pools if done < end), cfg, rng)]
            batch = collate(examples, tokenizer.pad_token_id)
            relabel = greedy_relabel(batch, batch["greedy_src"]) if "greedy_src" in batch else None
            l_ar, l_diff = joint_losses(model, batch, relabel)
            loss = combine(l_ar, l_diff, cfg.ar_loss_weight)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            done += 1
            stats = {"ar": f"{l_ar.item():.3f}", "diff": f"{l_diff.item():.3f}" if l_diff is not None else "-"}
            bar.set_postfix(stats, refresh=False)
            if step % 50 == 0 or step == steps - 1:
                logger.info("%s step %d/%d (total %d): L_AR %s L_diff %s", stage, step, steps, done,
                            stats["ar"], stats["diff"])
            if done >= stop:
                break
            if cfg.save_every and done % cfg.save_every == 0:
                model.eval()
                save(model, processor, Path(cfg.checkpoint_dir) / f"step-{done}", cfg)
                model.train()
    model.eval()
    return save(model, processor, cfg.output_dir, cfg)
