#!/usr/bin/env bash
# Compiles the CUDA objects of one or more builds on the CPU machine and packs
# them into one archive that a GPU-machine call carries, so the call's time
# goes to linking (seconds) instead of nvcc (60-240 s per tree there, out of
# the session's device time).
#
#   scripts/prebuild.sh NAME=MACROS ...          (on the CPU machine)
#   scripts/prebuild.sh --unpack                 (on the GPU machine, first)
#
# NAME=MACROS: the objects of `make BUILD=build_ab_NAME NVCC="nvcc MACROS"`
# (NAME `build`: the Makefile's own build/), e.g. a= b=-DMM_EARLY_COMBINE=1
# "tl=-DMM_FUSED_MATH_TIMELINE=1 -DMM_GEMM_WAIT_TIMER=1". Each directory gets
# the .nvcc_defs that scripts/ab_bench.sh and scripts/device_run.sh read, so
# they reuse it. The archive is _prebuilt.tgz (git-ignored): pass
# carry: ["_prebuilt.tgz"] to the device call, and run
# `scripts/prebuild.sh --unpack` before the builds there.
#
# Why this is safe:
# - Only objects of .cu sources are packed: every host object and every link
#   is made on the GPU machine, against its NCCL. A .cu object whose sources
#   use NCCL (the .cu or a project header its .d file lists names nccl* or
#   NCCL_*: today peers.cu; the GPU tests that take a rank context are .c) is left out
#   too: compiled there.
# - The archive records a hash of the source tree (Makefile, include, src,
#   ref, bench, tests, tools); --unpack compares it with the tree it runs in
#   and unpacks nothing on a mismatch (the builds then compile everything, as
#   before), so an edit after the prebuild cannot run stale kernels. A
#   directory here is reused only for the same macros, Makefile and nvcc.
# - The nvcc of both machines is the same release (CUDA 13.0, DESIGN.md);
#   --unpack checks `nvcc --version` against the one recorded.
# - The unpacked objects are touched after the sources are in place, so make
#   takes them as up to date whatever times the copy gave the files; --unpack
#   prints how many objects make would still compile there.
# - ptxas's report (registers, spills) is not in the call's build log for
#   these objects: scripts/device_run.sh prints cuobjdump's instead.
set -uo pipefail
cd "$(dirname "$0")/.."
archive=_prebuilt.tgz
CU=${CUDA_HOME:-/usr/local/cuda}

# The source tree's hash: the files the GPU machine's copy holds (git's
# tracked and untracked, not ignored) where git is (here), every file there
# (no .git); an ignored leftover on either side only makes the archive unused.
hashed_dirs=(Makefile include src ref bench tests tools)
tree_hash() {
  if [ -d .git ]; then
    git ls-files -z -co --exclude-standard -- "${hashed_dirs[@]}"
  else
    find "${hashed_dirs[@]}" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0
  fi | LC_ALL=C sort -z | xargs -0 md5sum | md5sum | cut -c1-32
}
nvcc_release() { "$CU/bin/nvcc" --version | grep -o 'release [0-9.]*, V[0-9.]*'; }
# The CUDA objects of a build directory (the .cu sources the Makefile compiles).
cu_objects() { find src/device tests/gpu bench -name '*.cu' | sort | sed -e "s#^#$1/#" -e 's#\.cu$#.o#'; }

if [ "${1:-}" = "--unpack" ]; then
  [ -f "$archive" ] || { echo "prebuild: no $archive here: every object compiles on this machine"; exit 0; }
  tmp=$(mktemp -d)
  tar xzf "$archive" -C "$tmp" || { echo "prebuild: $archive unreadable: not used"; rm -rf "$tmp"; exit 0; }
  want=$(cat "$tmp/.prebuilt_tree") have=$(tree_hash)
  if [ "$want" != "$have" ]; then
    echo "prebuild: the archive was built from another source tree ($want, here $have): not used"
  elif [ "$(cat "$tmp/.prebuilt_nvcc")" != "$(nvcc_release)" ]; then
    echo "prebuild: the archive's nvcc ($(cat "$tmp/.prebuilt_nvcc")) is not this one ($(nvcc_release)): not used"
  else
    for d in "$tmp"/build*; do
      name=$(basename "$d")
      # Unpacked by an earlier call on this machine: its links are kept.
      if [ "$(cat "$name/.prebuilt_tree" 2> /dev/null)" = "$want" ] &&
        [ "$(cat "$name/.nvcc_defs" 2> /dev/null)" = "$(cat "$d/.nvcc_defs")" ]; then
        echo "prebuild: $name already unpacked"
        continue
      fi
      rm -rf "$name" && mv "$d" "$name"
      find "$name" -name '*.o' -exec touch {} +
      printf '%s' "$want" > "$name/.prebuilt_tree"
      # What make would still compile there (0 unless something is off: the
      # call's log then says so): the objects of the .cu sources.
      stale=$(make -n BUILD="$name" $(cu_objects "$name") 2> /dev/null | grep -c -e '-c .*\.cu ')
      echo "prebuild: $name ($(cat "$name/.nvcc_defs")): $(find "$name" -name '*.o' | wc -l) CUDA objects unpacked," \
        "$stale to compile here"
    done
  fi
  rm -rf "$tmp"
  exit 0
fi

[ $# -ge 1 ] || { echo "usage: scripts/prebuild.sh NAME=MACROS ... | --unpack" >&2; exit 2; }
# A directory is reused only for the same macros, Makefile and nvcc (make
# tracks none of them); the tree is hashed before and after the compiles, so
# an edit meanwhile cannot pack old objects under the new tree's hash.
tree_before=$(tree_hash)
build_key() { printf '%s|%s|%s' "$1" "$(md5sum < Makefile | cut -c1-32)" "$(nvcc_release)"; }
dirs=()
for spec in "$@"; do
  [[ "$spec" == *=* ]] || { echo "prebuild: '$spec' is not NAME=MACROS" >&2; exit 2; }
  name=${spec%%=*} macros=${spec#*=}
  [[ "$name" =~ ^[a-z0-9_]+$ ]] || { echo "prebuild: NAME '$name': lower-case letters, digits, _" >&2; exit 2; }
  [[ "$macros" != @* ]] || { echo "prebuild: '$spec': macros only (ab_bench's @DIR trees build there)" >&2; exit 2; }
  dir=build_ab_$name
  [ "$name" = build ] && dir=build
  if [ "$(cat "$dir/.prebuild_key" 2> /dev/null)" != "$(build_key "$macros")" ]; then rm -rf "$dir"; fi
  mkdir -p "$dir" && printf '%s' "$macros" > "$dir/.nvcc_defs" && build_key "$macros" > "$dir/.prebuild_key"
  echo "prebuild: $dir ($macros)"
  make -j"$(nproc)" BUILD="$dir" NVCC="$CU/bin/nvcc $macros" $(cu_objects "$dir") > "$dir/.prebuild.log" 2>&1 ||
    { tail -20 "$dir/.prebuild.log"; echo "prebuild: $dir failed" >&2; exit 1; }
  dirs+=("$dir")
done
if [ "$(tree_hash)" != "$tree_before" ]; then
  rm -rf "${dirs[@]}"
  echo "prebuild: the source tree changed during the compiles: nothing packed (run it again)" >&2
  exit 1
fi
# Whether an object's sources use NCCL: the .cu and the project headers its
# .d lists, except the public header (its NCCL types are opaque handles and
# the 128-byte unique id, the same in every NCCL release). A file grep cannot
# read counts as a use (grep's status 2).
uses_nccl() {
  local files
  files=$(sed -e 's/\\$//' -e 's/^[^:]*://' "$1" | tr ' ' '\n' | grep -v -e '^/' -e '^$' -e ':$' -e '^include/megamoe\.h$' | sort -u)
  [ -n "$files" ] || return 1
  grep -q -E '\bnccl[A-Z_]|\bNCCL_' $files 2> /dev/null
  [ $? -ne 1 ]
}
stage=$(mktemp -d)
printf '%s\n' "$tree_before" > "$stage/.prebuilt_tree"
nvcc_release > "$stage/.prebuilt_nvcc"
for dir in "${dirs[@]}"; do
  mkdir -p "$stage/$dir" && cp "$dir/.nvcc_defs" "$stage/$dir/"
  for o in $(cu_objects "$dir"); do
    uses_nccl "${o%.o}.d" && continue # compiled against the GPU machine's NCCL
    mkdir -p "$stage/$(dirname "$o")" && cp -p "$o" "$stage/$(dirname "$o")/"
    # The .d without its absolute paths: the system headers (nccl.h here is
    # CUDA's, elsewhere there) are covered by the nvcc check, and a path
    # missing there would have make rebuild the object (-MP's empty rule).
    sed -E 's#(^|[[:space:]])/[^[:space:]]+#\1#g' "${o%.o}.d" > "$stage/${o%.o}.d"
  done
done
tar czf "$archive.part" -C "$stage" . && mv "$archive.part" "$archive" && rm -rf "$stage"
echo "prebuild: $archive $(du -h "$archive" | cut -f1) (${dirs[*]}); carry it and run scripts/prebuild.sh --unpack first"
