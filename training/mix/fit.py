"""How held-out loss depends on the mixture, fitted on the swarm's proxies; its argmin; the gate.

Two regressions, the one with the lower leave-one-out error is used (and reported with it):

- "mixing_law" (Data Mixing Laws, Ye et al. 2024, eq. for multiple domains): each source's held-out
  loss is L_i(r) = c_i + exp(Σ_j t_ij r_j): a floor c_i it cannot go under, and an exponential in
  the mixture above it. (The law's constant k_i is folded into t_i: Σ r_j = 1, so a constant is a
  multiple of the weights' sum.) Each law is fitted by least squares in the loss's own units, c_i
  profiled over a grid below the smallest observed loss with t_i by least squares on log(L_i − c_i).
  The target is the target's weighted sum of the per-source laws.
- "linear" (RegMix's linear regression, Liu et al. 2025): the target loss linear in the weights.

The proposal is the fitted target's minimum over the constrained simplex: a seeded search (many
points drawn over the simplex, then shrinking perturbations around the best), deterministic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from training.mix.simplex import project

KINDS = ("mixing_law", "linear")


@dataclass(frozen=True)
class Fit:
    kind: str
    """"mixing_law" or "linear"."""
    cv_error: float
    """Root-mean-square leave-one-out error of the target loss (nats), over the swarm's proxies."""
    predict: Callable[[np.ndarray], np.ndarray]
    """Mixtures (n × sources) → predicted target loss (n)."""
    loo: np.ndarray
    """Each proxy's target loss predicted by the fit without it (for the plot)."""


def fit_law(X: np.ndarray, y: np.ndarray, grid: int = 64) -> tuple[float, np.ndarray]:
    """One source's law L(r) = c + exp(X t): (c, t) of the least squared error in loss units."""

    def solve(c: float) -> tuple[float, np.ndarray]:
        t, *_ = np.linalg.lstsq(X, np.log(y - c), rcond=None)
        return float(np.sum((c + np.exp(X @ t) - y) ** 2)), t

    top = float(np.min(y))
    cs = top * (1.0 - np.geomspace(1e-4, 1.0, grid))  # dense just under the smallest loss
    errs = [solve(c)[0] for c in cs]
    k = int(np.argmin(errs))
    a, b = cs[min(k + 1, grid - 1)], cs[max(k - 1, 0)]  # then a golden-section search between its neighbours
    g = (np.sqrt(5) - 1) / 2
    for _ in range(40):
        c1, c2 = b - g * (b - a), a + g * (b - a)
        if solve(c1)[0] < solve(c2)[0]:
            b = c2
        else:
            a = c1
    c = (a + b) / 2
    return float(c), solve(c)[1]


def _law_predictor(X: np.ndarray, Y: np.ndarray, w: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    laws = [(i, *fit_law(X, Y[:, i])) for i in range(Y.shape[1]) if w[i] > 0]

    def predict(R: np.ndarray) -> np.ndarray:
        R = np.atleast_2d(R)
        return sum(w[i] * (c + np.exp(R @ t)) for i, c, t in laws)

    return predict


def _linear_predictor(X: np.ndarray, Y: np.ndarray, w: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    b, *_ = np.linalg.lstsq(X, Y @ w, rcond=None)
    return lambda R: np.atleast_2d(R) @ b


_PREDICTORS = {"mixing_law": _law_predictor, "linear": _linear_predictor}


def fit(X: np.ndarray, Y: np.ndarray, w: np.ndarray) -> Fit:
    """The regression of the target loss Y @ w on the mixtures X (n × sources), per-source losses
    Y (n × sources): each kind fitted, the one with the lower leave-one-out RMSE returned."""
    X, Y, w = (np.asarray(a, dtype=np.float64) for a in (X, Y, w))
    target = Y @ w
    best: Fit | None = None
    for kind in KINDS:
        build = _PREDICTORS[kind]
        loo = np.array([build(np.delete(X, k, 0), np.delete(Y, k, 0), w)(X[k])[0] for k in range(len(X))])
        cv = float(np.sqrt(np.mean((loo - target) ** 2)))
        if best is None or cv < best.cv_error:
            best = Fit(kind, cv, build(X, Y, w), loo)
    assert best is not None
    return best


def argmin(
    predict: Callable[[np.ndarray], np.ndarray], lo: np.ndarray, hi: np.ndarray, seed: int
) -> np.ndarray:
    """The mixture of the lowest predicted loss in {lo ≤ r ≤ hi, Σ r = 1}: 4096 seeded points over
    the simplex and its corners, then rounds of 64 shrinking perturbations around the best."""
    rng = np.random.default_rng(seed)
    n = len(lo)
    points = project(np.concatenate([rng.dirichlet(np.ones(n), 4096), np.eye(n)]), lo, hi)  # + the corners
    best = points[int(np.argmin(predict(points)))]
    scale = 0.1
    for _ in range(30):  # shrinking perturbations around the best point, kept inside the bounds
        tries = project(best + rng.normal(0.0, scale, (64, n)), lo, hi)
        losses = predict(tries)
        if losses.min() < predict(best)[0]:
            best = tries[int(np.argmin(losses))]
        else:
            scale *= 0.7
    return best


def gate(proposal: list[float], uniform: list[float], proportional: list[float]) -> bool:
    """Do no harm: the proposal is returned only if its target loss is lower than both baselines'
    on every validation seed (a tie is no win)."""
    return all(p < u and p < q for p, u, q in zip(proposal, uniform, proportional, strict=True))
