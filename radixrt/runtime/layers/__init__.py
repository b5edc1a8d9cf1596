"""Layers swapped into a loaded model: weight formats for the projections (``quant``, over GGUF blocks
read by ``gguf_blocks``) and tensor parallelism (``parallel``: TPGroup and column/row/vocab-parallel
layers; ``tp_shard``: shard a loaded model for one ``--tp`` rank). May import kernels only.
"""
