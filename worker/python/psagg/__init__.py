"""psagg: Python bindings of libpsagg, the psagg worker library (ctypes; see worker/include/psagg.h).

    import psagg
    ctx = psagg.Context(config=None, rank=None, world_size=None)   # PSAGG_CONFIG, PSAGG_RANK, ...
    keys = ctx.declare([("w", 1000, None), ("b", 10, "fp32")])      # (name, count, codec text)
    h = ctx.push_pull(keys[0], in_ptr, out_ptr)                     # raw float* addresses
    h.wait()                                                        # raises psagg.Error

Every failure raises psagg.Error carrying the status name (e.g. "PSAGG_ETIMEDOUT") and
psagg_last_error()'s message: what went wrong and with whom. PyTorch users want psagg.torch.

The library is found from, in order: $PSAGG_LIBRARY, the one a pip-installed package carries
beside this file (_lib/libpsagg.so.0), the path CMake wrote into _paths.py (the build tree or the
install prefix), then the system's library path. libpsagg does not use
jemalloc (only psagg-server does), so it loads into a process that has already imported torch.
"""

import ctypes
import ctypes.util
import numbers
import os
import threading

# the psagg this package is; its libpsagg must be the same (library() refuses another), and
# CMake's project version is both (unit.python_abi checks it)
__version__ = "0.1.0"

__all__ = ["Error", "Context", "Handle", "library", "STATUS_NAMES", "SUM", "AVERAGE",
           "TENSOR_PARAMETER", "TENSOR_RARE", "ALL_KEYS", "BROADCAST_MAX"]

# The constants and structures below mirror psagg.h and psagg/types.h (unit.python_abi compares
# them with C: names, values, sizes and offsets). A public constant PSAGG_<NAME> is <NAME> here.
SUM = 0  # psagg_reduce
AVERAGE = 1
CODEC_DEFAULT = -1  # psagg_codec_id
CODEC_FP32 = 0
CODEC_FP16 = 1
CODEC_BF16 = 2
CODEC_MAXMIN = 3
CODEC_TOPK = 4
CODEC_THC = 5
ROUND_STOCHASTIC = 0  # psagg_rounding
ROUND_NEAREST = 1

# psagg_status (common/include/psagg/types.h)
STATUS_NAMES = {
    0: "PSAGG_OK",
    -1: "PSAGG_EINVAL",
    -2: "PSAGG_ENONFINITE",
    -3: "PSAGG_ERANGE",
    -4: "PSAGG_EBADLEN",
    -5: "PSAGG_EBADMETA",
    -6: "PSAGG_ENOMEM",
    -7: "PSAGG_EAGAIN",
    -8: "PSAGG_ETIMEDOUT",
    -9: "PSAGG_EUNSUPPORTED",
    -20: "PSAGG_ECONFIG",
    -30: "PSAGG_EPROTO",
    -31: "PSAGG_EPEER",
    -32: "PSAGG_EMISMATCH",
    -40: "PSAGG_EFABRIC",
    -41: "PSAGG_EIO",
    -42: "PSAGG_ECLOSED",
    -43: "PSAGG_ECUDA",
}


class Error(RuntimeError):
    """A psagg call failed. .status is the psagg_status code, .name its name ("PSAGG_EPEER"),
    .detail psagg_last_error()'s message."""

    def __init__(self, status, detail, call=""):
        self.status = status
        self.name = STATUS_NAMES.get(status, "PSAGG_E%d" % -status)
        self.detail = detail
        where = call + ": " if call else ""
        super().__init__("%s%s: %s" % (where, self.name, detail or "(no detail)"))


class _Codec(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("bits", ctypes.c_uint32), ("bucket", ctypes.c_uint32),
                ("rounding", ctypes.c_int), ("k", ctypes.c_uint32)]


# psagg.h's structs that grow start with struct_size, the size of the struct as the caller has
# it: _sized(cls) makes one with it set (arrays set it on each element).
def _sized(cls):
    return cls(struct_size=ctypes.sizeof(cls))


def _check_error_feedback_beta(who, beta):
    """ValueError naming `who` unless beta is None (the config's [codec] error_feedback_beta)
    or a number in 1e-6..1 (psagg_tensor_desc.error_feedback_beta's range; not a bool)."""
    if beta is not None and (isinstance(beta, bool) or not isinstance(beta, numbers.Real) or
                             not 1e-6 <= beta <= 1):  # (False for NaN)
        raise ValueError("%s: error_feedback_beta must be None (the config's) or a number in "
                         "1e-6..1, not %r" % (who, beta))


class _TensorDesc(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("name", ctypes.c_char_p),
                ("count", ctypes.c_uint64), ("codec", _Codec), ("error_feedback", ctypes.c_int),
                ("flags", ctypes.c_uint32), ("reserved", ctypes.c_uint32),
                ("error_feedback_beta", ctypes.c_float)]


TENSOR_PARAMETER = 1  # psagg_tensor_desc.flags: the servers optimize it ([server] optimizer)
TENSOR_RARE = 2  # psagg_tensor_desc.flags: used now and then (a broadcast): placed apart
ALL_KEYS = 0xFFFFFFFF
BROADCAST_MAX = 1 << 40  # the most bytes one psagg_broadcast carries


class _Timing(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t)] + [
        (f, ctypes.c_uint64) for f in ("queued_ns", "encode_ns", "send_ns", "wait_ns",
                                       "decode_ns", "total_ns")]

    def as_dict(self):
        return {f: getattr(self, f) for f, _ in self._fields_ if f != "struct_size"}


class _Stats(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("bytes_sent", ctypes.c_uint64),
                ("bytes_received", ctypes.c_uint64), ("bytes_raw", ctypes.c_uint64),
                ("push_pulls", ctypes.c_uint64), ("time", _Timing), ("left_out", ctypes.c_uint64)]


class _ServerOptim(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("kind", ctypes.c_char_p),
                ("momentum", ctypes.c_float), ("dampening", ctypes.c_float),
                ("beta1", ctypes.c_float), ("beta2", ctypes.c_float), ("eps", ctypes.c_float),
                ("nesterov", ctypes.c_int), ("sync_interval", ctypes.c_uint32)]


class _Membership(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("epoch", ctypes.c_uint32),
                ("rank", ctypes.c_int), ("size", ctypes.c_int), ("elastic", ctypes.c_int),
                ("joined", ctypes.c_int), ("joiner", ctypes.c_int)]


def _membership_dict(m):
    return {"epoch": m.epoch, "rank": m.rank, "size": m.size, "elastic": bool(m.elastic),
            "joined": m.joined, "joiner": bool(m.joiner)}


class _Assignment(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("codec", _Codec), ("bytes", ctypes.c_uint64),
                ("generation", ctypes.c_uint32), ("from_round", ctypes.c_uint32)]


_P, _I, _U32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32
# The C signatures bound on loading: name -> (restype, argtypes), every PSAGG_API function.
_SIGNATURES = {
    "psagg_version": (ctypes.c_char_p, []),
    "psagg_strerror": (ctypes.c_char_p, [_I]),
    "psagg_last_error": (ctypes.c_char_p, []),
    "psagg_codec_parse": (_I, [ctypes.c_char_p, ctypes.POINTER(_Codec)]),
    "psagg_codec_name": (ctypes.c_char_p, [ctypes.POINTER(_Codec), ctypes.c_char_p,
                                           ctypes.c_size_t]),
    "psagg_init": (_I, [ctypes.c_char_p, _I, _I, ctypes.POINTER(_P)]),
    "psagg_declare": (_I, [_P, ctypes.POINTER(_TensorDesc), ctypes.c_size_t,
                           ctypes.POINTER(_U32)]),
    "psagg_push_pull": (_I, [_P, _U32, _P, _P, _I, _I, ctypes.POINTER(_P)]),
    "psagg_push_pull_cuda": (_I, [_P, _U32, _P, _P, _I, _I, _P, ctypes.POINTER(_P)]),
    "psagg_test": (_I, [_P]),
    "psagg_wait": (_I, [_P, _I]),
    "psagg_release": (None, [_P]),
    "psagg_get_stats": (_I, [_P, ctypes.POINTER(_Stats)]),
    "psagg_get_server_optim": (_I, [_P, ctypes.POINTER(_ServerOptim)]),
    "psagg_get_membership": (_I, [_P, ctypes.POINTER(_Membership)]),
    "psagg_sync_membership": (_I, [_P, ctypes.POINTER(_Membership)]),
    "psagg_handle_timing": (_I, [_P, ctypes.POINTER(_Timing)]),
    "psagg_handle_codec": (_I, [_P, ctypes.POINTER(_Codec), ctypes.POINTER(_U32)]),
    "psagg_get_assignment": (_I, [_P, _U32, ctypes.POINTER(_Assignment)]),
    "psagg_param_init": (_I, [_P, _U32, _P, ctypes.POINTER(_P)]),
    "psagg_pull_weights": (_I, [_P, _U32, _P, _I, ctypes.POINTER(_P)]),
    "psagg_set_lr": (_I, [_P, _U32, ctypes.c_float, ctypes.c_float]),
    "psagg_set_param_sync": (_I, [_P, _U32, _U32, ctypes.c_float]),
    "psagg_checkpoint": (_I, [_P]),
    "psagg_get_tensor_round": (_I, [_P, _U32, ctypes.POINTER(_U32)]),
    "psagg_broadcast": (_I, [_P, _U32, _P, ctypes.c_size_t, _I]),
    "psagg_rank": (_I, [_P]),
    "psagg_world_size": (_I, [_P]),
    "psagg_min_compress_elems": (ctypes.c_uint64, [_P]),
    "psagg_close": (_I, [_P]),
    "psagg_abort": (_I, [_P, ctypes.c_char_p]),
}


def _candidates():
    env = os.environ.get("PSAGG_LIBRARY")
    if env:
        return [env]  # explicit: nothing else is tried
    out = []
    carried = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lib", "libpsagg.so.0")
    if os.path.isfile(carried):  # a pip install (wheel): found by the package's own location
        out.append(carried)
    try:
        from . import _paths  # written by CMake (build tree or install)
        out.append(_paths.LIBPSAGG)
    except ImportError:
        pass
    found = ctypes.util.find_library("psagg")
    if found:
        out.append(found)
    out.append("libpsagg.so.0")
    return out


_lib = None
_lib_lock = threading.Lock()

# Signals whose handlers loading libpsagg may change (below).
_KEPT_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGSEGV", "SIGBUS", "SIGABRT",
                 "SIGILL", "SIGFPE")


class _Sigaction(ctypes.Structure):
    """glibc's struct sigaction on Linux (x86-64, aarch64): handler, 1024-bit mask, flags,
    restorer; only copied whole, never interpreted."""
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16),
                ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p)]


def _load_keeping_signals(path):
    """ctypes.CDLL(path), with the process's signal handlers as they were before it.
    Debian's libfabric links libinfinipath (the psm provider), whose constructor installs
    handlers of its own for SIGINT, SIGTERM, SIGSEGV, SIGBUS and SIGABRT that call exit() from
    the handler: Python's KeyboardInterrupt and faulthandler were lost, and a SIGTERM that came
    while the process was already exiting (a launcher stopping a failed job) ran exit() again
    inside it and deadlocked in libtorch's destructors (a worker hung until SIGKILL; gdb).
    psagg uses no PSM hardware, so the handlers are put back."""
    import signal as _signal
    libc = ctypes.CDLL(None, use_errno=True)
    nums = [getattr(_signal, n) for n in _KEPT_SIGNALS if hasattr(_signal, n)]
    saved = {}
    for n in nums:
        sa = _Sigaction()
        if libc.sigaction(n, None, ctypes.byref(sa)) == 0:
            saved[n] = sa
    lib = ctypes.CDLL(path)
    for n, sa in saved.items():
        now = _Sigaction()
        if libc.sigaction(n, None, ctypes.byref(now)) == 0 and now.handler != sa.handler:
            libc.sigaction(n, ctypes.byref(sa), None)
    return lib


def library():
    """The loaded libpsagg (ctypes.CDLL: every call releases the GIL)."""
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in _candidates():
            try:
                lib = _load_keeping_signals(path)
                break
            except OSError as e:
                tried.append("%s (%s)" % (path, e))
        else:
            raise ImportError("psagg: cannot load libpsagg: tried " + "; ".join(tried) +
                              " (build it, or set PSAGG_LIBRARY to libpsagg.so)")
        # a library of another version is another ABI: refuse it by name, before any call
        version = getattr(lib, "psagg_version", None)
        if version is None:
            raise ImportError("psagg: %s has no psagg_version: a libpsagg older than this "
                              "package (%s)" % (lib._name, __version__))
        version.restype, version.argtypes = ctypes.c_char_p, []
        if version().decode() != __version__:
            raise ImportError("psagg: %s is libpsagg %s; this package is psagg %s: install one "
                              "version of both (or set PSAGG_LIBRARY)" %
                              (lib._name, version().decode(), __version__))
        for name, (res, args) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        _lib = lib
        return lib


def _last_error():
    return library().psagg_last_error().decode("utf-8", "replace")


def _check(status, call):
    if status != 0:
        raise Error(status, _last_error(), call)


def parse_codec(text):
    """Parse codec text ("fp32", "maxmin4", "maxmin4/512/nearest") into the C struct;
    None means the config's default ([codec] default and min_compress_elems)."""
    c = _Codec()
    if text is None:
        c.id = CODEC_DEFAULT
        return c
    _check(library().psagg_codec_parse(str(text).encode(), ctypes.byref(c)),
           "codec '%s'" % text)
    return c


def codec_name(text):
    """The canonical name of a codec text ("maxmin:4" -> "maxmin4/1024/sr")."""
    c = parse_codec(text)
    buf = ctypes.create_string_buffer(64)
    return library().psagg_codec_name(ctypes.byref(c), buf, 64).decode()


def _codec_text(c):
    buf = ctypes.create_string_buffer(64)
    return library().psagg_codec_name(ctypes.byref(c), buf, 64).decode()


class Handle:
    """One outstanding push_pull. wait() raises psagg.Error; the handle is released once done.
    After a successful wait(), .timing is its psagg_timing as a dict of nanoseconds (queued_ns,
    encode_ns, send_ns, wait_ns, decode_ns, total_ns), and .codec the codec it went in
    ("maxmin3/256/nearest"; with [codec] adaptive it may change between rounds) and
    .generation its assignment's generation (0: the declared codec); None before."""

    __slots__ = ("_h", "_keep", "key", "timing", "codec", "generation")

    def __init__(self, raw, keep, key):
        self._h = raw
        self._keep = keep  # whatever must outlive the operation (buffers)
        self.key = key
        self.timing = None
        self.codec = None
        self.generation = None

    def test(self):
        return self._h is None or library().psagg_test(self._h) == 1

    def wait(self, timeout_ms=-1):
        """Wait (GIL released) until done; raise psagg.Error if it failed. -1: no limit."""
        if self._h is None:
            return
        lib = library()
        st = lib.psagg_wait(self._h, int(timeout_ms))
        if st == -8 and timeout_ms >= 0 and lib.psagg_test(self._h) != 1:
            raise Error(st, _last_error(), "psagg_wait")  # still pending: keep the handle
        detail = _last_error() if st else ""
        if not st:
            t = _sized(_Timing)
            if lib.psagg_handle_timing(self._h, ctypes.byref(t)) == 0:
                self.timing = t.as_dict()
            c, g = _Codec(), ctypes.c_uint32()
            if lib.psagg_handle_codec(self._h, ctypes.byref(c), ctypes.byref(g)) == 0:
                self.codec, self.generation = _codec_text(c), g.value
        lib.psagg_release(self._h)
        self._h = None
        self._keep = None
        if st:
            raise Error(st, detail, "push_pull of key %d" % self.key)

    def __del__(self):
        if getattr(self, "_h", None) is not None:
            try:
                library().psagg_release(self._h)
            except Exception:
                pass


class Context:
    """A psagg worker context (psagg_init). config: the INI path (None: $PSAGG_CONFIG);
    rank/world_size: None reads PSAGG_RANK/PSAGG_WORLD_SIZE."""

    def __init__(self, config=None, rank=None, world_size=None):
        lib = library()
        if config is None:
            config = os.environ.get("PSAGG_CONFIG")
        if not config:
            raise Error(-20, "no config: pass config= or set PSAGG_CONFIG", "psagg_init")
        raw = ctypes.c_void_p()
        st = lib.psagg_init(os.fsencode(config), -1 if rank is None else int(rank),
                            -1 if world_size is None else int(world_size), ctypes.byref(raw))
        _check(st, "psagg_init")
        self._ctx = raw
        self._lock = threading.Lock()
        self.rank = lib.psagg_rank(raw)
        self.world_size = lib.psagg_world_size(raw)
        self.min_compress_elems = lib.psagg_min_compress_elems(raw)
        self.declared = None

    def _raw(self):
        if self._ctx is None:
            raise Error(-42, "the context is closed", "psagg")
        return self._ctx

    def declare(self, tensors, error_feedback=None, error_feedback_beta=None):
        """Declare every tensor once, in the same order on every worker. tensors: a list of
        (name, count, codec) or (name, count, codec, flags) with codec text or None (the
        config's default) and flags TENSOR_PARAMETER for a parameter the servers optimize.
        error_feedback: None (config), True or False. error_feedback_beta: None (config's
        [codec] error_feedback_beta) or the residual's decay in 1e-6..1. Returns the keys."""
        _check_error_feedback_beta("psagg.Context.declare", error_feedback_beta)
        n = len(tensors)
        descs = (_TensorDesc * n)()
        names = []
        for i, t in enumerate(tensors):
            name, count, codec = t[:3]
            b = str(name).encode()
            names.append(b)
            descs[i].struct_size = ctypes.sizeof(_TensorDesc)
            descs[i].name = b
            descs[i].count = int(count)
            descs[i].codec = parse_codec(codec)
            descs[i].error_feedback = -1 if error_feedback is None else int(bool(error_feedback))
            descs[i].flags = int(t[3]) if len(t) > 3 else 0
            descs[i].error_feedback_beta = 0.0 if error_feedback_beta is None else \
                float(error_feedback_beta)
        keys = (ctypes.c_uint32 * n)()
        _check(library().psagg_declare(self._raw(), descs, n, keys), "psagg_declare")
        self.declared = [(t[0], int(t[1])) for t in tensors]
        return list(keys)

    def push_pull(self, key, in_ptr, out_ptr, op=AVERAGE, priority=0, keep=None, stream=None):
        """Start a push_pull of `key` from in_ptr to out_ptr (float* addresses, host memory; or
        device memory when stream is given, an int cudaStream_t, 0 for the legacy default).
        keep: objects that must stay alive until it completes."""
        h = ctypes.c_void_p()
        lib = library()
        if stream is None:
            st = lib.psagg_push_pull(self._raw(), key, in_ptr, out_ptr, op, priority,
                                     ctypes.byref(h))
        else:
            st = lib.psagg_push_pull_cuda(self._raw(), key, in_ptr, out_ptr, op, priority,
                                          ctypes.c_void_p(stream or None), ctypes.byref(h))
        _check(st, "push_pull of key %d" % key)
        return Handle(h, keep, key)

    # ---- server-side optimizer ([server] optimizer; psagg.h) ----
    def param_init(self, key, ptr, keep=None):
        """Start psagg_param_init: ptr (float*, count floats) holds this worker's initial
        weights (worker 0's are used) and receives the weights every worker starts from."""
        h = ctypes.c_void_p()
        _check(library().psagg_param_init(self._raw(), key, ptr, ctypes.byref(h)),
               "psagg_param_init of key %d" % key)
        return Handle(h, keep, key)

    def pull_weights(self, key, ptr, sync=False, keep=None):
        """Start psagg_pull_weights: ptr receives the servers' exact master weights; with sync
        ptr must be the tensor's weights (the workers hold the master weights from then on)."""
        h = ctypes.c_void_p()
        _check(library().psagg_pull_weights(self._raw(), key, ptr, int(bool(sync)),
                                            ctypes.byref(h)),
               "psagg_pull_weights of key %d" % key)
        return Handle(h, keep, key)

    def set_lr(self, key, lr, weight_decay=0.0):
        """psagg_set_lr: the learning rate and weight decay of key's next steps (ALL_KEYS:
        every parameter)."""
        _check(library().psagg_set_lr(self._raw(), key, float(lr), float(weight_decay)),
               "psagg_set_lr")

    def membership(self):
        """psagg_get_membership as a dict: epoch (0 at the start, +1 each time a worker leaves
        an elastic job), rank (this worker's among the live ones), size (live workers),
        elastic."""
        m = _Membership(struct_size=ctypes.sizeof(_Membership))
        _check(library().psagg_get_membership(self._raw(), ctypes.byref(m)),
               "psagg_get_membership")
        return _membership_dict(m)

    def sync_membership(self):
        """psagg_sync_membership: the members' barrier where workers that wait to join an
        elastic job are admitted; call it between steps, with nothing in flight, at the same
        point on every worker. Returns membership() after it; "joined" > 0 says workers were
        admitted (then every worker pulls the model state: psagg.torch does)."""
        m = _Membership(struct_size=ctypes.sizeof(_Membership))
        _check(library().psagg_sync_membership(self._raw(), ctypes.byref(m)),
               "psagg_sync_membership")
        return _membership_dict(m)

    def server_optimizer(self):
        """psagg_get_server_optim as a dict: kind ("none", "sgd", "adam", "adamw"), momentum,
        dampening, nesterov, beta1, beta2, eps, sync_interval."""
        o = _ServerOptim(struct_size=ctypes.sizeof(_ServerOptim))
        _check(library().psagg_get_server_optim(self._raw(), ctypes.byref(o)),
               "psagg_get_server_optim")
        out = {f: getattr(o, f) for f, _ in _ServerOptim._fields_ if f != "struct_size"}
        out["kind"] = out["kind"].decode()
        out["nesterov"] = bool(out["nesterov"])
        return out

    def set_param_sync(self, key, tag, weight=1.0):
        """psagg_set_param_sync: key's next pushes carry `tag` (the same on every worker, else
        the job fails naming both) and count with `weight` in an AVERAGE (ALL_KEYS: every
        parameter)."""
        _check(library().psagg_set_param_sync(self._raw(), key, int(tag) & 0xFFFFFFFF,
                                              float(weight)), "psagg_set_param_sync")

    def checkpoint(self):
        """psagg_checkpoint: every server writes its optimizer state ([server] checkpoint_dir);
        call between steps."""
        _check(library().psagg_checkpoint(self._raw()), "psagg_checkpoint")

    def tensor_round(self, key):
        """The round (a parameter's optimizer step) of key's next push_pull."""
        r = ctypes.c_uint32()
        _check(library().psagg_get_tensor_round(self._raw(), key, ctypes.byref(r)),
               "psagg_get_tensor_round")
        return r.value

    def broadcast(self, key, data, root):
        """Root's bytes on every caller (psagg_broadcast): every live worker calls it with the
        same key (a declared fp32 tensor, e.g. one declared with TENSOR_RARE) and root (a
        rank); data is root's bytes-like object, ignored (None) on the others. Returns root's
        bytes. Two psagg_broadcasts: root's length (8 bytes, little-endian), then the bytes;
        a length above BROADCAST_MAX raises psagg.Error (PSAGG_EINVAL) on every caller."""
        lib, raw = library(), self._raw()
        mine = self.rank == root
        if mine:
            data = bytes(data)
        head = ctypes.create_string_buffer(8)
        if mine:
            head.raw = len(data).to_bytes(8, "little")
        _check(lib.psagg_broadcast(raw, key, head, 8, int(root)),
               "psagg_broadcast of key %d (the length)" % key)
        size = int.from_bytes(head.raw, "little")
        if size > BROADCAST_MAX:  # (known to every caller now: all raise alike)
            raise Error(-1, "root %d broadcasts %d bytes, more than BROADCAST_MAX (%d)"
                        % (root, size, BROADCAST_MAX), "psagg_broadcast of key %d" % key)
        # root's bytes are only read: passed as they are; the others' land in a new buffer
        buf = data if mine else ctypes.create_string_buffer(size)
        _check(lib.psagg_broadcast(raw, key, buf if size else None, size, int(root)),
               "psagg_broadcast of key %d" % key)
        return data if mine else buf.raw

    def stats(self):
        """psagg_get_stats as a dict: bytes_sent, bytes_received, bytes_raw, push_pulls since
        psagg_init, left_out (chunk rounds closed without this worker's push: [server]
        quorum), and "time": the sums of the completed push_pulls' timings (ns, as
        Handle.timing). Two calls' difference is what happened between them (a step)."""
        s = _sized(_Stats)
        _check(library().psagg_get_stats(self._raw(), ctypes.byref(s)), "psagg_get_stats")
        out = {f: getattr(s, f) for f, _ in _Stats._fields_ if f not in ("struct_size", "time")}
        out["time"] = s.time.as_dict()
        return out

    def assignment(self):
        """The newest codec assignment (psagg_get_assignment), per declared tensor: a list of
        dicts with name, codec ("maxmin3/256/nearest"), bytes (one push of the whole tensor),
        generation (0: the declared codec) and from_round (its first round in this codec).
        Without [codec] adaptive every tensor says its declared codec, generation 0."""
        if self.declared is None:
            raise Error(-20, "declare the tensors first", "assignment")
        out = []
        for key, (name, _) in enumerate(self.declared):
            a = _sized(_Assignment)
            _check(library().psagg_get_assignment(self._raw(), key, ctypes.byref(a)),
                   "psagg_get_assignment")
            out.append({"name": name, "codec": _codec_text(a.codec), "bytes": a.bytes,
                        "generation": a.generation, "from_round": a.from_round})
        return out

    def close(self):
        """Tell the servers this worker is done (psagg_close). Idempotent."""
        if self._ctx is None:
            return
        raw, self._ctx = self._ctx, None
        _check(library().psagg_close(raw), "psagg_close")

    def abort(self, why=None):
        """Give up (psagg_abort): the training loop failed. The servers hear why and fail the job
        at once, naming this worker; the context is closed without waiting for the others.
        Idempotent; a no-op once closed."""
        if why is not None and not isinstance(why, str):
            raise TypeError("psagg.Context.abort: why must be a str or None, not %s"
                            % type(why).__name__)
        if self._ctx is None:
            return
        raw, self._ctx = self._ctx, None
        _check(library().psagg_abort(raw, why.encode("utf-8", "replace") if why else None),
               "psagg_abort")
