"""The built-in checkpoints and pools, shipped in the gravity-grpo wheel as `grpo.data` (setup.py, grpo/builtin.py)."""
