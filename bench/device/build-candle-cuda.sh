#!/usr/bin/env bash
# Runs HERE (the build machine), not on the GPU machine: builds attn-candle with its `cuda` feature
# for sm_90 and stages the binaries for the device tool in .device/candle/ (gzipped: each is about
# 40 MB, most of it candle's own CUDA kernels; carry [".device/candle"] and gunzip them there).
#
# candle-core's `cuda` feature compiles its kernels with nvcc and links the CUDA libraries. This
# machine has no CUDA toolkit: the first run makes a CUDA 13.0 build environment in .cuda-build/
# from PyPI wheels (nvcc, nvvm, the CUDA headers, and the libraries to link against), plus a
# link-time stand-in for libcuda.so.1 (which comes with the GPU driver, never from PyPI): a
# library that defines every driver entry point cudarc declares and is never run against, since
# the GPU machine's own libcuda.so.1 is found by its SONAME at start-up. A build from scratch
# takes about 9 minutes on 2 cores (mostly nvcc in candle-kernels); later ones seconds.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD/.cuda-build
if [[ ! -f $root/env.sh ]]; then
  python3 -m venv "$root/venv"
  "$root/venv/bin/pip" install -q --no-deps \
    nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-cccl==13.0.85 \
    nvidia-cuda-runtime==13.0.96 nvidia-cuda-nvrtc==13.0.88 nvidia-cublas==13.0.2.14 nvidia-curand==10.4.0.35
  cuda=$(echo "$root"/venv/lib/python3*/site-packages/nvidia/cu13)
  link=$root/link
  mkdir -p "$link"
  # Unversioned names for the linker (the wheels ship only the SONAME files).
  for l in cudart.so.13 nvrtc.so.13 cublas.so.13 cublasLt.so.13 curand.so.10; do
    ln -sf "$cuda/lib/lib$l" "$link/lib${l%.so.*}.so"
  done
  cargo fetch -q
  bindings=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.19.*/src/driver/sys/mod.rs | tail -1)
  grep -oE '^pub unsafe fn cu[A-Za-z0-9_]+' "$bindings" | awk '{print $4}' | sort -u |
    awk '{print "int " $1 "(void) { return 34; /* CUDA_ERROR_STUB_LIBRARY */ }"}' > "$link/libcuda-stub.c"
  cc -shared -fPIC -O1 -Wl,-soname,libcuda.so.1 -o "$link/libcuda.so" "$link/libcuda-stub.c"
  cat > "$root/env.sh" <<ENV
export CUDA_HOME=$cuda
export PATH=$cuda/bin:\$PATH
export LIBRARY_PATH=$link\${LIBRARY_PATH:+:\$LIBRARY_PATH}
export LD_LIBRARY_PATH=$cuda/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export CUDA_COMPUTE_CAP=90
export CARGO_TARGET_DIR=$root/target
ENV
fi
source "$root/env.sh"
# Only this package: a workspace-wide build would link the attn command and attn-verify too.
cargo build --release -p attn-candle --features cuda --example block --example train
cargo test --release -p attn-candle --features cuda --test cuda --no-run
out=.device/candle; mkdir -p "$out"
strip -o "$out/block" "$CARGO_TARGET_DIR/release/examples/block"
strip -o "$out/train" "$CARGO_TARGET_DIR/release/examples/train"
test_bin=$(ls -t "$CARGO_TARGET_DIR"/release/deps/cuda-* | grep -v '\.d$' | head -1)
strip -o "$out/test-cuda" "$test_bin"
gzip -f -9 "$out/block" "$out/train" "$out/test-cuda"
git rev-parse --short HEAD > "$out/COMMIT"
ls -la "$out"
