"""`gravity-grpo joint`: joint AR / block-diffusion fine-tuning (SPEC §6) into a joint checkpoint."""
from __future__ import annotations

HELP = "joint AR + block-diffusion training: build a self-speculative checkpoint (the tiny default or from an AR model)"


def add_arguments(parser) -> None:
    parser.add_argument("--config", default="configs/joint_tiny.yaml", help="YAML of JointConfig fields")
    parser.add_argument("--out", dest="out_dir", help="output checkpoint folder (overrides out_dir)")
    parser.add_argument("--init", help="plain AR checkpoint folder to start from (default: tiny model from scratch)")
    parser.add_argument("--data", help="training rows: built-in split name or pool path")
    parser.add_argument("--bd-size", dest="bd_size", type=int, help="block size B")
    parser.add_argument("--ar-steps", dest="ar_steps", type=int, help="AR-only warm-up steps")
    parser.add_argument("--joint-steps", dest="joint_steps", type=int, help="joint steps")
    parser.add_argument("--batch-size", dest="batch_size", type=int, help="examples per step")
    parser.add_argument("--lr", type=float, help="peak learning rate")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--save-every", dest="save_every", type=int, help="intermediate checkpoint every N steps")
    parser.add_argument("--checkpoint-dir", dest="checkpoint_dir", help="folder of intermediate checkpoints")
    parser.add_argument("--seed", type=int, help="seed")


def run(args) -> int:
    from grpo.console import console, escape
    from grpo.joint.train import JointConfig, load_config, train_joint

    overrides = {name: getattr(args, name, None) for name in JointConfig.__dataclass_fields__}
    cfg = load_config(args.config, **overrides)
    out = train_joint(cfg)
    console.print(f"[green]joint checkpoint written to {escape(str(out))}[/green]")
    return 0
