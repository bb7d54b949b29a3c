"""megamoe: an expert-parallel FP8 Mixture-of-Experts layer for Hopper GPUs,
from Python. A thin binding (ctypes, see _lib.py for why) over the C library
libmegamoe.so: every check, every number and every message is the library's;
the binding adds the reading of tensors (torch, DLPack, CUDA array
interface) and torch.distributed set-up.

    import megamoe, torch, torch.distributed as dist
    cfg = megamoe.Config(hidden=7168, intermediate=2048, num_experts=256, top_k=8,
                         max_tokens_per_rank=4096)
    with megamoe.Layer(cfg, dist.group.WORLD) as layer:     # collective
        layer.prepare_weights(w1, w1_sf, w2, w2_sf)          # this rank's experts
        y = layer.forward(x, x_sf, topk_idx, topk_w)         # current stream, async
        layer.sync()                                         # device-side errors, if any

Importing megamoe sets NCCL_NVLS_ENABLE=0 when it is unset and refuses any
other value (layer.py says why).
"""

import os as _os
import sys as _sys
import warnings as _warnings

from .info import NVLS_VARIABLE as _NVLS, nvls_problem as _nvls_problem

# NVLink multicast stays off (before anything loads NCCL's parameters).
_nvls_preset = _os.environ.get(_NVLS)
if _nvls_preset is None:
    _os.environ[_NVLS] = "0"
    _dist = _sys.modules.get("torch.distributed")
    if _dist is not None and _dist.is_available() and _dist.is_initialized():
        _warnings.warn(f"megamoe was imported after torch.distributed was initialised, with {_NVLS} unset: "
                       f"an NCCL communicator made before this import may have read it already (NCCL reads it "
                       f"once per process). Import megamoe first, or set {_NVLS}=0 in the environment.",
                       RuntimeWarning, stacklevel=2)
elif _nvls_problem():
    raise ImportError("megamoe: " + _nvls_problem())

from . import _lib  # noqa: E402  (loads libmegamoe.so)
from .config import Config, arm_names  # noqa: E402
from .errors import *  # noqa: E402,F401,F403
from .errors import BY_STATUS, Error, LayerClosedError, UnknownStatusError  # noqa: E402,F401
from .info import layout, nvls_problem, runtime_info  # noqa: E402
from .layer import Layer, current_device, set_device, unique_id  # noqa: E402
from .reference import CheckBounds, CheckResult, check_output, default_check_bounds, reference  # noqa: E402

__version__ = f"{_lib.VERSION_MAJOR}.{_lib.VERSION_MINOR}"


def library_path():
    """The libmegamoe.so this process loaded."""
    return str(_lib.path)
