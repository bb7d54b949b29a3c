"""Config <-> megamoe_config (defaults and struct layout as the library has
them) and the layout dict against the library's other size queries and the
`megamoe info` tool."""

import ctypes
import dataclasses
import os
import re
import subprocess
from pathlib import Path

import pytest

import megamoe
from megamoe import _lib

SMALL = dict(hidden=256, intermediate=256, num_experts=8, top_k=2, max_tokens_per_rank=64)


def test_defaults_are_the_librarys():
    made = _lib.lib.megamoe_config_make(512, 384, 16, 4, 100)
    assert (made.hidden, made.intermediate, made.num_experts, made.top_k, made.max_tokens_per_rank) == \
        (512, 384, 16, 4, 100)
    cfg = megamoe.Config(hidden=512, intermediate=384, num_experts=16, top_k=4, max_tokens_per_rank=100)
    assert cfg.quant_group == made.quant_group == 128
    assert cfg.timeout_s == made.timeout_s == 60.0
    assert cfg.pool_imbalance == made.pool_imbalance == 0.0
    assert made.has_swiglu_clamp == 0 and cfg.swiglu_clamp is None
    assert megamoe.arm_names()[made.arm] == cfg.arm == "staged"


def test_struct_round_trip_field_by_field():
    cfg = megamoe.Config(hidden=1024, intermediate=512, num_experts=32, top_k=6, max_tokens_per_rank=777,
                         quant_group=64, swiglu_clamp=7.5, arm="split", timeout_s=12.25, pool_imbalance=1.5)
    c = cfg.to_c()
    assert megamoe.Config.from_c(c) == cfg
    # The library reads what ctypes wrote: each field echoed by a check that names it.
    probes = [("hidden", 100, "hidden = 100"), ("intermediate", 100, "intermediate = 100"),
              ("num_experts", 0, "num_experts = 0"), ("top_k", 0, "top_k = 0"),
              ("max_tokens_per_rank", 0, "max_tokens_per_rank = 0"), ("quant_group", 96, "quant_group = 96"),
              ("swiglu_clamp", -2.5, "swiglu_clamp = -2.5"), ("arm", 5, "arm = 5"),
              ("timeout_s", 1e12, "timeout_s = 1e+12"), ("pool_imbalance", 9.0, "pool_imbalance = 9")]
    for field, bad, text in probes:
        with pytest.raises(megamoe.Error) as e:
            dataclasses.replace(cfg, **{field: bad}).check(8)
        assert text in e.value.message, (field, e.value.message)
    assert cfg.check(8) is cfg
    assert ctypes.sizeof(_lib.megamoe_config) == 64


def test_layout_agrees_with_the_size_queries():
    lib = _lib.lib
    for arm in megamoe.arm_names():
        for ranks in (1, 2, 8):
            cfg = megamoe.Config(**{**SMALL, "arm": arm, "num_experts": 16})
            d = megamoe.layout(cfg, ranks)
            c = cfg.to_c()
            sym, ws = ctypes.c_size_t(), ctypes.c_size_t()
            assert lib.megamoe_buffer_sizes(ctypes.byref(c), ranks, ctypes.byref(sym), ctypes.byref(ws)) == 0
            assert (d["symmetric_bytes"], d["workspace_bytes"]) == (sym.value, ws.value)
            for mode, key in ((_lib.WEIGHTS_COPY, "copy"), (_lib.WEIGHTS_IN_PLACE, "in_place")):
                res, peak = ctypes.c_size_t(), ctypes.c_size_t()
                assert lib.megamoe_weight_memory(ctypes.byref(c), ranks, mode, ctypes.byref(res),
                                                 ctypes.byref(peak)) == 0
                assert d["weights"][key] == {"resident_bytes": res.value, "peak_bytes": peak.value}
            assert d["num_ranks"] == ranks and d["local_experts"] == 16 // ranks
            assert d["config"] == cfg.as_dict()
            # Regions: aligned, in order, inside their space, not overlapping.
            end = {"symmetric": 0, "workspace": 0}
            for name, r in d["regions"].items():
                assert r["bytes"] > 0 and r["offset"] % r["align"] == 0 and r["align"] == 256, name
                assert r["offset"] >= end[r["space"]], f"{name} overlaps the region before it"
                end[r["space"]] = r["offset"] + r["bytes"]
            assert end["symmetric"] <= d["symmetric_bytes"] and end["workspace"] <= d["workspace_bytes"]
            # The staged arm keeps fp32 L1 accumulators, the split arm rows-ready counters, the
            # fused arm a ring (its pool regions) with per-block counters and the call table.
            assert ("l1_acc" in d["regions"]) == (arm == "staged")
            assert ("rows_ready" in d["regions"]) == (arm == "split")
            assert ("block_counters" in d["regions"]) == ("call_tokens" in d["regions"]) == (arm == "fused")
            # The persistent arms' early-combine arrival counters (one per token and 512 columns)
            # and the ranks' combine orders.
            assert ("combine_arrived" in d["regions"]) == ("combine_order" in d["regions"]) == (arm != "staged")
            if arm != "staged":
                units = (cfg.hidden + 511) // 512
                assert d["regions"]["combine_arrived"]["bytes"] == 4 * cfg.max_tokens_per_rank * units
                assert d["regions"]["combine_order"]["bytes"] == 4 * ranks
            assert (d["ring"] is not None) == (arm == "fused")
            if d["ring"]:
                assert d["pool_rows"] == d["ring"]["blocks"] * d["ring"]["block_rows"]
                assert d["regions"]["block_counters"]["bytes"] == 2 * 3 * 4 * d["ring"]["virtual_blocks"]


def test_pool_imbalance_shrinks_the_pool():
    full = megamoe.layout({**SMALL, "max_tokens_per_rank": 4096}, 8)
    half = megamoe.layout({**SMALL, "max_tokens_per_rank": 4096, "pool_imbalance": 2.0}, 8)
    assert half["pool_rows"] < full["pool_rows"]
    assert half["regions"]["pool_x"]["bytes"] < full["regions"]["pool_x"]["bytes"]


def _tool():
    lib = os.environ.get("MEGAMOE_LIBRARY") or megamoe.library_path()
    tool = Path(lib).resolve().parent / "megamoe"
    return tool if tool.is_file() and os.access(tool, os.X_OK) else None


def test_fused_ring_at_flash_ep8_fits_700_mib():
    # docs/FUSED.md section 6: 4096/2048/256 experts/top-6, EP8, T_max 8192: 64 units, lag 29, ring of
    # 8 x (29 + 4) + 4 = 268 blocks; symmetric + workspace within the 700 MiB.
    d = megamoe.layout(dict(hidden=4096, intermediate=2048, num_experts=256, top_k=6, max_tokens_per_rank=8192,
                            arm="fused"), 8)
    assert d["ring"] == {"blocks": 268, "block_rows": 128, "lag": 29, "group": 4, "virtual_blocks": 3103}
    assert d["symmetric_bytes"] + d["workspace_bytes"] <= 700 * 2**20
    split = megamoe.layout(dict(hidden=4096, intermediate=2048, num_experts=256, top_k=6, max_tokens_per_rank=8192,
                                arm="split"), 8)
    assert d["symmetric_bytes"] == split["symmetric_bytes"] + 256  # the call table, one aligned region more


@pytest.mark.skipif(_tool() is None, reason="the megamoe tool is not beside the library")
@pytest.mark.parametrize("arm", ["staged", "split", "fused"])
def test_layout_is_what_megamoe_info_prints(arm):
    out = subprocess.run([str(_tool()), "info", "--model", "flash", "--ranks", "8", "--arm", arm],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    m = re.search(r"config: H (\d+), I (\d+), E (\d+) \(\d+ per rank\), top-(\d+), T_max (\d+) per rank, G (\d+), "
                  r"(\d+) ranks, arm (\w+)", out)
    H, I, E, K, T, G, R = (int(v) for v in m.groups()[:7])
    d = megamoe.layout(megamoe.Config(hidden=H, intermediate=I, num_experts=E, top_k=K, max_tokens_per_rank=T,
                                      quant_group=G, arm=m.group(8)), R)
    printed = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 6 and parts[0] in ("symmetric", "workspace") and parts[2].isdigit():
            printed[parts[1]] = {"space": parts[0], "offset": int(parts[2]), "bytes": int(parts[3]),
                                 "align": int(parts[4])}
    assert printed == d["regions"]
    assert f"pool capacity: {d['pool_rows']} rows" in out
    if arm == "fused":
        r = d["ring"]
        assert f"fused ring: {r['blocks']} blocks of 128 rows = 8 x (lag {r['lag']} + group {r['group']}) + 4" in out
    else:
        assert "fused ring" not in out
