"""Structured output: JSON schemas checked and turned into llama.cpp grammars (GBNF)."""
