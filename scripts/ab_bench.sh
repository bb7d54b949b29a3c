#!/usr/bin/env bash
# A/B of two builds of the kernels in one GPU-machine call (docs/PERF.md's
# method: a prediction first, then both builds alternating in one call).
#
#   scripts/ab_bench.sh [--rounds N] [--env-a V=X] [--env-b V=X] [--also DEFS_C]... [--one-process] \
#       "DEFS_A" "DEFS_B" BENCH_ARGS...
#
# DEFS_A / DEFS_B: nvcc macros of each build ("" for the default build),
# e.g. "" "-DMM_EARLY_COMBINE=1"; "@DIR [MACROS]" builds the source tree in
# DIR instead of this one, so a change with no macro of its own is measured
# against the tree before it. Make DIR fresh on the CPU machine (its
# Makefile builds every source it finds): `rm -rf _ab_head && mkdir
# _ab_head && git archive HEAD | tar -x -C _ab_head` (the device's copy has
# no .git; _ab_head is git-ignored, so the device call carries it by name).
# The builds go to build_ab_a and
# build_ab_b (reused when their macros match; make does not track macros),
# in parallel. Then `megamoe bench BENCH_ARGS` runs N times per build
# (default 2), alternating A B B A A B ..., each run's table rows printed
# under a header naming the build. --env-a / --env-b export a variable for
# that build's runs only (repeatable), so one build can be compared with
# itself under two settings: --env-a MEGAMOE_EARLY_COMBINE=0 "" "" ... (a
# build with the macros of an earlier one is not built again: it runs that
# one's binary).
# --also DEFS (repeatable, up to 4): more builds, c, d, ..., each compared
# with A in its own closing table; one call then measures several options
# against one baseline (a round runs A B C ..., the next ... C B A).
# Logs: $OUT/ab_build_{a,b}.log, $OUT/ab_bench.log, and the medians per arm
# and token count with each build's SM clock at the end (scripts/ab_summary.py,
# also $OUT/ab_summary.txt; OUT defaults to /tmp/megamoe-out).
# One token count per process: a `--tokens A,B,...` in BENCH_ARGS becomes one
# bench process per count (in that order, per build and round), because what
# a process ran before changes a later count's time: 2048 tokens after 1024
# in one process ran 0.5-1.2 % slower than alone with the same routing, and
# processes differed by up to 4 % on another machine (docs/PERF.md,
# twentieth session). Each such process gets the list's largest count as
# --max-tokens. --one-process: the whole list in one process, as before.
# With --clocks in BENCH_ARGS, each row's clock line (the GPU's SM clock,
# power, temperature during the cell) is printed under it too.
# NCCL_NVLS_ENABLE=0 as everywhere. Each bench run is
# bounded by AB_TIMEOUT seconds (300). Exit 0, 1 when a
# build or a run failed, 2 on a bad command line, 77 when no GPU is visible.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/megamoe-out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
rounds=2
env_a=()
env_b=()
also=()
one_process=0
usage() {
  echo "usage: scripts/ab_bench.sh [--rounds N] [--env-a V=X] [--env-b V=X] [--also DEFS_C]... [--one-process] \"DEFS_A\" \"DEFS_B\" BENCH_ARGS..." >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds | --env-a | --env-b | --also) [ $# -ge 2 ] || usage ;;&
    --rounds) rounds=$2; shift 2 ;;
    --env-a) env_a+=("$2"); shift 2 ;;
    --env-b) env_b+=("$2"); shift 2 ;;
    --also) also+=("$2"); shift 2 ;;
    --one-process) one_process=1; shift ;;
    *) break ;;
  esac
done
[ $# -ge 2 ] || usage
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || usage
defs_a=$1
defs_b=$2
shift 2
[ ${#also[@]} -le 4 ] || { echo "ab_bench: at most 4 --also builds" >&2; usage; }
# The builds: a, b, then c, d, ... for each --also.
names=(a b)
defs_of=([0]="$defs_a" [1]="$defs_b")
letters=(c d e f)
for ((i = 0; i < ${#also[@]}; ++i)); do
  names+=("${letters[$i]}")
  defs_of+=("${also[$i]}")
done
# BENCH_ARGS without its --tokens, whose list goes to token_lists: one entry
# per count, or the whole list as one entry (--one-process). Each per-count
# process gets --max-tokens of the whole list (unless BENCH_ARGS has one), so
# its layers have the T_max the list's one process would have (the ring, the
# workspace, and what --no-bound's bound 0 means). No --tokens: one run with
# the bench's default counts, in one process (said so).
# --rates design first: the builds compare in µs, and a floor measured again
# in every process would only add a second and noise to its columns (a
# --rates in BENCH_ARGS comes later and wins).
bench_args=(--rates design)
token_lists=("")
tokens=""
has_tokens=0
has_max=0
while [ $# -gt 0 ]; do
  case "$1" in
    --tokens) [ $# -ge 2 ] || usage; tokens=$2; has_tokens=1; shift 2 ;;
    --max-tokens) has_max=1; bench_args+=("$1"); shift ;;
    --one-process | --env-a | --env-b | --also)
      echo "ab_bench: $1 goes before DEFS_A" >&2; usage ;;
    *) bench_args+=("$1"); shift ;;
  esac
done
if [ $has_tokens = 1 ]; then
  [[ "$tokens" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "ab_bench: --tokens '$tokens': counts separated by commas" >&2; usage; }
  if [ $one_process = 1 ]; then
    token_lists=("$tokens")
  else
    IFS=, read -r -a token_lists <<< "$tokens"
    if [ $has_max = 0 ]; then
      max=0
      for t in "${token_lists[@]}"; do ((t > max)) && max=$t; done
      bench_args+=(--max-tokens "$max")
    fi
  fi
elif [ $one_process = 0 ]; then
  echo "ab_bench: no --tokens: the bench's default counts run in one process" >&2
fi
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "ab_bench: no GPU visible (this compares kernel builds on a GPU machine)" >&2
  exit 77
fi
# CUDA objects compiled on the CPU machine (scripts/prebuild.sh), if carried.
scripts/prebuild.sh --unpack

build() { # name defs
  local dir=build_ab_$1 src=. macros=$2 key=$2 bdir=build_ab_$1
  if [[ "$2" == @* ]]; then # "@DIR [MACROS]": another source tree, built from inside it
    read -r src macros <<< "${2#@}"
    [ -f "$src/Makefile" ] || { echo "ab_bench: no source tree at '$src'" > "$OUT/ab_build_$1.log"; return 1; }
    # make cannot tell what changed in DIR (an archive's files carry the
    # commit's time), so the build is reused only for the same content.
    key="$2 $(cd "$src" && find . -type f ! -path './build*' -print0 | sort -z | xargs -0 md5sum | md5sum | cut -c1-32)"
    bdir=$PWD/$dir
  fi
  if [ "$(cat "$dir/.nvcc_defs" 2> /dev/null)" != "$key" ]; then rm -rf "$dir"; fi
  mkdir -p "$dir" && printf '%s' "$key" > "$dir/.nvcc_defs"
  make -C "$src" -j"$jobs" BUILD="$bdir" NVCC="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc $macros" "$bdir/megamoe" \
    > "$OUT/ab_build_$1.log" 2>&1
}
# A build whose macros an earlier one has (e.g. "" "" --env-b V=X: one
# build under two settings) runs that build's binary: built once.
pids=()
bin_of=()
own=()
for ((i = 0; i < ${#names[@]}; ++i)); do
  bin_of[$i]=./build_ab_${names[$i]}/megamoe
  pids[$i]=0 # not built here
  for ((j = 0; j < i; ++j)); do
    if [ "${defs_of[$j]}" == "${defs_of[$i]}" ]; then bin_of[$i]=${bin_of[$j]}; continue 2; fi
  done
  own+=("$i")
done
jobs=$(( $(nproc) / ${#own[@]} ))
[ "$jobs" -ge 1 ] || jobs=1
for i in "${own[@]}"; do
  build "${names[$i]}" "${defs_of[$i]}" &
  pids[$i]=$!
done
ok=1
for ((i = 0; i < ${#names[@]}; ++i)); do
  [ "${pids[$i]}" = 0 ] && continue
  wait "${pids[$i]}" || {
    echo "build ${names[$i]^^} (${defs_of[$i]}) failed: $OUT/ab_build_${names[$i]}.log"
    ok=0
  }
done
[ $ok = 1 ] || exit 1

run() { # index env...: one bench process per entry of token_lists
  local name=${names[$1]} defs=${defs_of[$1]} bin=${bin_of[$1]} toks
  shift
  for toks in "${token_lists[@]}"; do
    echo "== build $name (${defs:-default}${*:+; $*})${toks:+ tokens $toks}" | tee -a "$OUT/ab_bench.log"
    env "$@" timeout "${AB_TIMEOUT:-300}" "$bin" bench ${bench_args[@]+"${bench_args[@]}"} \
        ${toks:+--tokens "$toks"} 2>&1 |
      tee -a "$OUT/ab_bench.log" |
      grep -E "^(staged|split|fused)|^  clocks |^clocks:|^  timeline |SM MHz" || return 1
  done
}
rc=0
# Where this run's rows start in the log (a second A/B in the same OUT appends).
log_start=$(stat -c %s "$OUT/ab_bench.log" 2> /dev/null || echo 0)
for ((i = 0; i < rounds; ++i)); do
  # A B (C ...), then (... C) B A: no build always runs first or last.
  order=()
  for ((k = 0; k < ${#names[@]}; ++k)); do
    if ((i % 2 == 0)); then order+=("$k"); else order=("$k" "${order[@]}"); fi
  done
  for k in "${order[@]}"; do
    case "${names[$k]}" in
      a) run "$k" ${env_a[@]+"${env_a[@]}"} || rc=1 ;;
      b) run "$k" ${env_b[@]+"${env_b[@]}"} || rc=1 ;;
      *) run "$k" || rc=1 ;;
    esac
  done
done
# The medians per arm and token count, each build against A, with each
# build's clock (scripts/ab_summary.py; also in $OUT/ab_summary.txt).
for ((k = 1; k < ${#names[@]}; ++k)); do
  echo "== summary (A: ${defs_a:-default}; B = build ${names[$k]}: ${defs_of[$k]:-default})" |
    tee -a "$OUT/ab_summary.txt"
  tail -c +$((log_start + 1)) "$OUT/ab_bench.log" | python3 scripts/ab_summary.py /dev/stdin "${names[$k]}" 2>&1 |
    tee -a "$OUT/ab_summary.txt"
done
exit $rc
