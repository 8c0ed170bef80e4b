"""LiteRT-LM: a ``.litertlm`` bundle (target and edgekit's MTP drafter section) behind the agent's
llama-server-compatible front. engine: the engine class; front: the bundle and the front's argv; bench: its
bench, the bundle per tune point, ``bench --backend litert-lm``."""
