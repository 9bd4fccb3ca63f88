__version__ = __import__("importlib.metadata").metadata.version("gravity-grpo")  # from pyproject.toml
