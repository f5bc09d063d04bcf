"""psagg.torch.broadcast_parameters: root's tensors on every worker, exact for fp32, fp16
and bf16 (root's values summed with zeros in fp32, on the session's broadcast key)."""

import torch

import psagg as _p

from ._session import _Op, session
from ._util import _FLOATS


def broadcast_parameters(params, root=0):
    """Make every worker's tensors equal root's: a module (its parameters and floating-point
    buffers), a state_dict or a list of (name, tensor) / tensors. Exact for fp32, fp16 and
    bf16 (root's values summed with zeros in fp32); integer tensors are left alone. In a
    worker that joined a running elastic job a call before its first step returns at once:
    the members made theirs at the start, and the joiner takes their state from
    DistributedOptimizer, ServerOptimizer or DiLoCo (docs/elastic.md)."""
    return broadcast_tensors(params, root, joiner_skips=True)


def broadcast_tensors(params, root, joiner_skips=False):
    """broadcast_parameters' work (elastic.py's hand-over calls it as it is)."""
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
    if joiner_skips and sess.joiner_fresh:
        # a joiner (elastic, admitted as its declaration returned) takes the members' state
        # from the wrappers' hand-over; its script's broadcast at the start has no members in
        # it (they made theirs steps ago): it returns at once
        return
    tensors = [t for t in tensors if t.is_floating_point()]
    for t in tensors:
        if t.dtype not in _FLOATS:
            raise TypeError("psagg.torch.broadcast_parameters: dtype %s is not exact through "
                            "fp32; convert it first" % t.dtype)
    mine = sess.ctx.rank == root
    cap = sess.bcast_elems
    # a non-contiguous tensor (channels_last, a transpose) goes through a contiguous copy,
    # written back at the end
    staged = [(t, t if t.is_contiguous() else t.detach().contiguous()) for t in tensors]
    # pack the tensors into cap-element rounds of the broadcast key
    pieces, fill = [], 0  # (tensor, start, n, offset in the round)
    rounds = []
    for _, t in staged:
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
        for t, s in staged:
            if s is not t:
                t.copy_(s)
