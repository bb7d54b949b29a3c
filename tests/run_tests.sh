#!/usr/bin/env bash
# Runs the CPU tests and the GPU tests (which skip, saying so, without a GPU)
# and prints one closing line over both: N passed, N failed, N skipped.
set -uo pipefail
build=${1:-build}
total_p=0 total_f=0 total_s=0 rc=0
for runner in "$build/unit_tests" "$build/gpu_tests"; do
  out=$(mktemp)
  NCCL_NVLS_ENABLE=0 "$runner" 2>&1 | tee "$out"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$out" | tail -n 1)
  rm -f "$out"
  if [ -z "$line" ]; then echo "$runner printed no summary"; rc=1; continue; fi
  p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
  f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
  s=$(echo "$line" | grep -oE '[0-9]+ skipped' | grep -oE '[0-9]+' || echo 0)
  total_p=$((total_p + p)); total_f=$((total_f + f)); total_s=$((total_s + ${s:-0}))
done
echo
echo "$total_p passed, $total_f failed, $total_s skipped"
[ "$total_f" -eq 0 ] || rc=1
exit $rc
