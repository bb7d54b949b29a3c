"""megamoe.Layer: one rank's layer, one process per GPU.

Streams. Every call that touches the device works on a stream: the one given,
else torch's current stream on the layer's device when torch is imported,
else the legacy default stream. forward() enqueues the whole layer there and
returns at once (inputs read and the output written in stream order, as a
kernel of that stream would); prepare_weights() enqueues the weight
conversion there (the in-place mode waits for it); sync() waits for the
stream and reports the first device-side error since the last sync. Use
layer.error_word() to check forwards without a host sync.

CUDA graphs. forward() makes no allocation of its own (unless out is None,
then torch allocates the output, inside the graph's pool when capturing),
no host sync and no stream query, so it can be captured: call it inside
`with torch.cuda.graph(g):` on every rank and replay the graph on every rank
the same number of times. Each replay is one collective forward, with the
inputs that sit in the captured tensors at replay time.

Collectives. The constructor, forward() and close() are collective: every
rank calls them, in the same order. A forward whose arguments this binding
rejects (wrong dtype, shape, device, ...) still takes part: it enqueues the
C layer's empty forward that carries an error to the peers (their sync()
raises PeerFailedError) and then raises BadArgumentError here, so no rank
waits for a forward that never comes.

NVLink multicast. Importing megamoe sets NCCL_NVLS_ENABLE=0 when it is unset
(NCCL reads it once per process, at its first communicator) and refuses any
other value: megamoe never uses NVLink multicast, and a program that sets it
up can take shared GPUs out of service. Import megamoe before
torch.distributed creates its NCCL communicators, or set NCCL_NVLS_ENABLE=0
in the environment that starts the processes.
"""

import ctypes
import sys
import warnings

from . import _lib
from .config import as_config
from .errors import (BadArgumentError, BadRanksError, Error, LayerClosedError, PeerFailedError, check,
                     error_for)
from .info import layout, nvls_problem
from .tensors import BF16, F32, FP8, INDEX, device_tensor, stream_handle

_lib_ = _lib.lib


def unique_id():
    """A new NCCL unique id (bytes) for Layer(..., rank=, world_size=, unique_id=):
    make it on one rank and pass it to the others."""
    uid = _lib.nccl_unique_id()
    check(_lib_.megamoe_unique_id(ctypes.byref(uid)), "megamoe_unique_id")
    return uid.to_bytes()


_new_unique_id = unique_id  # (Layer's unique_id argument hides the name there)


def set_device(device):
    """cudaSetDevice on the library's CUDA runtime (and torch's, when torch is imported)."""
    device = _int_arg("device", device, "set_device")
    check(_lib_.megamoe_set_device(device), "megamoe_set_device")
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.set_device(device)


def current_device():
    """cudaGetDevice on the library's CUDA runtime (NoDeviceError without a GPU)."""
    d = ctypes.c_int(-1)
    check(_lib_.megamoe_get_device(ctypes.byref(d)), "megamoe_get_device")
    return d.value


def _int_arg(name, value, call="megamoe"):
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadArgumentError(f"{name} = {value!r}: must be an integer", call)
    if not -(1 << 31) <= value < (1 << 31):
        raise BadArgumentError(f"{name} = {value}: does not fit in int32", call)
    return value


def _uid_struct(uid):
    if isinstance(uid, (bytes, bytearray)) and len(uid) == _lib.NCCL_UNIQUE_ID_BYTES:
        return _lib.nccl_unique_id.from_bytes(uid)
    raise BadArgumentError(f"unique_id: {_lib.NCCL_UNIQUE_ID_BYTES} bytes from megamoe.unique_id(), not "
                           f"{type(uid).__name__}" + (f" of {len(uid)} bytes" if isinstance(uid, (bytes, bytearray))
                                                      else ""), "Layer")


def _torch_dist(group):
    """torch.distributed when it is imported and initialised (or a group was given)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    if group is not None:
        raise BadArgumentError("group: given, but torch.distributed is not initialised "
                               "(call torch.distributed.init_process_group first)", "Layer")
    return None


class Layer:
    """One rank of a megamoe layer.

    Layer(config)                       one process, one GPU (or: torch.distributed
                                        initialised: its default group)
    Layer(config, group)                a torch.distributed process group (NCCL
                                        backend), one process per GPU: rank 0 makes the
                                        NCCL unique id and the group shares it
    Layer(config, rank=r, world_size=n, unique_id=uid)
                                        without torch.distributed: uid from
                                        megamoe.unique_id() on one rank, passed to all
    device: the CUDA device (default: the current one, torch's when torch is
    imported; set it first, e.g. torch.cuda.set_device(local_rank)).
    config: a megamoe.Config or a dict of its fields.
    Collective: every rank constructs it with the same config. NCCL's
    communicator set-up (ncclCommInitRank) waits for every rank: a rank that
    fails before it (the checks here are shared first in the group mode)
    leaves the others waiting there.
    """

    def __init__(self, config, group=None, *, rank=None, world_size=None, unique_id=None, device=None):
        self.config = as_config(config)
        self._handle = None
        self._comm = None
        self._keep = ()            # tensors the layer reads until close (in-place weights)
        self._binding_rejects = []  # forwards this binding rejected since the last sync
        self.weights_mode = None
        explicit = rank is not None or world_size is not None or unique_id is not None
        if explicit and group is not None:
            raise BadArgumentError("give either group or rank / world_size / unique_id, not both", "Layer")
        if explicit:
            if rank is None or world_size is None:
                raise BadArgumentError("rank and world_size: both needed with unique_id", "Layer")
            self.rank, self.world_size = _int_arg("rank", rank, "Layer"), _int_arg("world_size", world_size, "Layer")
            self._check_ranks()
            self.config.check(self.world_size)
            if unique_id is None and self.world_size > 1:
                raise BadArgumentError("unique_id: needed with world_size > 1 (megamoe.unique_id() on one rank, "
                                       "passed to every rank)", "Layer")
            uid = _uid_struct(unique_id) if unique_id is not None else None
            self._local_setup(device)
            if uid is None:
                uid = _uid_struct(_new_unique_id())
        else:
            dist = _torch_dist(group)
            if dist is None:
                self.rank, self.world_size = 0, 1
                self.config.check(1)
                self._local_setup(device)
                uid = _uid_struct(_new_unique_id())
            else:
                uid = self._agree(dist, group, device)
        self._create(uid)

    # ---- construction ---------------------------------------------------------

    def _check_ranks(self):
        if not 1 <= self.world_size:
            raise BadRanksError(f"world_size = {self.world_size}: must be at least 1", "Layer")
        if not 0 <= self.rank < self.world_size:
            raise BadRanksError(f"rank = {self.rank}: must be in [0, world_size = {self.world_size})", "Layer")

    def _local_setup(self, device):
        """Checks that need no peer: NCCL_NVLS_ENABLE, the device."""
        problem = nvls_problem()
        if problem:
            raise BadArgumentError(problem, "Layer")
        if device is None:
            # torch's current device, made the library's too (the same setting
            # whether or not the two load one CUDA runtime).
            torch = sys.modules.get("torch")
            if torch is not None and torch.cuda.is_available():
                device = torch.cuda.current_device()
        if device is not None:
            set_device(device)
        self.device = current_device()

    def _agree(self, dist, group, device):
        """torch.distributed: every rank checks what it can alone, then one
        all_gather_object shares the outcome, the config and rank 0's unique id,
        so a rank that fails here never leaves the others waiting."""
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        failure, uid = None, None
        try:
            self._check_ranks()
            self.config.check(self.world_size)
            self._local_setup(device)
            if self.rank == 0:
                uid = _new_unique_id()
        except Exception as e:  # noqa: BLE001 - shared with the peers, then raised
            failure = e
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, (failure is None, str(failure) if failure else "",
                                          self.config.as_dict(), uid), group=group)
        if failure is not None:
            raise failure
        for r, (ok, message, _, _) in enumerate(gathered):
            if not ok:
                raise PeerFailedError(f"rank {r} of the group failed before the layer was made: {message}", "Layer")
        for r, (_, _, cfg, _) in enumerate(gathered):
            if cfg != gathered[0][2]:
                raise BadArgumentError(f"config: rank {r} has {cfg}, rank 0 has {gathered[0][2]}: every rank needs "
                                       f"the same config", "Layer")
        return _uid_struct(gathered[0][3])

    def _create(self, uid):
        comm = ctypes.c_void_p()
        check(_lib_.megamoe_comm_create(self.rank, self.world_size, ctypes.byref(uid), ctypes.byref(comm)),
              "megamoe_comm_create")
        self._comm = comm
        cfg = self.config.to_c()
        handle = ctypes.c_void_p()
        status = _lib_.megamoe_create(ctypes.byref(cfg), comm, ctypes.byref(handle))
        if status != 0:
            err = error_for(status, "megamoe_create")
            _lib_.megamoe_comm_destroy(comm)
            self._comm = None
            raise err
        self._handle = handle

    @classmethod
    def _for_argument_checks(cls, config, world_size=1, device=0):
        """A layer object with no C layer behind it (NULL): every method runs its
        Python checks and then reaches the C call, which refuses the NULL layer
        (NullPointerError) without touching a device. For tests on machines
        without a GPU."""
        self = cls.__new__(cls)
        self.config = as_config(config)
        self.config.check(world_size)
        self._handle = ctypes.c_void_p()
        self._comm = None
        self._keep = ()
        self._binding_rejects = []
        self.weights_mode = None
        self.rank, self.world_size, self.device = 0, world_size, device
        return self

    # ---- state -----------------------------------------------------------------

    def _layer(self, call):
        if self._handle is None:
            raise LayerClosedError("the layer was closed", call)
        return self._handle

    @property
    def local_experts(self):
        return self.config.num_experts // self.world_size

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        if getattr(self, "_handle", None):
            warnings.warn("megamoe.Layer was not closed: its device memory stays allocated until the process ends "
                          "(close() is collective, so the garbage collector does not call it)", ResourceWarning,
                          stacklevel=2)

    def __repr__(self):
        state = "closed" if self._handle is None else f"cuda:{self.device}"
        return f"megamoe.Layer(rank {self.rank} of {self.world_size}, {state}, {self.config})"

    # ---- weights ---------------------------------------------------------------

    def prepare_weights(self, w1, w1_sf, w2, w2_sf, in_place=False, stream=None):
        """This rank's E_l experts in the checkpoint layout (DESIGN.md section 1):
        w1 [E_l, 2I, H] fp8 e4m3 (gate rows, then up rows), w1_sf [E_l, 2I/128, H/128]
        fp32, w2 [E_l, H, I] fp8, w2_sf [E_l, H/128, I/128] fp32.

        in_place=False (megamoe_prepare_weights): the layer keeps its own prepared
        copy, made on the stream; the tensors may be freed once the stream ran it.
        in_place=True (megamoe_prepare_weights_in_place): no second copy: w1 is
        REWRITTEN in place into the kernels' layout, w2 and w2_sf are read at every
        forward; the layer keeps references to them until close(). Not collective."""
        call = "prepare_weights"
        handle = self._layer(call)
        c = self.config
        El, H, I = self.local_experts, c.hidden, c.intermediate
        s = stream_handle(stream, self.device, call)
        dev = self.device
        t_w1 = device_tensor("w1", w1, FP8, (El, 2 * I, H), dev, 16, writable=in_place, stream=s, call=call)
        t_w1_sf = device_tensor("w1_sf", w1_sf, F32, (El, 2 * I // 128, H // 128), dev, 4, stream=s, call=call)
        t_w2 = device_tensor("w2", w2, FP8, (El, H, I), dev, 16, stream=s, call=call)
        t_w2_sf = device_tensor("w2_sf", w2_sf, F32, (El, H // 128, I // 128), self.device, 16 if in_place else 4,
                                stream=s, call=call)
        if in_place:
            status = _lib_.megamoe_prepare_weights_in_place(handle, t_w1.ptr, t_w1_sf.ptr, t_w2.ptr, t_w2_sf.ptr, s)
            check(status, "megamoe_prepare_weights_in_place")
            self._keep = (w1, w2, w2_sf)
        else:
            w = _lib.megamoe_weights(t_w1.ptr, t_w1_sf.ptr, t_w2.ptr, t_w2_sf.ptr)
            check(_lib_.megamoe_prepare_weights(handle, ctypes.byref(w), s), "megamoe_prepare_weights")
            self._keep = ()
        self.weights_mode = "in_place" if in_place else "copy"

    # ---- forward ---------------------------------------------------------------

    def forward(self, x, x_sf, topk_idx, topk_w, out=None, num_tokens_bound=None, stream=None):
        """One forward of this rank's T tokens (collective):
        x [T, H] fp8 e4m3, x_sf [T, H/128] fp32, topk_idx [T, K] int32 or int64
        (global expert ids, -1 = masked slot), topk_w [T, K] fp32; out [T, H] bf16
        (allocated with torch when None). num_tokens_bound: None, or the same
        bound >= every rank's T on all ranks (picks the GEMM tiles).
        Enqueued on the stream; returns out at once. Device-side errors (a bad
        top-k index, a peer's failure) come from sync() and error_word()."""
        call = "forward"
        handle = self._layer(call)
        try:
            s = stream_handle(stream, self.device, call)
        except BadArgumentError as rejected:
            self._reject(handle, stream_handle(None, self.device, call), rejected)  # the current stream
            raise
        try:
            args, out = self._forward_args(x, x_sf, topk_idx, topk_w, out, num_tokens_bound, s)
        except Exception as rejected:  # noqa: BLE001 - whatever it was, the peers must not wait for this rank
            self._reject(handle, s, rejected)
            raise
        check(_lib_.megamoe_forward(handle, ctypes.byref(args), s), "megamoe_forward")
        return out

    __call__ = forward

    def _forward_args(self, x, x_sf, topk_idx, topk_w, out, bound, s):
        call = "forward"
        c, dev = self.config, self.device
        H, K = c.hidden, c.top_k
        t_x = device_tensor("x", x, FP8, (None, H), dev, 1, stream=s, call=call)
        T = t_x.shape[0]
        t_sf = device_tensor("x_sf", x_sf, F32, (T, H // 128), dev, 4, stream=s, call=call)
        t_idx = device_tensor("topk_idx", topk_idx, INDEX, (T, K), dev, {"int32": 4, "int64": 8}, stream=s,
                              call=call)
        t_w = device_tensor("topk_w", topk_w, F32, (T, K), dev, 4, stream=s, call=call)
        if bound is None:
            bound = 0
        elif isinstance(bound, bool) or not isinstance(bound, int) or not 0 <= bound < 1 << 63:
            raise BadArgumentError(f"num_tokens_bound = {bound!r}: must be None or an integer >= 0", "forward")
        if out is None:
            torch = sys.modules.get("torch")
            if torch is None:
                raise BadArgumentError("out: None needs torch to allocate the output; pass a [T, H] bf16 tensor",
                                       "forward")
            out = torch.empty((T, H), dtype=torch.bfloat16, device=f"cuda:{dev}")
        t_y = device_tensor("out", out, BF16, (T, H), dev, 16, writable=True, stream=s, call=call)
        args = _lib.megamoe_forward_args(
            t_x.ptr, t_sf.ptr, t_idx.ptr, _lib.INDEX_INT64 if t_idx.dtype == "int64" else _lib.INDEX_INT32,
            t_w.ptr, T, bound, t_y.ptr)
        return args, out

    def _reject(self, handle, s, rejected):
        """megamoe_forward_reject: the C layer's empty forward carrying the
        binding's rejection, so the peers stay in step (their sync() raises
        PeerFailedError) and this rank's next sync() reports this message."""
        text = f"{rejected.call}: {rejected.message}" if isinstance(rejected, Error) else \
            f"{type(rejected).__name__}: {rejected}"
        self._binding_rejects.append(text)
        status = rejected.status if isinstance(rejected, Error) and rejected.status else BadArgumentError.status
        _lib_.megamoe_forward_reject(handle, status, text.encode("utf-8", "replace"), s)

    # ---- errors and sync -------------------------------------------------------

    def sync(self, stream=None):
        """megamoe_sync: waits for the stream and raises the first error of this
        layer's forwards since the last sync (this rank's, or PeerFailedError
        naming the peer), then clears it. A TimeoutError leaves the layer failed
        (every later call raises LayerFailedError): close it, or abandon() it when
        a peer process died."""
        handle = self._layer("sync")
        rejects, self._binding_rejects = self._binding_rejects, []
        status = _lib_.megamoe_sync(handle, stream_handle(stream, self.device, "sync"))
        if status != 0:
            err = error_for(status, "megamoe_sync")
            if rejects:
                err = type(err)(f"{err.message} (the binding rejected {len(rejects)} forward(s) since the last "
                                f"sync, the first: {rejects[0]})", "megamoe_sync")
            raise err

    def error_word(self):
        """The device address of the error word (int32): every forward overwrites
        it, in stream order, with 0 or its megamoe_status. Valid until close()."""
        ptr = ctypes.c_void_p()
        check(_lib_.megamoe_error_word(self._layer("error_word"), ctypes.byref(ptr)), "megamoe_error_word")
        return ptr.value

    def set_programmatic_launch(self, enable=True):
        """Programmatic dependent launch of the split and fused arms' kernels
        (megamoe_set_programmatic_launch): a forward's kernel may be scheduled
        while the kernel before it on the stream still runs; results are bitwise
        the same on and off; the staged arm ignores it. Per rank, from the next
        forward on."""
        check(_lib_.megamoe_set_programmatic_launch(self._layer("set_programmatic_launch"), 1 if enable else 0),
              "megamoe_set_programmatic_launch")

    def error_word_tensor(self):
        """The error word as a one-element torch.int32 tensor on the layer's device,
        aliasing the layer's memory (read it, do not write it; valid until close()).
        After a replayed graph, `layer.error_word_tensor().item()` (a sync) or a
        copy into pinned memory tells whether the forward failed."""
        import torch
        return torch.as_tensor(_ErrorWord(self.error_word()), device=f"cuda:{self.device}")

    # ---- facts -----------------------------------------------------------------

    def info(self):
        """The buffer layout of this layer (megamoe.layout(config, world_size))
        with rank, device and weights mode."""
        self._layer("info")
        d = layout(self.config, self.world_size)
        d.update(rank=self.rank, device=self.device, weights_mode=self.weights_mode)
        return d

    # ---- teardown --------------------------------------------------------------

    def close(self):
        """megamoe_destroy then the communicator (collective: every rank calls it).
        Idempotent."""
        self._release(("megamoe_destroy", _lib_.megamoe_destroy), ("megamoe_comm_destroy", _lib_.megamoe_comm_destroy))

    def abandon(self):
        """After a peer process died (TimeoutError): frees this rank's layer
        without the collective steps (megamoe_abandon) and aborts the
        communicator. Not collective. Idempotent."""
        self._release(("megamoe_abandon", _lib_.megamoe_abandon), ("megamoe_comm_abort", _lib_.megamoe_comm_abort))

    def _release(self, layer_step, comm_step):
        """Frees the layer, then the communicator (each step a (name, C
        function) pair), both even when the first fails; raises the first
        failure."""
        handle, comm = self._handle, self._comm
        self._handle, self._comm, self._keep = None, None, ()
        first = None
        for (name, fn), obj in ((layer_step, handle), (comm_step, comm)):
            if obj:
                status = fn(obj)
                if status != 0 and first is None:
                    first = error_for(status, name)
        if first is not None:
            raise first


class _ErrorWord:
    """The error word through the CUDA array interface (for torch.as_tensor)."""

    def __init__(self, ptr):
        self.__cuda_array_interface__ = {"shape": (1,), "typestr": "<i4", "data": (ptr, False), "version": 3,
                                         "strides": None}
