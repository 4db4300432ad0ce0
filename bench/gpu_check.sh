#!/usr/bin/env bash
# bench/gpu_check.sh — everything worth measuring on a lent GPU, in one call of under 8 minutes:
# the CUDA test suites on the device, the GPT-2-124M-shaped training step (bench_gpu_step) at
# Tiny Shakespeare's vocabulary and GPT-2's, and PyTorch's peer on the same shapes in the same
# call (so every ratio compares two programs on one machine), then a short table.
#
#   bench/gpu_check.sh [BUILD_DIR=build-nvcc]
#
# BUILD_DIR is an nvcc build (-Dcuda=enabled -Demulate_cuda=false); it is configured and built
# here when meson and nvcc are on the machine, or carried in already built (the device machine
# has CUDA and PyTorch but no meson: build here, then carry the folder with the Debian libraries
# it links, pointed at by QK_LIBS). Environment:
#   QK_LIBS        a folder of shared libraries to put on LD_LIBRARY_PATH (openblas, fmt, ...)
#   QK_TORCH_PEER  PyTorch's peer of the step (a script taking `train VOCAB BATCH eager` and
#                  printing a RESULT line); skipped when unset or without PyTorch
#   QK_QUICK=1     the step benchmarks only, no test suites
#   QK_ATTENTION=0 no attention benchmark (bench_gpu_attention beside torch_peer.py attn)
#   QK_GPU         h100 or h200: print the launch ledger of one naive step (V = 65 and 50257,
#                  B = 16) with each launch's measured time beside the cost model's estimate
#   QK_OUT         where the ledgers' CSV files go (default: the current directory)
#   QK_NCU=1       also profile the three tensor-core attention kernels with Nsight Compute (one
#                  launch each at B 2, H 12, T 4096, D 64; ~20 s) into QK_OUT/ncu_attention.txt
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-nvcc}
[ -n "${QK_LIBS:-}" ] && export LD_LIBRARY_PATH="$QK_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
peer=${QK_TORCH_PEER:-}
results=$(mktemp)
trap 'rm -f "$results"' EXIT

if [ ! -x "$build/bench/bench_gpu_step" ]; then
    command -v meson >/dev/null || { echo "gpu_check: no $build/bench/bench_gpu_step and no meson to build it"; exit 1; }
    [ -f "$build/build.ninja" ] || meson setup "$build" -Dcuda=enabled -Demulate_cuda=false \
        -Dnative=false -Dmpi=disabled || exit 1
    ninja -C "$build" || exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null |
    sed 's/^/gpu: /'

# 1. The suites that run kernels: every CUDA suite against its cpu twin, on the device.
if [ "${QK_QUICK:-0}" != 1 ]; then
    for t in "$build"/tests/test_cuda_* "$build"/tests/test_bfloat16 "$build"/tests/test_generate; do
        [ -x "$t" ] || continue
        start=$(date +%s%N)
        # From the build folder, as `meson test` runs them.
        if out=$(cd "$(dirname "$t")/.." && timeout 90 "./tests/$(basename "$t")" 2>&1); then
            status=pass
        else
            status=FAIL
        fi
        secs=$(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN { print (b - a) / 1e9 }')
        printf 'suite %-22s %s %5.1f s  %s\n' "$(basename "$t")" "$status" "$secs" \
            "$(echo "$out" | grep -E '^\[doctest\] (test cases|assertions)' | tr '\n' ' ')"
        [ "$status" = FAIL ] && echo "$out" | tail -30
        echo "suite $(basename "$t") $status" >>"$results"
    done
fi

# 2. The 124M-shaped step: qknorm, then PyTorch eager on the same shapes.
step() { timeout 150 "$build/bench/bench_gpu_step" "$@" | tee -a "$results"; }
ledger_step() {  # step ARGS..., with the ledger of one more step when QK_GPU names the GPU
    QK_LEDGER=${QK_GPU:-} QK_LEDGER_CSV="${QK_OUT:-.}/ledger_V$1_B$2_$3.csv" step "$@"
}
ledger_step 65 16 fused 20 8
step 65 4 fused 20 8
ledger_step 50257 16 fused 20 8
ledger_step 65 16 naive 20 8
step 65 4 naive 20 8
if [ -n "$peer" ] && [ -f "$peer" ] && python3 -c 'import torch' 2>/dev/null; then
    for args in "65 16" "65 4" "50257 16"; do
        # shellcheck disable=SC2086
        timeout 150 python3 "$peer" train $args eager 2>&1 | grep RESULT | tee -a "$results"
    done
else
    echo "gpu_check: no PyTorch peer (QK_TORCH_PEER): qknorm's figures only"
fi

# 3. The fused attention against PyTorch's scaled_dot_product_attention (FlashAttention-2) on
#    the same shapes, causal, bf16 (QK_ATTENTION=0 skips it).
if [ "${QK_ATTENTION:-1}" = 1 ] && [ -x "$build/bench/bench_gpu_attention" ]; then
    timeout 300 "$build/bench/bench_gpu_attention" | tee -a "$results"
    if [ -n "$peer" ] && [ -f "$peer" ] && python3 -c 'import torch' 2>/dev/null; then
        timeout 150 python3 "$peer" attn 2>&1 | grep RESULT | tee -a "$results"
    fi
fi

# 3b. Where the attention kernels' time goes (QK_NCU=1): one launch of each, every section.
if [ "${QK_NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
    timeout 120 ncu --set full -k 'regex:attention_(forward|dkdv|dq)_mma' --launch-count 3 \
        "$build/bench/bench_gpu_attention" profile 2 12 4096 64 >"${QK_OUT:-.}/ncu_attention.txt" 2>&1
    grep -E '_mma_kernel<|Duration|Executed Instructions  |Registers Per|Local Memory Spilling Requests  ' \
        "${QK_OUT:-.}/ncu_attention.txt" | sed 's/(float \*.*//'
fi

# 4. The tables: tokens/s against PyTorch eager at the same vocabulary and batch; attention
#    TFLOP/s against SDPA's.
echo
echo "| program | vocab | batch | step ms | tokens/s | vs PyTorch eager |"
echo "|---|---|---|---|---|---|"
python3 - "$results" <<'EOF'
import re, sys
rows = []
for line in open(sys.argv[1]):
    m = re.search(r"RESULT (\S+) .*?(naive|fused|eager|compile)? ?bf16 ?(naive|fused)? V=(\d+) B=(\d+).*?step ([\d.]+) ms, (\d+) tok/s", line)
    if m:
        who = "PyTorch eager" if "torch" in line else f"qknorm {m.group(3) or 'naive'}"
        rows.append((who, int(m.group(4)), int(m.group(5)), float(m.group(6)), float(m.group(7))))
torch = {(v, b): t for who, v, b, _, t in rows if who.startswith("PyTorch")}
for who, v, b, ms, tok in rows:
    ratio = f"{tok / torch[(v, b)]:.2f}x" if (v, b) in torch else "-"
    print(f"| {who} | {v} | {b} | {ms:.1f} | {tok:,.0f} | {ratio} |")
EOF
python3 - "$results" <<'EOF'
import re, sys
ours, sdpa = {}, {}
for line in open(sys.argv[1]):
    shape = re.search(r"B=(\d+) H=(\d+) T=(\d+) D=(\d+)", line)
    if not shape or ("attn" not in line and "sdpa" not in line):
        continue
    rates = dict(re.findall(r"(kernel fwd|fused fwd\+bwd|fused fwd|naive fwd\+bwd|naive fwd|"
                            r"fwd\+bwd|fwd) [\d.]+ ms ([\d.]+) TFLOP/s", line))
    (sdpa if "sdpa" in line else ours)[shape.groups()] = {k: float(v) for k, v in rates.items()}
if ours:
    print("\n| B, H, T, D | kernel fwd | SDPA fwd | kernel / SDPA | fused fwd+bwd | naive fwd+bwd "
          "| SDPA fwd+bwd | fused / SDPA |")
    print("|---|---|---|---|---|---|---|---|")
    ratio = lambda a, b: f"{a / b:.2f}" if b else "-"
    for shape, r in ours.items():
        t = sdpa.get(shape, {})
        print(f"| {', '.join(shape)} | {r.get('kernel fwd', 0):.1f} | {t.get('fwd', 0):.1f} | "
              f"{ratio(r.get('kernel fwd', 0), t.get('fwd'))} | {r.get('fused fwd+bwd', 0):.1f} | "
              f"{r.get('naive fwd+bwd', 0):.1f} | {t.get('fwd+bwd', 0):.1f} | "
              f"{ratio(r.get('fused fwd+bwd', 0), t.get('fwd+bwd'))} |")
EOF
# The fixed cost of a step: what does not shrink with the batch (B = 4 minus a quarter of B = 16).
python3 - "$results" <<'EOF'
import re, sys
ms = {}
for line in open(sys.argv[1]):
    m = re.search(r"RESULT (\S+) .*?bf16 ?(naive|fused)? V=65 B=(\d+).*?step ([\d.]+) ms", line)
    if m: ms[(m.group(1), m.group(2) or "eager", int(m.group(3)))] = float(m.group(4))
for (who, path, b), b16 in sorted(ms.items()):
    b4 = ms.get((who, path, 4))
    if b == 16 and b4:
        print(f"{who} {path}, V=65: fixed cost per step {b4 - b16 / 4:.1f} ms "
              f"(B=4 {b4:.1f} ms, B=16 {b16:.1f} ms)")
EOF
grep -q FAIL "$results" && exit 1
exit 0
