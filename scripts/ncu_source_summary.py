#!/usr/bin/env python3
"""Summarise ncu's SASS source page (warp stall samples per instruction) per kernel.

Input: the CSV of `ncu -i REPORT --page source --csv --print-source sass` (one block per
profiled kernel, each opened by a "Kernel Name" row). Output, per kernel: the samples and
instructions in total, the stall reasons, the samples by what the instruction does (the
wgmma chain's wait, its issue, the promotion's FFMAs, mbarrier waits, ...), and the top
instructions. A few kilobytes of text instead of megabytes of CSV, so a device call can bring
back the comparison of several kernels (the run tool returns at most 8 files).

Classes (by SASS opcode; a branch at most 3 instructions after an mbarrier try_wait is that
wait's retry loop):
  wgmma wait     WARPGROUP.DEPBAR / WARPGROUP.ARRIVE   (waiting for the tensor-core chain)
  wgmma issue    QGMMA / HGMMA
  mbarrier wait  SYNCS.PHASECHK (try_wait, test_wait) and the branch that retries it
                 (SYNCS.ARRIVE / EXCH, the arrivals and inits, are "other")
  ffma           FFMA / FMUL / FADD                      (the promotion, the epilogue's math)
  global mem     LDG / STG / LD / ST / RED / ATOM        (generic global accesses)
  shared mem     LDS / STS / LDSM / STSM
  barrier        BAR / B2R / NOP (named and CTA barriers: NOP carries a barrier's wait)
  other          everything else

Usage: ncu_source_summary.py SOURCE.csv [--top N]
"""
import csv
import sys
from collections import Counter

CLASSES = ("wgmma wait", "wgmma issue", "mbarrier wait", "ffma", "global mem", "shared mem", "barrier", "other")


def opcode(src):
    """The instruction's opcode without predicate and modifiers ("@!P0 BRA 0x.." -> "BRA")."""
    words = src.strip().split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def classify(src, after_trywait):
    """after_trywait: instructions since the last mbarrier try_wait (large: none near)."""
    op = opcode(src)
    if op == "WARPGROUP":
        return "wgmma wait"
    if op in ("QGMMA", "HGMMA"):
        return "wgmma issue"
    if (op == "SYNCS" and "PHASECHK" in src) or (op == "BRA" and after_trywait <= 3):
        return "mbarrier wait"
    if op in ("FFMA", "FMUL", "FADD"):
        return "ffma"
    if op in ("LDG", "STG", "LD", "ST", "RED", "REDG", "ATOM", "ATOMG"):
        return "global mem"
    if op in ("LDS", "STS", "LDSM", "STSM"):
        return "shared mem"
    if op in ("BAR", "B2R", "NOP"):
        return "barrier"
    return "other"


def kernels(rows):
    """(name, header, data rows) for each kernel block of the CSV."""
    i = 0
    while i < len(rows):
        if rows[i] and rows[i][0] == "Kernel Name":
            name = rows[i][1] if len(rows[i]) > 1 else "?"
            header = rows[i + 1]
            j = i + 2
            while j < len(rows) and not (rows[j] and rows[j][0] == "Kernel Name"):
                j += 1
            yield name, header, [r for r in rows[i + 2 : j] if len(r) == len(header)]
            i = j
        else:
            i += 1


def summarise(name, header, data, top):
    col = {h: k for k, h in enumerate(header)}
    src, smp, exe = col["Source"], col["Warp Stall Sampling (All Samples)"], col["Instructions Executed"]
    stall_cols = [k for k, h in enumerate(header) if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(int(r[smp]) for r in data) or 1
    executed = sum(int(r[exe]) for r in data)
    print(f"== {name[:160]}")
    print(f"   {len(data)} instructions, {executed} warp instructions executed, {total} samples")
    stalls = Counter({header[k][6:]: sum(int(r[k]) for r in data) for k in stall_cols})
    print("   stalls: " + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in stalls.most_common(8)))
    by_class = Counter()
    after_trywait = 1 << 30
    for r in data:
        after_trywait = 0 if "TRYWAIT" in r[src] else after_trywait + 1
        by_class[classify(r[src], after_trywait)] += int(r[smp])
    print("   samples by class: " + ", ".join(f"{c} {100 * by_class[c] / total:.1f}%" for c in CLASSES))
    print(f"   top {top} instructions (index, samples, share, executed, source, top stalls):")
    order = sorted(range(len(data)), key=lambda k: -int(data[k][smp]))[:top]
    for k in sorted(order):
        r = data[k]
        reasons = sorted(((int(r[c]), header[c][6:]) for c in stall_cols if int(r[c]) > 0), reverse=True)[:2]
        why = " ".join(f"{n}:{v}" for v, n in reasons)
        print(f"   {k:6d} {int(r[smp]):7d} {100 * int(r[smp]) / total:5.2f}% {int(r[exe]):10d}  {r[src].strip()[:56]:56s} {why}")


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    top = int(argv[argv.index("--top") + 1]) if "--top" in argv else 25
    with open(argv[1], newline="") as f:
        rows = list(csv.reader(f))
    found = False
    for name, header, data in kernels(rows):
        found = True
        summarise(name, header, data, top)
    if not found:
        print(f"{argv[1]}: no kernel in this file (expected ncu --page source --csv output)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
