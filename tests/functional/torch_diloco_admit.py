"""torch_diloco_admit.py - a worker joins a resumed Streaming DiLoCo job (test_torch.sh, case
diloco_admit): the members keep their local progress across the admission, the joiner starts
from the global weights at the members' step.

The job: [cluster] elastic = on, workers = 2, max_workers = 3; DiLoCo with 2 fragments, H = 8
(fragment 1 syncs at the steps 4, 12, 20, ..., fragment 0 at 8, 16, ...), maxmin4 outer
gradients; [server] optimizer = sgd, momentum 0.9, nesterov on. PHASE (environment):
  first   ranks 0 and 1 train CKPT_AT = 12 inner steps; rank 0 asks for a checkpoint right
          after fragment 1's sync at step 12; both stop
  resume  the servers resumed ([server] resume = on). Ranks 0 and 1 (the members) must report
          start_step 12 and train on, a step every 50 ms, until the membership says 3 workers;
          the step() where that happened holds the barrier that admitted rank 2. For every
          tensor of the fragment that did not sync at that step, the member's own weights must
          be what they were before the step plus the change of its anchor in that step
          (p + new anchor - old anchor: unchanged when the anchor is, never overwritten by the
          global weights, which would throw away the inner steps since that fragment's last
          sync). Prints "ADMIT member rank=R step=S anchors=<hash> progress=... moved=..."
          (progress: the largest local change kept, moved: the largest anchor change of those
          tensors).
          Rank 2 (started by hand, the joiner): its weights must equal its anchors (the global
          weights); prints "ADMIT joiner step=S anchors=<hash>" with S its start_step. Every
          worker then trains to S + 2H (the members' admission step S + 2H: the two agree when
          the joiner's start_step is the members' step, else the servers' step tags differ and
          the job fails) and prints "ADMIT end rank=R anchors=<hash>" after finish().
The harness checks that the members' and the joiner's S and admission anchors agree, and the
three final anchors.
"""

import hashlib
import os
import sys
import time

import torch

import psagg.torch as pt

PHASE = os.environ["PHASE"]
H, P, CKPT_AT = 8, 2, 12


def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def inner_step(model, opt, rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(32, 16, generator=g)
    y = torch.randn(32, 4, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def train_step(model, opt, diloco, rank, step):
    inner_step(model, opt, rank, step)
    diloco.step()


def main():
    pt.init()
    rank = pt.rank()
    torch.manual_seed(700 + rank)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    diloco = pt.DiLoCo(model, opt, sync_every=H, fragments=P,
                       codec=os.environ.get("CODEC", "maxmin4"))
    anchors = list(diloco.global_weights().values())
    frag = pt.diloco_fragments([a.numel() for a in anchors], P)
    start = diloco.start_step

    if PHASE == "first":
        for step in range(start, CKPT_AT):
            train_step(model, opt, diloco, rank, step)
        if rank == 0:
            diloco.checkpoint()
            print("CHECKPOINT after %d steps" % CKPT_AT, flush=True)
        pt.shutdown()
        return

    if pt.membership()["joiner"]:
        for (name, p), a in zip(model.named_parameters(), anchors):
            if not torch.equal(p.detach(), a):
                sys.exit("FAIL: joiner: its weights %s are not the global weights" % name)
        print("ADMIT joiner step=%d anchors=%s" % (start, digest(anchors)), flush=True)
        end = start + 2 * H
    else:
        if start != CKPT_AT:
            sys.exit("FAIL: rank %d resumed at start_step %d, expected %d (right after "
                     "fragment 1's sync)" % (rank, start, CKPT_AT))
        step, end = start, None
        while end is None:
            if step - start > 2000:
                sys.exit("FAIL: rank %d: the joiner was not admitted within 2000 steps" % rank)
            inner_step(model, opt, rank, step)
            before = [p.detach().clone() for p in model.parameters()]
            old = [a.clone() for a in anchors]
            diloco.step()
            step += 1
            if pt.membership()["size"] < 3:
                time.sleep(0.05)
                continue
            # the barrier of this step() admitted the joiner: the fragments that did not sync
            # here keep this member's local progress, moved only by their anchors' change
            synced = [(step - f * H // P) % H == 0 for f in range(P)]
            if all(synced) or not any(synced):
                sys.exit("FAIL: rank %d: admitted at step %d, where fragments %s synced"
                         % (rank, step, synced))
            progress = moved = 0.0
            for i, ((name, p), a) in enumerate(zip(model.named_parameters(), anchors)):
                if synced[frag[i]]:
                    continue
                want = before[i] + (a - old[i])
                err = (p.detach() - want).abs().max().item()
                progress = max(progress, (before[i] - old[i]).abs().max().item())
                moved = max(moved, (a - old[i]).abs().max().item())
                if err > 1e-6 * max(1.0, want.abs().max().item()):
                    sys.exit("FAIL: rank %d: the admission at step %d changed %s (fragment %d, "
                             "not synced at this step) by %.3g beyond its anchor's change (%.3g); "
                             "its local progress since the fragment's last sync was %.3g"
                             % (rank, step, name, frag[i],
                                err, (a - old[i]).abs().max().item(),
                                (before[i] - old[i]).abs().max().item()))
            if not progress > 1e-4:
                sys.exit("FAIL: rank %d: no local progress to keep at step %d (%.3g)"
                         % (rank, step, progress))
            moved_any = max((a - o).abs().max().item() for a, o in zip(anchors, old))
            print("ADMIT member rank=%d step=%d anchors=%s progress=%.3g moved=%.3g "
                  "(all anchors: %.3g)" % (rank, step, digest(anchors), progress, moved,
                                           moved_any), flush=True)
            end = step + 2 * H
        start = step
    for step in range(start, end):
        train_step(model, opt, diloco, rank, step)
    diloco.finish()
    print("ADMIT end rank=%d anchors=%s" % (rank, digest(anchors)), flush=True)
    pt.shutdown()


if __name__ == "__main__":
    main()
