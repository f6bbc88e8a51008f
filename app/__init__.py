"""Hearth: a local, single-user LLM inference app (llama.cpp through llama-cpp-python)."""

__version__ = "0.1.0"
