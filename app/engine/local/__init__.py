"""The local runtime: the ``Engine`` handle in this process, and the scheduler, llama.cpp runtime, canonical
prefill layout, speculative decoding and the prefix cache in its child process (docs/engine.md)."""
