"""Test-time-compute policies over any backend: self-consistency with verifiers, and the reasoning router
(docs/reasoning.md)."""
