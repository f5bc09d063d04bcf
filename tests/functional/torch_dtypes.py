#!/usr/bin/python3
"""torch_dtypes.py - psagg.torch's per-parameter codecs and gradient dtypes, 2+ workers.

Run under deploy/psagg-local (config: [codec] default = maxmin4, min_compress_elems = 256):
- codec choice: a dict gives 'exact.weight' fp32 (its average must be exact) and leaves
  'lossy.weight' to the default maxmin4 (close to the average, but not exact);
- fp16 and bf16 gradients go through an fp32 copy: values exact in both formats come back
  exact, in their own dtype; float64 is refused with a message that says what to do;
- broadcast_parameters copies rank 0's fp32, fp16 and bf16 tensors exactly (non-contiguous
  ones too: channels_last, a transpose) and leaves
  integer tensors alone;
- worker metrics: Handle.timing after the wait, and psagg.torch.stats() moving by exactly the
  handles' timings and bytes;
- codecs: Handle.codec says what each push_pull went in, psagg.torch.assignment() the same
  (no [codec] adaptive: the declared codecs, generation 0);
- psagg.Context.broadcast (psagg_broadcast) on the session's broadcast key: root's bytes, 0
  bytes to several rounds of the key, from every rank, exact everywhere (the others' data is
  ignored); a compressed key is refused by name, on every rank alike.
- DistributedOptimizer: the wrapped optimizer's defaults kept, synchronize() then step()
  pushes once, add_param_group and a parameter unfrozen after it was built refused by name.
Every rank prints "DTYPES ok"; any failure raises (exit 1).
"""
import os

import torch

import psagg
import psagg.torch as pt

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


class Two(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.exact = torch.nn.Linear(64, 64, bias=False)
        self.lossy = torch.nn.Linear(64, 64, bias=False)
        self.empty = torch.nn.Parameter(torch.zeros(0))  # (no elements: left out, as DDP may)


model = Two()
sess = pt.init()
sess.declare(model.named_parameters(), codec={"exact.weight": "fp32"})
# every rank's gradient: rank-dependent, the same shape
g = torch.linspace(-1, 1, 4096).reshape(64, 64)
mine = g * (rank + 1)
want = g * (world + 1) / 2  # the average of g * 1 .. g * world
before = pt.stats()
timings = []
assert id(model.empty) not in sess.keys, "a parameter of no elements was declared"
for name, p in model.named_parameters():
    if p.numel() == 0:
        continue
    t = mine.clone()
    op = pt._Op(sess, sess.key_of(p), t, psagg.AVERAGE, 0)
    assert op.handle.timing is None, "a timing before the wait"
    op.finish()
    timings.append(op.handle.timing)
    assert op.handle.codec == ("fp32" if name == "exact.weight" else "maxmin4/1024/sr"), \
        (name, op.handle.codec)
    assert op.handle.generation == 0, op.handle.generation
    err = (t - want).abs().max().item()
    if name == "exact.weight":
        assert torch.equal(t, want) or err <= 1e-6 * want.abs().max().item(), (name, err)
    else:
        assert 0 < err < 0.2, (name, "maxmin4 error %g out of its expected range" % err)

# worker metrics: each handle's timing, and the context's sums moved by exactly those
after = pt.stats()
assert after["push_pulls"] - before["push_pulls"] == 2, (before, after)
assert after["bytes_raw"] - before["bytes_raw"] == 2 * 4096 * 4, (before, after)
assert 0 < after["bytes_sent"] - before["bytes_sent"] < 2 * 4096 * 4 + 1024, (before, after)
for f in ("queued_ns", "encode_ns", "send_ns", "wait_ns", "decode_ns", "total_ns"):
    moved = after["time"][f] - before["time"][f]
    assert moved == sum(tm[f] for tm in timings), (f, moved, timings)
for tm in timings:
    phases = tm["queued_ns"] + tm["encode_ns"] + tm["send_ns"] + tm["wait_ns"]
    assert 0 < phases <= tm["total_ns"] <= phases + tm["decode_ns"], tm

# the assignment: the declared codecs (no [codec] adaptive), and their bytes per push
got = {a["name"]: a for a in pt.assignment()}
assert got["exact.weight[64,64]"]["codec"] == "fp32" and \
    got["exact.weight[64,64]"]["bytes"] == 4096 * 4, got
assert got["lossy.weight[64,64]"]["codec"] == "maxmin4/1024/sr" and \
    got["lossy.weight[64,64]"]["bytes"] == 4 * 8 + 4096 // 2, got
assert all(a["generation"] == 0 for a in got.values()), got

# dtypes: values exact in fp16 and bf16 (small integers / 8) average to exact values
for dt in (torch.float16, torch.bfloat16):
    t = (torch.arange(4096, dtype=torch.float32).reshape(64, 64) % 16 / 8 * (rank + 1)).to(dt)
    ref = (torch.arange(4096, dtype=torch.float32).reshape(64, 64) % 16 / 8 * (world + 1) / 2)
    pt._Op(sess, sess.key_of(model.exact.weight), t, psagg.AVERAGE, 0).finish()
    assert t.dtype == dt, t.dtype
    assert torch.equal(t.float(), ref.to(dt).float()), (dt, (t.float() - ref).abs().max())
try:  # a tensor of another size than the key's is refused before anything is sent
    pt._Op(sess, sess.key_of(model.exact.weight), torch.zeros(65, 64), psagg.AVERAGE, 0)
    raise AssertionError("a tensor of the wrong size was accepted")
except ValueError as e:
    assert "4160" in str(e) and "4096" in str(e), str(e)
try:
    pt._Op(sess, sess.key_of(model.exact.weight), torch.zeros(64, 64, dtype=torch.float64),
           psagg.AVERAGE, 0)
    raise AssertionError("float64 was accepted")
except TypeError as e:
    assert "float64" in str(e) and "convert" in str(e), str(e)

# broadcast: rank 0's values everywhere, exactly; integers untouched
torch.manual_seed(100 + rank)
a = torch.randn(3000)
b = torch.randn(70).half()
c = torch.randn(5, 7).bfloat16()
n = torch.tensor([rank])
torch.manual_seed(100)
a0, b0, c0 = torch.randn(3000), torch.randn(70).half(), torch.randn(5, 7).bfloat16()
pt.broadcast_parameters([a, b, ("c", c), n], root=0)
assert torch.equal(a, a0) and torch.equal(b, b0) and torch.equal(c, c0), "broadcast differs"
assert n.item() == rank, "an integer tensor was changed"
# non-contiguous tensors (channels_last, a transpose): written in place, strides kept
torch.manual_seed(200 + rank)
d = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
e = torch.randn(6, 9).t()
torch.manual_seed(200)
d0, e0 = torch.randn(2, 3, 4, 5), torch.randn(6, 9).t()
pt.broadcast_parameters([d, e], root=0)
assert torch.equal(d, d0) and torch.equal(e, e0), "a non-contiguous broadcast differs"
assert d.is_contiguous(memory_format=torch.channels_last) and not e.is_contiguous(), "strides"
# bytes: root's on every rank, through psagg_broadcast (the hand-over's call)
rounds = 3 * sess.bcast_elems  # about one round of the key, in bytes
for i, size in enumerate((0, 1, 3, 5000, rounds - 1, 2 * rounds + 7)):
    root = i % world
    data = torch.randint(0, 256, (size,), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(i)).numpy().tobytes()
    got = sess.ctx.broadcast(sess.bcast_key, data if rank == root else b"junk", root)
    assert got == data, "broadcast %d (%d bytes from %d) differs" % (i, size, root)
try:
    sess.ctx.broadcast(sess.key_of(model.lossy.weight), b"x", 0)
    raise AssertionError("a compressed key was accepted")
except psagg.Error as e:
    assert e.name == "PSAGG_EINVAL" and "fp32" in e.detail, str(e)

# DistributedOptimizer: the wrapped optimizer's defaults kept; synchronize(), clip, step()
# pushes each gradient once (Horovod's clipping pattern); add_param_group and a parameter
# unfrozen after the optimizer was built are refused by name
frozen = torch.nn.Parameter(torch.zeros(4), requires_grad=False)
opt = pt.DistributedOptimizer(
    torch.optim.SGD([{"params": list(model.parameters())}, {"params": [frozen]}], lr=0.25,
                    momentum=0.5), list(model.named_parameters()) + [("frozen", frozen)])
assert opt.defaults["lr"] == 0.25 and opt.defaults["momentum"] == 0.5, opt.defaults
x = torch.randn(8, 64, generator=torch.Generator().manual_seed(rank))
before = pt.stats()
opt.zero_grad()
(model.exact(x).sum() + model.lossy(x).sum() + model.empty.sum()).backward()
opt.synchronize()
torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
clipped = model.exact.weight.grad.clone()
w0 = model.exact.weight.detach().clone()
opt.step()
moved = pt.stats()["push_pulls"] - before["push_pulls"]
assert moved == 2, "synchronize(), then step(): %d push_pulls of 2 parameters" % moved
assert torch.equal(model.exact.weight.detach(), w0 - 0.25 * clipped), "step() did not apply " \
    "the synchronized, clipped gradient"
try:
    opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})
    raise AssertionError("add_param_group was accepted")
except ValueError as e:
    assert "add_param_group" in str(e), str(e)
frozen.requires_grad_(True)
opt.zero_grad()
(model.exact(x).sum() + (2 * frozen).sum()).backward()
try:
    opt.step()
    raise AssertionError("a parameter unfrozen after the optimizer was built was accepted")
except RuntimeError as e:
    assert "param group 1" in str(e) and "unfrozen" in str(e), str(e)
print("DTYPES ok rank=%d" % rank, flush=True)
