"""Small integer helpers whose output appears in user-facing reasons."""
from __future__ import annotations

import math

GIB = 1 << 30


def factorize(n: int) -> str:
    """7168 -> '2^10 x 7'."""
    parts: list[str] = []
    rest, p = n, 2
    while p * p <= rest:
        count = 0
        while rest % p == 0:
            rest //= p
            count += 1
        if count:
            parts.append(f"{p}^{count}" if count > 1 else str(p))
        p += 1
    if rest > 1:
        parts.append(str(rest))
    return " x ".join(parts) or "1"


def divisors(n: int) -> list[int]:
    """All positive divisors of n, ascending (pairs up to sqrt(n): n may be a user's number)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0] if n > 0 else []
    return small + [n // d for d in reversed(small) if d * d != n]


def stage_layers(num_layers: int, pp: int) -> list[range]:
    """Contiguous 1-based layer ranges of the pipeline stages that hold any layer (earlier stages take the
    remainder); with more stages than layers the rest are empty and left out, so a huge pp costs nothing."""
    base, extra = divmod(num_layers, pp)
    out, start = [], 1
    for s in range(min(pp, num_layers)):
        size = base + (1 if s < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out
