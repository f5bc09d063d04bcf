"""psagg.torch.DiLoCo: DiLoCo and Streaming DiLoCo with the outer optimizer on the psagg
servers; diloco_fragments (the split into fragments) and diloco_ddp_hook (DDP that
communicates nothing)."""

import time

import torch

import psagg as _p

from ._session import session
from ._util import _FLOATS, _check_codec, _check_error_feedback, _is_int, _is_real


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

    Sparse outer gradients (SparseLoCo, arXiv 2508.15706): codec="topk2:0.02" sends each block's
    2 % largest entries in 2 bits; error_feedback_beta=0.95 decays the residual of what was left
    out before each push (e <- beta * e + delta; None: the config's [codec]
    error_feedback_beta, 1 by default); SparseLoCo runs the outer step without momentum
    (outer_momentum=0, with the servers' momentum = 0).

    The servers must run `[server] optimizer = sgd` with `momentum` = outer_momentum and
    `nesterov` = on|off as nesterov (the papers' 0.9 and on; None: on with momentum, off at
    outer_momentum=0), which the constructor checks (ValueError naming both); outer_lr goes
    with every push.

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
                 nesterov=None, codec="maxmin4", error_feedback=None, fragments=1,
                 fragment_sync_delay=0, fragment_update_alpha=0.0, named_parameters=None,
                 error_feedback_beta=None):
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
        if nesterov is None:  # (Nesterov's step needs momentum: off without it)
            nesterov = outer_momentum > 0
        if not isinstance(nesterov, bool):
            raise ValueError("psagg.torch.DiLoCo: nesterov must be True, False or None, not %r"
                             % (nesterov,))
        if nesterov and outer_momentum == 0:
            raise ValueError("psagg.torch.DiLoCo: nesterov=True needs outer_momentum > 0 "
                             "(leave nesterov=None: on with momentum, off without)")
        _check_codec("DiLoCo", codec)
        _check_error_feedback("DiLoCo", error_feedback)
        _p._check_error_feedback_beta("psagg.torch.DiLoCo", error_feedback_beta)
        named = list(named_parameters if named_parameters is not None
                     else model.named_parameters())
        named = [(n, p) for n, p in named if p.requires_grad and p.numel() > 0]
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
                            error_feedback, params=True, all_tensors=True,
                            error_feedback_beta=error_feedback_beta)
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
        self._psagg.joiner_fresh = False  # (a joiner's steps began: broadcast_parameters)
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
        checkpoint_dir); one worker is enough (with [server] quorum: every worker, at the
        same step, as ServerOptimizer.checkpoint says). Call it right after the step() that applied a
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
