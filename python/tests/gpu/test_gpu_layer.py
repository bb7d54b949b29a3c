"""The Python package on GPUs: EP1 and EP2, one process per GPU started with
torch.multiprocessing (spawn), joined through torch.distributed (NCCL);
gpu_worker.py is what each rank does. Skips, saying why, without torch, a
CUDA GPU, enough GPUs or a Hopper GPU.

Nothing here can hang for good: the layer's waits end at its timeout_s (20 s),
torch.distributed's at 180 s, and the ranks of one world are killed after
MEGAMOE_PY_GPU_TIMEOUT seconds (default 600), the test failing with what
each rank had recorded by then.
"""

import json
import os
import time

import pytest

WORLDS = (1, 2)
ARMS = ("staged", "split", "fused")  # gpu_worker.ARMS
# What gpu_worker.py records per arm, in order.
CHECKS = ("create", "info", "forward_reference", "int64_out_bound", "bitwise_c_api", "graph_capture_replay",
          "bad_argument_raises_here", "bad_argument_peers_fail", "recovers_after_bad_argument",
          "too_many_tokens_raises_here", "too_many_tokens_peers_fail", "recovers_after_too_many_tokens",
          "bad_topk_index_peers_fail", "recovers_after_bad_topk_index", "in_place_weights", "explicit_unique_id",
          "close")
TIMEOUT_S = float(os.environ.get("MEGAMOE_PY_GPU_TIMEOUT", "600"))
_runs = {}


def _skip_reason(world):
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    count = torch.cuda.device_count()
    if count < world:
        return f"{world} GPUs needed, {count} visible"
    for d in range(world):
        if torch.cuda.get_device_capability(d)[0] != 9:
            return f"cuda:{d} is not a Hopper (sm_90) GPU"
    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        return "torch.distributed has no NCCL backend"
    return None


def _run_world(world, tmp):
    """Starts the ranks, waits for them (at most TIMEOUT_S), returns what they wrote."""
    import torch.multiprocessing as mp

    import gpu_worker

    ctx = mp.get_context("spawn")
    store = tmp / "store"
    procs = [ctx.Process(target=gpu_worker.main, args=(r, world, str(store), str(tmp)), daemon=False)
             for r in range(world)]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + TIMEOUT_S
    for proc in procs:
        proc.join(max(1.0, deadline - time.monotonic()))
    hung = [r for r, proc in enumerate(procs) if proc.is_alive()]
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(30)
    results = {}
    for r in range(world):
        path = tmp / f"rank{r}.json"
        results[r] = json.loads(path.read_text()) if path.exists() else {"checks": {}, "done": False}
    return {"results": results, "hung": hung, "exitcodes": [proc.exitcode for proc in procs]}


@pytest.fixture(scope="module", params=WORLDS, ids=[f"EP{w}" for w in WORLDS])
def world_run(request, tmp_path_factory):
    world = request.param
    reason = _skip_reason(world)
    if reason:
        pytest.skip(reason)
    if world not in _runs:
        _runs[world] = _run_world(world, tmp_path_factory.mktemp(f"ep{world}"))
    return world, _runs[world]


def _where(run):
    """What each rank last recorded (for a failure message)."""
    lines = []
    for r, res in run["results"].items():
        last = list(res.get("checks", {}))[-1:] or ["nothing"]
        lines.append(f"rank {r}: done {res.get('done')}, last check {last[0]}")
    return "; ".join(lines)


def test_ranks_finish_in_time(world_run, capsys):
    world, run = world_run
    with capsys.disabled():
        for r, res in run["results"].items():
            print(f"\n[EP{world} rank {r}] {json.dumps(res.get('info', {}))}")
            for name, c in res.get("checks", {}).items():
                last = c["detail"].splitlines()[-1] if c["detail"] else ""
                print(f"[EP{world} rank {r}] {'ok  ' if c['ok'] else 'FAIL'} {name}: {last}")
    assert not run["hung"], f"ranks {run['hung']} were still running after {TIMEOUT_S:.0f} s: {_where(run)}"
    setup = [res["checks"].get("setup") for res in run["results"].values()]
    assert all(s is None for s in setup), f"set-up failed: {setup}"
    aborted = {r: c for r, res in run["results"].items() for n, c in res["checks"].items() if n.endswith("/aborted")}
    assert not aborted, f"a sequence broke off: {aborted}"
    assert all(res["done"] for res in run["results"].values()), _where(run)
    expected = {f"{a}/{c}" for a in ARMS for c in CHECKS}
    for r, res in run["results"].items():
        assert set(res["checks"]) == expected, f"rank {r} recorded {sorted(set(res['checks']) ^ expected)} unexpectedly"


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("arm", ARMS)
def test_gpu_check(world_run, arm, check):
    world, run = world_run
    name = f"{arm}/{check}"
    for r, res in run["results"].items():
        c = res["checks"].get(name)
        assert c is not None, f"rank {r} did not get to {name} ({_where(run)})"
        assert c["ok"], f"rank {r}, {name}: {c['detail']}"
