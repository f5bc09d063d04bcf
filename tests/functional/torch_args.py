"""torch_args.py - psagg.torch's argument checks, with no server and no job (ctest
functional.torch_args, label regression).

Every public entry point that takes counts, rates or a codec (DiLoCo, DiLoCo.step,
register_ddp_hook, DistributedOptimizer, ServerOptimizer) must refuse a bad argument at the
call, before it connects to anything: a bool where an int or a float belongs (bool is an int to
Python, so sync_every=True used to pass as 1), a float count, a non-finite rate, a codec psagg
does not parse ('bogus' used to be caught only by psagg_declare, after connecting), an
error_feedback or op of the wrong kind. Each must raise ValueError whose message names the
argument and the bad value. psagg.torch.init is replaced by one that raises Connected, so a
check that is missing shows as "reached init()", and good arguments must get that far (the
checks refuse nothing valid). DiLoCo.step's samples check runs on an instance that was never
constructed: the check must come before step() touches any state.
Prints "TORCH-ARGS ok: N cases"; exit 0 passed, 1 failed, 77 skipped (no torch).
"""

import math
import sys

try:
    import torch
except ImportError:
    print("torch_args: SKIP: this python cannot import torch")
    sys.exit(77)

import psagg
import psagg.torch as pt


class Connected(Exception):
    pass


def no_connect(*_a, **_k):
    raise Connected("reached init(): the arguments were not refused before connecting")


pt._session.init = no_connect  # session() and register_ddp_hook() call it there
failures = []
cases = 0


def expect_refused(what, call, *names):
    """call() must raise ValueError naming every one of names."""
    global cases
    cases += 1
    try:
        call()
    except ValueError as e:
        missing = [n for n in names if n not in str(e)]
        if missing:
            failures.append("%s: ValueError does not name %s: %s" % (what, missing, e))
        return
    except Connected as e:
        failures.append("%s: accepted (%s)" % (what, e))
        return
    except Exception as e:
        failures.append("%s: %s instead of ValueError: %s" % (what, type(e).__name__, e))
        return
    failures.append("%s: returned without an error" % what)


def expect_accepted(what, call):
    """call() must get as far as connecting (the checks refuse nothing valid)."""
    global cases
    cases += 1
    try:
        call()
    except Connected:
        return
    except Exception as e:
        failures.append("%s: refused good arguments: %s: %s" % (what, type(e).__name__, e))
        return
    failures.append("%s: returned without connecting" % what)


def main():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def diloco(**kw):
        kw.setdefault("sync_every", 4)
        return lambda: pt.DiLoCo(model, opt, **kw)

    for kw, names in [
            (dict(sync_every=True), ["sync_every", "True"]),
            (dict(sync_every=4.0), ["sync_every", "4.0"]),
            (dict(sync_every=0), ["sync_every"]),
            (dict(fragments=True), ["fragments", "True"]),
            (dict(fragments=2.0), ["fragments", "2.0"]),
            (dict(sync_every=8, fragments=2, fragment_sync_delay=True),
             ["fragment_sync_delay", "True"]),
            (dict(fragment_sync_delay=0.0), ["fragment_sync_delay", "0.0"]),
            (dict(outer_lr=True), ["outer_lr", "True"]),
            (dict(outer_lr=math.inf), ["outer_lr", "inf"]),
            (dict(outer_lr="0.7"), ["outer_lr", "'0.7'"]),
            (dict(outer_momentum=False), ["outer_momentum", "False"]),
            (dict(outer_momentum=math.nan), ["outer_momentum", "nan"]),
            (dict(fragment_update_alpha=True), ["fragment_update_alpha", "True"]),
            (dict(nesterov="on"), ["nesterov", "'on'"]),
            (dict(codec="bogus"), ["codec", "'bogus'", "unknown codec"]),
            (dict(codec="maxmin99"), ["codec", "'maxmin99'"]),
            (dict(codec=4), ["codec", "4"]),
            (dict(codec={"0.weight": "maxmin4", "2.weight": "fp31"}),
             ["codec['2.weight']", "'fp31'"]),
            (dict(error_feedback="off"), ["error_feedback", "'off'"]),
            (dict(error_feedback_beta=0), ["error_feedback_beta", "0"]),
            (dict(error_feedback_beta=1.5), ["error_feedback_beta", "1.5"]),
            (dict(error_feedback_beta=math.nan), ["error_feedback_beta", "nan"]),
            (dict(error_feedback_beta=True), ["error_feedback_beta", "True"]),
            (dict(error_feedback_beta=1e-9), ["error_feedback_beta", "1e-09"])]:
        expect_refused("DiLoCo(%r)" % kw, diloco(**kw), *names)
    expect_accepted("DiLoCo(sync_every=4, codec='maxmin4/512/nearest')",
                    diloco(codec="maxmin4/512/nearest"))
    expect_accepted("DiLoCo(sync_every=4, codec='topk2:0.02', error_feedback_beta=0.95)",
                    diloco(codec="topk2:0.02", error_feedback_beta=0.95))
    expect_accepted("DiLoCo(sync_every=8, fragments=2, fragment_sync_delay=1, outer_lr=1, "
                    "codec={'0.weight': 'fp32', '2.bias': None})",
                    diloco(sync_every=8, fragments=2, fragment_sync_delay=1, outer_lr=1,
                           codec={"0.weight": "fp32", "2.bias": None}))

    bare = pt.DiLoCo.__new__(pt.DiLoCo)  # never constructed: the check must come first
    for samples in (True, False, 0, -3, math.nan, math.inf, "32"):
        expect_refused("DiLoCo.step(samples=%r)" % (samples,),
                       lambda: bare.step(samples=samples), "samples", repr(samples))

    expect_refused("register_ddp_hook(codec='bogus')",
                   lambda: pt.register_ddp_hook(None, codec="bogus"), "codec", "'bogus'")
    expect_refused("register_ddp_hook(error_feedback=1)",
                   lambda: pt.register_ddp_hook(None, error_feedback=1), "error_feedback")

    def dist_opt(**kw):
        return lambda: pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                               model.named_parameters(), **kw)
    for kw, names in [(dict(codec="bogus"), ["codec", "'bogus'"]),
                      (dict(codec={"0.bias": 3}), ["codec['0.bias']", "3"]),
                      (dict(error_feedback="on"), ["error_feedback", "'on'"]),
                      (dict(backward_passes_per_step=True), ["backward_passes_per_step", "True"]),
                      (dict(backward_passes_per_step=2.5), ["backward_passes_per_step", "2.5"]),
                      (dict(backward_passes_per_step=0), ["backward_passes_per_step", "0"]),
                      (dict(op=True), ["op", "True"]),
                      (dict(op=7), ["op", "7"])]:
        expect_refused("DistributedOptimizer(%r)" % kw, dist_opt(**kw), *names)
    expect_accepted("DistributedOptimizer(codec='maxmin4', backward_passes_per_step=2, op=SUM)",
                    dist_opt(codec="maxmin4", backward_passes_per_step=2, op=psagg.SUM))

    def server_opt(**kw):
        kw.setdefault("lr", 0.1)
        return lambda: pt.ServerOptimizer(model.parameters(), **kw)
    for kw, names in [(dict(lr=True), ["lr", "True"]),
                      (dict(lr=math.nan), ["lr", "nan"]),
                      (dict(lr=-0.1), ["lr", "-0.1"]),
                      (dict(weight_decay=False), ["weight_decay", "False"]),
                      (dict(codec="bogus"), ["codec", "'bogus'"]),
                      (dict(error_feedback=0), ["error_feedback", "0"]),
                      (dict(op=True), ["op", "True"])]:
        expect_refused("ServerOptimizer(%r)" % kw, server_opt(**kw), *names)
    expect_accepted("ServerOptimizer(lr=1, weight_decay=0, codec='fp32', error_feedback=False)",
                    server_opt(lr=1, weight_decay=0, codec="fp32", error_feedback=False))

    if failures:
        for f in failures:
            print("torch_args: FAIL: " + f)
        print("torch_args: %d of %d cases failed" % (len(failures), cases))
        sys.exit(1)
    print("TORCH-ARGS ok: %d cases" % cases)


if __name__ == "__main__":
    main()
