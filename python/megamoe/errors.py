"""One exception class per megamoe_status.

Every failing C call raises the class of its status, carrying the C message
(megamoe_last_error(): it names the argument or the call that failed). The
checks the binding makes itself (dtype, shape, device, contiguity, alignment
of a tensor) raise BadArgumentError naming the Python argument.

Class names follow the C names: MEGAMOE_ERR_BAD_TOPK_INDEX -> BadTopkIndexError
(words in CamelCase, "Error" appended). TimeoutError and NotImplementedError
also derive from the builtins of those names, the errors of a bad value
(shapes, counts, arguments) from ValueError.
"""

import builtins

from . import _lib


class Error(Exception):
    """A megamoe failure.

    status       the megamoe_status code (int), None for the binding's own errors
    status_name  its C name, e.g. "MEGAMOE_ERR_BAD_SHAPE"
    message      the C message (megamoe_last_error) or the binding's text
    call         the C function that failed, or the Python method
    """

    status = None
    status_name = None

    def __init__(self, message, call=None):
        self.message = message
        self.call = call
        text = f"{call}: {message}" if call else message
        if self.status_name:
            text += f" [{self.status_name}]"
        super().__init__(text)


def _define(code, c_name, *bases):
    words = c_name[len("MEGAMOE_ERR_"):].split("_")
    name = "".join(w.capitalize() for w in words) + "Error"
    cls = type(name, (Error,) + bases, {"status": code, "status_name": c_name,
                                       "__doc__": f"{c_name} ({code})", "__module__": __name__})
    return cls


NullPointerError = _define(1, "MEGAMOE_ERR_NULL_POINTER", ValueError)
BadShapeError = _define(2, "MEGAMOE_ERR_BAD_SHAPE", ValueError)
BadExpertsError = _define(3, "MEGAMOE_ERR_BAD_EXPERTS", ValueError)
BadTopKError = _define(4, "MEGAMOE_ERR_BAD_TOP_K", ValueError)
BadMaxTokensError = _define(5, "MEGAMOE_ERR_BAD_MAX_TOKENS", ValueError)
BadQuantGroupError = _define(6, "MEGAMOE_ERR_BAD_QUANT_GROUP", ValueError)
BadClampError = _define(7, "MEGAMOE_ERR_BAD_CLAMP", ValueError)
BadArmError = _define(8, "MEGAMOE_ERR_BAD_ARM", ValueError)
BadRanksError = _define(9, "MEGAMOE_ERR_BAD_RANKS", ValueError)
SizeOverflowError = _define(10, "MEGAMOE_ERR_SIZE_OVERFLOW", ValueError)
TooManyTokensError = _define(11, "MEGAMOE_ERR_TOO_MANY_TOKENS", ValueError)
BadTopkIndexError = _define(12, "MEGAMOE_ERR_BAD_TOPK_INDEX", ValueError)
BadArgumentError = _define(13, "MEGAMOE_ERR_BAD_ARGUMENT", ValueError)
CudaError = _define(14, "MEGAMOE_ERR_CUDA")
NcclError = _define(15, "MEGAMOE_ERR_NCCL")
OutOfMemoryError = _define(16, "MEGAMOE_ERR_OUT_OF_MEMORY")
NoPeerAccessError = _define(17, "MEGAMOE_ERR_NO_PEER_ACCESS")
TimeoutError = _define(18, "MEGAMOE_ERR_TIMEOUT", builtins.TimeoutError)
PeerFailedError = _define(19, "MEGAMOE_ERR_PEER_FAILED")
LayerFailedError = _define(20, "MEGAMOE_ERR_LAYER_FAILED")
NoDeviceError = _define(21, "MEGAMOE_ERR_NO_DEVICE")
UnsupportedDeviceError = _define(22, "MEGAMOE_ERR_UNSUPPORTED_DEVICE")
NotImplementedError = _define(23, "MEGAMOE_ERR_NOT_IMPLEMENTED", builtins.NotImplementedError)
WeightsNotReadyError = _define(24, "MEGAMOE_ERR_WEIGHTS_NOT_READY")
InternalError = _define(25, "MEGAMOE_ERR_INTERNAL")
DeviceCheckError = _define(26, "MEGAMOE_ERR_DEVICE_CHECK")

# status code -> class (the tests check it against megamoe_status_string for
# every code the library knows).
BY_STATUS = {cls.status: cls for cls in (
    NullPointerError, BadShapeError, BadExpertsError, BadTopKError, BadMaxTokensError, BadQuantGroupError,
    BadClampError, BadArmError, BadRanksError, SizeOverflowError, TooManyTokensError, BadTopkIndexError,
    BadArgumentError, CudaError, NcclError, OutOfMemoryError, NoPeerAccessError, TimeoutError,
    PeerFailedError, LayerFailedError, NoDeviceError, UnsupportedDeviceError, NotImplementedError,
    WeightsNotReadyError, InternalError, DeviceCheckError)}


class LayerClosedError(Error):
    """A method of a Layer called after close() or abandon()."""


class UnknownStatusError(Error):
    """A status code this package does not know (a newer library)."""


__all__ = ["Error", "LayerClosedError", "UnknownStatusError", "BY_STATUS"] + \
    [cls.__name__ for cls in BY_STATUS.values()]


def error_for(status, call, message=None):
    """The exception for a failed C call (status != 0), with the C message."""
    msg = _lib.last_error() if message is None else message
    cls = BY_STATUS.get(status)
    if cls is None:
        err = UnknownStatusError(f"status {status} ({_lib.lib.megamoe_status_string(status).decode()}): {msg}",
                                 call)
        err.status = status
        return err
    return cls(msg, call)


def check(status, call):
    """Raises the exception of status (read megamoe_last_error at once, on this thread)."""
    if status != 0:
        raise error_for(status, call)
