"""check_torch_api.py PYTHON_DIR - the psagg Python package against the torch it runs with.

psagg.torch must work with every torch from 1.13 (Debian's) to the current 2.x, so it may use
only torch's public API that all of them have. This test, run with whatever torch the
interpreter has (CI: Debian's 1.13; tests/gpu/check-gpu.sh: the GPU host's 2.x), fails when a
name the package uses is missing or private:

1. every module of the package imports (psagg, psagg.launch, psagg.cli, psagg.timeline,
   psagg.torch and each of its modules);
2. every attribute chain rooted at `torch` in psagg.torch's code (torch.futures.Future,
   torch.optim.Optimizer, ...) resolves in this torch, and none has a private (_) part;
3. the methods psagg.torch calls on torch's objects that no chain names (DDP's
   register_comm_hook, GradBucket's buffer and parameters, Future's set_result, ...) exist;
4. every public entry point's argument checks run before anything needs a job: a bad argument
   is refused with its own exception and a message naming it (no servers here);
5. loading libpsagg leaves the process's signal handlers as they were (SIGINT still raises
   KeyboardInterrupt).

Exit 77 (skipped) when the interpreter has no torch.
"""
import ast
import importlib
import os
import pkgutil
import sys

try:
    import torch
except ImportError:
    print("check_torch_api: SKIP: %s has no torch" % sys.executable)
    sys.exit(77)

sys.path.insert(0, sys.argv[1])
for var in ("PSAGG_CONFIG", "PSAGG_RANK", "PSAGG_WORLD_SIZE", "RANK", "WORLD_SIZE"):
    os.environ.pop(var, None)  # (no job: an entry point that reaches init() fails)
import psagg  # noqa: E402
import psagg.torch as pt  # noqa: E402

problems = []


def problem(text):
    problems.append(text)
    print("FAIL: " + text)


# 1. every module imports
mods = ["psagg", "psagg.launch", "psagg.cli", "psagg.timeline", "psagg.torch"]
mods += ["psagg.torch." + m.name for m in pkgutil.iter_modules(pt.__path__)]
for name in mods:
    try:
        importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 (any failure to import is the finding)
        problem("import %s: %s: %s" % (name, type(e).__name__, e))
print("imported %d modules: %s" % (len(mods), " ".join(mods)))


# 2. torch.X.Y chains in psagg.torch's code
def chains(tree):
    """Every maximal attribute chain rooted at the name `torch`: ("futures", "Future")."""
    out = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        parts, n = [], node
        while isinstance(n, ast.Attribute):
            parts.append(n.attr)
            n = n.value
        if isinstance(n, ast.Name) and n.id == "torch":
            out.add(tuple(reversed(parts)))
    # keep the longest: torch.futures.Future covers torch.futures
    return {c for c in out if not any(len(o) > len(c) and o[:len(c)] == c for o in out)}


used = set()
for path in sorted(os.listdir(os.path.dirname(pt.__file__))):
    if path.endswith(".py"):
        with open(os.path.join(os.path.dirname(pt.__file__), path), encoding="utf-8") as fh:
            for c in chains(ast.parse(fh.read(), path)):
                used.add((c, path))
for c, path in sorted(used):
    obj, name = torch, "torch"
    for part in c:
        name += "." + part
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            problem("%s uses %s: a private torch name" % (path, name))
            break
        if not hasattr(obj, part):
            problem("%s uses %s: torch %s has no such name" % (path, name, torch.__version__))
            break
        obj = getattr(obj, part)
print("torch %s: %d torch names psagg.torch uses, all public and present: %s" %
      (torch.__version__, len({c for c, _ in used}),
       " ".join(sorted({"torch." + ".".join(c) for c, _ in used}))))

# 3. methods called on torch objects (not through a torch.X chain)
import torch.distributed as dist  # noqa: E402
import torch.nn.parallel  # noqa: E402

DUCK = [
    (torch.nn.parallel.DistributedDataParallel, ["register_comm_hook"]),
    (dist.GradBucket, ["buffer", "parameters", "index", "is_last"]),
    (torch.futures.Future, ["set_result", "set_exception", "then", "value", "wait"]),
    (torch.Tensor, ["register_hook", "data_ptr", "is_contiguous", "numel", "detach", "clone",
                    "contiguous", "float", "cpu", "copy_", "add_", "view", "element_size",
                    "is_cuda", "requires_grad", "grad", "dtype", "device"]),
    (torch.optim.Optimizer, ["state_dict", "load_state_dict", "zero_grad", "step",
                             "add_param_group"]),
    (torch.nn.Module, ["named_parameters", "parameters", "named_buffers", "register_buffer"]),
]
# FSDP2 (torch >= 2.7, public): what register_fsdp_hook calls, where this torch has it
fsdp_cls = pt.fsdp._fsdp_module_class()  # (None where torch.distributed.fsdp fails to import)
if fsdp_cls is not None and hasattr(fsdp_cls, "set_all_reduce_hook"):
    DUCK.append((fsdp_cls, ["set_all_reduce_hook"]))
    DUCK.append((importlib.import_module("torch.distributed.tensor").DTensor,
                 ["device_mesh", "full_tensor"]))
    DUCK.append((importlib.import_module("torch.distributed.device_mesh").DeviceMesh,
                 ["size", "ndim"]))
    print("FSDP2 with set_all_reduce_hook: register_fsdp_hook's names checked")
else:
    print("no public FSDP2 all-reduce hook in torch %s: register_fsdp_hook refuses (checked "
          "below)" % torch.__version__)
n = 0
for cls, names in DUCK:
    for name in names:
        n += 1
        if not hasattr(cls, name):
            problem("torch %s: %s has no %s" % (torch.__version__, cls.__qualname__, name))
print("%d methods on torch's objects present" % n)


# 4. argument checks, before any job is needed
def refused(what, exc, words, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except exc as e:
        if not all(w in str(e) for w in words):
            problem("%s: refused, but the message does not name %s: %s" % (what, words, e))
        return
    except Exception as e:  # noqa: BLE001
        want = exc.__name__ if isinstance(exc, type) else "/".join(x.__name__ for x in exc)
        problem("%s: %s: %s, not %s" % (what, type(e).__name__, e, want))
        return
    problem("%s: accepted" % what)


model = torch.nn.Linear(4, 2)
sgd = torch.optim.SGD(model.parameters(), lr=0.1)
checks = [
    ("DiLoCo(sync_every=0)", ValueError, ["sync_every"], pt.DiLoCo, model, sgd, 0),
    ("DiLoCo(outer_lr=-1)", ValueError, ["outer_lr"], pt.DiLoCo, model, sgd, 10, -1.0),
    ("DiLoCo(outer_momentum=1)", ValueError, ["outer_momentum"], pt.DiLoCo, model, sgd, 10,
     0.7, 1.0),
    ("DiLoCo(fragments=0)", ValueError, ["fragments"], lambda: pt.DiLoCo(model, sgd, 10,
                                                                          fragments=0)),
    ("DiLoCo(fragment_sync_delay=-1)", ValueError, ["fragment_sync_delay"],
     lambda: pt.DiLoCo(model, sgd, 10, fragment_sync_delay=-1)),
    ("DiLoCo(nesterov='yes')", ValueError, ["nesterov"],
     lambda: pt.DiLoCo(model, sgd, 10, nesterov="yes")),
    ("ServerOptimizer(lr=-1)", ValueError, ["lr"], pt.ServerOptimizer, model.parameters(), -1.0),
    ("ServerOptimizer(weight_decay=nan)", ValueError, ["weight_decay"],
     lambda: pt.ServerOptimizer(model.parameters(), 0.1, weight_decay=float("nan"))),
    ("ServerOptimizer(a float64 parameter)", TypeError, ["float64"],
     lambda: pt.ServerOptimizer([torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))],
                                0.1)),
    ("DistributedOptimizer(backward_passes_per_step=0)", ValueError,
     ["backward_passes_per_step"],
     lambda: pt.DistributedOptimizer(sgd, model.named_parameters(), backward_passes_per_step=0)),
    ("DistributedOptimizer(codec=42)", (TypeError, ValueError), ["codec"],
     lambda: pt.DistributedOptimizer(sgd, model.named_parameters(), codec=42)),
    ("register_ddp_hook(codec=42)", (TypeError, ValueError), ["codec"],
     lambda: pt.register_ddp_hook(None, codec=42)),
    ("register_ddp_hook(error_feedback='x')", (TypeError, ValueError), ["error_feedback"],
     lambda: pt.register_ddp_hook(None, error_feedback="x")),
    ("shutdown(error=42)", TypeError, ["error"], lambda: pt.shutdown(error=42)),
    ("register_fsdp_hook(codec=42)", (TypeError, ValueError), ["codec"],
     lambda: pt.register_fsdp_hook(model, codec=42)),
    # (no FSDP2 hook in this torch: refused naming it; else: a model without fully_shard)
    ("register_fsdp_hook(a model without fully_shard)", (RuntimeError, TypeError),
     ["register_fsdp_hook", "torch" if fsdp_cls is None else "fully_shard"],
     lambda: pt.register_fsdp_hook(model)),
]
for what, exc, words, fn, *args in checks:
    refused(what, exc, words, fn, *args)
if pt.diloco_fragments([10, 10, 10, 10], 2) != [0, 0, 1, 1]:
    problem("diloco_fragments([10]*4, 2) = %s" % pt.diloco_fragments([10] * 4, 2))
for name in pt.__all__:
    if not callable(getattr(pt, name, None)):
        problem("psagg.torch.%s in __all__ is not callable" % name)
print("%d argument checks refused their bad argument by name; psagg.torch.__all__: %d names" %
      (len(checks), len(pt.__all__)))

# 5. loading libpsagg keeps the process's signal handlers (libfabric's libinfinipath installs
# its own, which call exit(): Ctrl-C raised no KeyboardInterrupt, a SIGTERM during exit hung)
import signal  # noqa: E402
import time  # noqa: E402

interrupted = False
psagg.library()
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(1)
except KeyboardInterrupt:
    interrupted = True
if not interrupted:
    problem("SIGINT after loading libpsagg raised no KeyboardInterrupt (its handler was replaced)")
else:
    print("SIGINT after loading libpsagg: KeyboardInterrupt, as before")

if problems:
    print("check_torch_api: %d problem(s)" % len(problems))
    sys.exit(1)
print("check_torch_api: ok (torch %s, psagg %s)" % (torch.__version__, psagg.__version__))
