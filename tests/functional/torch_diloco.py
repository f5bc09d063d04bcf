"""torch_diloco.py - psagg.torch.DiLoCo against a single-process reference, run under
deploy/psagg-local by test_torch.sh (case diloco) with [server] optimizer = sgd, momentum 0.9,
nesterov on.

Every rank builds a small MLP from a seed of its own (DiLoCo must hand all of them rank 0's
weights) and trains it with its own SGD on its own shard for STEPS inner steps, calling
DiLoCo.step() after each. Every rank also keeps a reference of the whole job: all N workers'
local models trained on their shards, Streaming DiLoCo's fragment schedule (arXiv 2501.18512:
fragment p syncs at the inner steps t >= 1 with (t - p*H/P) mod H == 0, so first at p*H/P when
that is > 0, else at H), each sync's pseudo-gradients
summed in rank order and scaled by 1/N in fp32 (what the servers compute), torch.optim.SGD
(momentum 0.9, Nesterov, outer lr) on the global weights, and the merge alpha * local +
(1 - alpha) * global when the sync is applied. Checks, after the run:
  CODEC=fp32: every anchor within fp32 rounding of the reference's global weights, and this
              rank's weights within rounding of the reference's worker of this rank;
  any codec:  the loss fell, and "DILOCO-DIGEST step=T <hex>" of the anchors after every
              applied sync (the harness checks that every rank printed the same lines);
and that bad arguments are refused at construction with a message naming them.
With WEIGHTED=1 every rank says it took 32 * (rank + 1) samples per step (step(samples)), and
the reference weights each pseudo-gradient so. With DISAGREE=1 rank 1 runs 2 fragments where
the others run 1: every rank must fail with the servers' message naming the fragments and
steps ("DILOCO disagreement caught"). With DIE=T rank 2 kills itself (SIGKILL) at inner step T,
before its DiLoCo.step(): every other rank must get an error naming worker 2 within 10 s
("DILOCO peer death caught"), never a hang (the job is not elastic). With MIX=1 the even ranks
call step(samples=32) and the odd ones step() for the first H steps; at step H + 1 each calls
the other kind once, which must raise ValueError naming samples and change nothing (before,
a weighted worker's later step() pushed weight 0, which psagg_set_param_sync refuses with
EINVAL at the next sync, and an unweighted worker's later step(samples) was taken), then goes on
as before to STEPS ("DILOCO mix refused").
Env: CODEC (fp32), H (sync_every, 4), FRAGMENTS (1), DELAY (0), ALPHA (0.0), STEPS (24),
EF_BETA (error_feedback_beta: unset, the config's).
Prints "DILOCO ok rank=R ..." on success.
"""

import hashlib
import math
import os
import signal
import sys
import time

import torch

import psagg.torch as pt

CODEC = os.environ.get("CODEC", "fp32")
H = int(os.environ.get("H", "4"))
P = int(os.environ.get("FRAGMENTS", "1"))
TAU = int(os.environ.get("DELAY", "0"))
ALPHA = float(os.environ.get("ALPHA", "0.0"))
STEPS = int(os.environ.get("STEPS", "24"))
WEIGHTED = os.environ.get("WEIGHTED") == "1"
DISAGREE = os.environ.get("DISAGREE") == "1"
DIE = int(os.environ.get("DIE", "0"))
MIX = os.environ.get("MIX") == "1"
EF_BETA = float(os.environ["EF_BETA"]) if os.environ.get("EF_BETA") else None
OUTER_LR, MOM, INNER_LR = 0.7, 0.9, 0.05
torch.set_num_threads(1)


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8),
                               torch.nn.Tanh(), torch.nn.Linear(8, 1))


def shard(r):
    g = torch.Generator().manual_seed(1000 + r)
    x = torch.randn(256, 20, generator=g)
    w = torch.linspace(-1, 1, 20).unsqueeze(1)
    return x, torch.tanh(x @ w) + 0.05 * torch.randn(256, 1, generator=g)


def batch(data, t):
    x, y = data
    i = (t * 32) % x.shape[0]
    return x[i:i + 32], y[i:i + 32]


def inner_step(model, opt, data, t):
    x, y = batch(data, t)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def fragments_of(params, p):
    """The same split as DiLoCo's (psagg.torch.diloco_fragments), written out again."""
    sizes = [t.numel() for t in params]
    total, acc, f, in_f, out = sum(sizes), 0, 0, 0, []
    for i, n in enumerate(sizes):
        if in_f and f < p - 1 and (acc * p >= (f + 1) * total or len(sizes) - i <= p - 1 - f):
            f, in_f = f + 1, 0
        out.append(f)
        in_f += 1
        acc += n
    if sorted(set(out)) != list(range(p)):
        sys.exit("fragments %s: not every one of %d holds a tensor" % (out, p))
    return out


def bad_arguments(model, opt):
    """Bad arguments, and an outer momentum the servers do not run: ValueError naming it."""
    cases = [(dict(sync_every=0), "sync_every"), (dict(sync_every=4, fragments=99), "fragments"),
             (dict(sync_every=4, fragment_update_alpha=1.5), "fragment_update_alpha"),
             (dict(sync_every=4, outer_lr=math.nan), "outer_lr"),
             (dict(sync_every=4, outer_momentum=1.0), "outer_momentum"),
             (dict(sync_every=4, fragment_sync_delay=4), "fragment_sync_delay"),
             (dict(sync_every=4, outer_momentum=0.5), "momentum = 0.5"),
             (dict(sync_every=4, nesterov=False), "nesterov = off"),
             # (nesterov defaults to off at momentum 0, so what the error asks the servers for
             # is a setting they accept)
             (dict(sync_every=4, outer_momentum=0), "momentum = 0, dampening = 0, nesterov = off"),
             (dict(sync_every=4, outer_momentum=0, nesterov=True), "needs outer_momentum > 0")]
    for kw, name in cases:
        try:
            pt.DiLoCo(model, opt, **kw)
        except ValueError as e:
            if name not in str(e):
                sys.exit("DiLoCo(%r): the error does not name %s: %s" % (kw, name, e))
            continue
        sys.exit("DiLoCo(%r) was accepted" % kw)


def main():
    pt.init()
    rank, n = pt.rank(), pt.world_size()
    model = make_model(rank)
    opt = torch.optim.SGD(model.parameters(), lr=INNER_LR)
    bad_arguments(model, opt)
    if DISAGREE:
        diloco = pt.DiLoCo(model, opt, sync_every=H, codec=CODEC,
                           fragments=2 if rank == 1 else 1)
        try:
            for t in range(1, STEPS + 1):
                inner_step(model, opt, shard(rank), t)
                diloco.step()
            diloco.finish()
        except Exception as e:  # psagg.Error
            if "disagree" in str(e) and "fragment" in str(e) and "step" in str(e):
                print("DILOCO disagreement caught rank=%d: %s" % (rank, e), flush=True)
                return
            sys.exit("rank %d: an error, but not the disagreement: %s" % (rank, e))
        sys.exit("rank %d: workers that disagree on the fragments were not refused" % rank)
    diloco = pt.DiLoCo(model, opt, sync_every=H, outer_lr=OUTER_LR, outer_momentum=MOM,
                       nesterov=True, codec=CODEC, fragments=P, fragment_sync_delay=TAU,
                       fragment_update_alpha=ALPHA, named_parameters=model.named_parameters(),
                       error_feedback_beta=EF_BETA)
    if MIX:
        weighted, refused, switched = rank % 2 == 0, None, False
        try:
            for t in range(1, STEPS + 1):
                inner_step(model, opt, shard(rank), t)
                if t == H + 1:
                    try:
                        diloco.step(samples=None if weighted else 32.0)
                        switched = True  # taken: go on with it, as the worker did
                        continue
                    except ValueError as e:
                        refused = e
                    if "samples" not in str(refused) or diloco.step_count != H:
                        sys.exit("rank %d: step %d: not the samples' error, or the step "
                                 "count moved (%d): %s" % (rank, t, diloco.step_count, refused))
                diloco.step(samples=32.0 if weighted != switched else None)
            diloco.finish()
        except Exception as e:  # psagg.Error: weight 0 pushed at step 2H (EINVAL)
            sys.exit("rank %d: %s at step %d: %s" % (rank, type(e).__name__,
                                                     diloco.step_count, e))
        if switched:
            sys.exit("rank %d: step(%s) after %d steps %s samples was accepted" % (
                rank, "" if weighted else "samples=32", H, "with" if weighted else "without"))
        print("DILOCO mix refused rank=%d: %s" % (rank, refused), flush=True)
        return
    if DIE:
        t0 = time.monotonic()
        try:
            for t in range(1, STEPS + 1):
                inner_step(model, opt, shard(rank), t)
                if t == DIE and rank == 2:
                    os.kill(os.getpid(), signal.SIGKILL)
                t0 = time.monotonic()
                diloco.step()
            diloco.finish()
        except Exception as e:  # psagg.Error
            took = time.monotonic() - t0
            if "worker 2" in str(e) and took < 10.0:
                print("DILOCO peer death caught rank=%d after %.2f s: %s" % (rank, took, e),
                      flush=True)
                return
            sys.exit("rank %d: after %.2f s, an error that does not name worker 2: %s"
                     % (rank, took, e))
        sys.exit("rank %d: worker 2 died and the job went on" % rank)
    weights = [32.0 * (r + 1) * H for r in range(n)] if WEIGHTED else [1.0] * n

    # the reference job: N workers from rank 0's weights, the global weights, the outer SGD
    ref_global = make_model(0)
    workers = [make_model(0) for _ in range(n)]
    ref_opts = [torch.optim.SGD(w.parameters(), lr=INNER_LR) for w in workers]
    outer = torch.optim.SGD(ref_global.parameters(), lr=OUTER_LR, momentum=MOM, nesterov=True)
    gparams = list(ref_global.parameters())
    frag = fragments_of(gparams, P)
    data = [shard(r) for r in range(n)]
    pending = []  # (apply at, fragment)
    first = last = None
    for t in range(1, STEPS + 1):
        loss = inner_step(model, opt, data[rank], t)
        before = [p.detach().clone() for p in model.parameters()]
        diloco.step(samples=32.0 * (rank + 1) if WEIGHTED else None)
        applied = any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
        first = loss if first is None else first
        last = loss
        for r in range(n):
            inner_step(workers[r], ref_opts[r], data[r], t)
        for f in range(P):
            off = f * H // P
            if (t - off) % H == 0:  # (t >= 1)
                with torch.no_grad():
                    for i, g in enumerate(gparams):
                        if frag[i] != f:
                            g.grad = None
                            continue
                        acc = torch.zeros_like(g)
                        wsum = torch.zeros((), dtype=torch.float32)
                        for r in range(n):
                            d = g - list(workers[r].parameters())[i]
                            acc += d * weights[r] if WEIGHTED else d
                            wsum += weights[r]
                        g.grad = acc * (1.0 / wsum)
                outer.step()
                pending.append((t + TAU, f))
        due = [x for x in pending if x[0] <= t]
        for at, f in due:
            with torch.no_grad():
                for r in range(n):
                    for i, (p, g) in enumerate(zip(workers[r].parameters(), gparams)):
                        if frag[i] == f:
                            if ALPHA == 0.0:
                                p.copy_(g)
                            else:
                                p.mul_(ALPHA).add_(g, alpha=1.0 - ALPHA)
        pending = [x for x in pending if x[0] > t]
        if applied != bool(due):  # DiLoCo.step() moved the weights: it applied a sync
            sys.exit("rank %d: DiLoCo applied %s sync at step %d; the schedule (fragment p at "
                     "the steps t >= 1 with (t - p*H/P) mod H == 0, applied fragment_sync_delay "
                     "later) %s" % (rank, "a" if applied else "no", t,
                                    "applies %s" % [f for _, f in due] if due else
                                    "applies none"))
        if due:  # a sync was applied and none is in flight (delay < H / fragments)
            h = hashlib.sha256()
            for a in diloco.global_weights().values():
                h.update(a.numpy().tobytes())
            print("DILOCO-DIGEST step=%d %s" % (t, h.hexdigest()[:16]), flush=True)
    diloco.finish()
    with torch.no_grad():  # the reference's finish(): the syncs still in flight
        for _, f in pending:
            for r in range(n):
                for i, (p, g) in enumerate(zip(workers[r].parameters(), gparams)):
                    if frag[i] == f:
                        p.mul_(ALPHA).add_(g, alpha=1.0 - ALPHA)

    worst = 0.0
    if CODEC == "fp32":
        for (name, a), g in zip(diloco.global_weights().items(), gparams):
            rel = ((a - g.detach()).abs().max() / g.detach().abs().max().clamp(min=1e-6)).item()
            worst = max(worst, rel)
            if rel > 1e-4:
                sys.exit("rank %d: anchor %s differs from the reference's global weights by "
                         "%.3g (relative)" % (rank, name, rel))
        for (name, p), q in zip(model.named_parameters(), workers[rank].parameters()):
            rel = ((p - q).abs().max() / q.abs().max().clamp(min=1e-6)).item()
            if rel > 1e-4:
                sys.exit("rank %d: weights %s differ from the reference's worker %d by %.3g"
                         % (rank, name, rank, rel))
    if not last < first:
        sys.exit("rank %d: the loss did not fall (%.4f -> %.4f)" % (rank, first, last))
    print("DILOCO ok rank=%d codec=%s H=%d fragments=%d delay=%d alpha=%g loss %.4f -> %.4f "
          "max_rel_diff=%.2g" % (rank, CODEC, H, P, TAU, ALPHA, first, last, worst), flush=True)
    pt.shutdown()


if __name__ == "__main__":
    main()
