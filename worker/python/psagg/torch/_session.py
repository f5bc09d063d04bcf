"""psagg.torch's session: the process's psagg context, its one declaration (every parameter
plus the broadcast key), the push_pull of one tensor (_Op) and the thread that completes the
futures of DDP's hook; init() / session() / shutdown() and the questions a training loop asks
of it (rank, world_size, local_rank, stats, assignment, checkpoint)."""

import atexit
import hashlib
import queue
import sys
import threading
import time

import torch

import psagg as _p

from ._util import _FLOATS, _env_int

_BROADCAST_KEY = "psagg.broadcast"


def _wire_name(name, shape):
    """The declared name: '<name>[d0,d1]' (at most 63 bytes; longer ones keep a hash)."""
    text = "%s[%s]" % (name, ",".join(str(d) for d in shape))
    if len(text.encode()) <= 63:
        return text
    digest = hashlib.sha1(text.encode()).hexdigest()[:16]
    return text.encode()[:46].decode("utf-8", "ignore") + "~" + digest


class _Op:
    """One tensor's push_pull: the buffer psagg reads and writes, and where the result goes."""

    __slots__ = ("handle", "work", "dest")

    def __init__(self, sess, key, tensor, op, priority):
        if tensor.dtype not in _FLOATS:
            raise TypeError("psagg.torch: gradient of dtype %s: psagg aggregates float32 (float16 "
                            "and bfloat16 go through an fp32 copy); convert the model or leave "
                            "this parameter out" % tensor.dtype)
        if tensor.numel() != sess.counts[key]:
            raise ValueError("psagg.torch: a tensor of %d elements for key %d, declared with %d"
                             % (tensor.numel(), key, sess.counts[key]))
        if key != sess.bcast_key:
            sess.joiner_fresh = False  # (its steps began: broadcasts are the members' too)
        if tensor.dtype == torch.float32 and tensor.is_contiguous():
            self.work, self.dest = tensor, None
        else:
            self.work, self.dest = tensor.detach().float().contiguous(), tensor
        ptr = self.work.data_ptr()
        if not self.work.is_cuda:
            self.handle = sess.ctx.push_pull(key, ptr, ptr, op, priority, keep=self.work)
            return
        # the tensor's device is current for the call (libpsagg restores the caller's), and
        # the work is ordered after that device's current stream
        with torch.cuda.device(self.work.device):
            stream = torch.cuda.current_stream(self.work.device).cuda_stream
            self.handle = sess.ctx.push_pull(key, ptr, ptr, op, priority, keep=self.work,
                                             stream=stream)

    def finish(self):
        """Wait (GIL released); copy back when we worked on a copy. Raises psagg.Error."""
        self.handle.wait()
        if self.dest is not None:
            self.dest.copy_(self.work)


def _finish_all(ops):
    """Finish every operation, even after a failure (their buffers must stay valid until all
    are done); return the first error (psagg.Error, or a copy-back failure), or None."""
    err = None
    for op in ops:
        try:
            op.finish()
        except Exception as e:
            err = err or e
    return err


class _Session:
    """The process's psagg context, its declaration and the completion thread."""

    def __init__(self, config, rank, world_size):
        self.ctx = _p.Context(config, rank, world_size)
        self.keys = {}  # id(parameter) -> key
        self.names = {}  # id(parameter) -> name
        self.bcast_key = None
        self.bcast_elems = 0
        self.declare_seconds = 0.0  # psagg_declare took (a joiner: connect to admitted)
        self.state_seconds = 0.0  # a joiner took the job's state (weights, optimizer state)
        self.params = False  # declared for the server-side optimizer
        self.joiner_fresh = False  # a joiner before its first step (broadcast_parameters)
        self.server_opt = None  # the ServerOptimizer the DDP hook pushes for
        self.counts = {}  # key -> declared elements
        self._done = queue.Queue()
        self._thread = None
        self._lock = threading.Lock()

    # ---- declaration ----
    def declare(self, named_parameters, codec=None, error_feedback=None, params=False,
                all_tensors=False, error_feedback_beta=None):
        """params: declare them as parameters the servers optimize (ServerOptimizer, DiLoCo).
        all_tensors: every tensor given, not only those that require a gradient (DiLoCo's
        anchors)."""
        # (a tensor of no elements has nothing to push: DDP takes it, psagg leaves it out)
        named = [(n, p) for n, p in named_parameters
                 if (all_tensors or p.requires_grad) and p.numel() > 0]
        if not named:
            raise ValueError("psagg.torch: no parameter requires a gradient")
        with self._lock:
            if self.bcast_key is not None:
                if params != self.params:
                    raise _p.Error(-1, "the parameters were declared %s; psagg declares once "
                                   "per process: create the ServerOptimizer before anything "
                                   "else declares (DDP hook, broadcast_parameters)" %
                                   ("for the server-side optimizer" if self.params else
                                    "as gradients the servers sum"), "psagg.torch")
                if all(id(p) in self.keys for _, p in named):
                    return  # the same parameters again (e.g. broadcast, then the optimizer)
                raise _p.Error(-1, "psagg declares once per process and these parameters were "
                               "not in the first declaration (declare the whole model once)",
                               "psagg.torch")
            small = self.ctx.min_compress_elems
            tensors, seen = [], set()
            for name, p in named:
                if id(p) in seen:
                    continue  # shared (tied) parameters: one key
                seen.add(id(p))
                c = codec(name, p) if callable(codec) else (
                    codec.get(name) if isinstance(codec, dict) else codec)
                if c is not None and not callable(codec) and not isinstance(codec, dict) \
                        and p.numel() < small:
                    c = "fp32"  # a global codec text follows min_compress_elems
                tensors.append((_wire_name(name, p.shape), p.numel(), c,
                                _p.TENSOR_PARAMETER if params else 0))
            total = sum(t[1] for t in tensors)
            self.bcast_elems = max(1024, min(total, 1 << 20))
            # (a broadcast key: placed apart from the per-step load, runtime/layout.h)
            tensors.append((_BROADCAST_KEY, self.bcast_elems, "fp32", _p.TENSOR_RARE))
            t0 = time.monotonic()
            keys = self.ctx.declare(tensors, error_feedback, error_feedback_beta)
            self.declare_seconds = time.monotonic() - t0  # a joiner's: until it was admitted
            self.counts = {k: t[1] for k, t in zip(keys, tensors)}
            it = iter(keys)
            seen = {}
            for name, p in named:
                if id(p) not in seen:
                    seen[id(p)] = next(it)
                self.keys[id(p)] = seen[id(p)]
                self.names[id(p)] = name
            self.bcast_key = keys[-1]
            self.params = params
            self.joiner_fresh = self.ctx.membership()["joiner"]

    # ---- elastic joins (the hand-over itself: elastic.py) ----
    def elastic(self):
        return self.ctx.membership()["elastic"]

    def sync_membership(self):
        """The members' barrier between steps (psagg_sync_membership): the membership after
        it; "joined" > 0 when workers were admitted (then the caller hands them the state)."""
        self.joiner_fresh = False  # (a joiner's broadcasts from here on are the members' too)
        return self.ctx.sync_membership()

    def key_of(self, p):
        k = self.keys.get(id(p))
        if k is None:
            raise KeyError("psagg.torch: a parameter of shape %s was not declared (declare "
                           "every parameter that requires a gradient)" % (tuple(p.shape),))
        return k

    # ---- completion thread: completes futures when all their push_pulls are done ----
    def complete_later(self, ops, fut, value):
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._complete, name="psagg-completion",
                                                daemon=True)
                self._thread.start()
        self._done.put((ops, fut, value))

    def _complete(self):
        while True:
            item = self._done.get()
            if item is None:
                return
            ops, fut, value = item
            err = _finish_all(ops)
            if err is not None:
                fut.set_exception(err)
            else:
                fut.set_result(value)

    def close(self, why=None):
        if self._thread is not None:
            self._done.put(None)
            self._thread.join(timeout=60)
            self._thread = None
        if why is None:
            self.ctx.close()
        else:
            self.ctx.abort(why)


_current = None  # the process's _Session
_lock = threading.Lock()
_failure = None  # an exception that ends the process (its main thread's): shutdown aborts
_prev_excepthook = None


def _excepthook(etype, value, tb):
    """sys.excepthook while a session is open: note why the process is ending, so that
    shutdown (at exit) tells the servers instead of waiting for the other workers."""
    global _failure
    _failure = "%s: %s" % (etype.__name__, value)
    (_prev_excepthook or sys.__excepthook__)(etype, value, tb)


def init(config=None, rank=None, world_size=None):
    """Create this process's psagg context (once; later calls return it). config: INI path
    (None: $PSAGG_CONFIG). rank / world_size: None reads PSAGG_RANK / PSAGG_WORLD_SIZE, else
    torchrun's RANK / WORLD_SIZE. Connects to every server and waits for all workers."""
    global _current
    with _lock:
        if _current is not None:
            return _current
        if rank is None:
            rank = _env_int("PSAGG_RANK", "RANK")
        if world_size is None:
            world_size = _env_int("PSAGG_WORLD_SIZE", "WORLD_SIZE")
        if rank is None or world_size is None:
            raise ValueError("psagg.torch.init: no rank/world size: pass them, or set "
                             "PSAGG_RANK and PSAGG_WORLD_SIZE (deploy/psagg-local does) or "
                             "torchrun's RANK and WORLD_SIZE")
        _current = _Session(config, rank, world_size)
        atexit.register(_at_exit)
        global _prev_excepthook
        if sys.excepthook is not _excepthook:
            _prev_excepthook, sys.excepthook = sys.excepthook, _excepthook
        return _current


def session():
    """The process's session (init() with the defaults if there is none yet)."""
    return _current if _current is not None else init()


def shutdown(error=None):
    """Close the context: tell the servers this worker is done. With error (a str: why the
    training failed) give up instead (psagg_abort): the job fails at once naming this worker,
    and the others do not wait for it. Called at exit, with the exception that ends the process
    if one does."""
    global _current
    if error is not None and not isinstance(error, str):
        raise TypeError("psagg.torch.shutdown: error must be a str or None, not %s"
                        % type(error).__name__)
    with _lock:
        s, _current = _current, None
    if s is not None:
        s.close(error)


def _at_exit():
    shutdown(_failure)


def rank():
    return session().ctx.rank


def world_size():
    return session().ctx.world_size


def stats():
    """This worker's counters (psagg.Context.stats): bytes raw/sent/received, push_pulls, and
    "time", the summed phases of the completed push_pulls in ns. Take it before and after a
    step; the difference is the step's:
        a = psagg.torch.stats(); ...step...; b = psagg.torch.stats()
        wait_ms = (b["time"]["wait_ns"] - a["time"]["wait_ns"]) / 1e6"""
    return session().ctx.stats()


def assignment():
    """The codec of every declared tensor in the newest assignment (psagg.Context.assignment):
    with [codec] adaptive = on the workers choose them from the gradients every
    adaptive_interval steps; each change is logged at info."""
    return session().ctx.assignment()


def local_rank():
    """torchrun's LOCAL_RANK (psagg-local sets it), else 0: pick the GPU with it."""
    return _env_int("LOCAL_RANK") or 0


def checkpoint():
    """psagg_checkpoint on this process's context (see ServerOptimizer.checkpoint)."""
    session().ctx.checkpoint()
