"""`gravity-grpo joint`: joint AR / block-diffusion fine-tuning (docs/spec.md §6) into a joint checkpoint."""
from __future__ import annotations

HELP = "joint AR + block-diffusion training: build a self-speculative checkpoint (the tiny default or from an AR model)"
STAMP = "gravity-grpo joint"  # the marker of its output folders (grpo.outputs)


def add_arguments(parser) -> None:
    from grpo.joint.train import fields

    parser.add_argument("--config", default="joint_tiny",
                        help="YAML recipe of JointConfig keys (grpo/joint/train.py); 'extends: other.yaml' starts "
                             "from another recipe")
    fields().add_flags(parser)
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a joint checkpoint in --out (kept until the new one is saved)")


def is_own(folder) -> bool:
    """A folder joint wrote: its marker, or a joint checkpoint (a `block_diffusion.json` that parses) that is
    no GRPO run folder."""
    from grpo.block_diffusion import BD_FILE
    from grpo.errors import UserError
    from grpo.outputs import owns_folder
    from grpo.evaluation.run_dir import RUN_CONFIG
    from ocr_rewards.jsonl import read_json_object

    if owns_folder(folder, STAMP):
        return True
    try:
        read_json_object(folder / BD_FILE)
    except UserError:
        return False
    return not (folder / RUN_CONFIG).exists()


def run(args) -> int:
    from pathlib import Path

    from grpo.console import console, escape
    from grpo.joint.train import JointConfig, fields, train_joint
    from grpo.outputs import mark, output_folder, set_aside, writing
    from grpo.yaml_config import build

    from grpo.model_source import resolve_model

    values = fields().load(args.config, fields().command_line(args))
    if isinstance(values.get("model"), str) and values["model"]:  # a built-in name (tiny), as every command takes it
        values["model"] = str(resolve_model(values["model"]))
    cfg = build(JointConfig, values, args.config)
    if cfg.model is None:  # a model built from scratch: heads that do not divide fail at its first forward
        from grpo.errors import UserError

        if cfg.num_heads % cfg.num_kv_heads:
            raise UserError(f"num_heads {cfg.num_heads} must be a multiple of num_kv_heads {cfg.num_kv_heads} (each "
                            "key/value head serves a whole group of query heads)", setting="num_kv_heads")
        if cfg.head_dim % 2:
            raise UserError(f"head_dim must be even (rotary embeddings turn pairs of channels), got {cfg.head_dim}",
                            setting="head_dim")
    inputs = [p for p in (cfg.model, cfg.pool, args.config) if p]
    out = output_folder(cfg.output_dir, "output_dir", kind="joint checkpoint", is_own=is_own, inputs=inputs,
                        overwrite=args.overwrite, setting="output_dir")
    if cfg.save_every:
        output_folder(cfg.checkpoint_dir, "checkpoint_dir", kind="joint checkpoints", stamp=STAMP, inputs=inputs,
                      overwrite=None, setting="checkpoint_dir")
        mark(Path(cfg.checkpoint_dir), STAMP)
    with set_aside(out), writing(out):  # an earlier checkpoint there stays until the new one is saved
        train_joint(cfg)
        mark(out, STAMP)
    console.print(f"[green]joint checkpoint written to {escape(str(out))}[/green]")
    return 0
