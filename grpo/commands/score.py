"""`gravity-grpo score`: the `ocr-rewards score` command (`ocr_rewards.cli`) under the package's CLI."""
from ocr_rewards.cli import HELP, add_score_arguments as add_arguments, run_score as run

__all__ = ["HELP", "add_arguments", "run"]
