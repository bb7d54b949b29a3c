#!/usr/bin/env python3
"""The medians of an A/B run of scripts/ab_bench.sh, one line per (arm, tokens).

Input: ab_bench.sh's log ($OUT/ab_bench.log): each bench process is opened by a header
"== build a (DEFS...) tokens N" (or "== build b ..."), then the bench's rows ("fused  2048
1067.6 ...": arm, tokens per rank, µs) and, with --timeline, their clock lines ("  SM MHz fused
T 2048 (rank 0, the timed forwards, ...): 1813 median (...)"). Output: per arm and token count,
each build's median µs over its runs with the runs themselves, B's change against A in percent,
and each build's median SM clock (the clock moves the mid-size times by several percent:
docs/PERF.md, twenty-first session; read a change below the clocks' own difference as noise).
This is the table the sessions used to compute by hand.

With more builds (ab_bench.sh --also: builds c, d, ...), BUILD names the one compared with A
(default b); the columns keep their names ("B us", "B vs A").

Usage: ab_summary.py AB_BENCH.LOG [BUILD]
Exit 0, 1 when the log holds no bench row of both builds, 2 on a bad command line.
"""
import re
import sys
from statistics import median

HEADER = re.compile(r"^== build ([a-z]) ")
ROW = re.compile(r"^(staged|split|fused)\s+(\d+)\s+([0-9.]+)\s")
CLOCK = re.compile(r"^\s+SM MHz (staged|split|fused) T (\d+) \(rank \d+, the timed forwards[^:]*: (\d+) median")


def parse(lines):
    """{(arm, tokens): {"a": [µs...], "b": [...], "a_mhz": [...], "b_mhz": [...]}}."""
    cells = {}
    build = None
    for line in lines:
        m = HEADER.match(line)
        if m:
            build = m.group(1)
            continue
        if build is None:
            continue
        m = ROW.match(line)
        if m:
            cells.setdefault((m.group(1), int(m.group(2))), {}).setdefault(build, []).append(float(m.group(3)))
            continue
        m = CLOCK.match(line)
        if m:
            cells.setdefault((m.group(1), int(m.group(2))), {}).setdefault(build + "_mhz", []).append(int(m.group(3)))
    return cells


def summary(cells, other="b"):
    """The table of build `other` against build a."""
    order = {"staged": 0, "split": 1, "fused": 2}
    out = ["arm     tokens      A us      B us   B vs A   SM MHz A / B   runs A | runs B"]
    for arm, tokens in sorted(cells, key=lambda k: (order[k[0]], k[1])):
        c = cells[(arm, tokens)]
        if not c.get("a") or not c.get(other):
            continue
        a, b = median(c["a"]), median(c[other])
        mhz = "-"
        if c.get("a_mhz") and c.get(other + "_mhz"):
            mhz = f"{median(c['a_mhz']):.0f} / {median(c[other + '_mhz']):.0f}"
        runs = " ".join(f"{x:.1f}" for x in c["a"]) + " | " + " ".join(f"{x:.1f}" for x in c[other])
        out.append(f"{arm:7} {tokens:6} {a:9.1f} {b:9.1f} {100.0 * (b / a - 1.0):+7.1f} %  {mhz:>13}   {runs}")
    return out


def main(argv):
    if len(argv) not in (2, 3) or (len(argv) == 3 and not re.fullmatch(r"[b-z]", argv[2])):
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    with open(argv[1], errors="replace") as f:
        lines = summary(parse(f), argv[2] if len(argv) == 3 else "b")
    if len(lines) == 1:
        print(f"ab_summary: {argv[1]}: no bench row of both builds", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
