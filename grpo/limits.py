"""Upper bounds of counts and caps that flags and files read back (a run's `run_config.json`) may ask for.

Each is far above any real use and checked before work starts, so a typo (`--max-new-tokens 100000000`) is
named at once instead of running for days or exhausting memory.
"""
from __future__ import annotations

MAX_NEW_TOKENS = 65_536  # output cap per prompt: OCR outputs run to a few thousand tokens
MAX_PROBE_SIZE = 100_000  # prompts of one probe or evaluation: the built-in probe sets hold 60 to 1,000
MAX_SAMPLES = 64  # sampled decodes per prompt: each is a whole decode; TPF's interval is tight long before
MAX_BATCH = 256  # prompts decoded at once: their KV caches share one device
MAX_BD_SIZE = 4096  # draft block size B: recipes use 4 to 32; a block past any output cap is a typo
MAX_NUM_GENERATIONS = 1024  # completions per prompt (GRPO groups, mining): recipes use 8 to 64; more is a typo
# The lowest sampling temperature > 0: logits divided by less overflow half precision (65,504 / a logit of ~50 is
# ~1e-3) and 1e-300 overflows any float to inf (softmax then gives NaN); below it sampling is greedy in all but name.
MIN_TEMPERATURE = 0.01


def whole_in(value: object, low: int, high: int) -> bool:
    """True when `value` is an integer (not a bool) in [low, high]."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


MAX_SEED = 2**32 - 1  # numpy's and the samplers' seeds are 32-bit
