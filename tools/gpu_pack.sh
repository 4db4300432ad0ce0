#!/usr/bin/env bash
# tools/gpu_pack.sh — an nvcc build and the Debian libraries it links, packed as one archive to
# carry to a lent GPU machine (it has CUDA, cuBLAS and PyTorch, but no meson and none of the
# Debian packages libqk links), where bench/gpu_check.sh runs it.
#
#   tools/gpu_pack.sh [BUILD_DIR=build-nvcc] [OUT=build-gpu/carry.tar.xz]
#
# Configures BUILD_DIR when it is not (real CUDA, sm_80 + sm_90, no MPI or oneDNN), builds what
# gpu_check.sh runs (libqk, qknorm, bench_gpu_step, bench_gpu_attention, the CUDA suites,
# test_bfloat16, test_generate), and packs them with every shared library `ldd` finds outside
# the CUDA toolkit and the C/C++ runtime, and the PyTorch peer script QK_TORCH_PEER names, if any.
# On the device, from the repository root:
#
#   mkdir -p /tmp/c && tar xJf OUT -C /tmp/c && rm -rf BUILD_DIR && cp -a /tmp/c/BUILD_DIR . &&
#   QK_LIBS=/tmp/c/libs QK_GPU=h200 QK_TORCH_PEER=/tmp/c/torch_peer.py bench/gpu_check.sh BUILD_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-nvcc}
out=${2:-build-gpu/carry.tar.xz}
export PATH="$PATH:/usr/local/cuda/bin"
if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" -Dcuda=enabled -Demulate_cuda=false -Dnative=false -Dmpi=disabled \
        -Donednn=disabled -Dbench=true
else  # a tree ./qk test made: no benchmarks, and code for this CPU only; the device's differs
    meson configure "$build" -Dbench=true -Dnative=false >/dev/null
fi
targets=(examples/qknorm bench/bench_gpu_step bench/bench_gpu_attention tests/test_bfloat16
    tests/test_generate)
for s in $(grep -oE "'cuda_[a-z_]+'" tests/meson.build | tr -d "'" | sort -u); do
    targets+=("tests/test_$s")
done
ninja -C "$build" "${targets[@]}"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/$build/tests" "$stage/$build/bench" "$stage/$build/examples" "$stage/libs"
for f in "$build"/libqk.so*; do [ -d "$f" ] || cp -a "$f" "$stage/$build/"; done
for t in "${targets[@]}"; do
    [ -x "$build/$t" ] && cp "$build/$t" "$stage/$build/$t"
done
# The libraries the device lacks: everything ldd resolves but the toolkit's and the runtime's.
for binary in "$build/libqk.so.0" "$build/examples/qknorm"; do
    ldd "$binary" | awk '/=> \// { print $3 }'
done | sort -u | grep -vE '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux|libcuda|libcudart|libcublas|libcublasLt|libnccl|libqk)[.-]' |
    while read -r lib; do cp -L "$lib" "$stage/libs/"; done
if [ -n "${QK_TORCH_PEER:-}" ]; then cp "$QK_TORCH_PEER" "$stage/torch_peer.py"; fi
mkdir -p "$(dirname "$out")"
(cd "$stage" && tar cf - .) | xz -T0 -6 >"$out"
echo "gpu_pack: $out ($(du -h "$out" | cut -f1)): $build with ${#targets[@]} targets," \
    "$(ls "$stage/libs" | wc -l) libraries ($(ls "$stage/libs" | tr '\n' ' '))"
