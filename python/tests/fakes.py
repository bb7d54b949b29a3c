"""Stand-ins for device tensors, for the argument checks on machines without
a GPU: they speak __cuda_array_interface__ or DLPack about an address nothing
ever reads (the checks run, and fail or pass, before any CUDA call; a call
that passes them reaches the C library with a NULL layer, which refuses it
without touching a device)."""

import ctypes

BASE = 0x7F3A_0000_0000  # 256-byte aligned, never dereferenced


class FakeCAI:
    """A __cuda_array_interface__ (version 3) object."""

    def __init__(self, shape, typestr, ptr=BASE, strides=None, readonly=False):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (ptr, readonly),
                                         "strides": strides, "version": 3}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

# DLPack type codes (dlpack.h).
DL_INT, DL_UINT, DL_FLOAT, DL_BFLOAT, DL_FLOAT8_E4M3FN = 0, 1, 2, 4, 10


class FakeDLPack:
    """A DLPack producer of a (fake) CUDA tensor; remembers the stream it was asked for."""

    def __init__(self, shape, code, bits, device_type=2, device_id=0, ptr=BASE, strides=None, byte_offset=0):
        n = len(shape)
        self._shape = (ctypes.c_int64 * max(n, 1))(*shape)
        self._strides = (ctypes.c_int64 * max(n, 1))(*strides) if strides is not None else None
        self._managed = _DLManagedTensor(ptr, _DLDevice(device_type, device_id), n, _DLDataType(code, bits, 1),
                                         ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64)),
                                         ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64))
                                         if self._strides is not None else None, byte_offset, None, None)
        self.device = (device_type, device_id)
        self.streams = []

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        return _capsule_new(ctypes.addressof(self._managed), b"dltensor", None)


def gpu_visible():
    """Whether the library sees a CUDA device (the no-GPU tests skip otherwise)."""
    import megamoe
    try:
        megamoe.current_device()
        return True
    except megamoe.NoDeviceError:
        return False
