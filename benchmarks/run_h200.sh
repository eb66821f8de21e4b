#!/usr/bin/env bash
# Run on the GPU machine (device tool) from the repository root; results go to $OUT.
#   tests            the GPU tier of the kernel tests (real widths, `-m gpu`; GPU_TESTS: other test files)
#   arena_capture    benchmarks/arena_capture.py -> arena_capture_h200.json (a decode step in the arena, captured;
#                    which op's arena write breaks the capture, if one does)
#   bench_attention  benchmarks/kernels_attention.py -> kernels_attention.json
#   bench_ffn        benchmarks/kernels_ffn.py       -> kernels_ffn.json
#   tune_prefill     benchmarks/tune_moe_prefill.py  -> tune_moe_prefill.json (FP4 grouped GEMM decoders x tiles)
#   tune_decode      benchmarks/tune_moe_decode.py   -> tune_moe_decode.json (small-batch expert GEMV path)
#   tune_fp8         benchmarks/tune_fp8_decode.py   -> tune_fp8_decode.json (FP8 GEMM decode paths and tiles)
#   tune_compressor  benchmarks/tune_compressor_decode.py -> tune_compressor_decode.json (one-launch decode compressor)
#   tune_warp_split  benchmarks/tune_fp8_warp_split.py -> tune_fp8_warp_split.json (the warp-split FP8 decode GEMM;
#                    WS_GRID picks the grid: first, second, pairs, spf (default))
#   tune_attention   benchmarks/tune_sparse_attention.py  -> tune_sparse_attention.json (batched decode attention)
#   tune_topk        benchmarks/tune_indexer_topk.py      -> tune_indexer_topk.json (few-query selection)
#   profile          benchmarks/profile_decode.py under Nsight Compute -> ncu_decode.txt (PROFILE_ONLY picks cases)
#   profile_source   the same under `ncu --set full`, then its per-SASS-instruction source page (stall samples per
#                    instruction) as CSV -> ncu_source.csv, ncu_details.txt (PROFILE_ONLY picks cases;
#                    PROFILE_KERNEL, a regex, picks the kernels)
#   compiled         benchmarks/compiled_baseline.py -> compiled_baseline.json (the kernels against torch.compile of
#                    their references; COMPILED_ONLY picks groups, COMPILED_CASES a regex of cases, COMPILE_BUDGET
#                    the compile seconds, default 420)
#   tune_overlap     benchmarks/tune_moe_ffn_overlap.py -> tune_moe_ffn_chain.json (fused router, shared expert on a side stream)
#   step_chain       benchmarks/step_chain.py -> step_chain.json (decode kernels behind their real predecessor, with
#                    and without PDL / weights requested before the wait; CHAIN_ONLY / CHAIN_VARIANTS: regexes)
#   cpu_tier         benchmarks/cpu_tier_on_gpu.py -> cpu_tier_on_gpu.json (the CPU-tier kernel tests compiled on the
#                    GPU, a file a process; CPU_TIER_FILES picks files)
#   ws_timeline      benchmarks/ws_timeline.py -> ws_timeline.json (the warp-specialized attention's per-program
#                    timeline from clock stamps; WS_ONLY, a regex, picks its variants)
#   correctness      benchmarks/gpu_correctness.py -> gpu_correctness.json (tiny and mini artifacts, float32 and
#                    bf16 builds, compiled here, against the eager reference on this GPU; CORRECT_PRESETS,
#                    CORRECT_BUILDS,
#                    CORRECT_STEPS)
#   bench_artifact   `dsv41c compile --preset bench --target cuda:sm90 --max-context $BENCH_CONTEXT` into
#                    $BENCH_ARTIFACT (default /tmp/bench-sm90.dsv41c; kept while the machine is warm, so a later
#                    call's e2e finds it; BENCH_BUDGET, a size, passes --memory-budget: prefill in the chunks
#                    plan-chunks picks) -> bench_compile.txt
#   e2e              benchmarks/e2e.py on $BENCH_ARTIFACT -> e2e_$E2E_TAG.json (E2E_SYSTEMS, E2E_PREFILL,
#                    E2E_CONTEXT, E2E_STEPS pass --systems, --prefill, --decode-context, --decode-steps)
#   read_floor       benchmarks/read_floor.py -> read_floor.json (the least time to read each decode case's bytes,
#                    from the kept kernels_*.json, or this call's if bench_* ran first; ~6.5 min, so its
#                    timeout is at least 420 s whatever STEP_TIMEOUT says)
# STEPS picks the steps (default: tests bench_attention bench_ffn); STEP_TIMEOUT bounds each (s);
# ATTN_ONLY / FFN_ONLY pass --only to the two benchmark scripts. The logs end up in logs.tgz (the
# device tool brings back at most 8 files).
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
T=${STEP_TIMEOUT:-300}
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    # one -q (the project's addopts hold the other): -qq would drop the "N passed" line; pipefail: the step's
    # rc is pytest's, not tail's
    tests) (set -o pipefail; timeout "$T" python3 -m pytest -m gpu -p no:cacheprovider ${GPU_TESTS:-tests/test_kernels_*.py} 2>&1 \
             | tail -40 > "$OUT/gpu_tests.txt") ;;
    arena_capture) timeout "$T" python3 benchmarks/arena_capture.py --out "$OUT/arena_capture_h200.json" \
             > "$OUT/arena_capture.txt" 2>&1 ;;
    bench_attention) timeout "$T" python3 benchmarks/kernels_attention.py --out "$OUT/kernels_attention.json" \
             ${ATTN_ONLY:+--only "$ATTN_ONLY"} > "$OUT/bench_attention.txt" 2>&1 ;;
    bench_ffn) timeout "$T" python3 benchmarks/kernels_ffn.py --out "$OUT/kernels_ffn.json" \
             ${FFN_ONLY:+--only "$FFN_ONLY"} > "$OUT/bench_ffn.txt" 2>&1 ;;
    tune_prefill) timeout "$T" python3 benchmarks/tune_moe_prefill.py --out "$OUT/tune_moe_prefill.json" \
             > "$OUT/tune_prefill.txt" 2>&1 ;;
    tune_decode) timeout "$T" python3 benchmarks/tune_moe_decode.py --out "$OUT/tune_moe_decode.json" \
             > "$OUT/tune_decode.txt" 2>&1 ;;
    tune_fp8) timeout "$T" python3 benchmarks/tune_fp8_decode.py --out "$OUT/tune_fp8_decode.json" \
             > "$OUT/tune_fp8.txt" 2>&1 ;;
    tune_warp_split) timeout "$T" python3 benchmarks/tune_fp8_warp_split.py --grid "${WS_GRID:-spf}" \
             --out "$OUT/tune_fp8_warp_split.json" > "$OUT/tune_warp_split.txt" 2>&1 ;;
    tune_compressor) timeout "$T" python3 benchmarks/tune_compressor_decode.py \
             --out "$OUT/tune_compressor_decode.json" > "$OUT/tune_compressor.txt" 2>&1 ;;
    tune_attention) timeout "$T" python3 benchmarks/tune_sparse_attention.py --out "$OUT/tune_sparse_attention.json" \
             > "$OUT/tune_attention.txt" 2>&1 ;;
    tune_topk) timeout "$T" python3 benchmarks/tune_indexer_topk.py --out "$OUT/tune_indexer_topk.json" \
             > "$OUT/tune_topk.txt" 2>&1 ;;
    tune_overlap) timeout "$T" python3 benchmarks/tune_moe_ffn_overlap.py --out "$OUT/tune_moe_ffn_chain.json" \
             > "$OUT/tune_overlap.txt" 2>&1 ;;
    step_chain) timeout "$T" python3 benchmarks/step_chain.py --out "$OUT/step_chain.json" \
             ${CHAIN_ONLY:+--only "$CHAIN_ONLY"} ${CHAIN_VARIANTS:+--variants "$CHAIN_VARIANTS"} \
             > "$OUT/step_chain.txt" 2>&1 ;;
    read_floor) J=""; for k in ffn attention; do
               if [ -f "$OUT/kernels_$k.json" ]; then J="$J $OUT/kernels_$k.json"; else J="$J benchmarks/results/kernels_$k.json"; fi
             done
             timeout "$(( T > 420 ? T : 420 ))" python3 benchmarks/read_floor.py $J --out "$OUT/read_floor.json" \
               > "$OUT/read_floor.txt" 2>&1 ;;
    profile) NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
             timeout "$T" "$NCU" --profile-from-start off --clock-control none --print-kernel-base function \
               --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats \
               --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats \
               --section MemoryWorkloadAnalysis python3 benchmarks/profile_decode.py ${PROFILE_ONLY:+--only "$PROFILE_ONLY"} \
               > "$OUT/ncu_decode.txt" 2>&1 ;;
    profile_source) NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
             timeout "$T" "$NCU" --profile-from-start off --clock-control none --print-kernel-base function \
               --set full --import-source yes ${PROFILE_KERNEL:+--kernel-name "regex:$PROFILE_KERNEL"} -f \
               -o "$OUT/profile" python3 benchmarks/profile_decode.py ${PROFILE_ONLY:+--only "$PROFILE_ONLY"} \
               > "$OUT/ncu_profile_run.txt" 2>&1
             "$NCU" --import "$OUT/profile.ncu-rep" --page details > "$OUT/ncu_details.txt" 2>&1
             "$NCU" --import "$OUT/profile.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_source.csv" 2>&1 ;;
    compiled) timeout "$T" python3 benchmarks/compiled_baseline.py --out "$OUT/compiled_baseline.json" \
             ${COMPILED_ONLY:+--only "$COMPILED_ONLY"} ${COMPILED_CASES:+--cases "$COMPILED_CASES"} \
             --compile-budget "${COMPILE_BUDGET:-420}" \
             > "$OUT/compiled.txt" 2>&1 ;;
    cpu_tier) timeout "$T" python3 benchmarks/cpu_tier_on_gpu.py --out "$OUT/cpu_tier_on_gpu.json" \
             ${CPU_TIER_FILES:-} > "$OUT/cpu_tier.txt" 2>&1 ;;
    ws_timeline) timeout "$T" python3 benchmarks/ws_timeline.py --out "$OUT/ws_timeline.json" \
             ${WS_ONLY:+--only "$WS_ONLY"} > "$OUT/ws_timeline.txt" 2>&1 ;;
    correctness) timeout "$T" python3 benchmarks/gpu_correctness.py --out "$OUT/gpu_correctness.json" \
             --presets "${CORRECT_PRESETS:-tiny,mini}" --builds "${CORRECT_BUILDS:-float32,bf16}" --steps "${CORRECT_STEPS:-32}" > "$OUT/correctness.txt" 2>&1 ;;
    bench_artifact) A=${BENCH_ARTIFACT:-/tmp/bench-sm90.dsv41c}
             if [ -f "$A/manifest.json" ]; then echo "kept: $A" > "$OUT/bench_compile.txt"; else
               timeout "$T" dsv41c compile --preset bench --target cuda:sm90 --max-context "${BENCH_CONTEXT:-132096}" \
                 ${BENCH_BUDGET:+--memory-budget "$BENCH_BUDGET"} -o "$A" --force > "$OUT/bench_compile.txt" 2>&1; fi ;;
    e2e) A=${BENCH_ARTIFACT:-/tmp/bench-sm90.dsv41c}; ART=(); [ -f "$A/manifest.json" ] && ART=(--artifact "$A")
         timeout "$T" python3 benchmarks/e2e.py "${ART[@]}" \
             --systems "${E2E_SYSTEMS:-eager,compile,dsv41c}" --prefill "${E2E_PREFILL:-8192,32768,131072}" \
             --decode-context "${E2E_CONTEXT:-8192,32768}" --decode-steps "${E2E_STEPS:-32}" --timeout "${E2E_TIMEOUT:-3000}" \
             --out "$OUT/e2e_${E2E_TAG:-bench}.json" > "$OUT/e2e_${E2E_TAG:-bench}.txt" 2>&1 ;;
    *) echo "unknown step $step" ;;
  esac
  echo "== step $step: rc=$? in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/env.txt"
done
# The reply carries only the tail: end with each step's last lines.
for f in "$OUT"/gpu_tests.txt "$OUT"/correctness.txt "$OUT"/e2e_*.txt "$OUT"/bench_*.txt "$OUT"/tune_*.txt "$OUT"/step_chain.txt "$OUT"/read_floor.txt "$OUT"/compiled.txt; do
  [ -f "$f" ] && { echo "--- $f"; tail -${TAIL:-25} "$f"; }
done
(cd "$OUT" && tar czf logs.tgz ./*.txt && rm -f ./*.txt)
