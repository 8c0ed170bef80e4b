"""edgekit: Gemma 4 + MTP drafters from a workstation onto NVIDIA Jetson boards."""

__version__ = "0.1.0"
