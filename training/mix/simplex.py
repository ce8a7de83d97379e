"""Mixtures as points of the constrained simplex {lo ≤ r ≤ hi, Σ r = 1}: the prior, the swarm around
it, and the projection that keeps every point inside. Pure numpy, seeded: the same recipe gives the
same points."""

from __future__ import annotations

import numpy as np


def project(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The point of {lo ≤ r ≤ hi, Σ r = 1} nearest to x (Euclidean), for one point or each row of
    an array: r = clip(x − τ, lo, hi) with the τ that makes it sum to 1, found by bisection (the sum
    falls as τ rises)."""
    x = np.asarray(x, dtype=np.float64)
    a = np.min(x - hi, axis=-1, keepdims=True) - 1.0
    b = np.max(x - lo, axis=-1, keepdims=True) + 1.0
    for _ in range(60):
        tau = (a + b) / 2
        above = np.clip(x - tau, lo, hi).sum(axis=-1, keepdims=True) > 1.0
        a, b = np.where(above, tau, a), np.where(above, b, tau)
    r = np.clip(x - (a + b) / 2, lo, hi)
    return r / r.sum(axis=-1, keepdims=True)


def prior(tokens: list[int], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Token-proportional (each source at its share of the training tokens), inside the bounds,
    rounded as a recipe's mix line holds it."""
    t = np.asarray(tokens, dtype=np.float64)
    return rounded(project(t / t.sum(), lo, hi), lo, hi)


def uniform(n: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return rounded(project(np.full(n, 1.0 / n), lo, hi), lo, hi)


def swarm(
    center: np.ndarray, size: int, seed: int, concentration: float, lo: np.ndarray, hi: np.ndarray
) -> list[np.ndarray]:
    """`size` mixtures drawn from Dirichlet(concentration × n × center), each projected into the
    bounds and rounded to 4 decimals. Drawn one at a time from one seeded stream, so a larger size
    keeps the smaller one's points as its first ones (their proxies are reused). TooFewMixtures when
    the draws stop finding new ones (bounds that fit fewer than `size`)."""
    rng = np.random.default_rng(seed)
    alpha = np.maximum(concentration * len(center) * center, 1e-3)
    points: list[np.ndarray] = []
    misses = 0
    while len(points) < size:
        r = rounded(project(rng.dirichlet(alpha), lo, hi), lo, hi)
        if any(np.array_equal(r, p) for p in points):  # a duplicate would add no evidence
            misses += 1
            if misses > GIVE_UP * size:  # bounds so tight that few mixtures (at 4 decimals) fit them
                raise TooFewMixtures(len(points))
            continue
        points.append(r)
        misses = 0
    return points


GIVE_UP = 200  # draws per point of the swarm that bring nothing new, before the swarm says so


class TooFewMixtures(ValueError):
    """The bounds hold fewer distinct mixtures (at 4 decimals) than the swarm's size: `found` of them."""

    def __init__(self, found: int):
        super().__init__(found)
        self.found = found


def rounded(r: np.ndarray, lo: np.ndarray, hi: np.ndarray, digits: int = 4) -> np.ndarray:
    """r at `digits` decimals, still summing to exactly 1 and inside the bounds (the rounding error
    goes to the largest weight that has room): what a recipe's `mix = {…}` line can hold."""
    q = np.round(r, digits)
    err = round(1.0 - float(q.sum()), digits)
    for i in np.argsort(-q):
        if lo[i] - 1e-12 <= q[i] + err <= hi[i] + 1e-12:
            q[i] = round(q[i] + err, digits)
            break
    return q
