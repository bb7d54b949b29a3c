"""One rank of the Python GPU tests (test_gpu_layer.py starts world_size of
them through torch.multiprocessing, one process per GPU, and reads what each
wrote). Every rank runs the same sequence of collective calls whatever its
checks find; each check's outcome goes to <out>/rank<r>.json as soon as it is
known, so a rank that hangs still leaves what it did.

Per arm (staged, split): a layer made through torch.distributed (rank 0 makes
the NCCL unique id, the group shares it), its info(), the copying weights, a
forward judged against the C reference token by token, the same forward with
int64 indices / out / a token bound / uint8 x bitwise equal, a forward through
the C API directly (ctypes, the same inputs) bitwise equal, graph capture and
replay (new inputs judged against the reference, old inputs bitwise equal,
error word 0), a bad argument on the last rank (binding-side: the peers get
PeerFailedError; C-side: T > T_max; device-side: a bad top-k index), the layer
usable after each, the in-place weights bitwise equal, a layer made from an
explicit unique id, and close().
"""

import ctypes
import datetime
import json
import os
import traceback

import megamoe  # first: it sets NCCL_NVLS_ENABLE=0 before torch or NCCL read it

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import contract  # noqa: E402
from megamoe import _lib  # noqa: E402

ARMS = ("staged", "split", "fused")
H, I, K = 512, 256, 3
T_MAX, T = 128, 96          # T >= 32: the checker judges the whole-rank diff too
LAYER_TIMEOUT_S = 20.0      # every cross-rank wait of the layer
WEIGHT_SEED = 77


class Recorder:
    def __init__(self, out_dir, rank):
        self.path = os.path.join(out_dir, f"rank{rank}.json")
        self.data = {"rank": rank, "checks": {}, "info": {}, "done": False}
        self.write()

    def write(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1)
        os.replace(tmp, self.path)

    def record(self, name, ok, detail=""):
        self.data["checks"][name] = {"ok": bool(ok), "detail": str(detail)[-4000:]}
        self.write()

    def step(self, name, fn):
        """Runs fn() -> (ok, detail); an exception is a failed check."""
        try:
            ok, detail = fn()
        except Exception:  # noqa: BLE001 - recorded, the sequence goes on
            ok, detail = False, traceback.format_exc()
        self.record(name, ok, detail)
        return ok


def bits(t):
    return t.view(torch.int16)


def expect_error(fn, cls, text=None):
    """(ok, detail): fn() raised cls (with text in its message)."""
    try:
        fn()
    except megamoe.Error as e:
        ok = type(e) is cls and (text is None or text in str(e))
        return ok, f"{type(e).__name__}: {e}"
    return False, f"no error (expected {cls.__name__})"


def run_arm(arm, rank, world, rec):
    dev = torch.device("cuda", rank)
    E = 4 * world
    cfg = megamoe.Config(hidden=H, intermediate=I, num_experts=E, top_k=K, max_tokens_per_rank=T_MAX, arm=arm,
                         timeout_s=LAYER_TIMEOUT_S)
    p = contract.Problem(cfg, T, seed=1000 + rank, weight_seed=WEIGHT_SEED)
    q = contract.Problem(cfg, T, seed=2000 + rank, weight_seed=WEIGHT_SEED)  # other tokens, same weights
    y_ref = megamoe.reference(cfg, *p.inputs(), *p.weights(), num_ranks=world)
    yq_ref = megamoe.reference(cfg, *q.inputs(), *q.weights(), num_ranks=world)

    def up(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(dev)

    w1, w1_sf, w2, w2_sf = (up(w) for w in p.rank_weights(rank, world))
    x8 = up(p.x)                                   # uint8 e4m3 codes
    x = x8.view(torch.float8_e4m3fn)
    x_sf, idx, w = up(p.x_sf), up(p.topk_idx), up(p.topk_w)
    bad_rank = rank == world - 1
    n = f"{arm}/"

    def judge(y, ref, topk):
        r = megamoe.check_output(y, ref, topk)
        return r.passed, r.summary

    layer = megamoe.Layer(cfg, dist.group.WORLD)
    rec.record(n + "create", True, repr(layer))

    def info():
        d = layer.info()
        want = megamoe.layout(cfg, world)
        ok = d["regions"] == want["regions"] and d["rank"] == rank and d["device"] == rank and \
            d["symmetric_bytes"] == want["symmetric_bytes"] and d["local_experts"] == E // world
        return ok, json.dumps({k: d[k] for k in ("rank", "device", "pool_rows", "symmetric_bytes")})
    rec.step(n + "info", info)

    layer.prepare_weights(w1, w1_sf, w2, w2_sf)
    y = layer.forward(x, x_sf, idx, w)

    def forward_reference():
        layer.sync()
        ok, detail = judge(y, y_ref, p.topk_idx)
        return ok and y.dtype == torch.bfloat16 and tuple(y.shape) == (T, H), detail
    rec.step(n + "forward_reference", forward_reference)

    out = torch.full((T, H), float("nan"), dtype=torch.bfloat16, device=dev)
    y2 = layer.forward(x8, x_sf, idx.long(), w, out=out, num_tokens_bound=T_MAX)

    def int64_out_bound():
        layer.sync()
        return y2 is out and torch.equal(bits(out), bits(y)), "int64 indices, uint8 x, out=, num_tokens_bound=T_MAX"
    rec.step(n + "int64_out_bound", int64_out_bound)

    y3 = torch.full((T, H), float("nan"), dtype=torch.bfloat16, device=dev)
    stream = torch.cuda.current_stream(dev).cuda_stream
    args = _lib.megamoe_forward_args(x.data_ptr(), x_sf.data_ptr(), idx.data_ptr(), _lib.INDEX_INT32,
                                     w.data_ptr(), T, 0, y3.data_ptr())
    st_forward = _lib.lib.megamoe_forward(layer._handle, ctypes.byref(args), stream)

    def bitwise_c_api():
        st_sync = _lib.lib.megamoe_sync(layer._handle, stream)
        return st_forward == 0 and st_sync == 0 and torch.equal(bits(y3), bits(y)), \
            f"megamoe_forward {st_forward}, megamoe_sync {st_sync}: {_lib.last_error()}"
    rec.step(n + "bitwise_c_api", bitwise_c_api)

    # ---- graph capture and replay ---------------------------------------------
    xs, xs_sf, idxs, ws = x.clone(), x_sf.clone(), idx.clone(), w.clone()
    ys = torch.full((T, H), float("nan"), dtype=torch.bfloat16, device=dev)
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch advises before a capture
        layer.forward(xs, xs_sf, idxs, ws, out=ys)
    torch.cuda.current_stream(dev).wait_stream(side)
    layer.sync(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer.forward(xs, xs_sf, idxs, ws, out=ys)
    xs.copy_(up(q.x).view(torch.float8_e4m3fn))
    xs_sf.copy_(up(q.x_sf))
    idxs.copy_(up(q.topk_idx))
    ws.copy_(up(q.topk_w))
    graph.replay()
    torch.cuda.synchronize(dev)
    word_after_replay = int(layer.error_word_tensor().item())
    layer.sync()
    yq_graph = ys.clone()
    xs.copy_(x)
    xs_sf.copy_(x_sf)
    idxs.copy_(idx)
    ws.copy_(w)
    graph.replay()
    torch.cuda.synchronize(dev)
    layer.sync()
    y_graph_again = ys.clone()
    yq_eager = layer.forward(up(q.x).view(torch.float8_e4m3fn), up(q.x_sf), up(q.topk_idx), up(q.topk_w))

    def graph_capture_replay():
        layer.sync()
        ok_ref, detail = judge(yq_graph, yq_ref, q.topk_idx)
        same_old = torch.equal(bits(y_graph_again), bits(y))
        same_eager = torch.equal(bits(yq_graph), bits(yq_eager))
        return ok_ref and same_old and same_eager and word_after_replay == 0, \
            f"reference: {detail}; old inputs bitwise: {same_old}; eager bitwise: {same_eager}; " \
            f"error word after replay: {word_after_replay}"
    rec.step(n + "graph_capture_replay", graph_capture_replay)
    del graph

    # ---- a bad argument on the last rank --------------------------------------
    def after_error(name, local_cls, local_word):
        """The sync of every rank and the error word of that forward."""
        torch.cuda.synchronize(dev)
        word = int(layer.error_word_tensor().item())
        if bad_rank:
            ok, detail = expect_error(layer.sync, local_cls)
            ok = ok and word == local_word
        else:
            ok, detail = expect_error(layer.sync, megamoe.PeerFailedError, f"rank {world - 1}")
            ok = ok and word == megamoe.PeerFailedError.status
        rec.record(n + name, ok, f"{detail}; error word {word}")

    def recovers(name):
        y_next = layer.forward(x, x_sf, idx, w)

        def check():
            layer.sync()
            ok, detail = judge(y_next, y_ref, p.topk_idx)
            word = int(layer.error_word_tensor().item())
            return ok and word == 0 and torch.equal(bits(y_next), bits(y)), f"{detail}; error word {word}"
        rec.step(n + name, check)

    # Refused by the binding (x of the wrong dtype): it still takes part.
    if bad_rank:
        ok, detail = expect_error(lambda: layer.forward(x.float(), x_sf, idx, w), megamoe.BadArgumentError,
                                  "x: dtype float32")
        rec.record(n + "bad_argument_raises_here", ok, detail)
    else:
        layer.forward(x, x_sf, idx, w)
        rec.record(n + "bad_argument_raises_here", True, "not the bad rank")
    after_error("bad_argument_peers_fail", megamoe.BadArgumentError, megamoe.BadArgumentError.status)
    recovers("recovers_after_bad_argument")

    # Refused by the C layer (T > T_max): the same protocol, from C.
    if bad_rank:
        big = T_MAX + 1
        ok, detail = expect_error(
            lambda: layer.forward(torch.zeros((big, H), dtype=torch.uint8, device=dev),
                                  torch.ones((big, H // 128), dtype=torch.float32, device=dev),
                                  torch.zeros((big, K), dtype=torch.int32, device=dev),
                                  torch.ones((big, K), dtype=torch.float32, device=dev)),
            megamoe.TooManyTokensError, f"num_tokens = {big}")
        rec.record(n + "too_many_tokens_raises_here", ok, detail)
    else:
        layer.forward(x, x_sf, idx, w)
        rec.record(n + "too_many_tokens_raises_here", True, "not the bad rank")
    after_error("too_many_tokens_peers_fail", megamoe.TooManyTokensError, megamoe.TooManyTokensError.status)
    recovers("recovers_after_too_many_tokens")

    # Found on the device (a top-k index out of range).
    idx_bad = idx.clone()
    if bad_rank:
        idx_bad[T // 2, 1] = 1_000_000
    layer.forward(x, x_sf, idx_bad, w)
    after_error("bad_topk_index_peers_fail", megamoe.BadTopkIndexError, megamoe.BadTopkIndexError.status)
    recovers("recovers_after_bad_topk_index")

    # ---- in-place weights: no second copy, bitwise the same ------------------------
    layer2 = megamoe.Layer(cfg, dist.group.WORLD)
    w1c, w2c, w2_sfc = w1.clone(), w2.clone(), w2_sf.clone()
    layer2.prepare_weights(w1c, w1_sf, w2c, w2_sfc, in_place=True)
    y4 = layer2.forward(x, x_sf, idx, w)

    def in_place_weights():
        layer2.sync()
        rewritten = not torch.equal(w1c, w1)
        return torch.equal(bits(y4), bits(y)) and layer2.info()["weights_mode"] == "in_place" and rewritten, \
            f"w1 rewritten in place: {rewritten}"
    rec.step(n + "in_place_weights", in_place_weights)
    layer2.close()

    # ---- a layer made from an explicit unique id (no group) ---------------------
    box = [megamoe.unique_id() if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    layer3 = megamoe.Layer(cfg, rank=rank, world_size=world, unique_id=box[0])
    layer3.prepare_weights(w1, w1_sf, w2, w2_sf)
    y5 = layer3.forward(x, x_sf, idx, w)

    def explicit_unique_id():
        layer3.sync()
        return torch.equal(bits(y5), bits(y)), "Layer(cfg, rank=, world_size=, unique_id=)"
    rec.step(n + "explicit_unique_id", explicit_unique_id)
    layer3.close()

    rec.step(n + "close", lambda: (layer.close() is None, "closed"))


def main(rank, world, store, out_dir):
    rec = Recorder(out_dir, rank)
    ok = False
    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=180), device_id=torch.device("cuda", rank))
        nccl = torch.cuda.nccl.version()
        rec.data["info"] = {**megamoe.runtime_info(), "torch": torch.__version__,
                            "torch_nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
                            "device": torch.cuda.get_device_name(rank)}
        rec.write()
        for arm in ARMS:
            try:
                run_arm(arm, rank, world, rec)
            except Exception:  # noqa: BLE001 - the arm's sequence broke off: say where
                rec.record(f"{arm}/aborted", False, traceback.format_exc())
        dist.barrier()
        dist.destroy_process_group()
        ok = all(c["ok"] for c in rec.data["checks"].values())
    except Exception:  # noqa: BLE001
        rec.record("setup", False, traceback.format_exc())
    rec.data["done"] = True
    rec.write()
    os._exit(0 if ok else 1)  # results are written; skip interpreter teardown (NCCL threads)
