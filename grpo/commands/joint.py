"""`gravity-grpo joint`: joint AR / block-diffusion fine-tuning (docs/spec.md §6) into a joint checkpoint."""
from __future__ import annotations

HELP = "joint AR + block-diffusion training: build a self-speculative checkpoint (the tiny default or from an AR model)"


def add_arguments(parser) -> None:
    from grpo.joint.train import fields

    parser.add_argument("--config", default="joint_tiny",
                        help="YAML recipe of JointConfig keys (grpo/joint/train.py); 'extends: other.yaml' starts "
                             "from another recipe")
    fields().add_flags(parser)


def run(args) -> int:
    from grpo.console import console, escape
    from grpo.joint.train import JointConfig, fields, train_joint
    from grpo.yaml_config import build

    values = fields().load(args.config, fields().command_line(args))
    out = train_joint(build(JointConfig, values, args.config))
    console.print(f"[green]joint checkpoint written to {escape(str(out))}[/green]")
    return 0
