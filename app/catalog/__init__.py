"""Model files: GGUF reading, memory estimates, the registry of local models, the bundled default model,
recommended models and hub search. Qt-free, and usable without starting a runtime (the CLI, the doctor, the
window and the port list and check models through it)."""
