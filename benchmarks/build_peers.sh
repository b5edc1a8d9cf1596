#!/bin/sh
# Build llama.cpp's `llama-server`, `llama-bench` and `llama-quantize` once, from the llama.cpp that the llama-cpp-python sdist
# vendors (PyPI publishes that project as an sdist only). About 10 minutes on 2 cores; idempotent: a second
# run finds the binaries and exits. Run it through the CPU lock: flock /tmp/bench.lock nice -n 10 make peers
#
#   RADIXRT_PEERS_DIR  cache directory (default ~/.cache/radixrt/peers); binaries land in
#                      $RADIXRT_PEERS_DIR/llama.cpp-<version>/bin (benchmarks/peers.py finds them there)
#   PIP                the pip command used to download the sdist (default: python3 -m pip)
set -eu
VERSION=0.3.36
PEERS=${RADIXRT_PEERS_DIR:-$HOME/.cache/radixrt/peers}
DEST=$PEERS/llama.cpp-$VERSION
PIP=${PIP:-python3 -m pip}
if [ -x "$DEST/bin/llama-server" ] && [ -x "$DEST/bin/llama-bench" ] && [ -x "$DEST/bin/llama-quantize" ]; then
    echo "peers: $DEST/bin has llama-server, llama-bench and llama-quantize (llama-cpp-python $VERSION)"
    exit 0
fi
mkdir -p "$PEERS/src"
SDIST=$PEERS/src/llama_cpp_python-$VERSION.tar.gz
[ -f "$SDIST" ] || $PIP download --no-binary :all: --no-deps -d "$PEERS/src" \
    "llama-cpp-python==$VERSION"
[ -d "$PEERS/src/llama_cpp_python-$VERSION" ] || tar -xzf "$SDIST" -C "$PEERS/src"
SRC=$PEERS/src/llama_cpp_python-$VERSION/vendor/llama.cpp
BUILD=$PEERS/build-$VERSION
# Static libraries, so the two binaries run from bin/ alone; GGML_NATIVE tunes for this CPU (AVX2 here).
cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
cmake --build "$BUILD" --target llama-server llama-bench llama-quantize -j "$(nproc)"
mkdir -p "$DEST/bin.tmp"
cp "$BUILD/bin/llama-server" "$BUILD/bin/llama-bench" "$BUILD/bin/llama-quantize" "$DEST/bin.tmp/"
# convert_hf_to_gguf.py (and the gguf-py it imports) for benchmarks/real_models.py
ln -sfn "$SRC" "$DEST/src"
rm -rf "$DEST/bin" && mv "$DEST/bin.tmp" "$DEST/bin"
"$DEST/bin/llama-server" --version 2>&1 | head -n 2 || true
echo "peers: built $DEST/bin/llama-server, llama-bench and llama-quantize"
