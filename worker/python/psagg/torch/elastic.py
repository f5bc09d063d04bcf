"""psagg.torch's elastic jobs ([cluster] elastic = on): the membership a training loop
re-shards by, and the hand-over of the optimizer on the workers (DistributedOptimizer) to the
workers a barrier admitted: the lowest old member's tensors and optimizer state to everyone.
(ServerOptimizer and DiLoCo hand over through the servers' weights: their own modules.)"""

import io

import torch

import psagg as _p

from . import _session
from ._session import _Op
from .broadcast import broadcast_tensors


def membership():
    """The job's membership as this worker knows it (psagg.Context.membership): a dict of
    epoch, rank, size and elastic. In an elastic job ([cluster] elastic = on) a worker that
    dies leaves it and the others go on; rank and size are then this worker's rank among the
    live workers and their number, which is what a data sampler shards by. Poll it once a step
    (it is cheap) or use membership_changes()."""
    return _session.session().ctx.membership()


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


def old_member_root(sess, joiner):
    """The lowest rank that was a member before the last admission, agreed by every
    worker through one SUM of the broadcast key (a joiner pushes 0, a member 1)."""
    n = sess.ctx.world_size
    if n > sess.bcast_elems:
        raise _p.Error(-1, "%d workers: more than the broadcast key holds" % n, "psagg.torch")
    buf = torch.zeros(sess.bcast_elems, dtype=torch.float32)
    if not joiner:
        buf[sess.ctx.rank] = 1.0
    _Op(sess, sess.bcast_key, buf, _p.SUM, 0).finish()
    live = (buf[:n] > 0).nonzero()
    if live.numel() == 0:
        raise _p.Error(-1, "no member is left to give a joiner the state", "psagg.torch")
    return int(live[0])


def hand_over(sess, tensors, state_dict, load_state_dict, joiner):
    """After a barrier that admitted workers (every member, joiner=False) and in a joiner's
    constructor (joiner=True): every worker takes the lowest old member's `tensors`
    (broadcast_tensors) and the state its state_dict() returns, serialized (torch.save) and
    sent with psagg_broadcast on the session's broadcast key; the others load_state_dict() it."""
    root = old_member_root(sess, joiner)
    broadcast_tensors(tensors, root)
    data = None
    if sess.ctx.rank == root:
        f = io.BytesIO()
        torch.save(state_dict(), f)
        data = f.getvalue()
    data = sess.ctx.broadcast(sess.bcast_key, data, root)
    if sess.ctx.rank != root:
        load_state_dict(torch.load(io.BytesIO(data)))
