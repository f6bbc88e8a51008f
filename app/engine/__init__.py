"""The inference core: GGUF inspection, memory estimates, the llama.cpp engine process, chat templates,
decoding policies, generation with metrics and the persistent prefix cache. No Qt here."""
