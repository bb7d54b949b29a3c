"""The benchmark's files and tools without a GPU: the row files the C tool
writes (its CPU-reference mode) read by megamoe.benchfile, the Python writer
in the same format, `python -m megamoe.plot` on both (skipped without
matplotlib), and `python -m megamoe.bench`'s options and its no-GPU exit."""

import csv
import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import megamoe
from megamoe import bench, benchfile, plot

ROOT = Path(__file__).resolve().parents[2]
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
needs_matplotlib = pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib not installed")


def _tool():
    """build/megamoe next to the library under test (else the checkout's)."""
    lib = os.environ.get("MEGAMOE_LIBRARY")
    for path in ([Path(lib).parent / "megamoe"] if lib else []) + [ROOT / "build" / "megamoe"]:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    pytest.skip("the megamoe tool is not built (make all)")


def _env():
    """This package and library for the child processes; no GPU."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", MEGAMOE_LIBRARY=megamoe.library_path())
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(megamoe.__file__).parents[1]),
                                                      os.environ.get("PYTHONPATH")]))
    return env


def _run(*args, timeout=120):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, env=_env(), timeout=timeout)


@pytest.fixture(scope="module")
def tool_rows(tmp_path_factory):
    """The C tool's CPU-reference rows at T 8 and 16 on 2 ranks, as CSV and JSON."""
    d = tmp_path_factory.mktemp("rows")
    out = _run(_tool(), "bench", "--tokens", "8,16", "--ranks", "2", "--csv", d / "b.csv", "--json", d / "b.json")
    assert out.returncode == 0, out.stderr
    return d / "b.csv", d / "b.json"


def _synthetic_rows(experts=(32,)):
    """Two arms with floors, as a GPU run has them (made-up numbers)."""
    rows = []
    for e in experts:
        for t in (64, 512, 4096):
            floors = {"floor_compute_us": t * 0.02, "floor_hbm_us": 90.0, "floor_nvlink_us": t * 0.01}
            for arm, us in (("staged", 2.0 * max(floors.values())), ("split", 1.5 * max(floors.values()))):
                rows.append(dict(arm=arm, ranks=8, tokens_per_rank=t, experts_per_rank=e, hidden=4096,
                                 intermediate=2048, top_k=6, group=128, us=us,
                                 tflops=2.0 * t * 6 * 3 * 4096 * 2048 / us * 1e-6,
                                 nvl_gbs=None, symm_mib=100.0, workspace_mib=50.0, fp8_tflops=1300.0,
                                 hbm_read_gbs=3000.0, rates="measured", **floors))
    return rows


# ---- row files ----------------------------------------------------------------

def test_the_c_rows_have_the_python_columns(tool_rows):
    csv_path, json_path = tool_rows
    with open(csv_path) as f:
        header = next(csv.reader(f))
    assert header == list(benchfile.COLUMNS) + ["vs_reference"]
    from_csv, from_json = benchfile.read_rows(csv_path), benchfile.read_rows(json_path)
    assert [r["tokens_per_rank"] for r in from_csv] == [8, 16]  # one row per cell, in order
    for a, b in zip(from_csv, from_json):
        assert a == b
        assert a["arm"] == "reference" and a["ranks"] == 2 and a["experts_per_rank"] == 4
        for name in ("us", "tflops", "symm_mib", "workspace_mib"):
            assert math.isfinite(a[name]) and a[name] > 0, name
        assert a["floor_us"] is None and a["x_floor"] is None  # the CPU has no floors
        assert [a[c] for c in benchfile.RATE_COLUMNS] == [None, None, None]  # nor their rates
        assert a["vs_reference"] == 1


def test_the_python_writer_derives_floor_and_ratios(tmp_path):
    rows = _synthetic_rows()
    benchfile.write_rows(rows, tmp_path / "p.csv", tmp_path / "p.json")
    for path in ("p.csv", "p.json"):
        back = benchfile.read_rows(tmp_path / path)
        assert len(back) == len(rows)
        for r, w in zip(back, rows):
            floor = max(w["floor_compute_us"], w["floor_hbm_us"], w["floor_nvlink_us"])
            assert r["floor_us"] == pytest.approx(floor, rel=1e-5)
            assert r["x_floor"] == pytest.approx(w["us"] / floor, rel=1e-5)
            assert r["vs_staged"] == pytest.approx(1.0 if r["arm"] == "staged" else 0.75, rel=1e-5)
            assert r["vs_split"] == pytest.approx(1.0 if r["arm"] == "split" else 4 / 3, rel=1e-5)
            assert r["nvl_gbs"] is None
            assert (r["fp8_tflops"], r["hbm_read_gbs"], r["rates"]) == (1300.0, 3000.0, "measured")


def test_read_rows_of_files_without_the_later_columns():
    """The row files written before the group column (docs/bench_*.csv) read
    with the quantization group they ran at."""
    docs = os.path.join(os.path.dirname(__file__), "..", "..", "docs")
    rows = benchfile.read_rows(os.path.join(docs, "bench_2026-12-01.csv"))
    assert rows and all(r["group"] == 128 for r in rows)
    # written before the rate columns: their floors were at the design rates
    assert all((r["fp8_tflops"], r["hbm_read_gbs"], r["rates"]) == (1458.0, 4470.0, "design") for r in rows)
    assert rows[0]["arm"] in ("staged", "split", "fused") and rows[0]["top_k"] == 6


def test_read_rows_refuses_other_files(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="no column arm"):
        benchfile.read_rows(tmp_path / "x.csv")
    (tmp_path / "x.json").write_text('{"rows": []}')
    with pytest.raises(ValueError, match="no rows"):
        benchfile.read_rows(tmp_path / "x.json")


# ---- the plot -----------------------------------------------------------------

def _is_png(path):
    data = Path(path).read_bytes()
    return len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"


@needs_matplotlib
def test_plot_of_the_tool_rows(tool_rows, tmp_path):
    for src in tool_rows:
        png = tmp_path / (src.stem + src.suffix.replace(".", "_") + ".png")
        out = _run(sys.executable, "-m", "megamoe.plot", src, "-o", png)
        assert out.returncode == 0, out.stderr
        assert "lines: reference" in out.stdout
        assert _is_png(png)


@needs_matplotlib
def test_plot_draws_each_arm_and_the_floor(tmp_path):
    rows = benchfile.complete(_synthetic_rows())
    assert plot.plot_rows(rows, tmp_path / "a.png") == ["staged", "split", "floor"]
    assert _is_png(tmp_path / "a.png")
    rows = benchfile.complete(_synthetic_rows(experts=(32, 48)))
    labels = plot.plot_rows(rows, tmp_path / "b.png")
    assert labels == ["staged, 32 experts/rank", "split, 32 experts/rank", "staged, 48 experts/rank",
                      "split, 48 experts/rank", "floor, 32 experts/rank", "floor, 48 experts/rank"]
    assert _is_png(tmp_path / "b.png")


def test_plot_without_matplotlib_says_so(tool_rows, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert plot.main([str(tool_rows[0]), "-o", str(tmp_path / "c.png")]) == 1
    assert "matplotlib is not installed" in capsys.readouterr().err
    assert not (tmp_path / "c.png").exists()


def test_plot_refuses_a_file_that_is_not_rows(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    out = _run(sys.executable, "-m", "megamoe.plot", tmp_path / "x.csv", "-o", tmp_path / "x.png")
    assert out.returncode == 2
    assert "argument file" in out.stderr and "not a benchmark row file" in out.stderr


# ---- python -m megamoe.bench --------------------------------------------------

def test_bench_options(tool_rows, tmp_path):
    a = bench.parse_args([])
    assert (a.tokens, a.arms, a.iters, a.rounds, a.max_tokens, a.no_bound) == (
        [64, 512, 2048, 8192], ["staged", "split", "fused"], 20, 3, 8192, False)
    assert bench.parse_args(["--no-bound"]).no_bound
    assert (a.hidden, a.intermediate, a.experts_per_rank, a.top_k) == (4096, 2048, 32, 6)
    a = bench.parse_args(["--model", "pro", "--tokens", "16,128", "--arms", "split", "--ranks", "2", "--iters", "5",
                          "--csv", str(tmp_path / "p.csv"), "--c-csv", str(tool_rows[0])])
    assert (a.hidden, a.experts_per_rank, a.experts_total, a.ranks, a.max_tokens) == (7168, 0, 384, 2, 128)
    assert a.csv == str(tmp_path / "p.csv") and not (tmp_path / "p.csv").exists()  # checked, not left behind
    assert [r["tokens_per_rank"] for r in a.c_rows] == [8, 16]


@pytest.mark.parametrize("args, names", [
    (["--tokens", "0"], "argument --tokens: 0: must be in [1, 1048576]"),
    (["--tokens", "64,,512"], "argument --tokens: '' is not a whole number"),
    (["--arms", "staged,bogus"], "argument --arms: 'staged,bogus': unknown arm 'bogus'"),
    (["--arms", "split,split"], "argument --arms: 'split,split': an arm given twice"),
    (["--ranks", "9"], "argument --ranks: 9: must be in [1, 8]"),
    (["--rounds", "0"], "argument --rounds: 0"),
    (["--model", "flash-rankk"], "argument --model: invalid choice: 'flash-rankk'"),
    (["--tokens", "64,512", "--max-tokens", "100"], "argument --max-tokens: 100 is below the --tokens point 512"),
    (["--csv", "/nonexistent-megamoe/b.csv"], "argument --csv: '/nonexistent-megamoe/b.csv': cannot write it"),
    (["--csv", "same.csv", "--json", "same.csv"], "argument --json: the same file as --csv"),
    (["--c-csv", "/nonexistent-megamoe/c.csv"], "argument --c-csv: '/nonexistent-megamoe/c.csv'"),
])
def test_bench_rejects_bad_options(args, names, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        bench.parse_args(args)
    assert e.value.code == 2
    assert names in capsys.readouterr().err


def test_c_cells_match_by_arm_and_shape(tool_rows):
    c_rows = benchfile.read_rows(tool_rows[0])
    row = dict(c_rows[1])
    assert bench._c_cell(c_rows, row) is c_rows[1]
    assert bench._c_cell(c_rows, dict(row, hidden=1024)) is None
    assert bench._c_cell(c_rows, dict(row, group=64)) is None
    assert bench._c_cell(c_rows, dict(row, arm="split")) is None
    assert bench._c_cell(None, row) is None


def test_point_rows_take_the_c_floors_and_print(tmp_path, capsys):
    """Rank 0's rows of a point (as the GPU run makes them) from made-up
    timings, beside a C run of the same cells (the Python writer's file)."""
    c_rows = _synthetic_rows()
    benchfile.write_rows(c_rows, tmp_path / "c.csv")
    c_rows = benchfile.read_rows(tmp_path / "c.csv")
    info = {"staged": {"symmetric_bytes": 3 << 20, "workspace_bytes": 5 << 20},
            "split": {"symmetric_bytes": 4 << 20, "workspace_bytes": 6 << 20}}
    flops = 2.0 * 600 * 3 * 4096 * 2048
    shape = (8, 32, 4096, 2048, 6, 128)
    got = bench.point_rows({"staged": 200.0, "split": 150.0}, shape, 512, flops, info, c_rows)
    assert [(r["arm"], r["us"], r["symm_mib"], r["workspace_mib"]) for r, _ in got] == \
        [("staged", 200.0, 3.0, 5.0), ("split", 150.0, 4.0, 6.0)]
    for r, c in got:
        assert c is not None and (c["arm"], c["tokens_per_rank"]) == (r["arm"], 512)
        assert r["tflops"] == pytest.approx(flops / (r["us"] * 1e-6) / 1e12)
        assert [r[f] for f in benchfile.FLOOR_COLUMNS] == [c[f] for f in benchfile.FLOOR_COLUMNS]
        assert [r[f] for f in benchfile.RATE_COLUMNS] == [1300.0, 3000.0, "measured"]  # the C row's
    alone = bench.point_rows({"split": 150.0}, (8, 48, 4096, 2048, 6, 128), 512, flops, info, c_rows)
    assert alone[0][1] is None and benchfile.floor_of(alone[0][0]) is None  # no C cell of that shape: no floors
    table = bench.Table(with_c=True)
    for r, c in got + alone:
        table.row(r, c)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["arm", "T/rank", "us"] and "py / C" in lines[0]
    staged_c = got[0][1]["us"]
    assert lines[1].split() == ["staged", "512", "200.0", f"{got[0][0]['tflops']:.1f}", "3.0", "5.0",
                                f"{200.0 / benchfile.floor_of(got[0][0]):.2f}", f"{staged_c:.1f}",
                                f"{got[0][1]['tflops']:.1f}", f"{200.0 / staged_c:.2f}"]
    assert lines[3].split()[-4:] == ["-", "-", "-", "-"]  # x floor and the C columns unknown


def test_bench_without_gpu_exits_4(tmp_path):
    out = _run(sys.executable, "-m", "megamoe.bench", "--tokens", "64", "--csv", tmp_path / "b.csv")
    assert out.returncode == 4, out.stderr
    assert "needs a GPU" in out.stderr
    assert out.stdout == "" and not (tmp_path / "b.csv").exists()
    out = _run(sys.executable, "-m", "megamoe.bench", "--iters", "0")  # the options are read first
    assert out.returncode == 2 and "argument --iters" in out.stderr
    out = _run(sys.executable, "-m", "megamoe.bench", "--help")
    assert out.returncode == 0 and "--c-csv" in out.stdout


# ---- scripts/ncu_source_summary.py (the device script's ncu-src step) -------

def _ncu_source_csv(path, kernels):
    """An ncu --page source --csv file: per kernel its name row, the header,
    one row per instruction (source, samples, executed, stall_barrier, stall_long_sb)."""
    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
              "Instructions Executed", "stall_barrier", "stall_long_sb", "stall_long_sb (Not Issued)"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        for name, instrs in kernels:
            w.writerow(["Kernel Name", name])
            w.writerow(header)
            for i, (src, samples, executed, barrier, long_sb) in enumerate(instrs):
                w.writerow([hex(i * 16), src, samples, samples, executed, barrier, long_sb, long_sb])


def test_ncu_source_summary_classes_and_kernels(tmp_path):
    csv_path = tmp_path / "src.csv"
    _ncu_source_csv(csv_path, [
        ("kernel_a", [
            ("      QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR20], RZ, !UPT", 10, 100, 0, 0),
            ("      WARPGROUP.DEPBAR.LE gsb0, 0x0", 50, 100, 50, 0),
            ("      SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R31+URZ], R24", 5, 100, 0, 5),
            ("      VIADD R7, R7, 0x1", 0, 100, 0, 0),
            ("@!P0  BRA 0x7f8962227710", 25, 100, 0, 25),   # the try_wait's retry: mbarrier wait
            ("      FFMA R1, R2, R3, R4", 10, 100, 0, 0),
            ("@P1   BRA 0x7f8962227710", 0, 100, 0, 0),     # 5 after the try_wait: other
        ]),
        ("kernel_b", [("      STG.E.128 desc[UR10][R4.64], R8", 7, 3, 0, 7)]),
    ])
    script = ROOT / "scripts" / "ncu_source_summary.py"
    out = subprocess.run([sys.executable, str(script), str(csv_path), "--top", "3"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.count("== kernel_") == 2
    a, b = text.split("== kernel_b")
    assert "7 instructions, 700 warp instructions executed, 100 samples" in a
    assert "wgmma wait 50.0%" in a and "wgmma issue 10.0%" in a and "mbarrier wait 30.0%" in a
    assert "ffma 10.0%" in a and "other 0.0%" in a
    assert "stalls: barrier 50.0%, long_sb 30.0%" in a
    assert "global mem 100.0%" in b


def test_ncu_source_summary_rejects_a_file_without_kernels(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("no,kernels,here\n")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "ncu_source_summary.py"), str(empty)],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "no kernel" in out.stderr


# ---- scripts/ncu_source_join.py (samples per inlined role) -------------------

def _sass_gi(path, functions):
    """An `nvdisasm -gi` listing: per function (name, [(chain, instruction)]) its
    .text label, each instruction's inline chain (innermost first) before it."""
    lines = []
    for name, instrs in functions:
        lines.append(f"\t.text.{name}:")
        for k, (chain, text) in enumerate(instrs):
            for i, (f, n) in enumerate(chain):
                outer = f' inlined at "/src/{chain[i + 1][0]}", line {chain[i + 1][1]}' if i + 1 < len(chain) else ""
                lines.append(f'\t//## File "/src/{f}", line {n}{outer}')
            lines.append(f"        /*{k * 16:04x}*/                   {text} ;")
    Path(path).write_text("\n".join(lines) + "\n")


def _join_inputs(tmp_path):
    role_a = [("kern.cuh", 20), ("kern.cuh", 100)]          # a function inlined at the kernel's line 100
    role_a2 = [("loop.cuh", 7), ("kern.cuh", 21), ("kern.cuh", 100)]
    role_b = [("kern.cuh", 40), ("kern.cuh", 101)]
    instrs = [(role_a, "LDL R4, [R1+0x8]"), (role_a2, "WARPGROUP.DEPBAR.LE gsb0, 0x0"),
              (role_a, "VIADD R4, R4, 0x1"), (role_b, "STL [R1+0x4], R2"), (role_b, "BAR.SYNC 0x1, 0x100")]
    sass = tmp_path / "k.sass"
    _sass_gi(sass, [("other_kernel", instrs[:2]), ("the_kernel", instrs)])
    # the CSV's rows in the same order: source, samples, executed, stall_barrier, stall_long_sb
    csv_path = tmp_path / "src.csv"
    _ncu_source_csv(csv_path, [("void the_kernel<...>", [
        ("      LDL R4, [R1+0x8]", 4, 10, 0, 4),
        ("      WARPGROUP.DEPBAR.LE gsb0, 0x0", 50, 10, 50, 0),
        ("      VIADD R4, R4, 0x1", 30, 10, 0, 30),
        ("      STL [R1+0x4], R2", 1, 10, 0, 1),
        ("      BAR.SYNC 0x1, 0x100", 15, 10, 15, 0),
    ])])
    return csv_path, sass


def test_ncu_source_join_groups_by_role_and_finds_spills(tmp_path):
    csv_path, sass = _join_inputs(tmp_path)
    script = ROOT / "scripts" / "ncu_source_join.py"
    out = subprocess.run([sys.executable, str(script), str(csv_path), str(sass), "--group-file", "kern.cuh"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "5 instructions matched to the_kernel, 100 samples" in text
    assert "kern.cuh:100" in text and "84  84.0%" in text      # 4 + 50 + 30
    assert "kern.cuh:101" in text and "16  16.0%" in text
    spills = text.split("local memory")[1].split("top ")[0]
    assert "kern.cuh:100" in spills and "kern.cuh:101" in spills  # one LDL, one STL
    # --within: only the role inlined at line 100, by the frame inside it
    out = subprocess.run([sys.executable, str(script), str(csv_path), str(sass), "--within", "kern.cuh:100"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "inlined at kern.cuh:100: 84 samples (84.0%)" in out.stdout
    assert "kern.cuh:20" in out.stdout and "kern.cuh:21" in out.stdout and "kern.cuh:40" not in out.stdout


def test_ncu_source_join_refuses_another_build(tmp_path):
    csv_path, sass = _join_inputs(tmp_path)
    short = tmp_path / "short.sass"
    _sass_gi(short, [("the_kernel", [([("kern.cuh", 1)], "NOP")])])
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "ncu_source_join.py"), str(csv_path), str(short)],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "no function of 5 instructions" in out.stderr


# ---- scripts/ab_summary.py (ab_bench.sh's closing table) --------------------

def _ab_log(path, runs):
    """An ab_bench.sh log: per run (build, tokens, {arm: (µs, SM MHz or None)}) its
    header, the bench's rows and, where given, their clock lines."""
    lines = []
    for build, tokens, arms in runs:
        lines.append(f"== build {build} ({'default' if build == 'a' else '-DX=1'}) tokens {tokens}")
        lines.append("arm        T/rank         us  TFLOP/s")
        for arm, (us, mhz) in arms.items():
            lines.append(f"{arm:8} {tokens:8} {us:10.1f}    500.0       0.0")
            if mhz is not None:
                lines.append(f"  SM MHz {arm} T {tokens} (rank 0, the timed forwards, each its CTAs' median): "
                             f"{mhz} median ({mhz - 5}-{mhz + 5}, 20 forwards)")
    path.write_text("\n".join(lines) + "\n")


def test_ab_summary_medians_change_and_clocks(tmp_path):
    log = tmp_path / "ab_bench.log"
    _ab_log(log, [
        ("a", 2048, {"split": (800.0, 1700), "fused": (900.0, 1750)}),
        ("b", 2048, {"split": (780.0, 1702), "fused": (905.0, None)}),
        ("b", 2048, {"split": (790.0, 1704), "fused": (915.0, None)}),
        ("a", 2048, {"split": (810.0, 1710), "fused": (910.0, 1760)}),
        ("a", 2048, {"split": (805.0, 1720), "fused": (920.0, 1770)}),
        ("b", 2048, {"split": (785.0, 1706), "fused": (925.0, None)}),
        ("a", 8192, {"fused": (3000.0, None)}),  # no B run: no line
    ])
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "ab_summary.py"), str(log)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3, out.stdout  # the header, split 2048, fused 2048
    split, fused = lines[1].split(), lines[2].split()
    # split: A 800 805 810 -> 805, B 780 785 790 -> 785, -2.5 %, clocks 1710 / 1704
    assert split[:6] == ["split", "2048", "805.0", "785.0", "-2.5", "%"], lines[1]
    assert "1710 / 1704" in lines[1] and "800.0 810.0 805.0 | 780.0 790.0 785.0" in lines[1]
    # fused: A 910, B 915, +0.5 %, B without clock lines: no clock pair
    assert fused[:6] == ["fused", "2048", "910.0", "915.0", "+0.5", "%"], lines[2]
    assert " - " in lines[2]


def test_ab_summary_rejects_a_log_without_both_builds(tmp_path):
    log = tmp_path / "ab_bench.log"
    _ab_log(log, [("a", 64, {"split": (330.0, 1800)})])
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "ab_summary.py"), str(log)],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "no bench row of both builds" in out.stderr


def test_ab_summary_names_the_build_compared(tmp_path):
    log = tmp_path / "ab_bench.log"
    _ab_log(log, [("a", 2048, {"fused": (1000.0, None)}), ("b", 2048, {"fused": (900.0, None)}),
                  ("c", 2048, {"fused": (1100.0, None)})])
    run = lambda *extra: subprocess.run([sys.executable, str(ROOT / "scripts" / "ab_summary.py"), str(log), *extra],
                                        capture_output=True, text=True)
    b, c = run(), run("c")
    assert b.returncode == 0 and b.stdout.splitlines()[1].split()[:6] == ["fused", "2048", "1000.0", "900.0",
                                                                          "-10.0", "%"], b.stdout
    assert c.returncode == 0 and c.stdout.splitlines()[1].split()[:6] == ["fused", "2048", "1000.0", "1100.0",
                                                                          "+10.0", "%"], c.stdout
    assert run("a").returncode == 2 and run("d").returncode == 1


# ---- scripts/ab_bench.sh's orchestration, with stand-in tools ---------------

_FAKE_MAKE = r"""#!/usr/bin/env bash
# make BUILD=dir NVCC="nvcc DEFS" target: writes dir/megamoe, a bench that prints
# one fused row per --tokens count, 1000 us by default, 900 with -DB=1, 1100 with -DC=1.
for a in "$@"; do
  case "$a" in BUILD=*) dir=${a#BUILD=} ;; NVCC=*) nvcc=${a#NVCC=} ;; esac
done
us=1000.0
case "$nvcc" in *-DB=1*) us=900.0 ;; *-DC=1*) us=1100.0 ;; esac
mkdir -p "$dir"
cat > "$dir/megamoe" <<EOS
#!/usr/bin/env bash
while [ \$# -gt 0 ]; do [ "\$1" = --tokens ] && t=\$2; shift; done
echo "fused    \$t    $us    500.0       0.0"
EOS
chmod +x "$dir/megamoe"
"""


def test_ab_bench_runs_every_build_alternating_and_sums_each_against_a(tmp_path):
    """Three builds (--also): every build, both rounds, in A B C then C B A order, one
    process per token count, and one closing table per build against A."""
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    for name in ("ab_bench.sh", "ab_summary.py"):
        (tree / "scripts" / name).write_text((ROOT / "scripts" / name).read_text())
        (tree / "scripts" / name).chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "make").write_text(_FAKE_MAKE)
    (bin_dir / "nvidia-smi").write_text("#!/usr/bin/env bash\nexit 0\n")
    for tool in ("make", "nvidia-smi"):
        (bin_dir / tool).chmod(0o755)
    out_dir = tmp_path / "out"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", OUT=str(out_dir))
    res = subprocess.run(["bash", str(tree / "scripts" / "ab_bench.sh"), "--rounds", "2", "--also", "-DC=1", "",
                          "-DB=1", "--arms", "fused", "--tokens", "64,2048"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    heads = [line.split()[2] + line.split()[-1] for line in (out_dir / "ab_bench.log").read_text().splitlines()
             if line.startswith("== build")]
    assert heads == ["a64", "a2048", "b64", "b2048", "c64", "c2048",
                     "c64", "c2048", "b64", "b2048", "a64", "a2048"], heads
    summary = (out_dir / "ab_summary.txt").read_text()
    assert summary.count("== summary") == 2, summary
    rows = [line.split()[:6] for line in summary.splitlines() if line.startswith("fused")]
    assert rows == [["fused", "64", "1000.0", "900.0", "-10.0", "%"], ["fused", "2048", "1000.0", "900.0", "-10.0", "%"],
                    ["fused", "64", "1000.0", "1100.0", "+10.0", "%"],
                    ["fused", "2048", "1000.0", "1100.0", "+10.0", "%"]], summary
