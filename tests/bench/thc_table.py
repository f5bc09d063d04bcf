#!/usr/bin/python3
"""thc_table.py - which table is better for thc (kernels/thc.h): the uniform one psagg builds, or a
non-uniform one fitted to the Gaussian that the rotation makes of a block (THC's idea).

For b = 2 and 4 bits, coordinates x ~ N(0, 1) (what the rotated gradient of a block looks like),
the table's L = 2^b points over [-c, c] and stochastic rounding between neighbours (unbiased;
what falls outside [-c, c] is clipped, the excess kept for error feedback), the expected error per
coordinate E[(x - Q(x))^2] (clipped part included) for:
  uniform      points evenly spaced, c the best clip level for it;
  non-uniform  symmetric points and c fitted by gradient descent to the same objective, then
               snapped to an integer grid of G = 4 (L - 1) steps over [-c, c] (the servers add
               integers: they would add each index's grid value, 4x wider than the index);
and the error of the sum of W = 4 workers (independent roundings add their variances, so the
ratio carries over). Monte Carlo over 2^22 samples, torch (CPU), seed 0.
Usage: /usr/bin/python3 tests/bench/thc_table.py
"""
import torch

torch.manual_seed(0)
N = 1 << 22
x = torch.randn(N, dtype=torch.float64)


def sr_error(points, x):
    """E[(x - SR(x))^2] for sorted points: clip to [p0, pL], variance (x - a)(b - x) inside."""
    p = points
    xc = x.clamp(p[0], p[-1])
    i = torch.searchsorted(p.detach().contiguous(), xc.detach().contiguous()).clamp(1, len(p) - 1)
    a, b = p[i - 1], p[i]
    var = (xc - a) * (b - xc)
    return (var + (x - xc) ** 2).mean()


def uniform(L, c):
    return torch.linspace(-c, c, L, dtype=torch.float64)


for bits in (2, 4):
    L = 1 << bits
    best = min(((sr_error(uniform(L, c), x).item(), c) for c in
                [0.5 + 0.05 * k for k in range(80)]))
    # non-uniform: half the points (symmetric), as positive gaps
    half = L // 2
    gaps = torch.full((half,), best[1] / (L - 1) * 2, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([gaps], lr=0.01)
    sub = x[: 1 << 20]
    for it in range(600):
        g = torch.nn.functional.softplus(gaps)
        pos = torch.cumsum(g, 0) - g[0] / 2 if L % 2 == 0 else torch.cumsum(g, 0)
        pts = torch.cat([-pos.flip(0), pos])
        loss = sr_error(pts, sub)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        g = torch.nn.functional.softplus(gaps)
        pos = torch.cumsum(g, 0) - g[0] / 2
        pts = torch.cat([-pos.flip(0), pos])
        nonu = sr_error(pts, x).item()
        c = pts[-1].item()
        G = 4 * (L - 1)
        snapped = torch.round((pts + c) / (2 * c) * G) / G * 2 * c - c
        snap = sr_error(snapped, x).item()
    print("thc%d: uniform table (clip %.2f sigma): error %.4f per coordinate; non-uniform (clip "
          "%.2f sigma, points %s): %.4f (%.1f%% less); on an integer grid of %d steps: %.4f (%.1f%% less)"
          % (bits, best[1], best[0], c, ", ".join("%.2f" % p for p in pts.tolist()), nonu,
             100 * (1 - nonu / best[0]), G, snap, 100 * (1 - snap / best[0])))
