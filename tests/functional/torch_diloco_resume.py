"""torch_diloco_resume.py - a DiLoCo job checkpointed and resumed (test_torch.sh, case diloco).
PHASE (environment):
  full    train STEPS inner steps (an outer step every H); print the final weights' hash
  first   train; worker 0 asks for a checkpoint (DiLoCo.checkpoint) right after the outer step
          at CKPT_AT, go on 3 more inner steps and stop (what came after it is lost)
  resume  the servers resumed from the checkpoint ([server] resume = on): DiLoCo must report
          start_step == CKPT_AT and hand out the checkpoint's global weights; train the rest
The inner optimizer is plain SGD (no state of its own to save) and the outer gradients in CODEC
(default maxmin4; e.g. topk2:0.05/1024, sparse) without worker error feedback (a worker's residuals are not in the servers' checkpoint), so the
resumed job must end with the full run's weights bit for bit ("DILOCO-RESUME-HASH").

FRAGMENTS=P (default 1) runs Streaming DiLoCo and CKPT_AT (default 8) picks the checkpoint's
step, e.g. right after a fragment p > 0 synced. With P > 1 a fragment that has not synced since
the last outer step holds local progress that the servers' checkpoint lacks: every rank saves
its own weights (torch.save, into LOCAL_DIR) with the checkpoint and loads them after DiLoCo's
constructor on resume, as a training script must; the hash is then of the global weights (the
anchors: the same on every rank; a rank's own weights differ from the others' on the fragments
that did not sync last).
"""

import hashlib
import os

import torch

import psagg.torch as pt

PHASE = os.environ["PHASE"]
H, STEPS = 4, 16
CKPT_AT = int(os.environ.get("CKPT_AT", "8"))
P = int(os.environ.get("FRAGMENTS", "1"))
LOCAL_DIR = os.environ.get("LOCAL_DIR", "")
CODEC = os.environ.get("CODEC", "maxmin4")


def main():
    pt.init()
    rank = pt.rank()
    torch.manual_seed(700 + rank)  # every rank its own; the servers hand out worker 0's
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    diloco = pt.DiLoCo(model, opt, sync_every=H, codec=CODEC, error_feedback=False,
                       fragments=P)
    start = diloco.start_step
    mine = os.path.join(LOCAL_DIR, "rank%d.pt" % rank)
    if PHASE == "resume" and LOCAL_DIR:
        model.load_state_dict(torch.load(mine))  # this rank's weights at the checkpoint
    want = CKPT_AT if PHASE == "resume" else 0
    if start != want:
        raise SystemExit("FAIL: start_step %d, expected %d" % (start, want))
    for step in range(start, STEPS):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(32, 16, generator=g)
        y = torch.randn(32, 4, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        diloco.step()
        if PHASE == "first" and step + 1 == CKPT_AT:
            if rank == 0:
                diloco.checkpoint()
                print("CHECKPOINT after %d steps" % CKPT_AT, flush=True)
            if LOCAL_DIR:
                torch.save(model.state_dict(), mine)
        if PHASE == "first" and step + 1 == CKPT_AT + 3:
            print("STOPPED rank=%d" % rank, flush=True)
            pt.shutdown()
            return
    diloco.finish()
    h = hashlib.sha256()
    for p in (model.parameters() if P == 1 else diloco.global_weights().values()):
        h.update(p.detach().contiguous().numpy().tobytes())
    print("DILOCO-RESUME-HASH phase=%s rank=%d start=%d sha256=%s" % (PHASE, rank, start,
                                                                      h.hexdigest()), flush=True)
    pt.shutdown()


if __name__ == "__main__":
    main()
