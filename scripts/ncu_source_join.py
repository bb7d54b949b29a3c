#!/usr/bin/env python3
"""Join ncu's per-instruction samples with the compiler's inline chains: samples per role.

Input: the CSV of `ncu -i REPORT --page source --csv --print-source sass` (one block per profiled
kernel, as scripts/ncu_source_summary.py reads) and the output of `nvdisasm -gi` for the cubin(s)
the kernel came from (the same build: -lineinfo). The kernel's instructions are matched to one
function of the disassembly by count and opcode sequence (the addresses are offsets there), and
every instruction gets its inline chain (`//## File "...", line N inlined at ...` lines, innermost
first). That is how the thirtieth session found the fused math loop's stack reloads
(docs/PERF.md): a kernel whose roles are inlined into one function shows, per role, where its
warps stall.

Output, for the kernel (--kernel: a substring of its name; default the CSV's first):
  samples per group: the outermost frame in --group-file (default: the kernel-level frame of each
      chain, i.e. the role call's line when the roles are inlined), with their top stall reasons;
      with --within FILE:LINE (e.g. a role's call line), only the instructions inlined there,
      grouped by the frame just inside it (the lines of the role's function);
  local memory (LDL/STL: spills) per group: instructions, samples, and the L2 sectors the
      profile counted for them ("L2 Theoretical Sectors Local", when the CSV has it: reloads
      that missed L1);
  the top instructions: samples, group, innermost frame, top stalls.

Usage: ncu_source_join.py SOURCE.csv SASS_GI.txt [SASS_GI.txt ...] [--kernel SUBSTR]
       [--group-file NAME | --within FILE:LINE] [--top N]
"""
import csv
import re
import sys
from collections import Counter, defaultdict

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from ncu_source_summary import kernels, opcode  # noqa: E402

CHAIN_RE = re.compile(r'"([^"]+)", line (\d+)')
FUNC_RE = re.compile(r"^\s*\.text\.(\S+):")
INSTR_RE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def functions(path):
    """{name: [(offset, instruction text, chain)]}: chain = [(file, line), ...] innermost first."""
    funcs, cur, pending, chain = {}, None, [], []
    with open(path, errors="replace") as f:
        for line in f:
            m = FUNC_RE.match(line)
            if m:
                cur = funcs.setdefault(m.group(1), [])
                pending, chain = [], []
                continue
            if cur is None:
                continue
            if line.strip().startswith("//## File"):
                frames = CHAIN_RE.findall(line)
                if frames:
                    pending.append((frames[0][0].rsplit("/", 1)[-1], int(frames[0][1])))
                continue
            m = INSTR_RE.search(line)
            if m:
                if pending:
                    chain, pending = pending, []
                cur.append((int(m.group(1), 16), m.group(2), chain))
    return funcs


def match(data, src_col, funcs):
    """The function whose instructions are the kernel's: same count, most equal opcodes."""
    best, best_score = None, -1
    want = [opcode(r[src_col]) for r in data]
    for name, instrs in funcs.items():
        if len(instrs) != len(want):
            continue
        score = sum(1 for (_, text, _), op in zip(instrs, want) if opcode(text) == op)
        if score > best_score:
            best, best_score = name, score
    return best, best_score


def group_of(chain, group_file, within=None):
    """The instruction's group, or None when --within excludes it."""
    if within:
        for k, fr in enumerate(chain):
            if fr == within:
                return f"{chain[k - 1][0]}:{chain[k - 1][1]}" if k > 0 else f"{fr[0]}:{fr[1]}"
        return None
    if not chain:
        return "?"
    if group_file:
        frames = [fr for fr in chain if fr[0] == group_file]
        if frames:
            return f"{frames[-1][0]}:{frames[-1][1]}"
    return f"{chain[-1][0]}:{chain[-1][1]}"


def main(argv):
    args, opts = [], {}
    i = 1
    while i < len(argv):
        if argv[i] in ("--kernel", "--group-file", "--within", "--top"):
            if i + 1 >= len(argv):
                print(f"{argv[i]} needs a value", file=sys.stderr)
                return 2
            opts[argv[i]] = argv[i + 1]
            i += 2
        else:
            args.append(argv[i])
            i += 1
    if len(args) < 2:
        print(__doc__.strip().splitlines()[-2] + "\n" + __doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    top = int(opts.get("--top", "20"))
    within = None
    if "--within" in opts:
        f, _, ln = opts["--within"].rpartition(":")
        if not f or not ln.isdigit():
            print(f"--within {opts['--within']}: FILE:LINE", file=sys.stderr)
            return 2
        within = (f, int(ln))
    with open(args[0], newline="") as f:
        rows = list(csv.reader(f))
    chosen = None
    for name, header, data in kernels(rows):
        if "--kernel" not in opts or opts["--kernel"] in name:
            chosen = (name, header, data)
            break
    if not chosen:
        print(f"{args[0]}: no kernel{' matching ' + opts['--kernel'] if '--kernel' in opts else ''}", file=sys.stderr)
        return 1
    name, header, data = chosen
    col = {h: k for k, h in enumerate(header)}
    src, smp = col["Source"], col["Warp Stall Sampling (All Samples)"]
    local = col.get("L2 Theoretical Sectors Local")
    stall_cols = [k for k, h in enumerate(header) if h.startswith("stall_") and "Not Issued" not in h]
    funcs = {}
    for path in args[1:]:
        funcs.update(functions(path))
    fname, score = match(data, src, funcs)
    if fname is None:
        print(f"no function of {len(data)} instructions in the disassembly (another build?)", file=sys.stderr)
        return 1
    instrs = funcs[fname]
    if score < len(data):
        print(f"warning: {len(data) - score} of {len(data)} opcodes differ from {fname[:60]}", file=sys.stderr)
    total = sum(int(r[smp] or 0) for r in data) or 1
    samples, stalls = Counter(), defaultdict(Counter)
    spills = defaultdict(lambda: [0, 0, 0])  # instructions, samples, L2 sectors
    top_rows = []
    for r, (_, text, chain) in zip(data, instrs):
        g = group_of(chain, opts.get("--group-file"), within)
        if g is None:
            continue
        s = int(r[smp] or 0)
        samples[g] += s
        for k in stall_cols:
            stalls[g][header[k][6:]] += int(r[k] or 0)
        if opcode(text) in ("LDL", "STL"):
            sp = spills[g]
            sp[0] += 1
            sp[1] += s
            sp[2] += int(r[local] or 0) if local is not None and r[local] not in ("", "-") else 0
        inner = f"{chain[0][0]}:{chain[0][1]}" if chain else "?"
        top_rows.append((s, g, inner, r[src].strip()[:50], r))
    print(f"== {name[:140]}")
    print(f"   {len(data)} instructions matched to {fname[:80]}, {total} samples")
    scope = sum(samples.values())
    if within:
        print(f"   inlined at {within[0]}:{within[1]}: {scope} samples ({100 * scope / total:.1f}%), by the frame inside it:")
    else:
        print("   samples per group (group: the outermost frame" +
              (f" in {opts['--group-file']}" if "--group-file" in opts else "") + "):")
    for g, s in samples.most_common():
        why = ", ".join(f"{n} {v}" for n, v in stalls[g].most_common(3) if v)
        print(f"   {g:32s} {s:8d} {100 * s / total:5.1f}%  {why}")
    print("   local memory (spills) per group: instructions, samples, L2 sectors:")
    for g in sorted(spills, key=lambda k: -spills[k][1]):
        n, s, sec = spills[g]
        print(f"   {g:32s} {n:5d} {s:8d} {sec:10d}")
    print(f"   top {top} instructions (samples, group, innermost frame, source, top stalls):")
    for s, g, inner, text, r in sorted(top_rows, key=lambda t: -t[0])[:top]:
        reasons = sorted(((int(r[k] or 0), header[k][6:]) for k in stall_cols if int(r[k] or 0) > 0), reverse=True)[:2]
        print(f"   {s:7d} {g:24s} {inner:28s} {text:50s} " + " ".join(f"{n}:{v}" for v, n in reasons))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
