"""psagg.torch: psagg for PyTorch training loops.

With DDP (two lines; DDP still needs a process group for its start-up broadcast):

    model = DDP(model)
    psagg.torch.register_ddp_hook(model, codec="maxmin4")

Without DDP, Horovod style:

    psagg.torch.init()
    opt = psagg.torch.DistributedOptimizer(opt, model.named_parameters(), codec="maxmin4")
    psagg.torch.broadcast_parameters(model, root=0)

One psagg context per process (init(); the helpers call it). Every parameter that requires a
gradient is declared once, keyed by its name and shape, in named_parameters() order (every
worker must build the same model), plus one fp32 key that broadcast_parameters() uses. A
psagg context declares once: the first of register_ddp_hook() / DistributedOptimizer() /
broadcast_parameters() declares.

Codecs: codec=None takes the config's [codec] default (tensors under min_compress_elems go
fp32); a text ("maxmin4") does the same with that codec; a dict maps parameter names to codec
text (missing names: the default); a callable (name, parameter) -> codec text or None.

Gradients: fp32 tensors are aggregated in place; fp16 and bf16 through an fp32 copy; others
are refused. CUDA tensors use psagg_push_pull_cuda on the current stream (libpsagg built with
CUDA), CPU tensors psagg_push_pull. A failure (dead server, timeout) raises psagg.Error (a
RuntimeError) with psagg's message: from backward() through DDP, from step() here.
"""

import atexit
import hashlib
import math
import numbers
import os
import queue
import threading
import time

import torch

import psagg as _p

__all__ = ["init", "shutdown", "session", "stats", "assignment", "register_ddp_hook",
           "ddp_comm_hook", "DistributedOptimizer", "ServerOptimizer", "DiLoCo",
           "diloco_ddp_hook", "broadcast_parameters", "rank", "world_size", "local_rank",
           "membership", "membership_changes",
           "checkpoint"]

_BROADCAST_KEY = "psagg.broadcast"
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _env_int(*names):
    for n in names:
        v = os.environ.get(n)
        if v not in (None, ""):
            try:
                return int(v)
            except ValueError:
                raise ValueError("psagg.torch: %s='%s' is not a number" % (n, v)) from None
    return None


def _is_int(v):
    """An integer that is not a bool (True is an int to Python, never a count or a step)."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v):
    """A finite real number that is not a bool."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


def _check_codec(who, codec):
    """Refuse, at the call, a codec that psagg would refuse only at the declaration (after
    connecting): ValueError naming the argument and the value. codec: None (the config's), a
    text that psagg.parse_codec (libpsagg's parser) takes, a dict of such texts (or None), or a
    callable (its answers are checked when it is called, at the declaration)."""
    if codec is None or callable(codec):
        return
    items = [("codec[%r]" % (k,), v) for k, v in codec.items() if v is not None] \
        if isinstance(codec, dict) else [("codec", codec)]
    for name, text in items:
        if not isinstance(text, str):
            raise ValueError("psagg.torch.%s: %s must be a codec text such as 'maxmin4' (or "
                             "codec None, a dict of texts or a callable), not %r"
                             % (who, name, text))
        try:
            _p.parse_codec(text)
        except _p.Error as e:
            raise ValueError("psagg.torch.%s: %s=%r: %s" % (who, name, text, e.detail)) from None


def _check_error_feedback(who, error_feedback):
    if error_feedback is not None and not isinstance(error_feedback, bool):
        raise ValueError("psagg.torch.%s: error_feedback must be None (the config's), True or "
                         "False, not %r" % (who, error_feedback))


def _check_op(who, op):
    if not _is_int(op) or op not in (_p.SUM, _p.AVERAGE):
        raise ValueError("psagg.torch.%s: op must be psagg.SUM or psagg.AVERAGE, not %r"
                         % (who, op))


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
        self.server_opt = None  # the ServerOptimizer the DDP hook pushes for
        self.counts = {}  # key -> declared elements
        self._done = queue.Queue()
        self._thread = None
        self._lock = threading.Lock()

    # ---- declaration ----
    def declare(self, named_parameters, codec=None, error_feedback=None, params=False,
                all_tensors=False):
        """params: declare them as parameters the servers optimize (ServerOptimizer, DiLoCo).
        all_tensors: every tensor given, not only those that require a gradient (DiLoCo's
        anchors)."""
        named = [(n, p) for n, p in named_parameters if all_tensors or p.requires_grad]
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
            keys = self.ctx.declare(tensors, error_feedback)
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

    # ---- elastic joins ----
    def elastic(self):
        return self.ctx.membership()["elastic"]

    def sync_membership(self):
        """The members' barrier between steps (psagg_sync_membership): the membership after
        it; "joined" > 0 when workers were admitted (then the caller hands them the state)."""
        return self.ctx.sync_membership()

    def old_member_root(self, joiner):
        """The lowest rank that was a member before the last admission, agreed by every
        worker through one SUM of the broadcast key (a joiner pushes 0, a member 1)."""
        n = self.ctx.world_size
        if n > self.bcast_elems:
            raise _p.Error(-1, "%d workers: more than the broadcast key holds" % n, "psagg.torch")
        buf = torch.zeros(self.bcast_elems, dtype=torch.float32)
        if not joiner:
            buf[self.ctx.rank] = 1.0
        _Op(self, self.bcast_key, buf, _p.SUM, 0).finish()
        live = (buf[:n] > 0).nonzero()
        if live.numel() == 0:
            raise _p.Error(-1, "no member is left to give a joiner the state", "psagg.torch")
        return int(live[0])

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

    def close(self):
        if self._thread is not None:
            self._done.put(None)
            self._thread.join(timeout=60)
            self._thread = None
        self.ctx.close()


_session = None
_session_lock = threading.Lock()


def init(config=None, rank=None, world_size=None):
    """Create this process's psagg context (once; later calls return it). config: INI path
    (None: $PSAGG_CONFIG). rank / world_size: None reads PSAGG_RANK / PSAGG_WORLD_SIZE, else
    torchrun's RANK / WORLD_SIZE. Connects to every server and waits for all workers."""
    global _session
    with _session_lock:
        if _session is not None:
            return _session
        if rank is None:
            rank = _env_int("PSAGG_RANK", "RANK")
        if world_size is None:
            world_size = _env_int("PSAGG_WORLD_SIZE", "WORLD_SIZE")
        if rank is None or world_size is None:
            raise ValueError("psagg.torch.init: no rank/world size: pass them, or set "
                             "PSAGG_RANK and PSAGG_WORLD_SIZE (deploy/psagg-local does) or "
                             "torchrun's RANK and WORLD_SIZE")
        _session = _Session(config, rank, world_size)
        atexit.register(shutdown)
        return _session


def session():
    """The process's session (init() with the defaults if there is none yet)."""
    return _session if _session is not None else init()


def shutdown():
    """Close the context: tell the servers this worker is done. Called at exit."""
    global _session
    with _session_lock:
        s, _session = _session, None
    if s is not None:
        s.close()


def rank():
    return session().ctx.rank


def world_size():
    return session().ctx.world_size


def membership():
    """The job's membership as this worker knows it (psagg.Context.membership): a dict of
    epoch, rank, size and elastic. In an elastic job ([cluster] elastic = on) a worker that
    dies leaves it and the others go on; rank and size are then this worker's rank among the
    live workers and their number, which is what a data sampler shards by. Poll it once a step
    (it is cheap) or use membership_changes()."""
    return session().ctx.membership()


def membership_changes():
    """A generator for the training loop: each next() returns the membership (as membership())
    when it changed since the last next() (the first always), else None:
        changes = psagg.torch.membership_changes()
        for step in ...:
            m = next(changes)
            if m: sampler = DistributedSampler(data, num_replicas=m["size"], rank=m["rank"])"""
    last = None
    while True:
        m = membership()
        if last is None or m["epoch"] != last:
            last = m["epoch"]
            yield m
        else:
            yield None


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


# ---- DDP ----
def ddp_comm_hook(state, bucket):
    """The DDP communication hook: state is a psagg.torch session that declared the model.
    Starts one push_pull (average) per gradient of the bucket at once and returns a Future
    that the completion thread completes with the bucket's buffer."""
    buf = bucket.buffer()
    params = bucket.parameters()
    fut = torch.futures.Future()
    ops = []
    try:
        sizes = [p.numel() for p in params]
        if sum(sizes) != buf.numel():
            raise RuntimeError("psagg.torch: DDP bucket holds %d elements, its parameters %d"
                               % (buf.numel(), sum(sizes)))
        off = 0
        for p, n in zip(params, sizes):  # views of the bucket; _Op converts fp16/bf16 views
            if state.server_opt is not None:  # the gradient in, the weights updated in place
                ops.append(state.server_opt._psagg_push(p, buf[off:off + n]))
            else:
                ops.append(_Op(state, state.key_of(p), buf[off:off + n], _p.AVERAGE, 0))
            off += n
        state.complete_later(ops, fut, buf)
    except Exception as e:
        if ops:  # the ones started must finish before the buffer is reused
            state.complete_later(ops, torch.futures.Future(), None)
        fut.set_exception(e)
    # DDP reads the future's value in C++, where set_exception's error is only a value: a
    # callback that re-raises it marks the returned future failed with psagg's message
    return fut.then(_value)


def _value(fut):
    return fut.value()


def register_ddp_hook(ddp_model, codec=None, error_feedback=None, config=None, optimizer=None):
    """Declare every parameter of ddp_model.module that requires a gradient and register the
    psagg hook: DDP's all-reduce goes through psagg. Returns the session.

    optimizer: a ServerOptimizer of ddp_model.module's parameters: the hook pushes each
    bucket's gradients and the servers' weight updates land in the parameters before
    backward() returns; optimizer.step() then only finishes the step (its own gradient hooks
    stand down). codec and error_feedback are the ServerOptimizer's then.

    Not in an elastic job: DDP's process group cannot lose a member (ValueError)."""
    _check_codec("register_ddp_hook", codec)
    _check_error_feedback("register_ddp_hook", error_feedback)
    sess = init(config)
    if sess.ctx.membership()["elastic"]:
        raise ValueError("psagg.torch.register_ddp_hook: the job is elastic ([cluster] elastic = "
                         "on), and DDP's process group cannot go on without a worker that died: "
                         "train without DDP, with psagg.torch.DistributedOptimizer, "
                         "ServerOptimizer or DiLoCo")
    if optimizer is not None:
        if not isinstance(optimizer, ServerOptimizer):
            raise TypeError("psagg.torch.register_ddp_hook: optimizer must be a ServerOptimizer")
        optimizer._psagg_ddp = True
        sess.server_opt = optimizer
    else:
        sess.declare(ddp_model.module.named_parameters(), codec, error_feedback)
    ddp_model.register_comm_hook(sess, ddp_comm_hook)
    return sess


# ---- without DDP: optimizers that push from each parameter's gradient hook ----
def _named_params(opt, named_parameters, who):
    """named_parameters as a list, checked to cover every parameter of opt's param groups; or,
    without it, opt's parameters named "param.<group>.<index>"."""
    if named_parameters is None:
        return [("param.%d.%d" % (g, i), p) for g, group in enumerate(opt.param_groups)
                for i, p in enumerate(group["params"])]
    named = list(named_parameters)
    if not {id(p) for _, p in named} >= {id(p) for g in opt.param_groups for p in g["params"]}:
        raise ValueError("psagg.torch.%s: named_parameters does not cover every parameter of the "
                         "optimizer" % who)
    return named


def _hook_gradients(params, make_hook):
    """Register make_hook(p) on each parameter's gradient accumulator (it runs once the gradient
    is accumulated); returns the accumulators, which must be kept alive."""
    accs = []
    for p in params:
        acc = p.expand_as(p).grad_fn.next_functions[0][0]  # p's gradient accumulator
        acc.register_hook(make_hook(p))
        accs.append(acc)
    return accs


def _zero_grad(base, set_to_none):
    """base.zero_grad with torch's own default when set_to_none is None: PyTorch 1.13 zeroes
    the gradients, 2.x sets them to None (both work here: a missing gradient pushes zeros)."""
    return base.zero_grad() if set_to_none is None else base.zero_grad(set_to_none)


# ---- Horovod-style optimizer ----
class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, codec, error_feedback,
                 backward_passes_per_step, op, model):
        super(self.__class__, self).__init__(params)
        self._psagg = session()
        self._psagg_elastic = self._psagg.elastic()
        named = _named_params(self, named_parameters, "DistributedOptimizer")
        self._psagg.declare(named, codec, error_feedback)
        self._psagg_params = [p for group in self.param_groups for p in group["params"]
                              if p.requires_grad]
        self._psagg_ops = {}
        self._psagg_passes = {}
        self._psagg_every = int(backward_passes_per_step)
        self._psagg_op = op
        self._psagg_hooks = _hook_gradients(self._psagg_params, self._psagg_make_hook)
        self._psagg_model = model
        self.start_step = self._psagg.ctx.tensor_round(self._psagg.key_of(self._psagg_params[0]))
        m = self._psagg.ctx.membership()
        if m["joiner"]:  # a joiner: the members hand it their state at the barrier that let it in
            t0 = time.monotonic()
            self._psagg_take_state(joiner=True)
            self._psagg.state_seconds = time.monotonic() - t0

    def _psagg_take_state(self, joiner):
        """After a barrier that admitted workers: every worker takes the lowest old member's
        parameters (and the model's buffers, with model=) and optimizer state, through psagg."""
        sess = self._psagg
        root = sess.old_member_root(joiner)
        broadcast_parameters(list(self._psagg_model.parameters()) +
                             list(self._psagg_model.buffers())
                             if self._psagg_model is not None else self._psagg_params, root)
        data = None
        if sess.ctx.rank == root:
            import io
            f = io.BytesIO()
            torch.save(super(self.__class__, self).state_dict(), f)
            data = f.getvalue()
        data = sess.ctx.broadcast(sess.bcast_key, data, root)  # psagg_broadcast
        if sess.ctx.rank != root:
            import io
            super(self.__class__, self).load_state_dict(torch.load(io.BytesIO(data)))

    def _psagg_make_hook(self, p):
        def hook(*_):
            if id(p) in self._psagg_ops:
                raise RuntimeError("psagg.torch: the gradient of '%s' was computed again "
                                   "before step(); call step() or synchronize() between "
                                   "backward passes, or set backward_passes_per_step"
                                   % self._psagg.names.get(id(p)))
            n = self._psagg_passes.get(id(p), 0) + 1
            self._psagg_passes[id(p)] = n
            if n >= self._psagg_every:
                self._psagg_start(p)
        return hook

    def _psagg_start(self, p):
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        self._psagg_passes[id(p)] = 0
        self._psagg_ops[id(p)] = _Op(self._psagg, self._psagg.key_of(p), p.grad,
                                     self._psagg_op, 0)

    def synchronize(self):
        """Start what the hooks did not (unused parameters push zeros), then wait for all."""
        for p in self._psagg_params:
            if id(p) not in self._psagg_ops:
                self._psagg_start(p)
        ops, self._psagg_ops = self._psagg_ops, {}
        err = _finish_all(ops.values())
        if err is not None:
            raise err

    def step(self, closure=None):
        self.synchronize()
        loss = super(self.__class__, self).step(closure)
        if self._psagg_elastic and self._psagg.sync_membership()["joined"]:
            self._psagg_take_state(joiner=False)
        return loss

    def zero_grad(self, set_to_none=None):
        if self._psagg_ops:
            raise RuntimeError("psagg.torch: zero_grad() with push_pulls in flight; call "
                               "step() or synchronize() first")
        return _zero_grad(super(self.__class__, self), set_to_none)


def DistributedOptimizer(optimizer, named_parameters=None, codec=None, error_feedback=None,
                         backward_passes_per_step=1, op=_p.AVERAGE, model=None):
    """Wrap a torch optimizer, Horovod style: each parameter's push_pull starts from its
    gradient hook as soon as the gradient is ready; step() waits for all, then steps. The
    result is an instance of the optimizer's own class (LR schedulers accept it).

    Elastic jobs: step() ends with the members' barrier (psagg_sync_membership); when it
    admitted workers, every worker takes the lowest old member's parameters, optimizer state
    (its state_dict) and, with model=, the model's buffers (BatchNorm statistics), through
    psagg's broadcast key (the state with psagg_broadcast); a joiner does the same in this
    constructor. start_step: the step the job is at (a joiner's is the members')."""
    _check_codec("DistributedOptimizer", codec)
    _check_error_feedback("DistributedOptimizer", error_feedback)
    if not _is_int(backward_passes_per_step) or backward_passes_per_step < 1:
        raise ValueError("psagg.torch.DistributedOptimizer: backward_passes_per_step must be an "
                         "int >= 1, not %r" % (backward_passes_per_step,))
    _check_op("DistributedOptimizer", op)
    base = optimizer.__class__
    cls = type(base.__name__, (base,), dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, codec, error_feedback,
               backward_passes_per_step, op, model)


# ---- the server-side optimizer ([server] optimizer) ----
class _ParamOp:
    """A parameter's push_pull: its gradient in, its weights (p.data) updated in place."""

    __slots__ = ("handle", "grad")

    def __init__(self, sess, key, p, grad, lr, weight_decay, op):
        if grad.dtype != torch.float32 or grad.is_cuda:
            grad = grad.detach().float().cpu()
        grad = grad.contiguous()
        self.grad = grad
        sess.ctx.set_lr(key, lr, weight_decay)
        self.handle = sess.ctx.push_pull(key, grad.data_ptr(), p.data.data_ptr(), op, 0,
                                         keep=(grad, p))

    def finish(self):
        self.handle.wait()


class ServerOptimizer(torch.optim.Optimizer):
    """The optimizer runs on the psagg servers ([server] optimizer = sgd | adam | adamw, with
    its momentum / betas / eps from the config): the fp32 master weights and the optimizer's
    state live there, this process holds none. Every parameter is declared a psagg parameter;
    at construction all workers start from worker 0's weights (or, when the servers resumed
    from a checkpoint, the checkpoint's: start_step says which step that is). Each parameter's
    gradient is pushed from its gradient hook as soon as backward produces it; step() waits
    for all, and the weight updates (bit-identical on every worker) are in the parameters.

    params and param groups as torch.optim's; each group's lr and weight_decay go to the
    servers with every step, so LR schedulers work (every worker must use the same).
    named_parameters (optional, e.g. model.named_parameters()) names the declared tensors and
    sets their order, which must be the same on every worker. Parameters must be float32 CPU
    tensors. A parameter without a gradient is stepped with a zero gradient (as Horovod's
    wrapper pushes zeros), unlike torch.optim, which skips it. state_dict() holds only the param
    groups: the state lives on the servers, and checkpoint() has them save it.

        opt = psagg.torch.ServerOptimizer(model.parameters(), lr=1e-3,
                                          named_parameters=model.named_parameters())
        loss.backward(); opt.step(); opt.zero_grad()
    """

    def __init__(self, params, lr, weight_decay=0.0, named_parameters=None, codec=None,
                 error_feedback=None, op=_p.AVERAGE):
        for name, v in (("lr", lr), ("weight_decay", weight_decay)):
            if not _is_real(v) or v < 0:
                raise ValueError("psagg.torch.ServerOptimizer: %s must be a finite number >= 0, "
                                 "not %r" % (name, v))
        _check_codec("ServerOptimizer", codec)
        _check_error_feedback("ServerOptimizer", error_feedback)
        _check_op("ServerOptimizer", op)
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay))
        self._psagg_group = {id(p): g for g in self.param_groups for p in g["params"]}
        named = [(n, p) for n, p in _named_params(self, named_parameters, "ServerOptimizer")
                 if id(p) in self._psagg_group]
        for n, p in named:
            if p.requires_grad and (p.dtype != torch.float32 or p.is_cuda or
                                    not p.is_contiguous()):
                raise TypeError("psagg.torch.ServerOptimizer: parameter '%s' is %s%s; the servers "
                                "optimize contiguous float32 CPU parameters" %
                                (n, p.dtype, " on " + str(p.device) if p.is_cuda else ""))
        self._psagg = session()
        self._psagg.declare(named, codec, error_feedback, params=True)
        self._psagg_op = op
        self._psagg_ops = {}
        self._psagg_ddp = False
        self._psagg_elastic = self._psagg.elastic()
        self._psagg_params = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        ctx = self._psagg.ctx
        t0 = time.monotonic()
        with torch.no_grad():
            for h in [ctx.param_init(k, p.data.data_ptr(), keep=p) for k, p in self._psagg_keys()]:
                h.wait()
        self._psagg.state_seconds = time.monotonic() - t0
        self.start_step = ctx.tensor_round(self._psagg.key_of(self._psagg_params[0]))
        self._psagg_hooks = _hook_gradients(self._psagg_params, self._psagg_make_hook)

    def _psagg_keys(self):
        """(key, parameter) once per declared key (tied parameters share one)."""
        done = set()
        for p in self._psagg_params:
            k = self._psagg.key_of(p)
            if k not in done:
                done.add(k)
                yield k, p

    def _psagg_push(self, p, grad):
        g = self._psagg_group[id(p)]
        return _ParamOp(self._psagg, self._psagg.key_of(p), p, grad, g["lr"], g["weight_decay"],
                        self._psagg_op)

    def _psagg_make_hook(self, p):
        def hook(*_):
            if self._psagg_ddp:
                return  # the DDP hook pushes
            if id(p) in self._psagg_ops:
                raise RuntimeError("psagg.torch.ServerOptimizer: the gradient of '%s' was "
                                   "computed again before step()" % self._psagg.names.get(id(p)))
            self._psagg_ops[id(p)] = self._psagg_push(p, p.grad)
        return hook

    @torch.no_grad()
    def step(self, closure=None):
        """Wait for every parameter's update (pushing zeros for those without a gradient)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._psagg_ddp:
            return loss  # DDP's hook pushed, and backward() waited for the updates
        for p in self._psagg_params:
            if id(p) not in self._psagg_ops:
                self._psagg_ops[id(p)] = self._psagg_push(
                    p, p.grad if p.grad is not None else torch.zeros_like(p))
        ops, self._psagg_ops = self._psagg_ops, {}
        err = _finish_all(ops.values())
        if err is not None:
            raise err
        if self._psagg_elastic and self._psagg.sync_membership()["joined"]:
            self.pull_weights(sync=True)  # the joiners' psagg_param_init pulls with us
        return loss

    def zero_grad(self, set_to_none=None):
        if self._psagg_ops:
            raise RuntimeError("psagg.torch: zero_grad() with push_pulls in flight; call step() "
                               "first")
        return _zero_grad(super(), set_to_none)

    def pull_weights(self, sync=False):
        """The servers' exact fp32 master weights, {name: tensor}. With sync the parameters
        take them (every worker must call it at the same step). Call between steps."""
        ctx, got, handles = self._psagg.ctx, [], []
        with torch.no_grad():
            for k, p in self._psagg_keys():
                t = p.data if sync else torch.empty_like(p)
                handles.append(ctx.pull_weights(k, t.data_ptr(), sync, keep=t))
                got.append((self._psagg.names[id(p)], t))
            for h in handles:
                h.wait()
        return {name: t.clone() if sync else t for name, t in got}

    def checkpoint(self):
        """Every server writes the weights and the optimizer's state ([server] checkpoint_dir).
        Call between steps (after step()); one worker is enough."""
        self._psagg.ctx.checkpoint()


def diloco_ddp_hook(state, bucket):
    """A DDP communication hook that communicates nothing: each worker keeps its own gradient
    (DiLoCo's inner steps are local). register it with ddp.register_comm_hook(None,
    psagg.torch.diloco_ddp_hook) when DDP wraps a model that DiLoCo trains."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def diloco_fragments(sizes, fragments):
    """DiLoCo's split of tensors of these sizes (in order) into `fragments` contiguous groups:
    a group closes once it holds its share (total / fragments) of the elements, or when the
    tensors left are just enough to give every later group one. The fragment of each tensor;
    every fragment gets at least one (fragments <= len(sizes))."""
    total, acc, f, in_f, out = sum(sizes), 0, 0, 0, []
    for i, n in enumerate(sizes):
        if in_f and f < fragments - 1 and (acc * fragments >= (f + 1) * total or
                                           len(sizes) - i <= fragments - 1 - f):
            f, in_f = f + 1, 0
        out.append(f)
        in_f += 1
        acc += n
    return out


class DiLoCo:
    """DiLoCo (arXiv 2311.08105) and Streaming DiLoCo (arXiv 2501.18512) with the outer
    optimizer on the psagg servers: each worker takes sync_every (H) steps of its own inner
    optimizer with no communication; then every worker pushes its pseudo-gradient (anchor -
    local weights, in `codec`, with error feedback) and the servers average it over the workers
    and apply the outer optimizer, SGD with momentum (Nesterov) at outer_lr, to the global
    weights they hold; every worker gets the same delta, moves its anchor (its copy of the
    global weights) by it and takes the anchor as its weights. The global weights and the
    outer momentum live once, on the servers (and in their checkpoints).

    The servers must run `[server] optimizer = sgd` with `momentum` = outer_momentum and
    `nesterov` = on|off as nesterov (the papers' 0.9 and on), which the constructor checks
    (ValueError naming both); outer_lr goes with every push.

    Heterogeneous workers: step(samples=n) makes each worker's pseudo-gradient count with the
    samples it trained on since the fragment's last sync (the weight travels in the push; the
    servers divide by the sum of the weights).

    Streaming: fragments=P splits the parameters, in named_parameters() order, into P
    contiguous groups of about equal size (diloco_fragments); fragment p syncs at the inner
    steps t >= 1 with (t - offset(p)) mod H == 0, offset(p) = p*H//P: first at offset(p) when
    that is > 0 (its first pseudo-gradient covers those offset(p) steps), else at H, then every
    H steps. That is Streaming DiLoCo's schedule (the paper syncs fragment p when
    (t - t_p) mod H == 0), which spreads the syncs evenly over every window from the start; a
    joiner's and a resumed job's start_step follow it. With fragment_sync_delay=tau its push
    starts at that step and its result is applied tau inner steps later (the exchange overlaps
    the inner steps); the local weights then become alpha * local + (1 - alpha) * global
    (fragment_update_alpha).
    The fragments and steps are the same on every worker, and the servers take the pushes of
    each tensor in round order, so every worker applies the same updates in the same order.

        diloco = psagg.torch.DiLoCo(model, inner_opt, sync_every=50, codec="maxmin4")
        for x, y in data:
            loss_fn(model(x), y).backward()
            inner_opt.step(); inner_opt.zero_grad()
            diloco.step()          # after every inner step; syncs every sync_every steps
        diloco.finish()            # applies a sync still in flight

    With DDP wrapping the model, register diloco_ddp_hook so that backward() all-reduces
    nothing. start_step: the inner step the job starts from, from the servers' round of every
    fragment: 0 in a new job; after a resume from a checkpoint, the checkpoint's step (see
    checkpoint()); for a worker that joins an elastic job, the step of the members' barrier
    that admitted it.
    """

    def __init__(self, model, inner_optimizer, sync_every, outer_lr=0.7, outer_momentum=0.9,
                 nesterov=True, codec="maxmin4", error_feedback=None, fragments=1,
                 fragment_sync_delay=0, fragment_update_alpha=0.0, named_parameters=None):
        H, P, tau = sync_every, fragments, fragment_sync_delay
        # (bool is an int to Python: sync_every=True must not pass as 1)
        if not _is_int(H) or H < 1:
            raise ValueError("psagg.torch.DiLoCo: sync_every must be an int >= 1, not %r" % (H,))
        if not _is_real(outer_lr) or not 0 <= outer_lr <= 1e6:
            raise ValueError("psagg.torch.DiLoCo: outer_lr must be a finite number in 0..1e6, "
                             "not %r" % (outer_lr,))
        if not _is_real(outer_momentum) or not 0 <= outer_momentum < 1:
            raise ValueError("psagg.torch.DiLoCo: outer_momentum must be a number in [0, 1), "
                             "not %r" % (outer_momentum,))
        if not _is_real(fragment_update_alpha) or not 0 <= fragment_update_alpha <= 1:
            raise ValueError("psagg.torch.DiLoCo: fragment_update_alpha must be a number in "
                             "[0, 1], not %r" % (fragment_update_alpha,))
        if not isinstance(nesterov, bool):
            raise ValueError("psagg.torch.DiLoCo: nesterov must be True or False, not %r"
                             % (nesterov,))
        _check_codec("DiLoCo", codec)
        _check_error_feedback("DiLoCo", error_feedback)
        named = list(named_parameters if named_parameters is not None
                     else model.named_parameters())
        named = [(n, p) for n, p in named if p.requires_grad]
        if not _is_int(P) or not 1 <= P <= len(named):
            raise ValueError("psagg.torch.DiLoCo: fragments must be an int in 1..%d (the "
                             "parameters that require a gradient), not %r" % (len(named), P))
        H, P = int(H), int(P)
        if not _is_int(tau) or not 0 <= tau < max(1, H // P):
            raise ValueError("psagg.torch.DiLoCo: fragment_sync_delay must be an int in "
                             "0..%d (less than sync_every / fragments), not %r"
                             % (max(1, H // P) - 1, tau))
        tau = int(tau)
        for n, p in named:
            if p.dtype not in _FLOATS:
                raise TypeError("psagg.torch.DiLoCo: parameter '%s' is %s" % (n, p.dtype))
        self.model, self.inner_optimizer = model, inner_optimizer
        self.sync_every, self.fragments, self.delay = H, P, tau
        self.alpha, self.outer_lr = float(fragment_update_alpha), float(outer_lr)
        self.outer_momentum, self.nesterov = float(outer_momentum), bool(nesterov)
        self._named = named
        so = session().ctx.server_optimizer()  # the outer optimizer is the servers'
        if so["kind"] != "sgd" or abs(so["momentum"] - outer_momentum) > 1e-6 or \
                so["nesterov"] != bool(nesterov) or so["dampening"] != 0.0:
            raise ValueError(
                "psagg.torch.DiLoCo: the servers run [server] optimizer = %s (momentum %g, "
                "dampening %g, nesterov %s); DiLoCo's outer step needs optimizer = sgd, "
                "momentum = %g, dampening = 0, nesterov = %s (e.g. PSAGG_SERVER_OPTIMIZER=sgd "
                "PSAGG_SERVER_MOMENTUM=%g PSAGG_SERVER_NESTEROV=%s on the servers)"
                % (so["kind"], so["momentum"], so["dampening"], "on" if so["nesterov"] else "off",
                   outer_momentum, "on" if nesterov else "off", outer_momentum,
                   "on" if nesterov else "off"))
        # the anchors: fp32 CPU copies of the global weights, declared as psagg parameters
        self._anchors = [p.detach().float().cpu().contiguous().clone() for _, p in named]
        self._psagg = session()
        self._psagg.declare([(n, a) for (n, _), a in zip(named, self._anchors)], codec,
                            error_feedback, params=True, all_tensors=True)
        ctx = self._psagg.ctx
        t0 = time.monotonic()
        with torch.no_grad():
            for h in [ctx.param_init(self._psagg.key_of(a), a.data_ptr(), keep=a)
                      for a in self._anchors]:
                h.wait()
            for (_, p), a in zip(named, self._anchors):
                p.copy_(a)
        self._psagg.state_seconds = time.monotonic() - t0
        self._frag = diloco_fragments([a.numel() for a in self._anchors], P)
        self._elastic = self._psagg.elastic()
        # where the job is, from every fragment's round (its syncs so far): the same for a
        # joiner (the members' barrier) and a resumed job (the checkpoint's step)
        self.start_step = self._step_of_rounds(
            [ctx.tensor_round(self._psagg.key_of(self._anchors[self._frag.index(f)]))
             for f in range(P)])
        self.step_count = self.start_step
        self._pending = []  # (apply at step, fragment, ops)
        self._samples = [0.0] * P  # per fragment: samples since its last sync (step(samples))
        self._weighted = None  # the first step() says: with samples (True) or without

    def _offset(self, f):
        return f * self.sync_every // self.fragments

    def _first_sync(self, f):
        """Fragment f's first sync step: Streaming DiLoCo's schedule syncs it at the steps
        t >= 1 with (t - offset(f)) mod H == 0, so at offset(f) when that is > 0, else at H."""
        return self._offset(f) or self.sync_every

    def _sync_step(self, f, j):
        """The inner step of fragment f's j-th sync (j >= 1)."""
        return self._first_sync(f) + (j - 1) * self.sync_every

    def _syncs(self, f, t):
        """How many syncs fragment f has started by inner step t (t included)."""
        first = self._first_sync(f)
        return 0 if t < first else (t - first) // self.sync_every + 1

    def _step_of_rounds(self, rounds):
        """The inner step of a job whose fragment f has synced rounds[f] times (the servers'
        round of its tensors): right after the latest of those syncs was applied, its step plus
        fragment_sync_delay, which is where the members' barrier admits a joiner and where
        checkpoint() is called; 0 before any sync. Joiners and resumed jobs both start there,
        so their step tags agree with the members'. ValueError when the rounds fit no step of
        this schedule (e.g. a checkpoint of another sync_every or fragments)."""
        if not any(rounds):
            return 0
        last = max(self._sync_step(f, r) for f, r in enumerate(rounds) if r)
        if any(self._syncs(f, last) != r for f, r in enumerate(rounds)):
            raise ValueError(
                "psagg.torch.DiLoCo: the servers' rounds per fragment %s fit no step of this "
                "schedule (sync_every %d, fragments %d): the job's state (a checkpoint, the "
                "members') comes from another sync_every or fragments"
                % (list(rounds), self.sync_every, self.fragments))
        return last + self.delay

    def _start(self, f):
        """Push fragment f's pseudo-gradients; the anchors take the servers' delta."""
        ctx, ops = self._psagg.ctx, []
        with torch.no_grad():
            for i, ((_, p), a) in enumerate(zip(self._named, self._anchors)):
                if self._frag[i] != f:
                    continue
                pg = (a - p.detach().float().cpu()).contiguous()
                key = self._psagg.key_of(a)
                ctx.set_lr(key, self.outer_lr, 0.0)
                # the schedule in the push (the servers refuse workers that disagree, naming
                # the fragment and the step) and this worker's weight in the average
                weight = self._samples[f] if self._weighted else 1.0
                if weight != 1.0:
                    pg.mul_(weight)
                ctx.set_param_sync(key, (f << 24) | (self.step_count & 0xFFFFFF), weight)
                ops.append(ctx.push_pull(key, pg.data_ptr(), a.data_ptr(), _p.AVERAGE, 0,
                                         keep=(pg, a)))
        self._pending.append((self.step_count + self.delay, f, ops))
        self._samples[f] = 0.0

    def _apply(self, f, ops):
        err = None
        for h in ops:
            try:
                h.wait()
            except Exception as e:  # every handle must finish before the buffers may go
                err = err or e
        if err is not None:
            raise err
        a_ = 1.0 - self.alpha
        with torch.no_grad():
            for i, ((_, p), a) in enumerate(zip(self._named, self._anchors)):
                if self._frag[i] != f:
                    continue
                g = a.to(device=p.device, dtype=p.dtype)
                if self.alpha == 0.0:
                    p.copy_(g)
                else:
                    p.mul_(self.alpha).add_(g, alpha=a_)

    def step(self, samples=None):
        """Call once after every inner optimizer step: starts the fragments whose sync step
        this is and applies those whose delay has passed. samples: what this inner step
        trained on (e.g. the batch size); when given (on every worker), each worker's
        pseudo-gradient counts in the servers' average with the samples it took since the
        fragment's last sync (workers of different speeds, a token-weighted merge). Pass it to
        every step() or to none: the first step() decides, and a later one of the other kind
        raises ValueError and changes nothing (a step without samples would count nothing it
        trained on, and a weighted push of no samples is refused; samples after steps without
        them would leave those steps out of the weight)."""
        if samples is not None and (not _is_real(samples) or not samples > 0):
            raise ValueError("psagg.torch.DiLoCo.step: samples must be a finite number > 0, "
                             "not %r" % (samples,))
        if self._weighted is None:
            self._weighted = samples is not None
        elif self._weighted and samples is None:
            raise ValueError("psagg.torch.DiLoCo.step: no samples, but this DiLoCo's earlier "
                             "steps gave samples: pass samples to every step() or to none (a "
                             "step without them would count nothing in its fragments' weights, "
                             "a weight of 0 after a sync)")
        elif not self._weighted and samples is not None:
            raise ValueError("psagg.torch.DiLoCo.step: samples=%r, but this DiLoCo's earlier "
                             "steps gave none: pass samples to every step() or to none (those "
                             "steps would be left out of the weight)" % (samples,))
        if samples is not None:
            for f in range(self.fragments):
                self._samples[f] += float(samples)
        self.step_count += 1
        t = self.step_count
        for f in range(self.fragments):
            if self._syncs(f, t) != self._syncs(f, t - 1):
                self._start(f)
        due = [x for x in self._pending if x[0] <= t]
        self._pending = [x for x in self._pending if x[0] > t]
        for _, f, ops in due:
            self._apply(f, ops)
        if due and not self._pending and self._elastic:
            self._barrier()

    def _barrier(self):
        """Elastic jobs, after an outer sync with nothing in flight: the members' barrier. When
        it admitted workers, each joiner takes the servers' exact global weights in its
        constructor (psagg_param_init), and the members pull the same weights with it
        (psagg_pull_weights, sync): their anchors become the servers' master weights. A
        member's own weights are not overwritten: on the fragments that did not sync at this
        step they hold the inner steps since those fragments' last sync (up to H - H/P), and
        the alpha merge on the one that did. They move by the change of their anchor,
        p += new anchor - old anchor: usually by nothing (every worker applied the same
        updates, so the anchor is the master weights already); the master weights are ahead
        of the anchor when the updates came in a lossy codec (what a 4-bit delta dropped, the
        servers send later). Where a weight equals its old anchor (a fragment that just
        synced with alpha 0) it takes the new anchor exactly, as the joiner does."""
        if not self._psagg.sync_membership()["joined"]:
            return
        ctx = self._psagg.ctx
        old = [a.clone() for a in self._anchors]
        with torch.no_grad():
            for h in [ctx.pull_weights(self._psagg.key_of(a), a.data_ptr(), True, keep=a)
                      for a in self._anchors]:
                h.wait()
            for (_, p), a, o in zip(self._named, self._anchors, old):
                if torch.equal(a, o):
                    continue  # the anchor did not move: neither do the weights
                new, was = a.to(p.device), o.to(p.device)
                q = p.detach().float()
                p.copy_(torch.where(q == was, new, q + (new - was)))

    def finish(self):
        """Apply every sync still in flight (at the end of training)."""
        due, self._pending = self._pending, []
        for _, f, ops in due:
            self._apply(f, ops)

    def checkpoint(self):
        """Every server writes the global weights and the outer momentum ([server]
        checkpoint_dir); one worker is enough. Call it right after the step() that applied a
        sync (a fragment's sync step plus fragment_sync_delay), with no sync in flight.

        A job resumed from it ([server] resume = on) starts at start_step: the servers keep
        each fragment's round (its syncs so far), and start_step is the step right after the
        latest of those syncs was applied, the latest over all fragments (a fragment p > 0 that
        synced last counts, not fragment 0's round x sync_every). That is the step of the
        checkpoint when it was taken as said above; a checkpoint taken later in the same
        window resumes at that earlier step (the rounds cannot tell them apart), and one taken
        after finish() applied a sync early resumes fragment_sync_delay steps later than it
        was taken. A worker that joins the resumed job later computes its step the same way.

        Every worker's weights are then the checkpoint's global weights: exact for
        fragments=1 (after an outer step the local weights are the global ones). With
        fragments > 1 the fragments that did not sync last held each worker's own progress
        since their last sync, which the servers do not have: save the model's weights with
        the checkpoint (torch.save, every worker its own) and load them after this
        constructor on resume; the inner optimizer's state likewise."""
        if self._pending:
            raise RuntimeError("psagg.torch.DiLoCo.checkpoint: a sync is in flight; call it "
                               "after the sync is applied (or after finish())")
        self._psagg.ctx.checkpoint()

    def global_weights(self):
        """{name: the anchor}: this worker's copy of the global weights (the same bytes on
        every worker after each sync)."""
        return {n: a for (n, _), a in zip(self._named, self._anchors)}


def checkpoint():
    """psagg_checkpoint on this process's context (see ServerOptimizer.checkpoint)."""
    session().ctx.checkpoint()


def broadcast_parameters(params, root=0):
    """Make every worker's tensors equal root's: a module (its parameters and floating-point
    buffers), a state_dict or a list of (name, tensor) / tensors. Exact for fp32, fp16 and
    bf16 (root's values summed with zeros in fp32); integer tensors are left alone."""
    sess = session()
    if isinstance(params, torch.nn.Module):
        if sess.bcast_key is None:
            sess.declare(params.named_parameters())
        tensors = list(params.parameters()) + list(params.buffers())
    elif isinstance(params, dict):
        tensors = list(params.values())
    else:
        tensors = [t[1] if isinstance(t, tuple) else t for t in params]
    if sess.bcast_key is None:
        raise _p.Error(-1, "nothing declared yet: call register_ddp_hook or "
                       "DistributedOptimizer first, or pass the module", "broadcast_parameters")
    tensors = [t for t in tensors if t.is_floating_point()]
    for t in tensors:
        if t.dtype not in _FLOATS:
            raise TypeError("psagg.torch.broadcast_parameters: dtype %s is not exact through "
                            "fp32; convert it first" % t.dtype)
    mine = sess.ctx.rank == root
    cap = sess.bcast_elems
    # pack the tensors into cap-element rounds of the broadcast key
    pieces, fill = [], 0  # (tensor, start, n, offset in the round)
    rounds = []
    for t in tensors:
        flat_n, start = t.numel(), 0
        while start < flat_n:
            n = min(flat_n - start, cap - fill)
            pieces.append((t, start, n, fill))
            start += n
            fill += n
            if fill == cap:
                rounds.append(pieces)
                pieces, fill = [], 0
    if pieces:
        rounds.append(pieces)
    with torch.no_grad():
        for pieces in rounds:
            buf = torch.zeros(cap, dtype=torch.float32)
            if mine:
                for t, start, n, at in pieces:
                    buf[at:at + n] = t.detach().reshape(-1)[start:start + n].float().cpu()
            op = _Op(sess, sess.bcast_key, buf, _p.SUM, 0)
            op.finish()
            for t, start, n, at in pieces:
                t.view(-1)[start:start + n].copy_(buf[at:at + n])
