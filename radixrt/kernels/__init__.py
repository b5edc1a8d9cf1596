"""Attention kernels behind one interface: torch-native on CPU, FlashInfer on CUDA."""
