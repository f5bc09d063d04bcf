"""psagg.torch with DDP: the communication hook that sends DDP's buckets through psagg
(register_ddp_hook), optionally into a ServerOptimizer."""

import torch

import psagg as _p

from . import _session
from ._session import _Op
from ._util import _check_codec, _check_error_feedback
from .server_optimizer import ServerOptimizer


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
            if n == 0:
                continue  # (no elements: not declared)
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
    sess = _session.init(config)  # (through the module: tests replace it there)
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
