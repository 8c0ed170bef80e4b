"""llama.cpp: llama-server built for the board, GGUF (with the exact Q4_0 repack of QAT weights), speculative
decoding with ``--spec-type draft-mtp``. engine: the engine class; args: server flags from the build's --help;
quirks: guards against known upstream bugs; models: the recipe's GGUFs (and the no-op memo); packaged_gguf: a
GGUF from a package; bench: its bench and tune configurations."""
