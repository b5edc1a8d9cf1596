"""Layers swapped into a loaded model: quantized linear projections (:mod:`.quant`)."""
