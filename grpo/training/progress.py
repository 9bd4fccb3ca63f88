"""A progress bar for GRPO runs in place of transformers' own, which prints every metric dict to the terminal
(those go to `metrics.jsonl` only): steps, the live training reward and the last probe's TPF and held-out
reward."""
from __future__ import annotations

from transformers import TrainerCallback


class RewardProgressCallback(TrainerCallback):
    """One tqdm bar on the main process; the postfix shows the newest reward, TPF and held-out reward."""

    def __init__(self):
        self.bar = None
        self.postfix: dict[str, str] = {}

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc="GRPO", unit="step",
                            dynamic_ncols=True)

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.bar is None or not logs:
            return
        for key, label in (("reward", "reward"), ("tpf/mean", "TPF"), ("eval/reward", "held-out")):
            if key in logs:
                self.postfix[label] = f"{logs[key]:.3f}"
        self.bar.set_postfix(self.postfix, refresh=True)

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
