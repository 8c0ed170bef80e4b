"""vLLM: HF safetensors (a text-only export), vLLM's OpenAI server with ``"method": "mtp"``. engine: the engine
class; container: NVIDIA's image on a Jetson, pinned by digest, and the server's environment; bench: its bench
configurations."""
