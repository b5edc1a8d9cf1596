"""The runtime: everything between a validated request and its tokens, by role.

``engine``/``config``/``io_struct``/``errors`` are the public surface and the wire contract; ``child`` is
what every child process does at start. The packages, top to bottom (the layers import-linter enforces,
pyproject.toml): ``server`` (HTTP and ZMQ front ends, the main process) > ``profile`` > ``router`` (--dp)
> ``scheduler`` (decide and conclude a step) > ``executor`` (batch in, logits out) | ``tokenizer`` (text in,
text out) > ``models`` | ``sampling`` | ``layers`` | ``parsers`` > ``mem`` (pages, radix tree) |
``constrained`` (grammars) and ``radixrt.kernels``. Nothing here is imported eagerly: import the module
you need.
"""
