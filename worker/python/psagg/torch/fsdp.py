"""psagg.torch with FSDP2 (torch.distributed.fsdp.fully_shard): psagg as the replica all-reduce
of hybrid sharding (register_fsdp_hook).

FSDP2 shards a model over the ranks of its mesh and reduce-scatters each FSDP module's
gradients among them; its FSDPModule.set_all_reduce_hook (torch >= 2.7, public) lets a hook
take the reduce-scatter output, this rank's shard of the module's gradients, before the
optimizer sees it. Hybrid sharding (HSDP) all-reduces that shard across the replicas of the
model; register_fsdp_hook makes psagg that all-reduce: every FSDP module's shard is averaged
through the psagg servers, compressed with the module's codec, in place.

The psagg job's workers are the replicas of one shard: every worker of a psagg job pushes the
same tensors, so the ranks that hold shard s of the model (the same position in their shard
groups) form one job. With shard groups of one rank (fully_shard over a mesh of size 1: each
replica holds the whole model, FSDP's memory savings aside) that is one job of all the ranks,
as with DDP; with shard groups of S ranks it is S jobs (S configs, each with its servers and
[cluster] workers = the number of replicas; PSAGG_RANK the replica's index).

The hook waits for psagg's result (GIL released): FSDP uses the shard right after the hook
returns, so one module's exchange does not overlap the next module's backward as DDP's does.

torch 1.13 to 2.5 have no public FSDP2 hook: register_fsdp_hook refuses there, naming the
version (psagg.torch never uses a private torch name)."""

import importlib

import torch

import psagg as _p

from . import _session
from ._session import _Op
from ._util import _check_codec, _check_error_feedback


def _fsdp_module_class():
    """FSDP2's FSDPModule when this torch has it publicly with set_all_reduce_hook, else None."""
    try:
        mod = importlib.import_module("torch.distributed.fsdp")
    except Exception:  # noqa: BLE001 (torch 1.13 under Python 3.11 fails to import it at all)
        return None
    cls = getattr(mod, "FSDPModule", None)
    return cls if cls is not None and hasattr(cls, "set_all_reduce_hook") else None


def _shard_numel(module, fsdp_cls):
    """The elements of module's reduce-scatter output: the parameters it manages (its own, not
    those of an FSDP module below it), each sharded on dim 0 over its mesh, dim 0 padded to a
    multiple of the mesh size (FSDP2's default placement)."""
    below = set()
    for m in module.modules():
        if m is not module and isinstance(m, fsdp_cls):
            below.update(id(p) for p in m.parameters())
    total = 0
    for p in module.parameters():
        if id(p) in below or not p.requires_grad:
            continue
        mesh = getattr(p, "device_mesh", None)  # a DTensor: FSDP2's sharded parameter
        if mesh is None:
            raise TypeError("psagg.torch.register_fsdp_hook: a parameter of shape %s is not "
                            "sharded (no device_mesh): call fully_shard before the hook"
                            % (tuple(p.shape),))
        if mesh.ndim != 1:  # (a 2-D mesh is FSDP's own HSDP: it all-reduces the replicas itself)
            raise TypeError("psagg.torch.register_fsdp_hook: a parameter of shape %s is sharded "
                            "over a %d-D mesh: shard over the shard groups only (fully_shard(..., "
                            "mesh=mesh['shard'])): psagg is the replica all-reduce"
                            % (tuple(p.shape), mesh.ndim))
        ws = mesh.size()
        shape = tuple(p.shape)  # the global shape
        rows = -(-shape[0] // ws) * ws if shape else 1
        rest = 1
        for d in shape[1:]:
            rest *= d
        total += rows * rest // ws
    return total


def register_fsdp_hook(model, codec=None, error_feedback=None, config=None):
    """Declare one psagg tensor per FSDP module of model (fully_shard applied to it and its
    submodules already) and set psagg as each one's all-reduce hook: its reduce-scatter output
    is averaged across the job's workers (the replicas of this rank's shard). Returns the
    session.

    codec: as register_ddp_hook's (a text, None for the config's, a dict keyed by the FSDP
    modules' names in model.named_modules(), "" for the root, or a callable (name, tensor)).
    Every parameter of an FSDP module must get a gradient in each backward that reaches it, and
    be sharded on dim 0 (FSDP's default) over a 1-D mesh: else the module's shard is not what
    psagg declared, and its backward fails naming both sizes (that rank then pushes nothing, and
    the others' push of the module fails after op_timeout_ms)."""
    _check_codec("register_fsdp_hook", codec)
    _check_error_feedback("register_fsdp_hook", error_feedback)
    fsdp_cls = _fsdp_module_class()
    if fsdp_cls is None:
        raise RuntimeError("psagg.torch.register_fsdp_hook: torch %s has no public FSDP2 "
                           "all-reduce hook (torch.distributed.fsdp.FSDPModule."
                           "set_all_reduce_hook, torch >= 2.7): use register_ddp_hook, "
                           "DistributedOptimizer or DiLoCo" % torch.__version__)
    if not isinstance(model, torch.nn.Module):
        raise TypeError("psagg.torch.register_fsdp_hook: model must be a torch.nn.Module "
                        "after fully_shard, not %s" % type(model).__name__)
    modules = [(name, m) for name, m in model.named_modules() if isinstance(m, fsdp_cls)]
    if not modules:
        raise TypeError("psagg.torch.register_fsdp_hook: no FSDP module in model: call "
                        "torch.distributed.fsdp.fully_shard on it (and its layers) first")
    # one flat stand-in per module, named after it: what the declaration needs to know
    shards = []
    for name, m in modules:
        n = _shard_numel(m, fsdp_cls)
        if n:
            shards.append(("fsdp." + (name or "root"), torch.empty(n, device="meta"), m))
    sess = _session.init(config)
    if sess.ctx.membership()["elastic"]:
        raise ValueError("psagg.torch.register_fsdp_hook: the job is elastic ([cluster] elastic "
                         "= on), and FSDP's shard groups cannot go on without a rank that died")
    named = [(name, t) for name, t, _ in shards]
    sess.declare(named, codec if not isinstance(codec, dict) else
                 {"fsdp." + (k or "root"): v for k, v in codec.items()}, error_feedback,
                 all_tensors=True)
    for name, t, m in shards:
        m.set_all_reduce_hook(_make_hook(sess, t, name))
    return sess


def _make_hook(sess, stand_in, name):
    key, numel = sess.key_of(stand_in), stand_in.numel()  # (the hook keeps the stand-in: its
    # id stays its key's)

    def hook(output):
        _ = stand_in
        if output.numel() != numel:
            raise RuntimeError("psagg.torch: FSDP module %s handed the all-reduce hook %d "
                               "elements; psagg declared %d (its parameters sharded on dim 0)"
                               % (name[5:], output.numel(), numel))
        # on the stream FSDP runs the hook in (its all-reduce stream: after the reduce-scatter)
        _Op(sess, key, output, _p.AVERAGE, 0).finish()
    return hook
