"""The C CPU reference and the per-token checker on host arrays (numpy).

megamoe.reference(...) is the library's own reference (ref/ref.h, through
megamoe_reference_forward): the contract of DESIGN.md section 1 computed
exactly on the CPU. megamoe.check_output(...) is the checker the library's GPU
tests judge every forward with (ref/ref_check.h, through
megamoe_check_output). Both take numpy arrays (or CPU/GPU torch tensors,
copied to the host) and check every shape and dtype here before the C call.
fp8 data is uint8 (e4m3 bit patterns) or an fp8 dtype, bf16 data uint16 bit
patterns or torch.bfloat16.
"""

import ctypes
import dataclasses
import sys

from . import _lib
from .config import _rank_count, as_config
from .errors import BadArgumentError, check

_lib_ = _lib.lib

_FP8_NAMES = {"float8_e4m3fn"}
_BF16_NAMES = {"bfloat16"}


def _np():
    try:
        import numpy
    except ImportError as e:  # pragma: no cover - numpy is a dependency of these functions only
        raise ImportError("megamoe.reference / check_output need numpy") from e
    return numpy


def _host_array(name, a, kind, shape, call):
    """a as a C-contiguous numpy array of the kind's dtype with exactly shape
    (None entries free). kind: "fp8" (uint8 codes), "bf16" (uint16 bits),
    "float32", "index" (int32 or int64)."""
    np = _np()
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(a, torch.Tensor):
        t = a.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        name_of = str(t.dtype).replace("torch.", "")
        if name_of in _FP8_NAMES:
            t = t.view(torch.uint8)
        elif name_of in _BF16_NAMES:
            t = t.view(torch.int16)
        a = t.contiguous().numpy()
        if name_of in _BF16_NAMES:
            a = a.view(np.uint16)
    elif not isinstance(a, np.ndarray):
        if a is None or not hasattr(a, "__array__") and not isinstance(a, (list, tuple)):
            raise BadArgumentError(f"{name}: a {type(a).__name__} is not an array", call)
        a = np.asarray(a)
    dt = a.dtype
    if kind == "fp8":
        if dt.itemsize == 1 and (dt == np.uint8 or dt.name in _FP8_NAMES):
            a = a.view(np.uint8)
        else:
            raise BadArgumentError(f"{name}: dtype {dt}, expected uint8 (e4m3 bit patterns) or float8_e4m3fn", call)
    elif kind == "bf16":
        if dt == np.uint16 or dt == np.int16 or dt.name in _BF16_NAMES:
            a = a.view(np.uint16)
        else:
            raise BadArgumentError(f"{name}: dtype {dt}, expected uint16 (bf16 bit patterns) or bfloat16", call)
    elif kind == "float32":
        if dt != np.float32:
            raise BadArgumentError(f"{name}: dtype {dt}, expected float32", call)
    elif kind == "index":
        if dt != np.int32 and dt != np.int64:
            raise BadArgumentError(f"{name}: dtype {dt}, expected int32 or int64", call)
    if a.ndim != len(shape) or any(e is not None and d != e for d, e in zip(a.shape, shape)):
        want = "(" + ", ".join("*" if e is None else str(e) for e in shape) + ")"
        raise BadArgumentError(f"{name}: shape {a.shape}, expected {want}", call)
    return np.ascontiguousarray(a)


def _ptr(a):
    return a.ctypes.data if a.size else None


def _rank_slices(name, w, kind, per_expert_shape, num_ranks, local_experts, num_experts, call):
    """Per-rank arrays of a weight given either as one array of all E experts or
    as a list of num_ranks arrays of E_l experts each."""
    if isinstance(w, (list, tuple)):
        if len(w) != num_ranks:
            raise BadArgumentError(f"{name}: {len(w)} per-rank arrays, expected num_ranks = {num_ranks}", call)
        return [_host_array(f"{name}[{r}]", w[r], kind, (local_experts,) + per_expert_shape, call)
                for r in range(num_ranks)]
    whole = _host_array(name, w, kind, (num_experts,) + per_expert_shape, call)
    return [whole[r * local_experts:(r + 1) * local_experts] for r in range(num_ranks)]


def reference(config, x, x_sf, topk_idx, topk_w, w1, w1_sf, w2, w2_sf, num_ranks=1):
    """y [T, H] (uint16 bf16 bits) of one rank's tokens, by the C CPU reference.

    x [T, H] fp8 (uint8 codes), x_sf [T, H/128] float32, topk_idx [T, K] int32 or
    int64 (global expert ids, -1 masked), topk_w [T, K] float32.
    Weights of ALL experts (a token may go to any): each of w1 [E, 2I, H],
    w1_sf [E, 2I/128, H/128], w2 [E, H, I], w2_sf [E, H/128, I/128] as one array
    over every expert, or as a list of num_ranks arrays, rank r's E_l experts.
    num_ranks only splits the experts (the numbers do not depend on it) and
    enters the config check (E divisible by it)."""
    call = "megamoe.reference"
    np = _np()
    cfg = as_config(config)
    c = cfg.to_c()
    R = _rank_count(num_ranks)
    cfg.check(R)
    H, I, E, K = cfg.hidden, cfg.intermediate, cfg.num_experts, cfg.top_k
    El = E // R
    xa = _host_array("x", x, "fp8", (None, H), call)
    T = xa.shape[0]
    sfa = _host_array("x_sf", x_sf, "float32", (T, H // 128), call)
    idx = _host_array("topk_idx", topk_idx, "index", (T, K), call)
    wa = _host_array("topk_w", topk_w, "float32", (T, K), call)
    ranks = [_rank_slices("w1", w1, "fp8", (2 * I, H), R, El, E, call),
             _rank_slices("w1_sf", w1_sf, "float32", (2 * I // 128, H // 128), R, El, E, call),
             _rank_slices("w2", w2, "fp8", (H, I), R, El, E, call),
             _rank_slices("w2_sf", w2_sf, "float32", (H // 128, I // 128), R, El, E, call)]
    weights = (_lib.megamoe_weights * R)()
    for r in range(R):
        weights[r] = _lib.megamoe_weights(*(_ptr(ranks[i][r]) for i in range(4)))
    y = np.zeros((T, H), dtype=np.uint16)
    args = _lib.megamoe_forward_args(_ptr(xa), _ptr(sfa), _ptr(idx),
                                     _lib.INDEX_INT64 if idx.dtype == np.int64 else _lib.INDEX_INT32,
                                     _ptr(wa), T, 0, _ptr(y))
    check(_lib_.megamoe_reference_forward(ctypes.byref(c), R, weights, ctypes.byref(args)),
          "megamoe_reference_forward")
    return y


@dataclasses.dataclass
class CheckBounds:
    """Bounds of check_output (megamoe_check_bounds)."""
    row_rel_err: float
    row_abs_over_scale: float
    diff: float
    scale_floor: float

    def to_c(self):
        try:
            return _lib.megamoe_check_bounds(float(self.row_rel_err), float(self.row_abs_over_scale),
                                             float(self.diff), float(self.scale_floor))
        except (TypeError, ValueError) as e:
            raise BadArgumentError(f"bounds: {e}", "megamoe.check_output") from None


def default_check_bounds():
    """The bounds the library's GPU tests judge with (megamoe_check_default_bounds)."""
    b = _lib_.megamoe_check_default_bounds()
    return CheckBounds(b.row_rel_err, b.row_abs_over_scale, b.diff, b.scale_floor)


@dataclasses.dataclass
class CheckResult:
    """What check_output found (megamoe_check_stats). True when it passed."""
    passed: bool
    first_failure: str
    first_failure_token: int
    tokens_checked: int
    tokens_masked: int
    tokens_failed: int
    nonfinite: int
    max_rel_err: float
    max_rel_err_token: int
    max_abs_over_scale: float
    max_abs_over_scale_token: int
    diff: float
    diff_judged: bool
    diff_min_tokens: int
    bounds: CheckBounds
    summary: str

    def __bool__(self):
        return self.passed

    def __str__(self):
        return self.summary


def check_output(y, y_ref, topk_idx, bounds=None):
    """Judges y [T, H] (bf16) against y_ref [T, H] from reference(), token by
    token, with the slots' top-k indices [T, K] (ref/ref_check.h: per-token
    relative and max errors, the whole rank's diff, NaN never passes, a token
    with every slot masked must be exactly 0). Returns a CheckResult (falsy
    when it failed; .summary says where)."""
    call = "megamoe.check_output"
    ya = _host_array("y", y, "bf16", (None, None), call)
    T, H = ya.shape
    ra = _host_array("y_ref", y_ref, "bf16", (T, H), call)
    idx = _host_array("topk_idx", topk_idx, "index", (T, None), call)
    K = idx.shape[1]
    if bounds is None:
        cb = None
    elif isinstance(bounds, CheckBounds):
        cb = bounds.to_c()
    elif isinstance(bounds, dict):
        try:
            cb = CheckBounds(**{**dataclasses.asdict(default_check_bounds()), **bounds}).to_c()
        except TypeError as e:
            raise BadArgumentError(f"bounds: {e}", call) from None
    else:
        raise BadArgumentError(f"bounds: a CheckBounds or a dict, not {type(bounds).__name__}", call)
    np = _np()
    stats = _lib.megamoe_check_stats()
    status = _lib_.megamoe_check_output(
        _ptr(ya), _ptr(ra), T, H, _ptr(idx), _lib.INDEX_INT64 if idx.dtype == np.int64 else _lib.INDEX_INT32,
        K, ctypes.byref(cb) if cb is not None else None, ctypes.byref(stats))
    check(status, "megamoe_check_output")
    b = stats.bounds
    return CheckResult(
        passed=bool(stats.pass_), first_failure=stats.first_failure_name.decode(),
        first_failure_token=stats.first_failure_token, tokens_checked=stats.tokens_checked,
        tokens_masked=stats.tokens_masked, tokens_failed=stats.tokens_failed, nonfinite=stats.nonfinite,
        max_rel_err=stats.max_rel_err, max_rel_err_token=stats.max_rel_err_token,
        max_abs_over_scale=stats.max_abs_over_scale, max_abs_over_scale_token=stats.max_abs_over_scale_token,
        diff=stats.diff, diff_judged=bool(stats.diff_judged), diff_min_tokens=stats.diff_min_tokens,
        bounds=CheckBounds(b.row_rel_err, b.row_abs_over_scale, b.diff, b.scale_floor),
        summary=stats.summary.decode("utf-8", "replace"))
