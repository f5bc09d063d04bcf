"""torch_resume.py - a PyTorch job with the optimizer on the servers, checkpointed and resumed
(test_torch.sh, case server_optim). PHASE (environment):
  full    train STEPS steps; print the final weights' hash
  first   train, worker 0 asks for a checkpoint (ServerOptimizer.checkpoint) after CKPT_AT
          steps, go on two more steps and stop (what came after the checkpoint is lost)
  resume  the servers resumed from the checkpoint ([server] resume = on): ServerOptimizer must
          report start_step == CKPT_AT and hand out the checkpoint's weights; train the rest
The servers run Adam; gradients and weight deltas are maxmin4 without worker error feedback
(a worker's own residuals are not in the servers' checkpoint), so the resumed job must end
with the full run's weights bit for bit ("RESUME-HASH"). The learning rate follows a
LambdaLR schedule, fast-forwarded to start_step on resume.
"""

import hashlib
import os

import torch

import psagg.torch as pt

PHASE = os.environ["PHASE"]
STEPS, CKPT_AT = 8, 4


def main():
    pt.init()
    rank = pt.rank()
    torch.manual_seed(500 + rank)  # every rank its own; the servers hand out worker 0's
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = pt.ServerOptimizer(model.parameters(), lr=0.01,
                             named_parameters=model.named_parameters(), codec="maxmin4",
                             error_feedback=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.8 ** s)
    start = opt.start_step
    want = CKPT_AT if PHASE == "resume" else 0
    if start != want:
        raise SystemExit("FAIL: start_step %d, expected %d" % (start, want))
    for _ in range(start):
        sched.step()
    for step in range(start, STEPS):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(32, 16, generator=g)
        y = torch.randn(32, 4, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        sched.step()
        if PHASE == "first" and step + 1 == CKPT_AT and rank == 0:
            opt.checkpoint()
            print("CHECKPOINT after %d steps" % CKPT_AT, flush=True)
        if PHASE == "first" and step + 1 == CKPT_AT + 2:
            print("STOPPED rank=%d" % rank, flush=True)
            pt.shutdown()
            return
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    print("RESUME-HASH phase=%s rank=%d start=%d sha256=%s" % (PHASE, rank, start, h.hexdigest()),
          flush=True)
    pt.shutdown()


if __name__ == "__main__":
    main()
