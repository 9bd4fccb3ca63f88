"""Task-aware OCR rewards in [0, 1] for GRPO (docs/spec.md §4): text, table (HTML) and formula (LaTeX).

`score(pred, ref, task)` scores one pair and explains itself; `ocr_reward` is the same scorer as a TRL
reward function over a batch; `teds` is PubTabNet's TEDS. Importing this package loads no torch, vLLM or
numba (numba compiles the tree-edit kernel on the first table).
"""
from .trl_reward import OcrReward, ocr_reward, score_many
from .result import RewardResult
from .scoring import TASKS, score
from .teds import teds

__all__ = ["TASKS", "OcrReward", "RewardResult", "ocr_reward", "score", "score_many", "teds"]
