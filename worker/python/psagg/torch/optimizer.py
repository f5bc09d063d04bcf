"""psagg.torch.DistributedOptimizer: a torch optimizer wrapped Horovod style, each
parameter's push_pull started from its gradient hook; in an elastic job it hands its state to
the workers a barrier admits (elastic.hand_over)."""

import contextlib
import time

import torch

import psagg as _p

from . import elastic
from ._session import _finish_all, _Op, session
from ._util import (_check_codec, _check_error_feedback, _check_op, _check_tracked,
                    _hook_gradients, _is_int, _named_params, _refuse_new_group, _zero_grad)


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, defaults, named_parameters, codec, error_feedback,
                 backward_passes_per_step, op, model):
        super(self.__class__, self).__init__(params)
        self.defaults.update(defaults)  # (the wrapped optimizer's, not its class's)
        self._psagg = session()
        self._psagg_elastic = self._psagg.elastic()
        named = _named_params(self, named_parameters, "DistributedOptimizer")
        self._psagg.declare(named, codec, error_feedback)
        self._psagg_params = [p for group in self.param_groups for p in group["params"]
                              if p.requires_grad and p.numel() > 0]
        self._psagg_ids = {id(p) for p in self._psagg_params}
        self._psagg_ops = {}
        self._psagg_synced = False  # synchronize() ran and no gradient came since
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
        parameters (and the model's buffers, with model=) and optimizer state, through psagg
        (elastic.hand_over)."""
        base = super(self.__class__, self)
        model = self._psagg_model
        tensors = list(model.parameters()) + list(model.buffers()) if model is not None \
            else self._psagg_params
        elastic.hand_over(self._psagg, tensors, base.state_dict, base.load_state_dict, joiner)

    def _psagg_make_hook(self, p):
        def hook(*_):
            if id(p) in self._psagg_ops:
                raise RuntimeError("psagg.torch: the gradient of '%s' was computed again "
                                   "before step(): a second backward pass (call step() or "
                                   "synchronize() between them, or set "
                                   "backward_passes_per_step), or one backward that "
                                   "accumulates it twice (reentrant activation checkpointing "
                                   "of a parameter used outside the segment too: "
                                   "use_reentrant=False)" % self._psagg.names.get(id(p)))
            n = self._psagg_passes.get(id(p), 0) + 1
            self._psagg_passes[id(p)] = n
            if n >= self._psagg_every:
                self._psagg_start(p)
        return hook

    def _psagg_start(self, p):
        self._psagg_synced = False
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        self._psagg_passes[id(p)] = 0
        self._psagg_ops[id(p)] = _Op(self._psagg, self._psagg.key_of(p), p.grad,
                                     self._psagg_op, 0)

    def synchronize(self):
        """Start what the hooks did not (unused parameters push zeros), then wait for all.
        A step() after it (Horovod's gradient clipping: synchronize(), clip, step()) applies
        those gradients without pushing them again."""
        for p in self._psagg_params:
            if id(p) not in self._psagg_ops:
                self._psagg_start(p)
        ops, self._psagg_ops = self._psagg_ops, {}
        err = _finish_all(ops.values())
        if err is not None:
            raise err
        _check_tracked(self, self._psagg_ids, "DistributedOptimizer")  # (nothing in flight)
        self._psagg_synced = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Horovod's: a step() within it does not synchronize (after synchronize(), step()
        does not anyway)."""
        self._psagg_synced = True
        yield

    def add_param_group(self, param_group):
        _refuse_new_group(self, param_group, "DistributedOptimizer")
        return super(self.__class__, self).add_param_group(param_group)

    def step(self, closure=None):
        if not self._psagg_synced or self._psagg_ops:
            self.synchronize()
        self._psagg_synced = False
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
    return cls(optimizer.param_groups, optimizer.defaults, named_parameters, codec,
               error_feedback, backward_passes_per_step, op, model)
