"""Expert parallelism's imbalance: with EP each rank holds whole experts (E / ep of them), so a decode step
lasts as long as the rank whose experts the step's tokens touch most; TP-sharded experts split every expert
over all ranks and stay balanced. Derived from the config alone (experts, experts per token) under uniform
routing, the most even case: a real router's skew (no sourced figure in the catalog) only adds to it."""
from __future__ import annotations

import math


def expected_max_binomial(n: int, p: float, ranks: int) -> float:
    """E[max of `ranks` independent Binomial(n, p)] = sum over j of P(max >= j)."""
    if ranks <= 1 or n <= 0 or p <= 0.0:
        return n * p
    if p >= 1.0:
        return float(n)
    mean, sd = n * p, math.sqrt(n * p * (1 - p))
    lo, hi = max(0, math.floor(mean - 12 * sd)), min(n, math.ceil(mean + 12 * sd))
    log_pmf = math.lgamma(n + 1) - math.lgamma(lo + 1) - math.lgamma(n - lo + 1) + lo * math.log(p) \
        + (n - lo) * math.log1p(-p)
    pmf, cdf, total = math.exp(log_pmf), 0.0, float(lo)  # P(max >= j) is ~1 for every j <= lo
    for k in range(lo, hi):
        cdf += pmf
        total += 1 - min(cdf, 1.0) ** ranks  # P(max >= k + 1)
        pmf *= (n - k) / (k + 1) * p / (1 - p)
    return total


def slowest_rank_share(num_experts: int, ep: int, touched: float) -> float:
    """The slowest EP rank's touched experts over the mean rank's (1 without EP): each of its E / ep experts is
    touched with probability `touched`."""
    if ep <= 1 or touched <= 0.0:
        return 1.0
    per_rank = num_experts // ep
    return expected_max_binomial(per_rank, touched, ep) / (per_rank * touched)


def slowest_rank_tokens(assignments: int, ep: int) -> float:
    """The slowest EP rank's token-expert assignments over the mean rank's, each assignment landing on one of
    `ep` ranks alike (1 without EP)."""
    if ep <= 1 or assignments <= 0:
        return 1.0
    return expected_max_binomial(assignments, 1 / ep, ep) / (assignments / ep)
