"""The built-in recipes and accelerate configs, shipped in the gravity-grpo wheel as `grpo.configs` (setup.py,
grpo/builtin.py)."""
