#!/usr/bin/env bash
# scripts/sanitize.sh (`make sanitize`) without a GPU: a fake compute-sanitizer
# writes per-process logs the way the real one does (reports, summaries) and
# runs a fake GPU test runner, so the script's counting, suppressions,
# controls, timeouts and exit codes are checked on the CPU machine. Closing
# line "N passed, N failed, 0 skipped" (tests/run_tests.sh folds it in).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0

# ---- the fakes -------------------------------------------------------------
mkdir -p "$work/build"
cat > "$work/build/gpu_tests" << 'EOF'
#!/usr/bin/env bash
if [ "${1-}" = --list ]; then
  printf '%s\n' gemm_wgmma_f32_vs_cpu gemm_wgmma_vs_simple_large gemm_wgmma_scatter gemm_wgmma_vs_cublaslt_large gemm_wgmma_rows_ready \
    "sanitize small: uniform routing, 2 forwards"
  exit 0
fi
if [ "${FAKE_GPUS:-2}" = 0 ]; then echo "no GPU visible: skipping every GPU test"; echo "0 passed, 0 failed, 9 skipped"; exit 0; fi
echo "GPU tests on ${FAKE_GPUS:-2} visible GPU(s), seed 1"
[ -n "${FAKE_SLEEP:-}" ] && [ -n "${FAKE_UNDER_TOOL:-}" ] && sleep "$FAKE_SLEEP"
[ -n "${FAKE_UNDER_TOOL:-}" ] && echo "${FAKE_TESTS:-3 passed, 0 failed, 0 skipped}" || echo "0 passed, 0 failed, 0 skipped"
EOF
cat > "$work/compute-sanitizer" << 'EOF'
#!/usr/bin/env bash
# Fake: --tool T --log-file DIR/%p.log ... RUNNER FILTER
if [ "${1-}" = --version ]; then echo "Compute Sanitizer fake version 2099.1"; exit 0; fi
tool="" log=""
args=("$@")
while [ $# -gt 0 ]; do
  case "$1" in
    --tool) tool=$2; shift 2 ;;
    --log-file) log=$2; shift 2 ;;
    --target-processes | --print-limit | --report-api-errors | --kernel-name-exclude | --launch-timeout) shift 2 ;;
    *) break ;;
  esac
done
dir=$(dirname "$log")
printf '%s\n' "${args[@]}" > "$dir/args.txt"
target=${MEGAMOE_TEST_ARM:-gemm}
[ -n "${MEGAMOE_SANITIZE_CONTROL:-}" ] && target=control
for p in 101 102 103; do
  f="$dir/$p.log"
  echo "========= COMPUTE-SANITIZER" > "$f"
  n=0
  if [ "$target" = control ] && [ "$p" != 101 ] && [ "$((p - 101))" -le "${FAKE_CONTROL_PROCS:-2}" ]; then
    # FAKE_CONTROL_ONE_LOG: every rank's report in one log, as the real tool wrote them.
    reps=1
    [ -n "${FAKE_CONTROL_ONE_LOG:-}" ] && { [ "$p" = 102 ] && reps=${FAKE_CONTROL_PROCS:-2} || reps=0; }
    for ((i = 0; i < reps; ++i)); do
      printf '%s\n' "========= Invalid __global__ write of size 4 bytes" \
        "=========     at write_one_past_end(int *, unsigned long)+0x50 in test_sanitize.cu:26" "=========" >> "$f"
    done
    n=$reps
  fi
  if [ "$p" = 102 ] && [[ ",${FAKE_ERRORS:-}," == *",$tool:$target,"* ]]; then
    printf '%s\n' "========= Error: Race reported between Write access at mm_split_l1_kernel+0x10 in split_kernels.cuh:120" \
      "=========     and Read access at mm_split_l1_kernel+0x20 in split_kernels.cuh:130 [8 hazards]" "=========" \
      "========= Warning: Race reported between Read access at mm_reduce_kernel+0x8 in combine.cu:40" "=========" >> "$f"
    n=$((n + 1)) warnings=1
  fi
  # The real tools' closing lines: racecheck prints only its own summary (no ERROR SUMMARY;
  # FAKE_BOTH_SUMMARIES adds one, which must not count twice).
  if [ "$tool" = racecheck ]; then
    echo "========= RACECHECK SUMMARY: $((n + ${warnings:-0})) hazards displayed ($n errors, ${warnings:-0} warnings)" >> "$f"
    [ -n "${FAKE_BOTH_SUMMARIES:-}" ] && echo "========= ERROR SUMMARY: $n error$([ $n = 1 ] || echo s)" >> "$f"
  else
    echo "========= ERROR SUMMARY: $n error$([ $n = 1 ] || echo s)" >> "$f"
  fi
  warnings=0
done
shift 0
FAKE_UNDER_TOOL=1 exec "$@"
EOF
chmod +x "$work/build/gpu_tests" "$work/compute-sanitizer"

# run NAME WANT_RC [ENV=V ...] -- [ARGS...]: runs the script, keeps its output in $work/out.
run() {
  local name=$1 want=$2
  shift 2
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  env COMPUTE_SANITIZER="$work/compute-sanitizer" SANITIZE_SUPP="$work/empty.supp" "${envs[@]}" \
    "$root/scripts/sanitize.sh" --build "$work/build" --out "$work/logs" "$@" > "$work/out" 2>&1
  local rc=$?
  if [ "$rc" -ne "$want" ]; then
    echo "[FAIL] $name: exit $rc (want $want)"
    sed 's/^/    /' "$work/out"
    failed=$((failed + 1))
    return 1
  fi
  return 0
}
has() { grep -qE -- "$1" "$work/out" || { echo "[FAIL] $2: output lacks /$1/"; sed 's/^/    /' "$work/out"; return 1; }; }
ok() { echo "[PASS] $1"; passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); }
: > "$work/empty.supp"

name="sanitize.sh: clean runs pass, controls caught on every rank, the exclusions and filters reach the tool"
if run "$name" 0 SANITIZE_SUPP="$root/scripts/sanitize.supp" -- --tools memcheck,racecheck &&
  has '^\[PASS\] memcheck +control +the planted bug reported 2 time\(s\) for 2 rank' "$name" &&
  has '^\[PASS\] racecheck +split +0 error\(s\), tests 3 passed, 0 failed' "$name" &&
  has '^\[PASS\] memcheck +fused +0 error\(s\), tests 3 passed, 0 failed' "$name" &&
  has '^10 passed, 0 failed$' "$name" &&
  grep -qx 'kns=ncclDevKernel' "$work/logs/memcheck-gemm/args.txt" &&
  grep -qx 'gemm_wgmma' "$work/logs/memcheck-gemm/args.txt" &&
  grep -qx 'gemm_wgmma_f32_vs_cpu|gemm_wgmma_scatter' "$work/logs/racecheck-gemm/args.txt" &&
  grep -qx 'sanitize small' "$work/logs/racecheck-split/args.txt" &&
  grep -qx 'sanitize small' "$work/logs/racecheck-fused/args.txt"; then ok "$name"; else bad; fi

name="sanitize.sh: an error report fails its (tool, target) and names the first report"
if run "$name" 1 FAKE_ERRORS=racecheck:split -- --tools racecheck --targets staged,split &&
  has '^\[PASS\] racecheck +staged' "$name" &&
  has '^\[FAIL\] racecheck +split +1 error\(s\).*first: Error: Race reported between Write access at mm_split_l1_kernel' "$name" &&
  has '^1 passed, 1 failed$' "$name"; then ok "$name"; else bad; fi

name="sanitize.sh: racecheck errors come from its own summary line, once per log"
if run "$name" 1 FAKE_ERRORS=racecheck:split FAKE_BOTH_SUMMARIES=1 -- --tools racecheck --targets split &&
  has '^\[FAIL\] racecheck +split +1 error\(s\)' "$name"; then ok "$name"; else bad; fi

name="sanitize.sh: a narrow suppression with a reason hides that report only"
printf '%s\n' '# test' 'racecheck suppress mm_split_l1_kernel.*split_kernels\.cuh:120  # the fake race of this test' > "$work/one.supp"
if run "$name" 0 FAKE_ERRORS=racecheck:split SANITIZE_SUPP="$work/one.supp" -- --tools racecheck --targets split &&
  has '^\[PASS\] racecheck +split +0 error\(s\) \(1 suppressed' "$name"; then ok "$name"; else bad; fi
printf '%s\n' 'racecheck suppress other_kernel  # does not match' > "$work/other.supp"
if run "$name" 1 FAKE_ERRORS=racecheck:split SANITIZE_SUPP="$work/other.supp" -- --tools racecheck --targets split &&
  has '^\[FAIL\] racecheck +split +1 error' "$name"; then ok "$name (another pattern does not)"; else bad; fi

name="sanitize.sh: an entry without a reason is refused"
printf '%s\n' 'racecheck suppress mm_split_l1_kernel' > "$work/noreason.supp"
if run "$name" 2 SANITIZE_SUPP="$work/noreason.supp" -- --tools racecheck && has 'entry without a reason' "$name"; then ok "$name"; else bad; fi

name="sanitize.sh: a control the tool saw in one rank only fails (the ranks are not all checked)"
if run "$name" 1 FAKE_CONTROL_PROCS=1 -- --tools memcheck --targets control &&
  has '^\[FAIL\] memcheck +control .*reported 1 time\(s\) for 2 rank processes' "$name"; then ok "$name"; else bad; fi

name="sanitize.sh: both ranks' control reports in one log count for both ranks"
if run "$name" 0 FAKE_CONTROL_ONE_LOG=1 -- --tools memcheck --targets control &&
  has '^\[PASS\] memcheck +control +the planted bug reported 2 time\(s\) for 2 rank\(s\), in 1 of' "$name"; then ok "$name"; else bad; fi

name="sanitize.sh: a failed test fails the run even with a clean log"
if run "$name" 1 FAKE_TESTS="2 passed, 1 failed, 0 skipped" -- --tools synccheck --targets gemm &&
  has '^\[FAIL\] synccheck +gemm .*tests: 2 passed, 1 failed' "$name"; then ok "$name"; else bad; fi

name="sanitize.sh: a run past its timeout is ended and fails"
if run "$name" 1 FAKE_SLEEP=20 -- --tools initcheck --targets staged --timeout 1 &&
  has '^\[FAIL\] initcheck +staged .*timed out after 1 s' "$name"; then ok "$name"; else bad; fi

name="sanitize.sh: one GPU: the controls and the layer run at EP1"
if run "$name" 0 FAKE_GPUS=1 FAKE_CONTROL_PROCS=1 -- --tools memcheck --targets control &&
  has 'reported 1 time\(s\) for 1 rank' "$name"; then ok "$name"; else bad; fi

name="sanitize.sh: no GPU: exit 77, saying so; bad arguments: exit 2"
if run "$name" 77 FAKE_GPUS=0 -- && has 'no GPU visible' "$name" && run "$name" 2 -- --tools memcheck,helgrind &&
  has "unknown tool 'helgrind'" "$name" && run "$name" 2 -- --targets everything && run "$name" 2 -- --timeout 5m &&
  run "$name" 2 COMPUTE_SANITIZER="$work/nowhere" -- && has 'compute-sanitizer not found' "$name"; then ok "$name"; else bad; fi

echo "$passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
