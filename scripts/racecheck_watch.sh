#!/usr/bin/env bash
# racecheck on the split arm's "sanitize small" tests (the first alone by default), one run per build folder, with the
# timeline in mapped host memory and its watch (src/host/timeline.h): where each CTA stands while
# a kernel runs under the tool, each watch line with the seconds since the layer's create. The
# diagnostic of docs/RELIABILITY.md (racecheck on split); not part of `make sanitize`.
#
#   scripts/racecheck_watch.sh [BUILD_DIR ...]     (default: build; repeat a folder to run it again)
#
# Each BUILD_DIR, relative to the repository root, holds a `make all` (e.g. a second one built
# with NVCC="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc -DMM_GRID_SPIN_SLEEP_NS=2000" BUILD=build_sl).
# Exit 0 when every run passed, 1 when one failed or did not finish, 2 when a folder was missing. Environment: LIMIT
# (seconds per run, 200), WATCH (the watch's period in seconds, 2), EXTRA (more compute-sanitizer
# options), FILTER (the GPU tests run: "sanitize small: uniform"; "sanitize small" runs all three,
# as scripts/sanitize.sh does, whose runs hung in the second and third in the twenty-eighth
# session), OUT (logs: OUT/race<i>-<dir>/runner.txt and the tool's per-process logs).
set -u
export NCCL_NVLS_ENABLE=0 MEGAMOE_TEST_SEED=${MEGAMOE_TEST_SEED:-1}
OUT=${OUT:-/tmp/megamoe-out}
LIMIT=${LIMIT:-200}
cd "$(dirname "$0")/.."
cs=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")}
[ -x "$cs" ] || { echo "racecheck_watch: compute-sanitizer not found (PATH, CUDA_HOME; or set COMPUTE_SANITIZER)"; exit 2; }
i=0 rc_all=0
for b in "${@:-build}"; do
  i=$((i + 1))
  [ -x "$b/gpu_tests" ] || { echo "racecheck_watch: no $b/gpu_tests (make all BUILD=$b first)"; rc_all=2; continue; }
  d="$OUT/race$i-$(basename "$b")"
  rm -rf "$d" && mkdir -p "$d"
  start=$SECONDS
  # Straight into a file (no pipe a stray process could hold open past the limit); line-buffered
  # (stdbuf), so the test's lines and the watch's (which carry their own seconds) keep their order.
  # EXTRA is split into words on purpose (several options), with globbing off.
  set -f
  env MEGAMOE_GEMM=wgmma MEGAMOE_TEST_ARM=split MEGAMOE_TEST_RANKS=1 MEGAMOE_TIMELINE=mapped \
    MEGAMOE_TIMELINE_WATCH="${WATCH:-2}" \
    timeout -k 10 "$LIMIT" "$cs" --tool racecheck --target-processes all --log-file "$d/%p.log" \
    --print-limit 100 --report-api-errors no --launch-timeout 60 --kernel-name-exclude kns=ncclDevKernel \
    ${EXTRA:-} stdbuf -oL -eL "$b/gpu_tests" "${FILTER:-sanitize small: uniform}" > "$d/runner.txt" 2>&1
  rc=$?
  set +f
  late=""
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then late=" (did not finish in $LIMIT s)"; fi
  echo "run $i ($b): exit $rc after $((SECONDS - start)) s$late"
  cut -c1-330 "$d/runner.txt" | tail -n 25
  grep -h 'RACECHECK SUMMARY' "$d"/*.log 2> /dev/null
  [ "$rc" -eq 0 ] || [ "$rc_all" -eq 2 ] || rc_all=1
done
exit $rc_all
