"""gravity-grpo: GRPO through the causal AR path of a self-speculative (AR + block-diffusion) OCR model.

Importing `grpo` loads nothing else; the rewards are `ocr_rewards` (`OcrReward` for TRL), the command line is
`grpo.cli` (`gravity-grpo`).
"""
__version__ = "0.1.0"
