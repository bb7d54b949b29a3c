"""The shared library and its C types, through ctypes.

Why ctypes (and not cffi or a compiled extension): the C API is small, flat
and C11 (plain structs, enums and pointers), so ctypes describes it in a page;
installing needs no compiler, and the package is not tied to one Python
version's ABI: one build of libmegamoe.so serves every Python 3 interpreter
on the machine, the same library C programs link. What it costs: a call
through ctypes takes a few microseconds more than through an extension, which
does not show next to a forward (and nothing at all under CUDA graph replay).
The struct layouts below are the header's; the tests check them against the
library (values written by C read back field by field) and that every
function of include/megamoe.h is bound here or listed as not bound.

Where the library is looked for, first found wins:
  1. $MEGAMOE_LIBRARY (a path to libmegamoe.so*): nothing else is tried;
  2. in a source checkout (python/ beside include/megamoe.h), the repository's
     build/libmegamoe.so.0, then the package's own lib/ (so an in-tree run
     never picks a stale copy);
  3. the package's lib/libmegamoe.so.0: the copy `make python` stages and
     `pip install ./python` installs with the package.
The library finds its CUDA runtime and NCCL through the run paths it was
linked with, so no LD_LIBRARY_PATH is needed.
"""

import ctypes
import os
from ctypes import (POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int, c_int32, c_int64,
                    c_uint64, c_void_p)
from pathlib import Path

SONAME = "libmegamoe.so.0"
ENV_LIBRARY = "MEGAMOE_LIBRARY"

# The version of include/megamoe.h this binding is written for
# (MEGAMOE_VERSION_MAJOR / MINOR); the library loaded must say the same.
VERSION_MAJOR = 0
VERSION_MINOR = 1
VERSION = VERSION_MAJOR * 1000 + VERSION_MINOR

NCCL_UNIQUE_ID_BYTES = 128
INDEX_INT32 = 0
INDEX_INT64 = 1
WEIGHTS_COPY = 0
WEIGHTS_IN_PLACE = 1


class megamoe_config(Structure):
    _fields_ = [
        ("hidden", c_int64),
        ("intermediate", c_int64),
        ("num_experts", c_int32),
        ("top_k", c_int32),
        ("max_tokens_per_rank", c_int64),
        ("quant_group", c_int32),
        ("has_swiglu_clamp", c_int32),
        ("swiglu_clamp", c_float),
        ("arm", c_int),
        ("timeout_s", c_double),
        ("pool_imbalance", c_double),
    ]


class megamoe_weights(Structure):
    _fields_ = [("w1", c_void_p), ("w1_sf", c_void_p), ("w2", c_void_p), ("w2_sf", c_void_p)]


class megamoe_forward_args(Structure):
    _fields_ = [
        ("x", c_void_p),
        ("x_sf", c_void_p),
        ("topk_idx", c_void_p),
        ("topk_idx_type", c_int),
        ("topk_w", c_void_p),
        ("num_tokens", c_int64),
        ("num_tokens_bound", c_int64),
        ("y", c_void_p),
    ]


class nccl_unique_id(Structure):
    _fields_ = [("internal", ctypes.c_ubyte * NCCL_UNIQUE_ID_BYTES)]

    def to_bytes(self):
        return ctypes.string_at(ctypes.addressof(self), NCCL_UNIQUE_ID_BYTES)

    @classmethod
    def from_bytes(cls, data):
        s = cls()
        ctypes.memmove(ctypes.addressof(s), bytes(data), NCCL_UNIQUE_ID_BYTES)
        return s


class megamoe_region(Structure):
    _fields_ = [("name", c_char_p), ("space", c_int), ("offset", c_uint64), ("bytes", c_uint64),
                ("align", c_uint64)]


class megamoe_layout_info(Structure):
    _fields_ = [
        ("num_ranks", c_int32),
        ("num_regions", c_int32),
        ("local_experts", c_int64),
        ("pool_rows", c_int64),
        ("symmetric_bytes", c_uint64),
        ("workspace_bytes", c_uint64),
        ("prepared_weight_bytes", c_uint64),
        ("in_place_resident_bytes", c_uint64),
        ("in_place_peak_bytes", c_uint64),
        ("ring_blocks", c_int32),
        ("ring_lag", c_int32),
        ("ring_group", c_int32),
        ("ring_virtual_blocks", c_int32),
    ]


class megamoe_check_bounds(Structure):
    _fields_ = [("row_rel_err", c_double), ("row_abs_over_scale", c_double), ("diff", c_double),
                ("scale_floor", c_double)]


class megamoe_check_stats(Structure):
    _fields_ = [
        ("pass_", c_int32),
        ("first_failure", c_int),
        ("first_failure_name", c_char_p),
        ("first_failure_token", c_int64),
        ("tokens_checked", c_int64),
        ("tokens_masked", c_int64),
        ("tokens_failed", c_int64),
        ("nonfinite", c_int64),
        ("max_rel_err", c_double),
        ("max_rel_err_token", c_int64),
        ("max_abs_over_scale", c_double),
        ("max_abs_over_scale_token", c_int64),
        ("diff", c_double),
        ("diff_judged", c_int32),
        ("diff_min_tokens", c_int32),
        ("bounds", megamoe_check_bounds),
        ("summary", c_char * 512),
    ]


status_t = c_int

# Every function of include/megamoe.h: (name, restype, argtypes).
PROTOTYPES = [
    ("megamoe_status_string", c_char_p, [status_t]),
    ("megamoe_last_error", c_char_p, []),
    ("megamoe_arm_name", c_char_p, [c_int]),
    ("megamoe_config_make", megamoe_config, [c_int64, c_int64, c_int32, c_int32, c_int64]),
    ("megamoe_check_config", status_t, [POINTER(megamoe_config), c_int]),
    ("megamoe_buffer_sizes", status_t, [POINTER(megamoe_config), c_int, POINTER(ctypes.c_size_t),
                                        POINTER(ctypes.c_size_t)]),
    ("megamoe_prepared_weight_bytes", status_t, [POINTER(megamoe_config), c_int, POINTER(ctypes.c_size_t)]),
    ("megamoe_weight_memory", status_t, [POINTER(megamoe_config), c_int, c_int, POINTER(ctypes.c_size_t),
                                         POINTER(ctypes.c_size_t)]),
    ("megamoe_comm_create", status_t, [c_int, c_int, POINTER(nccl_unique_id), POINTER(c_void_p)]),
    ("megamoe_create", status_t, [POINTER(megamoe_config), c_void_p, POINTER(c_void_p)]),
    ("megamoe_destroy", status_t, [c_void_p]),
    ("megamoe_abandon", status_t, [c_void_p]),
    ("megamoe_prepare_weights", status_t, [c_void_p, POINTER(megamoe_weights), c_void_p]),
    ("megamoe_prepare_weights_in_place", status_t, [c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p]),
    ("megamoe_forward", status_t, [c_void_p, POINTER(megamoe_forward_args), c_void_p]),
    ("megamoe_forward_reject", status_t, [c_void_p, status_t, ctypes.c_char_p, c_void_p]),
    ("megamoe_sync", status_t, [c_void_p, c_void_p]),
    ("megamoe_error_word", status_t, [c_void_p, POINTER(c_void_p)]),
    ("megamoe_set_programmatic_launch", status_t, [c_void_p, c_int]),
    ("megamoe_input_staging", status_t, [c_void_p, POINTER(c_void_p), POINTER(c_void_p)]),
    ("megamoe_layer_config", POINTER(megamoe_config), [c_void_p]),
    ("megamoe_layer_rank", c_int, [c_void_p]),
    ("megamoe_layer_num_ranks", c_int, [c_void_p]),
    ("megamoe_version", c_int, []),
    ("megamoe_nccl_versions", status_t, [POINTER(c_int), POINTER(c_int)]),
    ("megamoe_unique_id", status_t, [POINTER(nccl_unique_id)]),
    ("megamoe_comm_destroy", status_t, [c_void_p]),
    ("megamoe_comm_abort", status_t, [c_void_p]),
    ("megamoe_set_device", status_t, [c_int]),
    ("megamoe_get_device", status_t, [POINTER(c_int)]),
    ("megamoe_layout", status_t, [POINTER(megamoe_config), c_int, POINTER(megamoe_layout_info),
                                  POINTER(megamoe_region), c_int]),
    ("megamoe_reference_forward", status_t, [POINTER(megamoe_config), c_int, POINTER(megamoe_weights),
                                             POINTER(megamoe_forward_args)]),
    ("megamoe_check_default_bounds", megamoe_check_bounds, []),
    ("megamoe_check_output", status_t, [c_void_p, c_void_p, c_int64, c_int64, c_void_p, c_int, c_int64,
                                        POINTER(megamoe_check_bounds), POINTER(megamoe_check_stats)]),
]


def _in_source_tree():
    """The repository root when this package runs from a source checkout."""
    root = Path(__file__).resolve().parent.parent.parent
    return root if (root / "include" / "megamoe.h").is_file() and (root / "python").is_dir() else None


def candidates():
    """The paths tried, in order (see the module's docstring)."""
    explicit = os.environ.get(ENV_LIBRARY)
    if explicit:
        return [Path(explicit)]
    packaged = Path(__file__).resolve().parent / "lib" / SONAME
    root = _in_source_tree()
    return ([root / "build" / SONAME] if root else []) + [packaged]


def _load():
    tried = []
    for path in candidates():
        if not path.exists():
            tried.append(f"{path} (absent)")
            continue
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise ImportError(f"megamoe: cannot load {path}: {e}") from e
        return lib, path
    hint = (f"${ENV_LIBRARY} points at a missing file" if os.environ.get(ENV_LIBRARY) else
            "build it with `make -j python` in the repository (or `make python-install`), or point "
            f"${ENV_LIBRARY} at a libmegamoe.so")
    raise ImportError("megamoe: libmegamoe.so not found; tried " + ", ".join(tried) + ": " + hint)


def _bind(lib):
    for name, restype, argtypes in PROTOTYPES:
        try:
            fn = getattr(lib, name)
        except AttributeError as e:
            raise ImportError(f"megamoe: the library lacks {name}: it is older than this package "
                              f"(rebuild it: make -j python)") from e
        fn.restype = restype
        fn.argtypes = argtypes


lib, path = _load()
_bind(lib)
_loaded_version = lib.megamoe_version()
if _loaded_version != VERSION:
    raise ImportError(f"megamoe: {path} is version {_loaded_version // 1000}.{_loaded_version % 1000}, this "
                      f"package is {VERSION_MAJOR}.{VERSION_MINOR}: rebuild and reinstall both from one checkout")


def last_error():
    """megamoe_last_error() of this thread, as text."""
    return lib.megamoe_last_error().decode("utf-8", "replace")
