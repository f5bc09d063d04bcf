"""psagg.torch.ServerOptimizer: the optimizer on the psagg servers ([server] optimizer); this
process pushes gradients and takes the weight updates."""

import time

import torch

import psagg as _p

from ._session import _finish_all, session
from ._util import (_check_codec, _check_error_feedback, _check_op, _check_tracked,
                    _hook_gradients, _is_real, _named_params, _refuse_new_group, _zero_grad)


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
                raise TypeError("psagg.torch.ServerOptimizer: parameter '%s' is %s%s%s; the "
                                "servers optimize contiguous float32 CPU parameters" %
                                (n, "" if p.is_contiguous() else "non-contiguous ", p.dtype,
                                 " on " + str(p.device) if p.is_cuda else ""))
        self._psagg = session()
        self._psagg.declare(named, codec, error_feedback, params=True)
        self._psagg_op = op
        self._psagg_ops = {}
        self._psagg_ddp = False
        self._psagg_elastic = self._psagg.elastic()
        self._psagg_params = [p for g in self.param_groups for p in g["params"]
                              if p.requires_grad and p.numel() > 0]
        self._psagg_ids = {id(p) for p in self._psagg_params}
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
                                   "computed again before step(): a second backward pass, or "
                                   "one that accumulates it twice (reentrant activation "
                                   "checkpointing of a parameter used outside the segment "
                                   "too: use_reentrant=False)" % self._psagg.names.get(id(p)))
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
        _check_tracked(self, self._psagg_ids, "ServerOptimizer")  # (nothing in flight)
        if self._psagg_elastic and self._psagg.sync_membership()["joined"]:
            self.pull_weights(sync=True)  # the joiners' psagg_param_init pulls with us
        return loss

    def add_param_group(self, param_group):
        _refuse_new_group(self, param_group, "ServerOptimizer")
        return super().add_param_group(param_group)

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
        Call between steps (after step()); one worker is enough, except with [server] quorum:
        then every worker calls it at the same step (rounds may close without a worker, so
        only then are all chunks between the same two rounds), and it fails by name for the
        workers that did not within op_timeout_ms."""
        self._psagg.ctx.checkpoint()
