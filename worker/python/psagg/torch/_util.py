"""psagg.torch's argument checks and small helpers, shared by its modules."""

import math
import numbers
import os

import torch

import psagg as _p

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _env_int(*names):
    for n in names:
        v = os.environ.get(n)
        if v not in (None, ""):
            try:
                return int(v)
            except ValueError:
                raise ValueError("psagg.torch: %s='%s' is not a number" % (n, v)) from None
    return None


def _is_int(v):
    """An integer that is not a bool (True is an int to Python, never a count or a step)."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v):
    """A finite real number that is not a bool."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


def _check_codec(who, codec):
    """Refuse, at the call, a codec that psagg would refuse only at the declaration (after
    connecting): ValueError naming the argument and the value. codec: None (the config's), a
    text that psagg.parse_codec (libpsagg's parser) takes, a dict of such texts (or None), or a
    callable (its answers are checked when it is called, at the declaration)."""
    if codec is None or callable(codec):
        return
    items = [("codec[%r]" % (k,), v) for k, v in codec.items() if v is not None] \
        if isinstance(codec, dict) else [("codec", codec)]
    for name, text in items:
        if not isinstance(text, str):
            raise ValueError("psagg.torch.%s: %s must be a codec text such as 'maxmin4' (or "
                             "codec None, a dict of texts or a callable), not %r"
                             % (who, name, text))
        try:
            _p.parse_codec(text)
        except _p.Error as e:
            raise ValueError("psagg.torch.%s: %s=%r: %s" % (who, name, text, e.detail)) from None


def _check_error_feedback(who, error_feedback):
    if error_feedback is not None and not isinstance(error_feedback, bool):
        raise ValueError("psagg.torch.%s: error_feedback must be None (the config's), True or "
                         "False, not %r" % (who, error_feedback))


def _check_op(who, op):
    if not _is_int(op) or op not in (_p.SUM, _p.AVERAGE):
        raise ValueError("psagg.torch.%s: op must be psagg.SUM or psagg.AVERAGE, not %r"
                         % (who, op))


def _named_params(opt, named_parameters, who):
    """named_parameters as a list, checked to cover every parameter of opt's param groups; or,
    without it, opt's parameters named "param.<group>.<index>"."""
    if named_parameters is None:
        return [("param.%d.%d" % (g, i), p) for g, group in enumerate(opt.param_groups)
                for i, p in enumerate(group["params"])]
    named = list(named_parameters)
    if not {id(p) for _, p in named} >= {id(p) for g in opt.param_groups for p in g["params"]}:
        raise ValueError("psagg.torch.%s: named_parameters does not cover every parameter of the "
                         "optimizer" % who)
    return named


def _hook_gradients(params, make_hook):
    """Register make_hook(p) on each parameter's gradient accumulator (it runs once the gradient
    is accumulated); returns the accumulators, which must be kept alive."""
    accs = []
    for p in params:
        acc = p.expand_as(p).grad_fn.next_functions[0][0]  # p's gradient accumulator
        acc.register_hook(make_hook(p))
        accs.append(acc)
    return accs


def _zero_grad(base, set_to_none):
    """base.zero_grad with torch's own default when set_to_none is None: PyTorch 1.13 zeroes
    the gradients, 2.x sets them to None (both work here: a missing gradient pushes zeros)."""
    return base.zero_grad() if set_to_none is None else base.zero_grad(set_to_none)


def _check_tracked(opt, tracked, who):
    """Every parameter of opt's groups that has a gradient is one psagg pushes (tracked: their
    ids): a parameter frozen (requires_grad=False) when the optimizer was built and unfrozen
    since would otherwise train on this worker's gradient alone, or not at all."""
    for gi, g in enumerate(opt.param_groups):
        for pi, p in enumerate(g["params"]):
            if p.requires_grad and p.grad is not None and p.numel() and id(p) not in tracked:
                raise RuntimeError(
                    "psagg.torch.%s: parameter %d of param group %d (shape %s) has a gradient, "
                    "but it did not require one when the optimizer was built (frozen, then "
                    "unfrozen?): psagg declares the tensors it pushes once, at that point. "
                    "Build the optimizer with it requiring a gradient (keep it still meanwhile "
                    "in a param group of its own with lr=0 and weight_decay=0)"
                    % (who, pi, gi, tuple(p.shape)))


def _refuse_new_group(opt, param_group, who):
    """add_param_group: while the optimizer is built, the base class's; after, refused."""
    if getattr(opt, "_psagg_params", None) is not None:
        raise ValueError("psagg.torch.%s.add_param_group: psagg declares the tensors it pushes "
                         "once, when the optimizer is built; build it with every param group "
                         "(one with lr=0 keeps parameters still until their turn)" % who)
