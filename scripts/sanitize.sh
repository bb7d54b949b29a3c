#!/usr/bin/env bash
# compute-sanitizer over the GPU tests: `make sanitize` (docs/RELIABILITY.md).
#
#   scripts/sanitize.sh [--build DIR] [--tools T1,T2] [--targets X,Y] [--out DIR] [--timeout S]
#
# Tools: memcheck, racecheck, synccheck, initcheck (default: all four).
# Targets (default: all five), each one run of build/gpu_tests under the tool:
#   control  the planted bug of that tool (tests/gpu/test_sanitize.cu) on every
#            rank process of an EP2 run (EP1 with one GPU): the tool must
#            report it in every rank's log, proving it checks the processes
#            the launcher forks. Passes when it does.
#   gemm     the GEMM engine tests (single GPU). racecheck and initcheck skip
#            the two *_large tests (minutes of instrumented shared-memory
#            traffic, and their cuBLASLt half is not our code) and rows_ready
#            (a writer kernel must overlap the GEMM that waits for it: a tool
#            that holds a launch back turns it into a timeout; the split arm's
#            layer tests run the same waits inside one kernel).
#   staged   the "sanitize small" layer tests (H 256, I 256, 8 experts,
#   split    top-2, T 64) at EP1 and EP2, on that arm (wgmma engine).
#   fused
# A run passes when the tool reports no error (after scripts/sanitize.supp),
# every test it ran passed, at least one ran, and it finished within the
# timeout. One line per (tool, target), then "N passed, N failed"; exit 1 when
# any failed, 2 on a bad command line or no compute-sanitizer, 77 when no GPU
# is visible.
#
# Logs: one per process ($OUT/<tool>-<target>/<pid>.log) and the runner's
# output (runner.txt) there; the lines also go to $OUT/summary.txt.
# Environment: SANITIZE_DIR (the --out default, BUILD/sanitize),
# SANITIZE_TIMEOUT (seconds per run, 400), COMPUTE_SANITIZER (the binary),
# MEGAMOE_TEST_COLOCATED=1 (one GPU: the layer targets at EP2 too, co-located),
# MEGAMOE_TEST_SEED (1), SANITIZE_LAYER_FILTER, SANITIZE_GEMM_FILTER (the
# runner's name filters), SANITIZE_SUPP (the suppression file).
set -uo pipefail
cd "$(dirname "$0")/.."

build=build tools="" targets="" out="" timeout_s=${SANITIZE_TIMEOUT:-400}
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=${2:?--build needs a value}; shift 2 ;;
    --tools) tools=${2-}; shift 2 ;;
    --targets) targets=${2-}; shift 2 ;;
    --out) out=${2:?--out needs a value}; shift 2 ;;
    --timeout) timeout_s=${2:?--timeout needs a value}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "sanitize: unknown argument '$1' (--help)"; exit 2 ;;
  esac
done
tools=${tools:-memcheck,racecheck,synccheck,initcheck}
targets=${targets:-control,gemm,staged,split,fused}
out=${out:-${SANITIZE_DIR:-$build/sanitize}}
case "$timeout_s" in '' | *[!0-9]*) echo "sanitize: --timeout '$timeout_s': not a whole number of seconds"; exit 2 ;; esac
for t in ${tools//,/ }; do
  case "$t" in memcheck | racecheck | synccheck | initcheck) ;; *) echo "sanitize: unknown tool '$t' (memcheck, racecheck, synccheck, initcheck)"; exit 2 ;; esac
done
for t in ${targets//,/ }; do
  case "$t" in control | gemm | staged | split | fused) ;; *) echo "sanitize: unknown target '$t' (control, gemm, staged, split, fused)"; exit 2 ;; esac
done

runner="$build/gpu_tests"
[ -x "$runner" ] || { echo "sanitize: $runner not built (make $runner)"; exit 2; }
cs=${COMPUTE_SANITIZER:-}
if [ -z "$cs" ]; then
  for c in "$(command -v compute-sanitizer 2> /dev/null)" "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" \
    "${CUDA_HOME:-/usr/local/cuda}/compute-sanitizer/compute-sanitizer"; do
    if [ -n "$c" ] && [ -x "$c" ]; then cs=$c; break; fi
  done
fi
[ -n "$cs" ] && [ -x "$cs" ] || { echo "sanitize: compute-sanitizer not found (PATH, CUDA_HOME; or set COMPUTE_SANITIZER)"; exit 2; }

export NCCL_NVLS_ENABLE=0 MEGAMOE_TEST_SEED=${MEGAMOE_TEST_SEED:-1}

# The runner's own GPU count (a throwaway child; no test matches the filter).
gpus=$("$runner" "no test is named this" 2>&1 | sed -n -E 's/^GPU tests on ([0-9]+) visible GPU.*/\1/p')
if [ -z "$gpus" ]; then
  echo "sanitize: no GPU visible: nothing to check"
  exit 77
fi
ranks=1 control_ranks=1
if [ "$gpus" -ge 2 ]; then ranks=1,2 control_ranks=2; fi
# MEGAMOE_TEST_COLOCATED=1 on one GPU: the layer targets' EP2 half runs
# co-located (docs/RELIABILITY.md section 5); the controls stay one rank.
if [ "$gpus" -eq 1 ] && [ "${MEGAMOE_TEST_COLOCATED:-}" = 1 ]; then ranks=1,2; fi

# ---- scripts/sanitize.supp ----------------------------------------------------
supp_file=${SANITIZE_SUPP:-scripts/sanitize.supp}
declare -A excludes suppress
n_entries=0
while IFS= read -r line || [ -n "$line" ]; do
  case "$line" in '' | '#'*) continue ;; esac
  spec=${line%%#*}
  reason=${line#*#}
  [ "$spec" != "$line" ] && [ -n "${reason// /}" ] || { echo "sanitize: $supp_file: entry without a reason: $line"; exit 2; }
  read -r s_tool s_kind s_pat s_extra <<< "$spec"
  [ -n "$s_pat" ] && [ -z "$s_extra" ] || { echo "sanitize: $supp_file: want 'TOOL KIND PATTERN # REASON': $line"; exit 2; }
  case "$s_tool" in all | memcheck | racecheck | synccheck | initcheck) ;; *) echo "sanitize: $supp_file: unknown tool '$s_tool'"; exit 2 ;; esac
  for t in memcheck racecheck synccheck initcheck; do
    [ "$s_tool" = all ] || [ "$s_tool" = "$t" ] || continue
    case "$s_kind" in
      exclude-kernel) excludes[$t]="${excludes[$t]:+${excludes[$t]},}$s_pat" ;;
      suppress) suppress[$t]="${suppress[$t]:+${suppress[$t]}$'\n'}$s_pat" ;;
      *) echo "sanitize: $supp_file: unknown kind '$s_kind' (exclude-kernel, suppress)"; exit 2 ;;
    esac
  done
  n_entries=$((n_entries + 1))
done < "$supp_file"

mkdir -p "$out"
summary="$out/summary.txt"
{
  echo "sanitize: $("$cs" --version 2> /dev/null | grep -iE 'version|[0-9]{4}\.[0-9]' | head -n 1) ($cs)"
  echo "sanitize: $gpus GPU(s); tools $tools; targets $targets; seed $MEGAMOE_TEST_SEED; timeout ${timeout_s} s per run;" \
    "$n_entries entr(y/ies) in $supp_file; logs in $out"
} | tee "$summary"

# Counts the tool's reports over one run's process logs: prints
#   total suppressed processes processes_with_errors first_unsuppressed_report
# (tab-separated). A report is a line "========= X" (not a summary line) with
# its indented "=========     ..." lines; warnings are not errors.
count_reports() {
  local dir=$1 patterns=$2
  local logs=("$dir"/*.log)
  [ -e "${logs[0]}" ] || { printf '0\t0\t0\t0\t\n'; return; }
  SANITIZE_PATTERNS=$patterns awk '
    BEGIN { np = split(ENVIRON["SANITIZE_PATTERNS"], pat, "\n"); total = 0; supp = 0; procs = 0; bad = 0; first = "" }
    function flush() {
      if (rec == "") return
      if (rec !~ /^========= Warning/) {
        hit = 0
        for (i = 1; i <= np; ++i) if (pat[i] != "" && rec ~ pat[i]) hit = 1
        if (hit) supp++
        else if (first == "") { first = head }
      }
      rec = ""
    }
    # One error count per log: its ERROR SUMMARY, or the racecheck line "RACECHECK
    # SUMMARY: 1 hazard displayed (1 error, 0 warnings)" (the number after
    # "("), which racecheck prints instead; a log with both counts once.
    function count(n) {
      if (counted >= 0) { total -= counted; if (counted > 0) bad-- }
      counted = n; total += n; if (n > 0) bad++
    }
    FNR == 1 { flush(); procs++; counted = -1; race = 0 }
    /^========= ERROR SUMMARY: [0-9]+ error/ {
      flush(); if (!race) count($4 + 0); next
    }
    /^========= RACECHECK SUMMARY: / {
      flush(); s = $0; sub(/.*\(/, "", s); count(s + 0); race = 1; next
    }
    /^========= [^ ]/ && !/SUMMARY|COMPUTE-SANITIZER|Target application|terminate/ {
      flush(); rec = $0; head = substr($0, 11); next
    }
    /^=========  / && rec != "" { rec = rec "\n" $0; next }
    { flush() }
    END { flush(); gsub(/\t/, " ", first); printf "%d\t%d\t%d\t%d\t%s\n", total, supp, procs, bad, first }
  ' "${logs[@]}"
}

passed=0 failed=0
for tool in ${tools//,/ }; do
  for target in ${targets//,/ }; do
    dir="$out/$tool-$target"
    rm -rf "$dir" && mkdir -p "$dir"
    envs=() filter=""
    case "$target" in
      control) envs=(MEGAMOE_SANITIZE_CONTROL=1 MEGAMOE_TEST_RANKS=$control_ranks); filter="control: $tool" ;;
      gemm)
        if [ -n "${SANITIZE_GEMM_FILTER:-}" ]; then filter=$SANITIZE_GEMM_FILTER
        elif [ "$tool" = racecheck ] || [ "$tool" = initcheck ]; then
          filter=$("$runner" --list 2> /dev/null | grep -E '^gemm_wgmma' | grep -vE '_large$|_rows_ready$' | paste -sd '|')
          filter=${filter:-gemm_wgmma}
        else filter=gemm_wgmma; fi ;;
      staged | split | fused) envs=(MEGAMOE_GEMM=wgmma MEGAMOE_TEST_ARM=$target MEGAMOE_TEST_RANKS=$ranks)
        filter=${SANITIZE_LAYER_FILTER:-sanitize small} ;;
    esac
    # --launch-timeout: the runner's parent never touches CUDA and its ranks start CUDA
    # after a fork, under instrumentation; give them a minute to reach the tool.
    opts=(--tool "$tool" --target-processes all --log-file "$dir/%p.log" --print-limit 1000 --report-api-errors no
      --launch-timeout 60)
    [ -n "${excludes[$tool]:-}" ] && opts+=(--kernel-name-exclude "${excludes[$tool]}")
    start=$SECONDS
    env "${envs[@]}" timeout -k 30 "$timeout_s" "$cs" "${opts[@]}" "$runner" "$filter" > "$dir/runner.txt" 2>&1
    rc=$?
    secs=$((SECONDS - start))
    IFS=$'\t' read -r total supp procs bad first <<< "$(count_reports "$dir" "${suppress[$tool]:-}")"
    errors=$((total - supp))
    tests=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$dir/runner.txt" | tail -n 1)
    t_pass=$(echo "$tests" | sed -n -E 's/^([0-9]+) passed.*/\1/p')
    t_fail=$(echo "$tests" | sed -n -E 's/.* ([0-9]+) failed.*/\1/p')
    verdict=PASS why=""
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then verdict=FAIL why="timed out after $timeout_s s; "; fi
    if [ "$procs" -eq 0 ]; then verdict=FAIL why="${why}no process log (did the tool start? see runner.txt); "; fi
    if [ "$target" = control ]; then
      # Every rank process plants the bug once (one thread, one launch), so each
      # checked rank adds one report. Count reports, not logs: the tool may write
      # all ranks' reports into one log (seen with memcheck on the H200 machine,
      # --target-processes all: both ranks' reports in the parent's %p.log).
      if [ "$total" -lt "$control_ranks" ]; then
        verdict=FAIL why="${why}the planted bug was reported $total time(s) for $control_ranks rank processes: the tool does not check every forked rank or does not see the planted bug (tests/gpu/test_sanitize.cu), and until it does a clean run of this tool proves nothing; "
      fi
      line="the planted bug reported $total time(s) for $control_ranks rank(s), in $bad of $procs log(s)"
    else
      if [ "$errors" -gt 0 ]; then verdict=FAIL why="${why}first: ${first:-?}; "; fi
      if [ -z "$tests" ]; then verdict=FAIL why="${why}the runner printed no closing line; "
      elif [ "${t_fail:-1}" -ne 0 ] || [ "${t_pass:-0}" -eq 0 ]; then verdict=FAIL why="${why}tests: $tests; "; fi
      suppressed=""
      [ "$supp" -gt 0 ] && suppressed=" ($supp suppressed by $supp_file)"
      line="$errors error(s)$suppressed, tests ${tests:-none}, $procs process log(s)"
    fi
    summary_line=$(printf '[%s] %-9s %-7s %s, %d s%s' "$verdict" "$tool" "$target" "$line" "$secs" \
      "${why:+; ${why%; }; log $dir}")
    echo "$summary_line" | tee -a "$summary"
    if [ "$verdict" = PASS ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
  done
done
echo "$passed passed, $failed failed" | tee -a "$summary"
[ "$failed" -eq 0 ]
