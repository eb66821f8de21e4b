#!/usr/bin/env bash
# Run on the GPU machine (device tool) from the repository root; results go to $OUT.
#   - the GPU tier of the kernel tests (real widths, `-m gpu`)
#   - the kernel micro-benchmarks (JSON per script)
# Each step keeps going when an earlier one fails, so one call returns everything.
set -u
OUT=${OUT:-out/h200}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c 'import torch, triton, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
} 2>&1 | tee "$OUT/env.txt"
STEPS=${STEPS:-"tests bench_attention bench_ffn"}
for step in $STEPS; do
  case $step in
    tests) timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_attention.py tests/test_kernels_ffn.py 2>&1 | tail -40 | tee "$OUT/gpu_tests.txt" ;;
    bench_attention) timeout 240 python3 benchmarks/kernels_attention.py --out "$OUT/kernels_attention.json" 2>&1 | tail -40 | tee "$OUT/bench_attention.txt" ;;
    bench_ffn) timeout 240 python3 benchmarks/kernels_ffn.py --out "$OUT/kernels_ffn.json" 2>&1 | tail -40 | tee "$OUT/bench_ffn.txt" ;;
  esac
done
