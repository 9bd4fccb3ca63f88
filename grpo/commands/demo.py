"""`gravity-grpo demo` (`make demo`): the main job, GRPO on the tiny default on this machine."""
from __future__ import annotations

import argparse
from pathlib import Path

HELP = "the main job: a few minutes of GRPO on the tiny default with colocated vLLM; prints where the results are"

CONFIG = "tiny_cpu"  # the shipped recipe (configs/tiny_cpu.yaml)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=CONFIG, help="run config: a file or a shipped recipe's name "
                                                         "(default: tiny_cpu)")
    parser.add_argument("--out", "--output-dir", dest="output_dir", type=Path, default=Path("runs/demo"),
                        help="run folder (default: runs/demo); an earlier run there is replaced once the new one "
                             "is complete, anything else there is refused")
    parser.add_argument("--max-steps", type=int, help="optimizer steps (default: the config's)")


def run(args: argparse.Namespace) -> int:
    from grpo.commands.train import print_summary
    from grpo.console import console
    from grpo.training.config import load_config
    from grpo.training.run import run_training

    config = load_config(args.config, {"output_dir": str(args.output_dir), "max_steps": args.max_steps})
    console.print(f"GRPO on {config.model} with pool {config.pool}: {config.max_steps} steps, "
                  f"{config.generation_batch_size // config.num_generations} prompts x {config.num_generations} "
                  f"rollouts per step, TPF probe every {config.tpf_every} steps", markup=False)
    summary = run_training(config, recipe=str(args.config), overwrite=True)  # every check first; an earlier run
                                                                              # goes only at the end
    print_summary(summary)
    return 0
