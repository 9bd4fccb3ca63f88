"""`gravity-grpo score`: the `ocr-rewards score` command (`ocr_rewards.cli`) under the package's CLI; its input
files are checked for regular files first (`grpo.paths.check_readable`: a FIFO would hang the read)."""
from ocr_rewards.cli import HELP, add_score_arguments as add_arguments, run_score

__all__ = ["HELP", "add_arguments", "run"]


def run(args) -> int:
    from grpo.paths import check_readable

    for dest, value in vars(args).items():
        if value is not None and dest in ("pairs", "pred", "ref"):
            check_readable(value, f"--{dest}")
    return run_score(args)
