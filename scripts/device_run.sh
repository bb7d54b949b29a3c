#!/usr/bin/env bash
# One GPU-machine session in one command: build there (its NCCL differs from
# the CPU machines'), then the steps named on the command line, each logged
# under $OUT (at most 8 files come back: with more, everything under $OUT is
# packed into $OUT/logs.tgz at the end). Steps:
#   test         make gpu-test (all GPU tests)
#   test:FILTER  GPU tests whose name contains FILTER
#   pygpu        the Python package's GPU tests (python/tests/gpu, torch + NCCL)
#   faults       the fault tests (./build/fault_tests: killed and silent ranks, deadline 1 s)
#   gemm         megamoe bench-gemm
#   bench        megamoe bench (flash per-rank equivalent, all visible GPUs)
#   bench:ARGS   megamoe bench with ARGS (commas inside, '+' for spaces)
#   gemm:ARGS    megamoe bench-gemm with ARGS
#   env:V=X      export V=X for the following steps
#   ncu:TILE[:N,K[:M]]  ncu --set full of one bench-gemm launch of TILE (report in $OUT/ncu_TILE.txt)
#   ncu-src:ARM[:TOKENS]  ncu's source counters of the arm's kernels in one forward of megamoe bench
#                (split or fused, TOKENS per rank, 8192 by default): per-kernel summary of the warp
#                samples per instruction (scripts/ncu_source_summary.py) in $OUT/ncu_src_ARM.txt,
#                the samples per inlined role (scripts/ncu_source_join.py) in $OUT/ncu_join_ARM.txt,
#                and the CSV and the `nvdisasm -gi` listing gzipped, for --within by hand
#   sanitize[:TOOLS[:TARGETS]]  scripts/sanitize.sh (its own timeout per run, SANITIZE_TIMEOUT):
#                the summary in $OUT/sanitize.txt, every log in $OUT/sanitize_logs.tgz
#   soak         megamoe soak (defaults: 1000 calls per arm on all visible GPUs)
#   soak:ARGS    megamoe soak with ARGS ('+' for spaces)
# NVCC_DEFS="-DNAME=V ..." builds the kernels with those macros (e.g. -DMM_EARLY_COMBINE=1,
# -DMM_FUSED_MATH_TIMELINE=1), into build/ as usual.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/megamoe-out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
{ nvidia-smi; nvidia-smi topo -m; nvcc --version; } > "$OUT/machine.txt" 2>&1
# CUDA objects compiled on the CPU machine (scripts/prebuild.sh), if carried.
scripts/prebuild.sh --unpack
nvcc_override=()
# The Makefile's compiler ($(CUDA_HOME)/bin/nvcc), with the macros.
if [ -n "${NVCC_DEFS:-}" ]; then nvcc_override=(NVCC="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc $NVCC_DEFS"); fi
# make does not track the macros: a build/ made with other ones is rebuilt from scratch.
if [ "$(cat build/.nvcc_defs 2> /dev/null)" != "${NVCC_DEFS:-}" ]; then rm -rf build; fi
mkdir -p build && printf '%s' "${NVCC_DEFS:-}" > build/.nvcc_defs
if ! make -j"$(nproc)" all PTXAS_VERBOSE=1 ${nvcc_override[@]+"${nvcc_override[@]}"} > "$OUT/build.log" 2>&1; then
  grep -E "error" "$OUT/build.log" | head -40
  echo "BUILD FAILED"
  exit 1
fi
grep -E "registers|spill|stack" "$OUT/build.log" | grep -E "gemm|wgmma|spill [1-9]|stack frame, [1-9]" | head -20
# Objects compiled on the CPU machine (scripts/prebuild.sh) left no ptxas
# report in the log: the kernels' registers, stack and spills from the objects.
if [ -f build/.prebuilt_tree ]; then
  cuobjdump -res-usage build/src/device/*/*.o > "$OUT/res_usage.txt" 2>&1
  grep -E "REG:|STACK:" "$OUT/res_usage.txt" | grep -E "STACK:[1-9]" | head -20
fi
rc=0
T=${STEP_TIMEOUT:-420}   # seconds per step, so one hang cannot eat the whole call
for step in "$@"; do
  case "$step" in
    test) (set -o pipefail; timeout $T ./build/gpu_tests 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "FAIL|passed|CHECK|diff|rank" | tail -60) || rc=1 ;;
    test:*) (set -o pipefail; timeout $T ./build/gpu_tests "${step#test:}" 2>&1 | tee -a "$OUT/gpu_tests.log" | tail -60) || rc=1 ;;
    faults) (set -o pipefail; timeout $T ./build/fault_tests 2>&1 | tee "$OUT/faults.log" | tail -20) || rc=1 ;;
    pygpu) (set -o pipefail; MEGAMOE_LIBRARY="$PWD/build/libmegamoe.so.0" PYTHONPATH="$PWD/python" PYTHONUNBUFFERED=1 \
        timeout $T python3 python/tests/run_pytest.py python/tests/gpu 2>&1 | tee "$OUT/pygpu.log" | tail -40) || rc=1 ;;
    gemm:*) (set -o pipefail; timeout $T ./build/megamoe bench-gemm $(echo "${step#gemm:}" | tr "+" " ") 2>&1 | tee -a "$OUT/bench_gemm.log" | tail -40) || rc=1 ;;
    gemm) (set -o pipefail; timeout $T ./build/megamoe bench-gemm 2>&1 | tee "$OUT/bench_gemm.log" | tail -40) || rc=1 ;;
    bench) (set -o pipefail; timeout $T ./build/megamoe bench 2>&1 | tee "$OUT/bench.log" | tail -30) || rc=1 ;;
    bench:*) (set -o pipefail; timeout $T ./build/megamoe bench $(echo "${step#bench:}" | tr "+" " ") 2>&1 | tee -a "$OUT/bench.log" | tail -30) || rc=1 ;;
    env:*) export "${step#env:}" ;;
    sanitize | sanitize:*) # bounded per run inside the script, not by the step timeout
      IFS=: read -r _ tools targets <<< "$step"
      scripts/sanitize.sh --build build --tools "${tools:-}" --targets "${targets:-}" > "$OUT/sanitize.txt" 2>&1 || rc=1
      tail -n 30 "$OUT/sanitize.txt"
      tar czf "$OUT/sanitize_logs.tgz" -C build sanitize 2> /dev/null ;;
    soak) (set -o pipefail; timeout $T ./build/megamoe soak 2>&1 | tee "$OUT/soak.log" | tail -30) || rc=1 ;;
    soak:*) (set -o pipefail; timeout $T ./build/megamoe soak $(echo "${step#soak:}" | tr "+" " ") 2>&1 | tee -a "$OUT/soak.log" | tail -30) || rc=1 ;;
    ncu:*) # ncu:TILE[:N,K[:M]]: one profiled launch of that tile in bench-gemm (full set, text report)
      IFS=: read -r _ tile nk m <<< "$step"
      timeout $T ncu --clock-control none --set full -k regex:mm_gemm_kernel --launch-skip 3 --launch-count 1 \
        ./build/megamoe bench-gemm --nk "${nk:-4096,4096}" --m "${m:-65536}" --iters 20 --no-check --tile "$tile" \
        > "$OUT/ncu_$tile.txt" 2>&1 || rc=1
      grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Shared Memory|Issue Slots Busy|No Eligible|Eligible Warps|Registers Per|Achieved Occupancy|tensor|Stall" "$OUT/ncu_$tile.txt" | head -40 ;;
    ncu-src:*) # the layer's persistent kernels: fused is one launch per forward, split two
      IFS=: read -r _ arm tokens <<< "$step"
      case "$arm" in
        fused) kfilter=(-k regex:mm_fused_kernel --launch-skip 3 --launch-count 1) ;;
        split) kfilter=(-k regex:mm_split --launch-skip 6 --launch-count 2) ;;
        *) echo "ncu-src: arm split or fused, not '$arm'"; rc=1; continue ;;
      esac
      rep="/tmp/ncu_src_$arm"
      timeout $T ncu --section SourceCounters --section WarpStateStats "${kfilter[@]}" -f -o "$rep" \
        ./build/megamoe bench --arms "$arm" --tokens "${tokens:-8192}" --rounds 1 --iters 3 > /dev/null 2>&1 || rc=1
      ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.csv" 2>&1 &&
        python3 scripts/ncu_source_summary.py "$rep.csv" > "$OUT/ncu_src_$arm.txt" 2>&1 || rc=1
      head -n 8 "$OUT/ncu_src_$arm.txt"
      # The samples per inlined role (scripts/ncu_source_join.py): the arm's kernel objects
      # disassembled with their inline chains (the build has -lineinfo), joined by address.
      case "$arm" in
        fused) objs=(fused_g128_large fused_g128 fused_g64); dir=fused; joins=("mm_fused_kernel:fused_kernel.cuh") ;;
        split) objs=(split_l1 split_l2); dir=split; joins=("mm_split_l1:split_kernels.cuh" "mm_split_l2:split_kernels.cuh") ;;
      esac
      elf="/tmp/ncu_elf_$arm"
      rm -rf "$elf" && mkdir -p "$elf"
      for o in "${objs[@]}"; do (cd "$elf" && cuobjdump -xelf all "$OLDPWD/build/src/device/$dir/$o.o" > /dev/null 2>&1); done
      for c in "$elf"/*.cubin; do nvdisasm -gi -c "$c"; done > "$elf/gi.sass" 2> /dev/null
      : > "$OUT/ncu_join_$arm.txt"
      for j in "${joins[@]}"; do
        python3 scripts/ncu_source_join.py "$rep.csv" "$elf/gi.sass" --kernel "${j%%:*}" --group-file "${j#*:}" \
          >> "$OUT/ncu_join_$arm.txt" 2>&1 || rc=1
      done
      gzip -c "$rep.csv" > "$OUT/ncu_src_$arm.csv.gz"
      gzip -c "$elf/gi.sass" > "$OUT/ncu_gi_$arm.sass.gz"
      head -n 12 "$OUT/ncu_join_$arm.txt" ;;
    *) echo "unknown step $step"; rc=1 ;;
  esac
done
# At most 8 files come back from the device machine, counted down into its
# folders (the rest are left out, which cost the twenty-sixth session its
# first timeline logs): more than that travel as one archive of everything
# under $OUT, folders included. Only when this script gets here: a call
# killed at its time limit keeps its files as they are.
n=$(find "$OUT" -type f | wc -l)
if [ "$n" -gt 8 ]; then
  if (cd "$OUT" && find . -mindepth 1 -maxdepth 1 ! -name logs.tgz -print0 |
      tar czf logs.tgz --null --verbatim-files-from --remove-files -T -); then
    echo "device_run: $n files under \$OUT, packed into \$OUT/logs.tgz"
  else
    echo "device_run: packing $n files into \$OUT/logs.tgz failed"
    rc=1
  fi
fi
exit $rc
