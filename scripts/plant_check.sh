#!/usr/bin/env bash
# Proves on the GPU machine that a test can fail: plants a bug with sed in a
# copy of the tree, builds the GPU tests there, runs the tests that must
# catch it, and passes only when they FAIL (and the unplanted tree's build
# of the same tests passes, when --control is given).
#
#   scripts/plant_check.sh [--defs "-DNAME=V ..."] [--env V=X]... [--control] [--hang] [--prebuild] \
#       NAME FILE SED_EXPR TEST_FILTER
#
# FILE, relative to the repository root, gets `sed -i SED_EXPR`; the script
# stops when that changed nothing (a plant that no longer matches the code
# proves nothing). --defs: nvcc macros of the build (e.g. the option the
# planted code lives in). --env: exported for the test run (repeatable), e.g.
# MEGAMOE_TEST_ARM=split. The test run is bounded by PLANT_TIMEOUT seconds
# (480; a plant caught by a timeout waits the test's deadline per call). Logs in $OUT/plant_NAME.log (OUT defaults to /tmp/megamoe-out).
# Exit 0 when caught, 1 when not, when the tests hung instead of failing, or
# when a build failed; 2 on a bad command line, 77 when no GPU is visible.
# --hang: a plant whose symptom is a forward that never ends, in a wait no
# deadline can cover (setmaxnreg.inc, a named barrier): caught when the
# planted run is stopped by PLANT_TIMEOUT, and only with --control passing
# (a timeout of the unplanted build would prove nothing). Give it a short
# PLANT_TIMEOUT.
# --prebuild (on the CPU machine, no GPU): builds the planted tree as the GPU
# run will, compiles its CUDA objects there (scripts/prebuild.sh build=DEFS)
# and packs them into _prebuilt_plant_NAME.tgz here; carried to the GPU
# machine, the planted tree there unpacks it and only links (the archive's
# tree hash covers the plant and the .orig copy, so a different sed or tree
# leaves it unused and everything compiles there as before).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/megamoe-out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
defs=""
control=0
hang=0
envs=()
prebuild=0
while [ $# -gt 0 ]; do
  case "$1" in
    --defs) defs=$2; shift 2 ;;
    --env) envs+=("$2"); shift 2 ;;
    --control) control=1; shift ;;
    --hang) hang=1; shift ;;
    --prebuild) prebuild=1; shift ;;
    *) break ;;
  esac
done
if [ $# -ne 4 ]; then
  echo "usage: scripts/plant_check.sh [--defs D] [--env V=X]... [--control] [--hang] [--prebuild] NAME FILE SED_EXPR TEST_FILTER" >&2
  exit 2
fi
if [ $hang = 1 ] && [ $control = 0 ]; then
  echo "plant_check: --hang needs --control (the unplanted build must finish where the planted one hangs)" >&2
  exit 2
fi
name=$1 file=$2 expr=$3 filter=$4
[[ "$name" =~ ^[A-Za-z0-9_]+$ ]] || { echo "plant_check: NAME '$name': letters, digits, _" >&2; exit 2; }
if [ $prebuild = 0 ] && ! nvidia-smi -L > /dev/null 2>&1; then
  echo "plant_check: no GPU visible" >&2
  exit 77
fi
log="$OUT/plant_$name.log"
tree="/tmp/megamoe_plant_$name"
rm -rf "$tree" && mkdir -p "$tree"
# The archives stay out of the copy (the planted one is put in place below).
tar --exclude=./build --exclude='./build_*' --exclude=./.git --exclude='./_prebuilt*.tgz' -c . | tar -x -C "$tree"
cp "$tree/$file" "$tree/$file.orig"
sed -i "$expr" "$tree/$file"
if cmp -s "$tree/$file" "$tree/$file.orig"; then
  echo "plant $name: the sed expression changed nothing in $file" | tee "$log"
  exit 1
fi
archive="$PWD/_prebuilt_plant_$name.tgz"
if [ $prebuild = 1 ]; then
  (cd "$tree" && scripts/prebuild.sh "build=$defs") || exit 1
  mv "$tree/_prebuilt.tgz" "$archive" || exit 1
  rm -rf "$tree"
  echo "plant $name: $(basename "$archive") packed; carry it with the GPU call"
  exit 0
fi
{ echo "plant $name in $file:"; diff "$tree/$file.orig" "$tree/$file"; } > "$log"
if [ -f "$archive" ]; then
  # The tree hash covers the sources, not the macros, and make tracks
  # neither: an archive packed with other --defs would link objects built
  # without this run's macros. It is used only for the same ones.
  if [ "$(tar xzf "$archive" -O ./build/.nvcc_defs 2> /dev/null)" = "$defs" ]; then
    cp "$archive" "$tree/_prebuilt.tgz"
    (cd "$tree" && scripts/prebuild.sh --unpack) >> "$log" 2>&1
  else
    echo "plant $name: $(basename "$archive") was packed with other --defs: not used" | tee -a "$log"
  fi
fi
run_tests() { # tree
  (cd "$1" && make -j"$(nproc)" NVCC="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc $defs" build/gpu_tests >> "$log" 2>&1) ||
    return 2
  # The run's own output in $run_log too: its summary line is judged alone.
  (cd "$1" && env ${envs[@]+"${envs[@]}"} timeout -k 30 "${PLANT_TIMEOUT:-480}" ./build/gpu_tests "$filter" 2>&1 |
    tee "$run_log" >> "$log"; exit "${PIPESTATUS[0]}")
}
run_log="$OUT/plant_$name.run.log"
if [ $control = 1 ]; then
  ctree="/tmp/megamoe_plant_${name}_control"
  rm -rf "$ctree" && mkdir -p "$ctree"
  tar --exclude=./build --exclude='./build_*' --exclude=./.git --exclude='./_prebuilt*.tgz' -c . | tar -x -C "$ctree"
  echo "== control (unplanted)" >> "$log"
  run_tests "$ctree"
  crc=$?
  csummary=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$run_log" | tail -1)
  if [ $crc != 0 ] || [[ "$csummary" == "0 passed"* ]]; then
    echo "plant $name: the unplanted control failed or ran nothing (rc $crc: $csummary): $log"
    exit 1
  fi
fi
echo "== planted" >> "$log"
run_tests "$tree"
rc=$?
if [ $rc = 2 ]; then
  echo "plant $name: the planted build failed: $log"
  exit 1
fi
summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$run_log" | tail -1)
if [ $rc = 0 ] && [[ "$summary" == "0 passed, 0 failed"* ]]; then
  echo "plant $name: no test ran ('$filter': $summary): proves nothing: $log"
  exit 1
fi
if [ $rc = 0 ]; then
  echo "plant $name: NOT caught (the tests '$filter' passed with the bug planted: $summary): $log"
  exit 1
fi
if [ $hang = 1 ]; then
  if [ $rc = 124 ] || [ $rc = 137 ]; then
    echo "plant $name: caught (the planted tests '$filter' never ended: stopped after ${PLANT_TIMEOUT:-480} s; the control passed)"
    exit 0
  fi
  echo "plant $name: NOT caught (--hang: the planted tests ended, rc $rc: ${summary:-no summary}): $log"
  exit 1
fi
if [ $rc = 124 ] || [ $rc = 137 ]; then
  echo "plant $name: the tests hung (stopped after ${PLANT_TIMEOUT:-480} s): a failure, but not a clean one: $log"
  exit 1
fi
# Caught only by failed tests, not by a crash or a broken environment.
failed=$(sed -E -n 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/p' <<< "$summary")
if [ -z "$failed" ] || [ "$failed" = 0 ]; then
  echo "plant $name: the run ended with rc $rc but no failed test (summary: '${summary:-none}'): not a verdict: $log"
  exit 1
fi
echo "plant $name: caught (tests '$filter' failed, rc $rc: $summary)"
exit 0
