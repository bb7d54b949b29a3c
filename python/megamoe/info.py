"""Facts without a device: the buffer layout of a config, the library's
versions, and the NCCL_NVLS_ENABLE rule."""

import ctypes
import os
import re

from . import _lib
from .config import _rank_count, as_config
from .errors import check

_lib_ = _lib.lib
NVLS_VARIABLE = "NCCL_NVLS_ENABLE"
_SPACES = {0: "symmetric", 1: "workspace"}
_RING_BLOCK_ROWS = 128  # src/fused.h MM_FUSED_BLOCK_ROWS: rows of a ring slot


def layout(config, num_ranks=1):
    """The buffers megamoe_create allocates per rank for config on num_ranks
    ranks, as `megamoe info` prints them (megamoe_layout):
      {"config": {...}, "num_ranks", "local_experts", "pool_rows",
       "symmetric_bytes", "workspace_bytes",
       "weights": {"copy": {"resident_bytes", "peak_bytes"},
                   "in_place": {"resident_bytes", "peak_bytes"}},
       "regions": {name: {"space": "symmetric" | "workspace", "offset", "bytes", "align"}},
       "ring": None, or for the fused arm {"blocks", "block_rows", "lag", "group", "virtual_blocks"}}
    regions lists those the config's arm uses (bytes > 0), in layout order. The
    fused arm's pool regions are its ring (docs/FUSED.md): pool_rows =
    blocks * block_rows."""
    cfg = as_config(config)
    c = cfg.to_c()
    ranks = _rank_count(num_ranks)
    info = _lib.megamoe_layout_info()
    check(_lib_.megamoe_layout(ctypes.byref(c), ranks, ctypes.byref(info), None, 0), "megamoe_layout")
    regions = (_lib.megamoe_region * info.num_regions)()
    check(_lib_.megamoe_layout(ctypes.byref(c), ranks, ctypes.byref(info), regions, info.num_regions),
          "megamoe_layout")
    return {
        "config": cfg.as_dict(),
        "num_ranks": info.num_ranks,
        "local_experts": info.local_experts,
        "pool_rows": info.pool_rows,
        "symmetric_bytes": info.symmetric_bytes,
        "workspace_bytes": info.workspace_bytes,
        "weights": {
            "copy": {"resident_bytes": info.prepared_weight_bytes, "peak_bytes": info.prepared_weight_bytes},
            "in_place": {"resident_bytes": info.in_place_resident_bytes, "peak_bytes": info.in_place_peak_bytes},
        },
        "regions": {r.name.decode(): {"space": _SPACES.get(r.space, str(r.space)), "offset": r.offset,
                                      "bytes": r.bytes, "align": r.align}
                    for r in regions if r.bytes > 0},
        "ring": None if info.ring_blocks == 0 else {
            "blocks": info.ring_blocks, "block_rows": _RING_BLOCK_ROWS, "lag": info.ring_lag,
            "group": info.ring_group, "virtual_blocks": info.ring_virtual_blocks},
    }


def nvls_problem(environ=None):
    """None when NCCL_NVLS_ENABLE reads as 0 the way megamoe_comm_create reads it
    (a whole base-10 zero: "0", "00", "-0"), else the reason, in words."""
    value = (os.environ if environ is None else environ).get(NVLS_VARIABLE)
    if value is not None and re.fullmatch(r"[ \t\n\v\f\r]*[+-]?[0-9]+", value) and int(value) == 0:
        return None
    shown = "unset" if value is None else repr(value)
    return (f"{NVLS_VARIABLE} is {shown}, not 0: megamoe never uses NVLink multicast, and NCCL must not set it up "
            f"either (a program that does can take GPUs that others share out of service); NCCL reads the variable "
            f"once per process, so set {NVLS_VARIABLE}=0 (or leave it unset and import megamoe before any NCCL "
            f"communicator is made)")


def _version_text(code):
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


def _mapped(fragment):
    """Files of this process whose name holds fragment (Linux /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
    except OSError:
        return []
    return sorted(p for p in paths if fragment in os.path.basename(p))


def runtime_info():
    """What this process runs: the package and library versions and path, the
    NCCL the library was built against and the one loaded, and the NCCL and
    CUDA runtime files mapped into the process (two different ones mean two
    copies are loaded: only the first one's symbols are used)."""
    header, loaded = ctypes.c_int(0), ctypes.c_int(0)
    check(_lib_.megamoe_nccl_versions(ctypes.byref(header), ctypes.byref(loaded)), "megamoe_nccl_versions")
    v = _lib_.megamoe_version()
    return {
        "version": f"{v // 1000}.{v % 1000}",
        "library": str(_lib.path),
        "nccl_header": _version_text(header.value),
        "nccl_loaded": _version_text(loaded.value),
        "nccl_files": _mapped("libnccl"),
        "cudart_files": _mapped("libcudart"),
        "nvls_enable": os.environ.get(NVLS_VARIABLE),
    }
