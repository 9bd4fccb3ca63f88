"""Every bound of the package: the upper bounds of counts and caps that flags, recipes and files read back (a
run's `run_config.json`) may ask for, and the lowest sampling temperature.

Each upper bound is far above any real use and checked before work starts, so a typo (`--max-new-tokens
100000000`) is named at once instead of running for days or exhausting memory.
"""
from __future__ import annotations

MAX_NEW_TOKENS = 65_536  # output cap per prompt: OCR outputs run to a few thousand tokens
MAX_PROBE_SIZE = 100_000  # prompts of one probe or evaluation: the built-in probe sets hold 60 to 1,000
MAX_SAMPLES = 64  # sampled decodes per prompt: each is a whole decode; TPF's interval is tight long before
MAX_BATCH = 256  # prompts decoded at once: their KV caches share one device
MAX_BD_SIZE = 4096  # draft block size B: recipes use 4 to 32; a block past any output cap is a typo
MAX_NUM_GENERATIONS = 1024  # completions per prompt (GRPO groups, mining): recipes use 8 to 64; more is a typo
MAX_ROLLOUTS_PER_CALL = 65_536  # mining: prompts x rollouts held in memory at once (one engine call, one part file)
# A prompt longer than this is a bad row before any tokenizer sees it: a token spans a few characters, so it
# holds far more tokens than any model's context (131,072 at most among those served here), and tokenizing
# tens of megabytes would keep a dry run silent for minutes.
MAX_PROMPT_CHARS = 1_048_576
MAX_NAME_CHARS = 100  # a name that becomes a folder name (an arm, a run)
# The lowest sampling temperature > 0: logits divided by less overflow half precision (65,504 / a logit of ~50 is
# ~1e-3) and 1e-300 overflows any float to inf (softmax then gives NaN); below it sampling is greedy in all but name.
MIN_TEMPERATURE = 0.01
MAX_SEED = 2**32 - 1  # numpy's and the samplers' seeds are 32-bit
# Crops (grpo.crop_size): the longest side over the shortest that the GLM-OCR image processor takes
# (transformers' `smart_resize` of Qwen2-VL and GLM-4V refuses more with a ValueError), and the largest
# `image_long_side`: GravityOCR's "never downscale" passes 99999; more is a typo, not a crop.
MAX_ASPECT_RATIO = 200
MAX_LONG_SIDE = 100_000  # pixels
# A GRPO run's config (grpo.training.config): past these a value is a typo, and some would make the checks or
# the run loop without end.
MAX_STEPS = 10_000_000  # optimizer steps (and step intervals): the paper's runs take hundreds
MAX_TRAIN_BATCH = 65_536  # completions held at once per process or generation (texts, logits' rows, rewards)
MAX_CONTEXT = 1_048_576  # positions of a context, in tokens
MAX_THREADS = 4096  # torch threads
MAX_EPOCHS = 1_000_000  # passes over the pool
MAX_LORA_RANK = 65_536
MAX_PROCESSES = 65_536  # launched processes: the largest clusters run a few thousand GPUs
MAX_NUMBER = 1_000_000_000  # any other number of a config: every field is a count, a rate or a setting below it


def whole_in(value: object, low: int, high: int) -> bool:
    """True when `value` is an integer (not a bool) in [low, high]."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
