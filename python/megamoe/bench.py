"""python -m megamoe.bench: the layer timed as a serving engine calls it.

    python -m megamoe.bench [--model flash-rank] [--ranks R] [--tokens 64,512,2048,8192]
                            [--arms staged,split] [--iters 20] [--rounds 3]
                            [--csv FILE] [--json FILE] [--c-csv FILE]

One process per GPU (torch.multiprocessing, spawn) joined through
torch.distributed (NCCL); torch tensors; per (arm, tokens) cell the forward is
captured once in a CUDA graph and the graph replayed. The method is the C
bench's (bench/bench_layer.c): random fp8 weights and inputs drawn on the
device; before every timed replay an L2 flush (a 256 MiB write) and an
all-rank barrier (an all_reduce); CUDA events around the replay; the median of
--iters replays per round; --rounds rounds with the arms bracketed (A B, B A,
...); each cell the median of the round medians, the slowest rank's. TFLOP/s
per GPU = 2 * routed * 3 * H * I / t with the busiest rank's routed slots.

--csv / --json write the C bench's row columns (megamoe.benchfile). The floors
are the C bench's: with --c-csv FILE (its --csv output), each cell takes the
floors of the same cell there (the same routing distribution, another draw),
and the table prints the C µs beside these. Exit codes as the C tool: 0, 1 the
run failed, 2 bad command line, 4 no GPU (or no torch with CUDA).
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
import traceback

from . import benchfile
from .config import arm_names

# The C bench's --model shapes (bench/bench_opts.c set_model): H, I, experts
# per rank (0: a whole model), experts in total (0: per rank), top-k.
MODELS = {"flash-rank": (4096, 2048, 32, 0, 6), "pro-rank": (7168, 3072, 48, 0, 6),
          "flash": (4096, 2048, 0, 256, 6), "pro": (7168, 3072, 0, 384, 6)}
MAX_TOKENS = 1 << 20     # per rank, as the C bench
MAX_RANKS = 8            # MEGAMOE_MAX_RANKS
DEADLINE_S = 3000.0      # the whole run, as the C bench's launcher
FLUSH_BYTES = 256 << 20  # the L2 flush
WARMUP = 3
PROG = "python -m megamoe.bench"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_GPU = 0, 1, 2, 4


# ---- command line ---------------------------------------------------------------

def _int_in(lo, hi):
    def parse(text):
        try:
            v = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{v}: must be in [{lo}, {hi}]")
        return v
    return parse


def _tokens(text):
    items = text.split(",")
    if len(items) > 16:
        raise argparse.ArgumentTypeError(f"'{text}': at most 16 values")
    return [_int_in(1, MAX_TOKENS)(t) for t in items]


def _arms(text):
    arms = text.split(",")
    for a in arms:
        if a not in arm_names():
            raise argparse.ArgumentTypeError(f"'{text}': unknown arm '{a}' ({', '.join(arm_names())})")
    if len(set(arms)) != len(arms):
        raise argparse.ArgumentTypeError(f"'{text}': an arm given twice")
    return arms


def _writable(text):
    try:
        return benchfile.check_writable(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _c_rows(text):
    try:
        return benchfile.read_rows(text)
    except (OSError, ValueError) as e:
        raise argparse.ArgumentTypeError(f"'{text}': {e}") from None


def parse_args(argv=None):
    """The options, checked (argparse exits 2 naming the option); no GPU touched."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), default="flash-rank",
                   help="shape, as megamoe bench --model (flash-rank: H 4096, I 2048, 32 experts per rank, top-6)")
    p.add_argument("--ranks", type=_int_in(1, MAX_RANKS), metavar="R",
                   help="ranks, one GPU each, 1..8 (default: every visible GPU)")
    p.add_argument("--tokens", type=_tokens, default=[64, 512, 2048, 8192], metavar="T1,T2,...",
                   help="tokens per rank, one cell each, at most 16 (64,512,2048,8192)")
    p.add_argument("--max-tokens", type=_int_in(1, MAX_TOKENS), metavar="T",
                   help="T_max of the layers (the largest point)")
    p.add_argument("--arms", type=_arms, default=["staged", "split", "fused"], metavar="A1,A2,...",
                   help="arms, each once (staged,split,fused)")
    p.add_argument("--iters", type=_int_in(1, 10000), default=20, metavar="N", help="timed replays per round (20)")
    p.add_argument("--rounds", type=_int_in(1, 100), default=3, metavar="N", help="rounds, arms bracketed (3)")
    p.add_argument("--no-bound", action="store_true",
                   help="pass num_tokens_bound = None (T_max) instead of the cell's T, as megamoe bench --no-bound")
    p.add_argument("--csv", type=_writable, metavar="FILE", help="write the rows as CSV (the C bench's columns)")
    p.add_argument("--json", type=_writable, metavar="FILE", help="write the rows as JSON")
    p.add_argument("--c-csv", type=_c_rows, metavar="FILE", dest="c_rows",
                   help="the C bench's --csv of the same cells: its µs beside ours, its floors in our rows")
    a = p.parse_args(argv)
    if a.max_tokens is None:
        a.max_tokens = max(a.tokens)
    elif a.max_tokens < max(a.tokens):
        p.error(f"argument --max-tokens: {a.max_tokens} is below the --tokens point {max(a.tokens)}")
    if a.csv and a.json and os.path.abspath(a.csv) == os.path.abspath(a.json):
        p.error(f"argument --json: the same file as --csv ('{a.csv}')")
    a.hidden, a.intermediate, a.experts_per_rank, a.experts_total, a.top_k = MODELS[a.model]
    return a


def no_gpu_reason():
    """Why this machine cannot run the benchmark (None when it can)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        return "torch.distributed has no NCCL backend"
    return None


# ---- one rank -------------------------------------------------------------------

def _fp8_normal(shape, spread, gen, dev):
    """An fp8 e4m3 tensor of values ~ N(0, spread^2) (saturated at 448), drawn
    in chunks so the float32 draw stays small."""
    import torch
    out = torch.empty(shape, dtype=torch.float8_e4m3fn, device=dev)
    flat = out.view(torch.uint8).view(-1)
    step = 1 << 24
    for s in range(0, flat.numel(), step):
        n = min(step, flat.numel() - s)
        draw = torch.randn(n, generator=gen, device=dev).mul_(spread).clamp_(-448, 448)
        flat[s:s + n] = draw.to(torch.float8_e4m3fn).view(torch.uint8)
    return out


def _uniform(shape, lo, hi, gen, dev):
    import torch
    return torch.empty(shape, dtype=torch.float32, device=dev).uniform_(lo, hi, generator=gen)


def _capture(layer, inputs, y, dev, bound):
    """The forward captured in a CUDA graph (after one forward on a side
    stream, as torch advises before a capture)."""
    import torch
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        layer.forward(*inputs, out=y, num_tokens_bound=bound)
    torch.cuda.current_stream(dev).wait_stream(side)
    layer.sync(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer.forward(*inputs, out=y, num_tokens_bound=bound)
    return graph


def _c_cell(c_rows, row):
    """The C bench's row of the same cell and shape (None when it has none)."""
    keys = ("arm",) + benchfile.INT_COLUMNS  # the shape and cell: every integer column
    for c in c_rows or ():
        if all(c.get(k) == row[k] for k in keys):
            return c
    return None


def point_rows(worst_us, shape, T, flops, info, c_rows):
    """The rows of one tokens point, each with the C bench's row of its cell
    (or None): worst_us {arm: the slowest rank's µs}, shape (ranks, experts
    per rank, H, I, top-k, quantization group), flops (the busiest rank's), info {arm: layer.info()}.
    The floors, and the rates they assume, are the C row's when there is one."""
    world, El, H, I, K, G = shape
    out = []
    for arm, us in worst_us.items():
        mib = {k: info[arm][k + "_bytes"] / 2 ** 20 for k in ("symmetric", "workspace")}
        row = dict(arm=arm, ranks=world, tokens_per_rank=T, experts_per_rank=El, hidden=H, intermediate=I, top_k=K,
                   group=G, us=us, tflops=flops / (us * 1e-6) / 1e12, nvl_gbs=None, symm_mib=mib["symmetric"],
                   workspace_mib=mib["workspace"],
                   **{f: None for f in benchfile.FLOOR_COLUMNS + benchfile.RATE_COLUMNS})
        c = _c_cell(c_rows, row)
        if c:
            row.update({f: c.get(f) for f in benchfile.FLOOR_COLUMNS + benchfile.RATE_COLUMNS})
        out.append((row, c))
    return out


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


class Table:
    """Rank 0's table on stdout (with the C bench's µs when given)."""

    def __init__(self, with_c):
        self.c = with_c
        head = f"{'arm':<7} {'T/rank':>7} {'us':>10} {'TFLOP/s':>8} {'symm MiB':>9} {'ws MiB':>8} {'x floor':>7}"
        print(head + (f" {'C us':>10} {'C TFLOP/s':>9} {'py / C':>7}" if self.c else ""), flush=True)

    def row(self, r, c):
        x_floor = r["us"] / benchfile.floor_of(r) if benchfile.floor_of(r) else None
        line = (f"{r['arm']:<7} {r['tokens_per_rank']:>7} {r['us']:>10.1f} {r['tflops']:>8.1f} "
                f"{r['symm_mib']:>9.1f} {r['workspace_mib']:>8.1f} {_fmt(x_floor, '7.2f'):>7}")
        if self.c:
            line += (f" {_fmt(c and c['us'], '10.1f'):>10} {_fmt(c and c['tflops'], '9.1f'):>9} "
                     f"{_fmt(c and r['us'] / c['us'], '7.2f'):>7}")
        print(line, flush=True)


def _rank(rank, world, store, a):
    import datetime

    import megamoe  # first: it sets NCCL_NVLS_ENABLE=0 before torch or NCCL read it
    import torch
    import torch.distributed as dist

    t_start = time.monotonic()
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=DEADLINE_S), device_id=dev)
    H, I, K, Tm = a.hidden, a.intermediate, a.top_k, a.max_tokens
    El = a.experts_per_rank or a.experts_total // world
    E = El * world
    gen = torch.Generator(device=dev)
    gen.manual_seed(11 + rank)
    s1, s2 = 1.0 / 64 / H ** 0.5, 1.0 / 64 / I ** 0.5
    w1, w2 = _fp8_normal((El, 2 * I, H), 64.0, gen, dev), _fp8_normal((El, H, I), 64.0, gen, dev)
    w1_sf = _uniform((El, 2 * I // 128, H // 128), 0.5 * s1, 1.5 * s1, gen, dev)
    w2_sf = _uniform((El, H // 128, I // 128), 0.5 * s2, 1.5 * s2, gen, dev)
    x, x_sf = _fp8_normal((Tm, H), 100.0, gen, dev), _uniform((Tm, H // 128), 0.004, 0.006, gen, dev)

    shape_args = dict(hidden=H, intermediate=I, num_experts=E, top_k=K, max_tokens_per_rank=Tm)
    G = megamoe.Config(**shape_args).quant_group  # the config's default, every arm's
    layers = {}
    for arm in a.arms:
        cfg = megamoe.Config(**shape_args, arm=arm)
        try:
            layer = megamoe.Layer(cfg, dist.group.WORLD)
        except megamoe.NotImplementedError:
            if rank == 0:
                print(f"arm {arm}: not implemented yet, skipped", flush=True)
            continue
        layer.prepare_weights(w1, w1_sf, w2, w2_sf)
        layers[arm] = layer
    info = {arm: layer.info() for arm, layer in layers.items()}
    torch.cuda.synchronize(dev)
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=dev)
    barrier = torch.zeros(1, device=dev)
    if rank == 0:
        print(f"\n{PROG}: {a.model}, H {H}, I {I}, {E} experts ({El} per rank), top-{K}, {world} rank(s), "
              f"T_max {Tm}; torch {torch.__version__}, CUDA graph replay")
        print(f"timing: L2 flush + all-rank barrier before each replay, median of {a.iters} replays per round, "
              f"{a.rounds} rounds, arms bracketed; each cell the slowest rank's median of round medians\n")
        table = Table(a.c_rows is not None)
    rows, cells = [], len(a.tokens) * len(layers)
    for p, T in enumerate(a.tokens):
        gr = torch.Generator(device=dev)
        gr.manual_seed(1000 + 7919 * T + rank)  # a count's routing, wherever it stands in the list
        # K distinct experts per token, uniform (as the C bench draws them).
        idx = torch.rand((T, E), generator=gr, device=dev).topk(K, dim=1).indices.to(torch.int32).contiguous()
        w = torch.full((T, K), 1.0 / K, dtype=torch.float32, device=dev)
        routed = torch.bincount((idx // El).view(-1).long(), minlength=world).to(torch.float64)
        dist.all_reduce(routed)
        flops = 2.0 * routed.max().item() * 3.0 * H * I
        y = torch.empty((T, H), dtype=torch.bfloat16, device=dev)
        inputs = (x[:T], x_sf[:T], idx, w)
        # Every rank runs T tokens: T is the call's bound (as the C bench).
        bound = None if a.no_bound else T
        graphs = {}
        for arm, layer in layers.items():
            for _ in range(WARMUP):
                layer.forward(*inputs, out=y, num_tokens_bound=bound)
            layer.sync()
            graphs[arm] = _capture(layer, inputs, y, dev, bound)
        round_medians = {arm: [] for arm in layers}
        for rnd in range(a.rounds):
            order = list(layers) if rnd % 2 == 0 else list(layers)[::-1]
            for arm in order:
                if rank == 0:
                    i = p * len(layers) + list(layers).index(arm) + 1
                    print(f"megamoe.bench: cell {i} of {cells} ({arm}, T {T}), round {rnd + 1} of {a.rounds}, "
                          f"{time.monotonic() - t_start:.1f} s elapsed", file=sys.stderr, flush=True)
                events = []
                for it in range(a.iters):
                    flush.fill_(it & 0xFF)
                    dist.all_reduce(barrier)
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    graphs[arm].replay()
                    e1.record()
                    events.append((e0, e1))
                torch.cuda.synchronize(dev)
                layers[arm].sync()
                round_medians[arm].append(statistics.median(e0.elapsed_time(e1) * 1000.0 for e0, e1 in events))
        worst = torch.tensor([statistics.median(round_medians[arm]) for arm in layers], dtype=torch.float64,
                             device=dev)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        del graphs
        if rank != 0:
            continue
        shape = (world, El, H, I, K, G)
        for row, c in point_rows(dict(zip(layers, worst.tolist())), shape, T, flops, info, a.c_rows):
            table.row(row, c)
            rows.append(row)
        benchfile.write_rows(rows, a.csv, a.json)
    if rank == 0:
        print("\nTFLOP/s per GPU = 2 * routed * 3 * H * I / t (the busiest rank's routed slots); "
              "x floor = us / max(the C bench's floors for the cell)")
        if a.c_rows is not None and not any(_c_cell(a.c_rows, r) for r in rows):
            print(f"--c-csv: no cell of this shape there (H {H}, I {I}, {El} experts per rank, top-{K}, G {G}, "
                  f"{world} rank(s))")
    for layer in layers.values():
        layer.close()
    dist.barrier()
    dist.destroy_process_group()
    return EXIT_OK


def _rank_main(rank, world, store, a):
    code = EXIT_FAILED
    try:
        code = _rank(rank, world, store, a)
    except Exception:  # noqa: BLE001 - reported; the parent ends the other ranks
        traceback.print_exc()
        print(f"{PROG}: rank {rank} failed", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown (NCCL threads)


# ---- the launcher ---------------------------------------------------------------

def _run_ranks(world, a):
    """Starts one process per rank and waits: the first failure, or the
    deadline, ends the others (a rank left alone waits in NCCL forever)."""
    import torch.multiprocessing as mp

    from megamoe.bench import _rank_main as target  # by its package name: the spawned ranks import it so

    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="megamoe_bench_") as tmp:
        procs = [ctx.Process(target=target, args=(r, world, os.path.join(tmp, "store"), a)) for r in range(world)]
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + DEADLINE_S
        while True:
            codes = [proc.exitcode for proc in procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed or all(c == 0 for c in codes) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join()
    if failed:
        print(f"{PROG}: rank {failed[0][0]} exited with code {failed[0][1]}; the others were ended", file=sys.stderr)
        return EXIT_FAILED
    if any(c != 0 for c in codes):
        print(f"{PROG}: the run passed its deadline ({DEADLINE_S:.0f} s); every rank was ended", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def main(argv=None):
    a = parse_args(argv)
    reason = no_gpu_reason()
    if reason:
        print(f"{PROG}: {reason}: the Python benchmark needs a GPU (one per rank) and torch with CUDA "
              f"(megamoe bench without a GPU runs the CPU reference)", file=sys.stderr)
        return EXIT_NO_GPU
    import torch
    gpus = torch.cuda.device_count()
    world = a.ranks or gpus
    if world > gpus:
        print(f"{PROG}: --ranks {world} but {gpus} GPU(s) visible", file=sys.stderr)
        return EXIT_USAGE
    if a.experts_total and a.experts_total % world:
        print(f"{PROG}: --model {a.model}: {a.experts_total} experts do not split over {world} ranks (--ranks)",
              file=sys.stderr)
        return EXIT_USAGE
    return _run_ranks(world, a)


if __name__ == "__main__":
    sys.exit(main())
