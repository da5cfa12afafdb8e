#!/usr/bin/env python3
"""Fits the odd rationals of `cpu/vmath.rs`: f(x) ≈ x·P(x²)/Q(x²) with Q(0) = 1, for the least
maximum relative error on [0, limit], and prints the coefficients rounded to f32 (bits and value).

    python3 scripts/fit-rational.py tanh   # (4, 4) on [0, 9.1]
    python3 scripts/fit-rational.py erf    # (5, 5) on [0, 3.95]

Needs numpy and scipy. The fit is Lawson-weighted linear least squares on the linearised error
`P − f·Q`, iterated; it reports the relative error before the coefficients are rounded. The
clamp points in `vmath.rs` (where the f32 evaluation first gives exactly 1) and the ulp bounds
are measured there, by the tests, not here.
"""
import sys

import numpy as np
from scipy.special import erf


def fit(f, hi, m, n, points=4000, iters=100):
    """P of degree m and Q of degree n in z = x² on [0, hi²]; returns (error, p, q)."""
    k = np.arange(points)
    z = hi * hi / 2 * (1 + np.cos(np.pi * (k + 0.5) / points))
    fz = f(z)
    t = z / (hi * hi)
    w = np.ones(points)
    q = np.ones(points)
    best = None
    for _ in range(iters):
        a = np.hstack([t[:, None] ** np.arange(m + 1), -(fz[:, None] * t[:, None] ** np.arange(1, n + 1))])
        scale = np.sqrt(w) / np.abs(fz * q)
        c, *_ = np.linalg.lstsq(a * scale[:, None], fz * scale, rcond=None)
        p, qq = c[: m + 1], np.concatenate([[1.0], c[m + 1 :]])
        q = np.polyval(qq[::-1], t)
        err = (np.polyval(p[::-1], t) / q - fz) / fz
        e = np.max(np.abs(err))
        if best is None or e < best[0]:
            best = (e, p.copy(), qq.copy())
        w = w * np.abs(err)
        w /= w.sum()
    e, p, qq = best
    s = (hi * hi) ** np.arange(max(m, n) + 1)
    return e, p / s[: m + 1], qq / s[: n + 1]


def over_x(g, small):
    """g(x)/x as a function of z = x², with `small(z)` near 0."""
    def h(z):
        x = np.sqrt(z)
        safe = np.where(x == 0, 1, x)
        return np.where(x < 1e-4, small(z), g(safe) / safe)
    return h


CASES = {
    # name: (function over z, limit, degrees of P and Q, iterations)
    "tanh": (over_x(np.tanh, lambda z: 1 - z / 3), 9.1, 4, 4, 60),
    "erf": (over_x(erf, lambda z: 2 / np.sqrt(np.pi) * (1 - z / 3)), 3.95, 5, 5, 100),
}

if __name__ == "__main__":
    name = sys.argv[1] if len(sys.argv) > 1 else "tanh"
    f, hi, m, n, iters = CASES[name]
    e, p, q = fit(f, hi, m, n, iters=iters)
    print(f"{name}: ({m}, {n}) on [0, {hi}], relative error {e:.3g} ({e / 2**-24:.2f} ulp)")
    for label, cs in (("P", p), ("Q", q)):
        for c in np.float32(cs):
            bits = int(np.array(c).view(np.uint32))
            print(f"{label} 0x{bits >> 16:04x}_{bits & 0xffff:04x} {float(c):.9g}")
