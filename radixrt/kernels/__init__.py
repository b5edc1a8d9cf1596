"""radixrt's compute kernels, below the whole runtime: attention backends behind one interface
(``attention``: torch-native and C++ paged/block attention on the CPU, FlashInfer on CUDA), the fused
elementwise ops (``fused``), dense and GGUF-block products (``gemv``, ``quant``), a whole decoder layer as
one C++ op (``layer``), and the C++ build shared by them (``cpp``: one library, built at first use, a
torch path wherever it cannot be). Imports nothing else of radixrt.
"""
