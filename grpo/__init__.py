"""gravity-grpo: GRPO through the causal AR path of a self-speculative (AR + block-diffusion) OCR model.

Importing `grpo` loads nothing else but the standard-library import hook of `grpo.torchvision_ops` (torchvision
beside a CPU torch); the rewards are `ocr_rewards` (`OcrReward` for TRL), the command line is `grpo.cli`
(`gravity-grpo`).
"""
from grpo import torchvision_ops as _torchvision_ops

__version__ = "0.1.0"

_torchvision_ops.install()
