"""psagg.torch: psagg for PyTorch training loops.

With DDP (two lines; DDP still needs a process group for its start-up broadcast):

    model = DDP(model)
    psagg.torch.register_ddp_hook(model, codec="maxmin4")

With FSDP2 (torch >= 2.7), psagg as hybrid sharding's replica all-reduce:

    fully_shard(layer, mesh=shard_mesh) ...; fully_shard(model, mesh=shard_mesh)
    psagg.torch.register_fsdp_hook(model, codec="maxmin4")

Without DDP, Horovod style:

    psagg.torch.init()
    opt = psagg.torch.DistributedOptimizer(opt, model.named_parameters(), codec="maxmin4")
    psagg.torch.broadcast_parameters(model, root=0)

One psagg context per process (init(); the helpers call it). Every parameter that requires a
gradient is declared once, keyed by its name and shape, in named_parameters() order (every
worker must build the same model), plus one fp32 key that broadcast_parameters() uses. A
psagg context declares once: the first of register_ddp_hook() / DistributedOptimizer() /
broadcast_parameters() declares.

Codecs: codec=None takes the config's [codec] default (tensors under min_compress_elems go
fp32); a text ("maxmin4") does the same with that codec; a dict maps parameter names to codec
text (missing names: the default); a callable (name, parameter) -> codec text or None.

Gradients: fp32 tensors are aggregated in place; fp16 and bf16 through an fp32 copy; others
are refused. CUDA tensors use psagg_push_pull_cuda on the current stream (libpsagg built with
CUDA), CPU tensors psagg_push_pull. A failure (dead server, timeout) raises psagg.Error (a
RuntimeError) with psagg's message: from backward() through DDP, from step() here.

The package, one module per concern (this file re-exports their public names):
    _session.py          the process's context, its declaration, one tensor's push_pull (_Op),
                         init / session / shutdown, rank, world_size, stats, checkpoint, ...
    ddp.py               register_ddp_hook, ddp_comm_hook
    fsdp.py              register_fsdp_hook (FSDP2's replica all-reduce, torch >= 2.7)
    optimizer.py         DistributedOptimizer (the optimizer on the workers)
    server_optimizer.py  ServerOptimizer (the optimizer on the servers)
    diloco.py            DiLoCo, diloco_fragments, diloco_ddp_hook
    broadcast.py         broadcast_parameters
    elastic.py           membership, membership_changes, and DistributedOptimizer's hand-over of
                         its state to joiners (psagg_broadcast)
    _util.py             argument checks and helpers they share
"""

# (_Op, one tensor's push_pull, is private: tests and benchmarks start it by hand)
from ._session import (_Op, assignment, checkpoint, init, local_rank, rank, session, shutdown,
                       stats, world_size)
from .broadcast import broadcast_parameters
from .elastic import membership, membership_changes
from .server_optimizer import ServerOptimizer
from .ddp import ddp_comm_hook, register_ddp_hook
from .fsdp import register_fsdp_hook
from .optimizer import DistributedOptimizer
from .diloco import DiLoCo, diloco_ddp_hook, diloco_fragments

__all__ = ["init", "shutdown", "session", "stats", "assignment", "register_ddp_hook",
           "ddp_comm_hook", "register_fsdp_hook", "DistributedOptimizer", "ServerOptimizer", "DiLoCo",
           "diloco_ddp_hook", "broadcast_parameters", "rank", "world_size", "local_rank",
           "membership", "membership_changes",
           "checkpoint"]
