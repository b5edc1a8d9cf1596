"""Offline tools that run without the model: ``profile`` replays a request log through the radix tree."""
