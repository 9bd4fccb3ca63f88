"""Task-aware OCR rewards in [0, 1] for GRPO: text, table (HTML) and formula (LaTeX).

`score(pred, ref, task)` scores one pair and explains itself; `OcrReward` is the same scorer as a TRL reward
function over a batch (TRL itself is not imported); `teds` is PubTabNet's TEDS. The distribution depends on
no torch, TRL or vLLM, and importing it loads no numba (the tree-edit kernel compiles on the first table).
"""
__version__ = "0.2.0"
from .trl_reward import OcrReward, ocr_reward, score_many
from .result import RewardResult
from .scoring import TASKS, score
from .teds import teds

__all__ = ["__version__", "TASKS", "OcrReward", "RewardResult", "ocr_reward", "score", "score_many", "teds"]
