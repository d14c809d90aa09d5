#!/usr/bin/env python3
"""Derives the erf coefficients in graph/src/approx.rs (numpy; not run by CI, which tests the result).

erf(x) = x + x*p(x^2) below SPLIT: p is a minimax fit (Lawson's reweighted least squares on a dense
grid) of erf(x)/x - 1. Above it erf(t) = 1 - 2^q(t), t = min(|x|, CLAMP): q fits log2(erfc(t)) with the
error weighted by erfc(t), which is the error it makes in erf. Coefficients are rounded to f32 and
printed constant term first, as approx.rs lists them.
"""
import math

import numpy as np

SPLIT, CLAMP, SMALL_DEGREE, LARGE_DEGREE = 0.921875, 4.0, 5, 6


def lawson(x, f, w, degree, iterations=300):
    vander = np.vander(x, degree + 1, increasing=True)
    u = np.ones_like(x) / len(x)
    for _ in range(iterations):
        sw = np.sqrt(u) * w
        c, *_ = np.linalg.lstsq(vander * sw[:, None], f * sw, rcond=None)
        u = u * np.abs(w * (vander @ c - f))
        u /= u.sum()
    return c


a = np.linspace(1e-4, SPLIT, 20000)
small = lawson(a * a, np.array([math.erf(v) / v - 1 for v in a]), np.ones_like(a), SMALL_DEGREE)
t = np.linspace(SPLIT, CLAMP, 20000)
erfc = np.array([math.erfc(v) for v in t])
large = lawson(t, np.log2(erfc), erfc, LARGE_DEGREE)
for name, c in (("ERF_SMALL", small), ("ERF_LARGE_LOG2", large)):
    print(name, [float(np.float32(v)) for v in c])
