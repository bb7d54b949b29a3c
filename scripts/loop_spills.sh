#!/usr/bin/env bash
# Where a build's spills land, read on the CPU machine before any GPU run:
# compiles one .cu to a cubin with the given nvcc macros, disassembles it,
# and prints per kernel ptxas's spill bytes and the local loads and stores
# (LDL/STL) inside two spans: from the first to the last QGMMA (the math
# warps' K loops) and from the first to the last UTMALDG (the producer's
# tile loads). An option whose spills stay outside both spans (the same
# counts as the default build's) does not put a cost into the loops that
# its A/B would then mistake for its own effect; one that moves them
# there does (docs/PERF.md, thirty-sixth session: a routing option's
# pointer, live across a grid barrier, moved six reloads into the fused K
# loops). The spans are address ranges, so they also hold whatever code
# ptxas placed between the loops: compare with the default, never read a
# count alone.
#
#   scripts/loop_spills.sh SRC.cu [MACROS...]     e.g.
#   scripts/loop_spills.sh src/device/fused/fused_g128_large.cu -DMM_FUSED_MATH_TIMELINE=1
#
# NVDISASM: nvdisasm to use (default: the CUDA toolkit's; pip's
# nvidia-cuda-nvdisasm works where the toolkit has none). Scratch files in
# a temporary directory, removed at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: scripts/loop_spills.sh SRC.cu [MACROS...]" >&2; exit 2; }
src=$1
shift
CU=${CUDA_HOME:-/usr/local/cuda}
NVDISASM=${NVDISASM:-$CU/bin/nvdisasm}
command -v "$NVDISASM" > /dev/null 2>&1 || { echo "loop_spills: no nvdisasm at $NVDISASM (set NVDISASM)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The Makefile's device flags (NVFLAGS, ARCH, the library's include paths).
"$CU/bin/nvcc" "$@" -O3 -lineinfo -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
  -Iinclude -Isrc -Isrc/device -Iref -I"$CU/include" -Xptxas -v -cubin -o "$tmp/k.cubin" "$src" 2> "$tmp/ptxas" ||
  { cat "$tmp/ptxas" >&2; exit 1; }
"$NVDISASM" -c "$tmp/k.cubin" > "$tmp/k.s" || exit 1
echo "$src $*"
grep -E "spill stores" "$tmp/ptxas" | sed -E 's/^ +/  ptxas: /'
# Per kernel (a `.text.` header starts one): the spill instructions between
# the first and the last instruction that matches each pattern.
awk '
  /^\/\/-+ \.text\./ { k++; name[k] = $0; sub(/.*\.text\./, "", name[k]); sub(/ -+$/, "", name[k]) }
  /^[ \t]+\/\*[0-9a-f]+\*\// { n[k]++; ins[k, n[k]] = $0 }
  function span(kk, pat,    i, first, last, c) {
    first = 0; last = 0
    for (i = 1; i <= n[kk]; i++) if (ins[kk, i] ~ pat) { if (!first) first = i; last = i }
    c = 0
    for (i = first; i <= last && first; i++) if (ins[kk, i] ~ /[^A-Z](STL|LDL)[. ]/) c++
    return sprintf("%d spill instructions in %d", c, first ? last - first + 1 : 0)
  }
  END {
    for (kk = 1; kk <= k; kk++) {
      printf "  kernel %d (%s)\n", kk, substr(name[kk], 1, 90)
      printf "    QGMMA span (math K loops):     %s\n", span(kk, "QGMMA|HGMMA")
      printf "    UTMALDG span (producer loads): %s\n", span(kk, "UTMALDG")
    }
  }' "$tmp/k.s"
