"""Device tensors as the C API takes them: a pointer, checked first.

A tensor is read, in this order, as
  - a torch.Tensor (its own attributes: no copy, no stream work),
  - a DLPack producer (__dlpack__ / __dlpack_device__): the producer is asked
    for the data on the forward's stream, so it orders its own work before it
    (the DLPack protocol's stream argument),
  - a __cuda_array_interface__ object (CuPy, Numba, ...): that protocol's
    stream entry is not waited on; the caller makes sure the data is ready on
    the forward's stream.
Every check (device, dtype, shape, contiguity, alignment, writability) runs
here, before any CUDA call, and a failure raises BadArgumentError naming the
argument. fp8 e4m3 data may also come as uint8 (the e4m3 bit patterns), bf16
as uint16 or int16 (the bf16 bit patterns): DLPack and the array interface
have no fp8 type for many producers.
"""

import ctypes
import sys
from typing import NamedTuple, Optional, Tuple

from .errors import BadArgumentError

# DLPack (dlpack.h): device types and type codes.
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
_DL_DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal", 10: "rocm",
                    13: "cuda_managed"}
_DL_CODES = {(0, 8): "int8", (0, 16): "int16", (0, 32): "int32", (0, 64): "int64", (1, 8): "uint8",
             (1, 16): "uint16", (1, 32): "uint32", (1, 64): "uint64", (2, 16): "float16", (2, 32): "float32",
             (2, 64): "float64", (4, 16): "bfloat16", (6, 8): "bool", (10, 8): "float8_e4m3fn",
             (12, 8): "float8_e5m2"}

# Array-interface type strings (little-endian or byte-order-free).
_TYPESTR = {"|i1": "int8", "<i2": "int16", "<i4": "int32", "<i8": "int64", "|u1": "uint8", "<u2": "uint16",
            "<u4": "uint32", "<u8": "uint64", "<f2": "float16", "<f4": "float32", "<f8": "float64",
            "|b1": "bool", "<V2": "bfloat16"}

_ITEMSIZE = {"int8": 1, "int16": 2, "int32": 4, "int64": 8, "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8,
             "float16": 2, "float32": 4, "float64": 8, "bfloat16": 2, "bool": 1, "float8_e4m3fn": 1,
             "float8_e5m2": 1}

# What each kind of argument accepts.
FP8 = ("float8_e4m3fn", "uint8")
BF16 = ("bfloat16", "uint16", "int16")
F32 = ("float32",)
INDEX = ("int32", "int64")


class Tensor(NamedTuple):
    """What the binding knows of one argument."""
    name: str
    ptr: int
    shape: Tuple[int, ...]
    strides: Optional[Tuple[int, ...]]  # in elements; None: C-contiguous
    dtype: str
    device: str                         # "cuda", "cpu", ...
    device_id: Optional[int]            # None when the protocol does not say (array interface)
    readonly: bool
    keep: object                        # keeps a DLPack capsule alive for the call

    @property
    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n


def _torch_tensor(name, obj):
    dtype = str(obj.dtype).replace("torch.", "")
    return Tensor(name, obj.data_ptr(), tuple(obj.shape), tuple(obj.stride()), dtype, obj.device.type,
                  obj.device.index, False, None)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get.restype = ctypes.c_void_p
_capsule_get.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _dlpack_stream(stream):
    """The DLPack stream argument for a CUDA stream handle (0, the legacy default stream, is 1 there)."""
    return 1 if not stream else stream


def _dlpack_tensor(name, obj, stream, call):
    dev_type, dev_id = obj.__dlpack_device__()
    dev_type, dev_id = int(dev_type), int(dev_id)
    if dev_type not in (_DL_CUDA, _DL_CUDA_MANAGED):
        # Not asked for its data: a producer may copy, or refuse, for a foreign device.
        return Tensor(name, 0, (), None, "?", _DL_DEVICE_NAMES.get(dev_type, f"dlpack device {dev_type}"), dev_id,
                      True, None)
    try:
        capsule = obj.__dlpack__(stream=_dlpack_stream(stream))
    except TypeError:
        capsule = obj.__dlpack__()
    try:
        address = _capsule_get(capsule, b"dltensor")
    except (ValueError, TypeError) as e:
        raise BadArgumentError(f"{name}: __dlpack__ gave no DLPack tensor capsule ({e})", call) from None
    t = _DLTensor.from_address(address)  # DLManagedTensor starts with its DLTensor
    key = (t.dtype.code, t.dtype.bits)
    dtype = _DL_CODES.get(key, f"dlpack type code {key[0]} bits {key[1]}") if t.dtype.lanes == 1 else \
        f"dlpack vector type ({t.dtype.lanes} lanes)"
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else None
    ptr = (t.data or 0) + t.byte_offset
    return Tensor(name, ptr, shape, strides, dtype, "cuda", t.device.device_id, False, capsule)


def _array_interface_tensor(name, obj, call):
    cai = obj.__cuda_array_interface__
    try:
        shape = tuple(int(d) for d in cai["shape"])
        typestr = cai["typestr"]
        ptr, readonly = cai["data"]
    except (KeyError, TypeError, ValueError) as e:
        raise BadArgumentError(f"{name}: malformed __cuda_array_interface__ ({e})", call) from None
    if cai.get("mask") is not None:
        raise BadArgumentError(f"{name}: a masked array (__cuda_array_interface__ mask) is not supported", call)
    dtype = _TYPESTR.get(typestr, f"typestr {typestr!r}")
    strides = cai.get("strides")
    if strides is not None:
        size = _ITEMSIZE.get(dtype)
        if size is None or any(int(s) % size for s in strides):
            strides = tuple(-1 for _ in shape)  # not expressible in elements: not contiguous
        else:
            strides = tuple(int(s) // size for s in strides)
    return Tensor(name, int(ptr or 0), shape, strides, dtype, "cuda", None, bool(readonly), None)


def describe(name, obj, stream=0, call="megamoe"):
    """The Tensor of one argument, whatever protocol it speaks (no checks yet)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return _torch_tensor(name, obj)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _dlpack_tensor(name, obj, stream, call)
    if hasattr(obj, "__cuda_array_interface__"):
        return _array_interface_tensor(name, obj, call)
    raise BadArgumentError(f"{name}: a {type(obj).__name__} is not a device tensor (give a torch.Tensor, or an "
                           f"object with __dlpack__ or __cuda_array_interface__)", call)


def _contiguous(t):
    if t.strides is None or t.numel == 0:
        return True
    expected = 1
    for size, stride in zip(reversed(t.shape), reversed(t.strides)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def device_tensor(name, obj, dtypes, shape, device_id, align=1, writable=False, stream=0, call="megamoe"):
    """Reads obj and checks it: CUDA memory on device_id (when the protocol says),
    one of dtypes, exactly shape (None entries are free), C-contiguous, its
    pointer a multiple of align bytes (an int, or a dict by dtype; checked when
    it holds elements), writable when
    asked. Returns the Tensor."""
    t = describe(name, obj, stream, call)
    if t.device != "cuda" and t.device != "cuda_managed":
        raise BadArgumentError(f"{name}: in {t.device} memory; the layer needs CUDA device memory", call)
    if device_id is not None and t.device_id is not None and t.device_id != device_id:
        raise BadArgumentError(f"{name}: on cuda:{t.device_id}, the layer runs on cuda:{device_id}", call)
    if t.dtype not in dtypes:
        raise BadArgumentError(f"{name}: dtype {t.dtype}, expected {' or '.join(dtypes)}", call)
    if len(t.shape) != len(shape) or any(e is not None and d != e for d, e in zip(t.shape, shape)):
        want = "(" + ", ".join("*" if e is None else str(e) for e in shape) + ")"
        raise BadArgumentError(f"{name}: shape {tuple(t.shape)}, expected {want}", call)
    if not _contiguous(t):
        raise BadArgumentError(f"{name}: not contiguous (strides {t.strides} for shape {t.shape}); pass "
                               f"a contiguous tensor (e.g. .contiguous())", call)
    if isinstance(align, dict):
        align = align[t.dtype]
    if t.numel > 0 and t.ptr % align:
        raise BadArgumentError(f"{name}: address {t.ptr:#x} is not {align}-byte aligned", call)
    if writable and t.readonly:
        raise BadArgumentError(f"{name}: read-only, and the layer writes it", call)
    return t


def stream_handle(stream, device_id=None, call="megamoe"):
    """A cudaStream_t (int) for stream: None (torch's current stream on the
    layer's device when torch is imported, else the legacy default stream 0),
    an int handle, an object with .cuda_stream (torch.cuda.Stream) or
    __cuda_stream__() (the CUDA Python stream protocol)."""
    if stream is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            return int(torch.cuda.current_stream(device_id).cuda_stream)
        return 0
    if isinstance(stream, bool):
        raise BadArgumentError(f"stream: {stream!r} is not a CUDA stream", call)
    if isinstance(stream, int):
        if stream < 0 or stream >= 1 << 64:
            raise BadArgumentError(f"stream: {stream} is not a stream handle", call)
        return stream
    handle = getattr(stream, "cuda_stream", None)
    if isinstance(handle, int) and not isinstance(handle, bool):
        return handle
    if hasattr(stream, "__cuda_stream__"):
        version_and_handle = stream.__cuda_stream__()
        try:
            return int(version_and_handle[1])
        except (TypeError, IndexError, ValueError):
            pass
    raise BadArgumentError(f"stream: a {type(stream).__name__} is not a CUDA stream (give None, an int "
                           f"handle, a torch.cuda.Stream or an object with __cuda_stream__)", call)
