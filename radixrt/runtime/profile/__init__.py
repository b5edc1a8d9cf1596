"""Replay traffic through the radix tree without the model: the engine of ``radixrt profile``."""
