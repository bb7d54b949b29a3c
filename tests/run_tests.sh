#!/usr/bin/env bash
# Runs the tests and prints one closing line over all of them:
# N passed, N failed, N skipped.
#   tests/run_tests.sh [BUILD] [all|gpu]
#   all (make test): the CPU tests (scripts/sanitize.sh's included, on a fake
#        compute-sanitizer), the GPU tests (which skip, saying so, without a
#        GPU), the Python package's tests (python/tests: CPU ones, and GPU
#        ones that skip without torch or a GPU) and the fault tests (killed
#        and silent ranks; they skip, saying so, without 2 GPUs);
#   gpu (make gpu-test): the GPU tests, the Python package's GPU tests and
#        the fault tests.
# The Python tests run with $PYTHON (default python3) against BUILD's shared
# library; without numpy or pytest they count as one skipped test, or as one
# failed test with MEGAMOE_REQUIRE_PYTHON_TESTS=1 (CI sets it).
set -uo pipefail
build=${1:-build}
mode=${2:-all}
case "$mode" in all | gpu) ;; *) echo "run_tests.sh: mode '$mode': not all or gpu"; exit 2 ;; esac
root=$(cd "$(dirname "$0")/.." && pwd)
lib="$(cd "$build" && pwd)/libmegamoe.so.0"
py=${PYTHON:-python3}
total_p=0 total_f=0 total_s=0 rc=0

# run LABEL COMMAND...: runs it, folds its closing "N passed, N failed[, N skipped]" line.
run() {
  local label=$1 out line p f s
  shift
  out=$(mktemp)
  NCCL_NVLS_ENABLE=0 "$@" 2>&1 | tee "$out"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$out" | tail -n 1)
  rm -f "$out"
  if [ -z "$line" ]; then echo "$label printed no summary"; rc=1; total_f=$((total_f + 1)); return; fi
  p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
  f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
  s=$(echo "$line" | grep -oE '[0-9]+ skipped' | grep -oE '[0-9]+' || echo 0)
  total_p=$((total_p + p)); total_f=$((total_f + f)); total_s=$((total_s + ${s:-0}))
}

python_tests() {
  MEGAMOE_LIBRARY="$lib" PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1 \
    "$py" "$root/python/tests/run_pytest.py" "$@"
}

if [ "$mode" = all ]; then
  run "$build/unit_tests" "$build/unit_tests"
  run "sanitize script" bash "$root/tests/sanitize/test_sanitize_script.sh"
fi
run "$build/gpu_tests" "$build/gpu_tests"
if ! command -v "$py" > /dev/null 2>&1; then
  echo "python tests: no interpreter '$py'"
  if [ "${MEGAMOE_REQUIRE_PYTHON_TESTS:-0}" = 1 ]; then total_f=$((total_f + 1)); rc=1; else total_s=$((total_s + 1)); fi
elif [ "$mode" = all ]; then
  run "python tests" python_tests "$root/python/tests"
else
  run "python GPU tests" python_tests "$root/python/tests/gpu"
fi
# Last: they kill processes that hold GPUs.
run "$build/fault_tests" "$build/fault_tests"
echo
echo "$total_p passed, $total_f failed, $total_s skipped"
[ "$total_f" -eq 0 ] || rc=1
exit $rc
