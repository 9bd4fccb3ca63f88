"""Joint AR / block-diffusion training (SPEC §6, paper 3.1 and appendix A): how joint checkpoints are made.

One forward per example over `[prompt | clean response | corrupted stream 1 | corrupted stream 2]`:
- the response is the target followed by exactly B EOS tokens (B = `bd_size`);
- the clean stream is causal and gives the AR next-token loss (targets: the response up to its first EOS);
- for every block of B response tokens a noise level t ~ U(0,1) is drawn, stream 1 masks each token with
  probability t and stream 2 masks exactly the other tokens of the block;
- a corrupted token of block b sees the prompt, the clean blocks before b and its own stream's block b
  (bidirectionally), never the clean block b or later, never the other stream;
- every stream is shifted: the logits at response index k-1 predict token k, so the last position of block b
  predicts the first token of block b+1 (the draft's last token d_B at inference) and token 0 is read from the
  last prompt token; the diffusion loss counts a token in the one stream where it is masked (all B EOS included).
Loss = (L_diff + w * L_AR) / (1 + w).

An optional AR-only warm-up stage trains the clean stream alone (one stream, about 3x cheaper per example),
which lets a model trained from scratch learn to copy before the drafter objective is added.

Example:
    >>> cfg = load_config("configs/joint_tiny.yaml")
    >>> train_joint(cfg)  # writes cfg.out_dir (weights, tokenizer, block_diffusion.json)
"""
from __future__ import annotations

import dataclasses
import logging
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

IGNORE = -100


@dataclass
class JointConfig:
    """Settings of `gravity-grpo joint`; YAML keys are these field names."""

    out_dir: str = field(default="data/tiny/model", metadata={"help": "where the final checkpoint goes"})
    init: str | None = field(default=None, metadata={
        "help": "plain AR (or joint) checkpoint folder to start from; None builds the tiny model from scratch"})
    data: str = field(default="tiny-train", metadata={"help": "training rows: a built-in split or a pool path"})
    bd_size: int = field(default=16, metadata={"help": "block size B (drafting window)"})
    ar_loss_weight: float = field(default=1.0, metadata={"help": "w in (L_diff + w L_AR) / (1 + w)"})
    ar_steps: int = field(default=0, metadata={"help": "AR-only warm-up steps before the joint stage"})
    joint_steps: int = field(default=1000, metadata={"help": "joint AR + diffusion steps"})
    batch_size: int = field(default=16, metadata={"help": "examples per step"})
    lr: float = field(default=1e-3, metadata={"help": "peak AdamW learning rate (each stage: warm-up, cosine)"})
    min_lr_ratio: float = field(default=0.1, metadata={"help": "final learning rate / peak"})
    warmup_steps: int = field(default=50, metadata={"help": "linear warm-up steps of each stage"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})
    grad_clip: float = field(default=1.0, metadata={"help": "gradient-norm clip"})
    max_target_tokens: int = field(default=128, metadata={"help": "longer training targets are skipped"})
    seed: int = field(default=0, metadata={"help": "seed of sampling, masking and initialisation"})
    threads: int = field(default=2, metadata={"help": "torch CPU threads"})
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
        if self.bd_size < 1:
            raise ValueError(f"bd_size must be >= 1, got {self.bd_size}")
        if self.ar_loss_weight < 0:
            raise ValueError(f"ar_loss_weight must be >= 0, got {self.ar_loss_weight}")
        if self.ar_steps < 0 or self.joint_steps < 0 or self.ar_steps + self.joint_steps == 0:
            raise ValueError("ar_steps and joint_steps must be >= 0 and not both 0")
        if self.stop_at_step < 0 or self.stop_at_step > self.ar_steps + self.joint_steps:
            raise ValueError(f"stop_at_step must be in [0, ar_steps + joint_steps], got {self.stop_at_step}")
        if self.head_dim * self.num_heads != self.hidden_size and self.init is None:
            logger.info("head_dim * num_heads (%d) differs from hidden_size (%d)",
                        self.head_dim * self.num_heads, self.hidden_size)


def load_config(path: str | Path | None = None, **overrides) -> JointConfig:
    """`path`'s keys (read by `grpo.yaml_config`), then `overrides` (non-None values), into a JointConfig."""
    from grpo.yaml_config import read_yaml

    known = {f.name for f in dataclasses.fields(JointConfig)}
    values = read_yaml(path, known) if path is not None else {}
    values.update({k: v for k, v in overrides.items() if v is not None})
    return JointConfig(**values)


# ----------------------------------------------------------------------------------------------- batches


def _response(target_ids: list[int], eos_id: int, bd_size: int) -> list[int]:
    return list(target_ids) + [eos_id] * bd_size


def complementary_masks(n: int, bd_size: int, gen: torch.Generator) -> torch.Tensor:
    """(n,) bool: stream 1's mask; stream 2 masks the complement. One t ~ U(0,1) per block of `bd_size`."""
    n_blocks = -(-n // bd_size)
    t = torch.rand(n_blocks, generator=gen).repeat_interleave(bd_size)[:n]
    return torch.rand(n, generator=gen) < t


def joint_layout(prompt_len: int, resp_len: int, bd_size: int) -> torch.Tensor:
    """(T, T) bool "row may attend to column" for `[prompt | clean | corrupted 1 | corrupted 2]`, T = P + 3R."""
    P, R = prompt_len, resp_len
    T = P + 3 * R
    allow = torch.zeros(T, T, dtype=torch.bool)
    allow[: P + R, : P + R] = torch.tril(torch.ones(P + R, P + R, dtype=torch.bool))  # prompt + clean: causal
    for offset in (P + R, P + 2 * R):
        for start in range(0, R, bd_size):
            end = min(start + bd_size, R)
            rows = slice(offset + start, offset + end)
            allow[rows, :P] = True                           # the prompt
            allow[rows, P: P + start] = True                 # earlier clean blocks
            allow[rows, offset + start: offset + end] = True  # own block, bidirectional
    return allow


def build_example(prompt_ids: list[int], target_ids: list[int], *, bd_size: int, mask_id: int, eos_id: int,
                  gen: torch.Generator, ar_only: bool = False) -> dict[str, torch.Tensor]:
    """One example's tokens, positions, (T, T) allow-matrix and AR / diffusion labels (IGNORE elsewhere).

    AR-only: `[prompt | target EOS]` under causal attention. Joint: the four-segment layout of `joint_layout`.
    """
    P = len(prompt_ids)
    if P == 0:
        raise ValueError("empty prompt: the first response token is predicted from the last prompt token")
    response = _response(target_ids, eos_id, 1 if ar_only else bd_size)
    R, N = len(response), len(target_ids)
    resp = torch.tensor(response)
    positions = torch.arange(P, P + R)
    ar_labels = torch.full((P + R,), IGNORE)
    ar_labels[P - 1: P + N] = resp[: N + 1]  # logits at P-1+k predict response[k]; only the first EOS counts
    if ar_only:
        ids = torch.cat([torch.tensor(prompt_ids), resp])
        return {"input_ids": ids, "position_ids": torch.arange(P + R), "labels_ar": ar_labels,
                "labels_diff": torch.full((P + R,), IGNORE),
                "allow": torch.tril(torch.ones(P + R, P + R, dtype=torch.bool))}
    masked1 = complementary_masks(R, bd_size, gen)
    streams, diff_labels = [], torch.full((P + 3 * R,), IGNORE)
    for s, masked in enumerate((masked1, ~masked1)):
        streams.append(torch.where(masked, mask_id, resp))
        offset = P + (s + 1) * R
        # stream position k-1 predicts response[k] where this stream masks it (k >= 1)
        k = torch.nonzero(masked[1:]).flatten() + 1
        diff_labels[offset + k - 1] = resp[k]
        if masked[0]:  # token 0 is read from the last prompt token, as a0 is read from x0 at inference
            diff_labels[P - 1] = resp[0]
    ids = torch.cat([torch.tensor(prompt_ids), resp, *streams])
    return {"input_ids": ids, "position_ids": torch.cat([torch.arange(P), positions, positions, positions]),
            "labels_ar": torch.cat([ar_labels, torch.full((2 * R,), IGNORE)]), "labels_diff": diff_labels,
            "allow": joint_layout(P, R, bd_size)}


def collate(examples: list[dict[str, torch.Tensor]], pad_id: int, dtype: torch.dtype = torch.float32) -> dict:
    """Right-pad to one length; the (b, 1, T, T) float additive mask (0 allowed, dtype-min blocked)."""
    T = max(len(e["input_ids"]) for e in examples)
    b = len(examples)
    batch = {"input_ids": torch.full((b, T), pad_id), "position_ids": torch.zeros(b, T, dtype=torch.long),
             "labels_ar": torch.full((b, T), IGNORE), "labels_diff": torch.full((b, T), IGNORE)}
    allow = torch.eye(T, dtype=torch.bool).repeat(b, 1, 1)  # padding rows see themselves (no NaN rows)
    for i, e in enumerate(examples):
        n = len(e["input_ids"])
        for key in ("input_ids", "position_ids", "labels_ar", "labels_diff"):
            batch[key][i, :n] = e[key]
        allow[i, :n, :n] = e["allow"]
    mask = torch.zeros(b, 1, T, T, dtype=dtype)
    mask.masked_fill_(~allow[:, None], torch.finfo(dtype).min)
    batch["attention_mask"] = mask
    return batch


def joint_losses(model, batch: dict) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(L_AR, L_diff): token-mean cross-entropies over the labelled positions (None when a kind has none)."""
    hidden = model.base_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                              position_ids=batch["position_ids"]).last_hidden_state  # (b, T, d)
    head = model.get_output_embeddings()
    losses = []
    for key in ("labels_ar", "labels_diff"):
        labels = batch[key]
        sel = labels != IGNORE
        if not sel.any():
            losses.append(None)
            continue
        logits = head(hidden[sel]).float()  # (n_labelled, V): the head only where a loss is taken
        losses.append(F.cross_entropy(logits, labels[sel]))
    return losses[0], losses[1]


def combine(l_ar: torch.Tensor | None, l_diff: torch.Tensor | None, w: float) -> torch.Tensor:
    """(L_diff + w L_AR) / (1 + w); a stage without diffusion targets is the AR loss alone."""
    if l_diff is None:
        return l_ar
    if l_ar is None:
        return l_diff
    return (l_diff + w * l_ar) / (1 + w)


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
    """(model, tokenizer, mask_id): from `cfg.init` (adds `<|mask|>` if absent) or the tiny model from scratch."""
    from grpo.checkpoint import add_mask_token

    if cfg.init:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(cfg.init)
        model = AutoModelForCausalLM.from_pretrained(cfg.init, dtype=torch.float32, attn_implementation="sdpa")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
    else:
        from data.tokenizer import build_tokenizer

        tokenizer = build_tokenizer()
        model = build_tiny_model(cfg, tokenizer)
    return model, tokenizer, add_mask_token(model, tokenizer)


def tokenize_rows(rows, tokenizer, max_target_tokens: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids with the tokenizer's default special tokens, target ids without) per row."""
    prompts = tokenizer(list(rows["prompt"])).input_ids
    targets = tokenizer(list(rows["target"]), add_special_tokens=False).input_ids
    pairs = [(p, t) for p, t in zip(prompts, targets) if len(t) <= max_target_tokens]
    if not pairs:
        raise ValueError(f"no training row has a target of <= {max_target_tokens} tokens")
    return pairs


def _training_rows(spec: str):
    from data.synthetic import SPLITS, build_split

    if spec in SPLITS:
        return build_split(spec)
    from data.pool import load_pool

    return load_pool(spec)


def _lr_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def save(model, tokenizer, out_dir: str | Path, cfg: JointConfig) -> Path:
    from grpo.checkpoint import save_joint_checkpoint

    save_joint_checkpoint(model, tokenizer, out_dir, bd_size=cfg.bd_size, ar_loss_weight=cfg.ar_loss_weight)
    return Path(out_dir)


def train_joint(cfg: JointConfig, progress: bool = True) -> Path:
    """Run the AR warm-up (if any) then the joint stage; save the final checkpoint to `cfg.out_dir`."""
    from tqdm.auto import tqdm

    torch.set_num_threads(cfg.threads)
    model, tokenizer, mask_id = load_start(cfg)
    model.config._attn_implementation = "sdpa"
    pairs = tokenize_rows(_training_rows(cfg.data), tokenizer, cfg.max_target_tokens)
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
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
        bar = tqdm(range(steps), desc=stage, disable=not progress, mininterval=5)
        for step in bar:
            for group in opt.param_groups:
                group["lr"] = cfg.lr * _lr_factor(step, steps, cfg.warmup_steps, cfg.min_lr_ratio)
            examples = [build_example(*rng.choice(pairs), bd_size=cfg.bd_size, mask_id=mask_id,
                                      eos_id=tokenizer.eos_token_id, gen=gen, ar_only=stage == "ar")
                        for _ in range(cfg.batch_size)]
            l_ar, l_diff = joint_losses(model, collate(examples, tokenizer.pad_token_id))
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
                save(model, tokenizer, Path(cfg.checkpoint_dir) / f"step-{done}", cfg)
                model.train()
    model.eval()
    return save(model, tokenizer, cfg.out_dir, cfg)
