"""torch_server_optim.py - psagg.torch.ServerOptimizer against torch.optim, run under
deploy/psagg-local by test_torch.sh (case server_optim) with [server] optimizer set and fp32
transport ([codec] default = fp32).

Every rank builds a small MLP from a seed of its own (ServerOptimizer must hand all of them
rank 0's weights), trains it on its shard of one batch, and keeps a reference: the same model
from rank 0's seed, whose gradient is every shard's gradient summed in rank order and scaled
by 1/N in fp32 (what the servers compute), stepped by torch.optim's own optimizer of the same
kind and settings (TORCH_OPT: sgd | adam | adamw, two param groups with their own weight
decay, a learning-rate schedule). After every step the parameters must equal the
reference's within fp32 rounding (torch's kernels fuse some operations the servers do not).
With DDP=1 the gradients go through DDP and psagg's hook (register_ddp_hook(optimizer=...)).
Prints "SERVER-OPTIM ok rank=R max_rel_diff=..." on success.
"""

import os
import sys

import torch

import psagg.torch as pt

OPT = os.environ["TORCH_OPT"]
DDP = os.environ.get("DDP") == "1"
STEPS = 8


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 5))


def groups(model):
    named = list(model.named_parameters())
    return ([p for n, p in named if n.endswith("weight")],
            [p for n, p in named if n.endswith("bias")])


def param_groups(model):
    w, b = groups(model)
    return [{"params": w, "weight_decay": 0.01}, {"params": b, "weight_decay": 0.0}]


LR = 0.05 if OPT == "sgd" else 0.01


def torch_optimizer(model):
    pg = param_groups(model)
    if OPT == "sgd":
        return torch.optim.SGD(pg, lr=LR, momentum=0.9, nesterov=True)
    if OPT == "adam":
        return torch.optim.Adam(pg, lr=LR, betas=(0.9, 0.999), eps=1e-8)
    return torch.optim.AdamW(pg, lr=LR, betas=(0.9, 0.999), eps=1e-8)


def main():
    pt.init()
    rank, world = pt.rank(), pt.world_size()
    model = make_model(1000 + rank)
    ref = make_model(1000)
    w_names = [n for n, _ in model.named_parameters() if n.endswith("weight")]
    opt = pt.ServerOptimizer(param_groups(model), lr=LR,
                             named_parameters=model.named_parameters())
    assert opt.start_step == 0, opt.start_step
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        if not torch.equal(p, q):
            raise SystemExit("FAIL: %s is not rank 0's initial weights after ServerOptimizer" % n)
    ref_opt = torch_optimizer(ref)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=3, gamma=0.5)

    net = model
    if DDP:
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=world)
        net = torch.nn.parallel.DistributedDataParallel(model)
        pt.register_ddp_hook(net, optimizer=opt)

    g = torch.Generator().manual_seed(7)
    x = torch.randn(16 * world, 20, generator=g)
    y = torch.randn(16 * world, 5, generator=g)
    worst = 0.0
    for step in range(STEPS):
        xs, ys = x[rank::world], y[rank::world]
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(xs), ys)
        loss.backward()
        opt.step()
        sched.step()
        # the reference: shard gradients summed in rank order, times 1/N, then torch's step
        total = None
        for r in range(world):
            ref.zero_grad()
            torch.nn.functional.mse_loss(ref(x[r::world]), y[r::world]).backward()
            gr = [p.grad.clone() for p in ref.parameters()]
            total = gr if total is None else [a + c for a, c in zip(total, gr)]
        for p, t in zip(ref.parameters(), total):
            p.grad = t * (1.0 / world)
        ref_opt.step()
        ref_sched.step()
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            d = ((p - q).abs().max() / q.abs().max().clamp_min(1e-12)).item()
            worst = max(worst, d)
            if not torch.allclose(p, q, rtol=1e-5, atol=1e-6):
                raise SystemExit("FAIL: step %d: %s differs from torch.optim.%s by %.3g (rel)"
                                 % (step, n, type(ref_opt).__name__, d))
    # what the optimizer keeps on this worker: torch's state against ServerOptimizer's (none)
    def state_bytes(o):
        return sum(t.numel() * t.element_size() for st in o.state.values() for t in st.values()
                   if torch.is_tensor(t) and t.dim() > 0)
    n_params = sum(p.numel() for p in model.parameters())
    if state_bytes(opt) != 0:
        raise SystemExit("FAIL: ServerOptimizer keeps %d bytes of state" % state_bytes(opt))
    master = opt.pull_weights()
    drift = max((master[n] - p).abs().max().item() for n, p in model.named_parameters())
    if DDP:
        import torch.distributed as dist
        dist.destroy_process_group()
    print("SERVER-OPTIM ok rank=%d opt=%s ddp=%d steps=%d max_rel_diff=%.3g drift=%.3g "
          "worker_state_bytes_per_param torch=%.1f psagg=0 weights_with_decay=%s"
          % (rank, OPT, DDP, STEPS, worst, drift, state_bytes(ref_opt) / n_params,
             ",".join(w_names)))
    sys.stdout.flush()
    pt.shutdown()


if __name__ == "__main__":
    main()
