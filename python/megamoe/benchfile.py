"""The benchmark's row files: what `megamoe bench --csv/--json` writes
(bench/bench_report.h), what `python -m megamoe.bench` writes too and what
`python -m megamoe.plot` reads.

One row per (arm, tokens per rank, experts per rank) cell: COLUMNS, then one
vs_<arm> column per arm of the run (the row's µs over that arm's µs in the
same cell; below 1: faster). A value not known is an empty CSV field, null in
JSON, None here. floor_us is the largest known floor and x_floor = us /
floor_us; the writers derive both (and the ratios) from the rest. The floors
are at the rates in fp8_tflops and hbm_read_gbs, measured on the GPU or the
design rates (rates: "measured" or "design"; bench/bench_rates.h).
"""

import csv
import json
import math
import os

# The columns after "arm", in the order the C writer uses (bench/bench_report.c kCols).
INT_COLUMNS = ("ranks", "tokens_per_rank", "experts_per_rank", "hidden", "intermediate", "top_k", "group")
FLOOR_COLUMNS = ("floor_compute_us", "floor_hbm_us", "floor_nvlink_us")
RATE_COLUMNS = ("fp8_tflops", "hbm_read_gbs", "rates")  # what the floors assume
COLUMNS = ("arm",) + INT_COLUMNS + ("us", "tflops") + FLOOR_COLUMNS + \
    ("floor_us", "x_floor", "nvl_gbs", "symm_mib", "workspace_mib") + RATE_COLUMNS
TEXT_COLUMNS = ("arm", "rates")
CELL = ("tokens_per_rank", "experts_per_rank")  # what makes a cell, within one run
# Columns added after row files were first written, with the value those files meant.
LATER_COLUMNS = {"group": 128}
# The rates of files written before the rate columns: the design rates,
# wherever a row has floors (the CPU reference's rows have none).
DESIGN_RATES = {"fp8_tflops": 1458.0, "hbm_read_gbs": 4470.0, "rates": "design"}


def _value(text):
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        return float(text)


def read_rows(path):
    """The rows of a CSV or JSON row file (either format, told by its first
    character), as dicts of str / int / float / None. OSError when it cannot
    be read; ValueError (saying why, not naming the file) when it is not a
    row file."""
    try:
        with open(path) as f:
            text = f.read()
        if text.lstrip().startswith("{"):
            rows = json.loads(text).get("rows")
        else:
            rows = [{k: (v or None if k in TEXT_COLUMNS else _value(v)) for k, v in row.items()}
                    for row in csv.DictReader(text.splitlines())]
    except ValueError as e:  # undecodable text, bad JSON, a field that is not a number
        raise ValueError(f"not a benchmark row file ({e})") from None
    if not isinstance(rows, list) or not rows:
        raise ValueError("not a benchmark row file (no rows)")
    missing = [c for c in COLUMNS if c not in rows[0] and c not in LATER_COLUMNS and c not in RATE_COLUMNS]
    if missing:
        raise ValueError(f"not a benchmark row file (no column {', '.join(missing)})")
    for r in rows:
        for c, v in LATER_COLUMNS.items():
            r.setdefault(c, v)
        if "rates" not in r:
            r.update(DESIGN_RATES if floor_of(r) is not None else dict.fromkeys(RATE_COLUMNS))
    return rows


def floor_of(row):
    """The row's floor: the largest known floor (None when none is known)."""
    known = [row.get(c) for c in FLOOR_COLUMNS if row.get(c) is not None]
    return max(known) if known else None


def arms_of(rows):
    """The arms of the rows, in order of first appearance."""
    return list(dict.fromkeys(r["arm"] for r in rows))


def complete(rows):
    """The rows with floor_us, x_floor and the vs_<arm> columns derived (new dicts)."""
    by_cell = {(r["arm"],) + tuple(r[c] for c in CELL): r for r in rows}
    out = []
    for r in rows:
        r = dict(r)
        r["floor_us"] = floor_of(r)
        r["x_floor"] = r["us"] / r["floor_us"] if r["floor_us"] else None
        for arm in arms_of(rows):
            other = by_cell.get((arm,) + tuple(r[c] for c in CELL))
            r["vs_" + arm] = r["us"] / other["us"] if other and other["us"] else None
        out.append(r)
    return out


def _text(v):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    return str(v) if isinstance(v, (int, str)) else f"{v:.6g}"


def write_rows(rows, csv_path=None, json_path=None, source="python -m megamoe.bench"):
    """Writes the rows (COLUMNS; the derived ones are derived here) to either
    file or both, replacing them."""
    rows = complete(rows)
    names = list(COLUMNS) + ["vs_" + a for a in arms_of(rows)]
    if csv_path:
        with open(csv_path, "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(names)
            for r in rows:
                w.writerow([_text(r.get(n)) for n in names])
    if json_path:
        clean = [{n: (None if _text(r.get(n)) == "" else r.get(n)) for n in names} for r in rows]
        with open(json_path, "w") as f:
            json.dump({"source": source, "rows": clean}, f, indent=None)
            f.write("\n")


def check_writable(path):
    """Raises ValueError naming what is wrong when path cannot be written (as
    the C tool's check: an existing regular file is left as it was, a new one
    is created and removed again)."""
    existed = os.path.exists(path)
    if existed and not os.path.isfile(path):
        raise ValueError(f"'{path}': not a regular file")
    try:
        with open(path, "a"):
            pass
    except OSError as e:
        raise ValueError(f"'{path}': cannot write it: {e.strerror}") from None
    if not existed:
        os.unlink(path)
    return path
