"""The GPU check for the lent H200 (`make gpu-check`, docs/gpu.md), rehearsed on CPU (`make gpu-rehearsal`).

    python3 -m grpo.gpu_check --wheels .whl --device cuda --out "$OUT"

The runner (`__main__`, standard library only, started in the checkout's root) installs the carried wheels
with `pip --no-index --no-deps --target` into a temporary folder, and the checkout's two distributions beside
them (non-editable, as a user installs them), then runs each step of `grpo.gpu_check.steps` in its own process
from the work folder with `PYTHONPATH=<that folder>` (without `--wheels`: `rewards:<checkout>`), so a crash, a hang or a CUDA error of one step never hides the
others. It writes `report.json` (rewritten after every step) and `steps.log` (every step's output) to `--out`.
"""
