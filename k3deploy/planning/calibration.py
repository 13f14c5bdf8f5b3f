"""A cluster's own constants, fitted from its measured runs: a decode factor on every decode-step term and a
prefill factor on every prefill term of the prediction.

A prediction is linear and homogeneous in the two factors (TTFT and TPOT are sums of prefill and decode
times, each scaled by one of them; 1 / throughput is a wave's time), so each measured figure m with its
prediction split into a decode part D and a prefill part P gives one row a D + b P = m; the factors are the
least-squares fit of those rows in relative error (each row divided by m, so a TTFT in seconds and a TPOT in
milliseconds weigh alike). Pure arithmetic: no file, no host.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from k3deploy.planning.perf_band import Band
from k3deploy.planning.perf_model import PerfInputs

FIGURES = ("ttft", "tpot")


class Figure(NamedTuple):
    """One measured figure of a run and its prediction split by factor: predicted = decode D + prefill P."""

    name: str
    measured: float
    decode: float
    prefill: float

    def predicted(self, decode_factor: float, prefill_factor: float) -> float:
        """The prediction under these factors."""
        return decode_factor * self.decode + prefill_factor * self.prefill

    def error(self, decode_factor: float, prefill_factor: float) -> float:
        """Signed relative error of the prediction: (predicted - measured) / measured."""
        return self.predicted(decode_factor, prefill_factor) / self.measured - 1


class Fit(NamedTuple):
    """The fitted factors, how many runs and figures they rest on, and the figures' largest error before/after."""

    decode_factor: float
    prefill_factor: float
    runs: int
    figures: int
    error_before: float
    error_after: float
    note: str

    @property
    def exact(self) -> bool:
        """No figure is left over to measure the fit's error: as many figures as factors."""
        return self.figures <= 2


class Calibration(NamedTuple):
    """A deployment's fitted factors as `plan --workload` applies them."""

    deployment: str
    decode_factor: float
    prefill_factor: float
    runs: int
    figures: int
    error_after: float
    exact: bool
    fitted_at: float

    def band(self, catalog_band: Band | None) -> Band:
        """`calibrated on this cluster: N points, error X%`; a fit with no figure to spare keeps the catalog's
        width (its error is not measured)."""
        pts = f"{self.runs} point{'s' if self.runs != 1 else ''}"
        if self.exact:
            rel = catalog_band.rel if catalog_band is not None else self.error_after
            return Band("calibrated", rel, f"calibrated on this cluster ({self.deployment}): {pts}, fitted exactly "
                        f"(no figure to spare: its error is unmeasured, the catalog's width kept); decode x"
                        f"{self.decode_factor:.3g}, prefill x{self.prefill_factor:.3g}")
        return Band("calibrated", self.error_after, f"calibrated on this cluster ({self.deployment}): {pts}, error "
                    f"{self.error_after:.0%}; decode x{self.decode_factor:.3g}, prefill x{self.prefill_factor:.3g}")

    def apply(self, inp: PerfInputs) -> PerfInputs:
        """The model's inputs with this cluster's factors and band."""
        return inp._replace(decode_scale=inp.decode_scale * self.decode_factor,
                            prefill_scale=inp.prefill_scale * self.prefill_factor, band=self.band(inp.band))

    def as_json(self) -> dict[str, Any]:
        """Field name -> value (`--json`, and the stored file)."""
        return self._asdict()

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Calibration:
        """The calibration a stored document holds (KeyError/TypeError/ValueError when it is not one)."""
        cal = cls(**{k: doc[k] for k in cls._fields})
        if not (float(cal.decode_factor) > 0 and float(cal.prefill_factor) > 0):
            raise ValueError(f"factors must be > 0, not {cal.decode_factor}, {cal.prefill_factor}")
        return cal


def _solve(rows: Sequence[Figure]) -> tuple[float, float] | None:
    """Least squares of a D/m + b P/m = 1 over `rows`; None when the rows do not fix both factors."""
    sdd = sum((r.decode / r.measured) ** 2 for r in rows)
    spp = sum((r.prefill / r.measured) ** 2 for r in rows)
    sdp = sum(r.decode * r.prefill / r.measured ** 2 for r in rows)
    td = sum(r.decode / r.measured for r in rows)
    tp = sum(r.prefill / r.measured for r in rows)
    det = sdd * spp - sdp * sdp
    if det <= 1e-9 * max(sdd * spp, 1e-300):
        return None
    a, b = (td * spp - tp * sdp) / det, (tp * sdd - td * sdp) / det
    return (a, b) if a > 0 and b > 0 else None


def _ratio(rows: Sequence[Figure], part: str) -> float | None:
    """The one factor fitting the rows that `part` dominates (the other factor left at 1)."""
    picked = [r for r in rows if getattr(r, part) > 0]
    other = "prefill" if part == "decode" else "decode"
    xs = [(getattr(r, part) / r.measured, 1 - getattr(r, other) / r.measured) for r in picked]
    den = sum(x * x for x, _ in xs)
    if not den:
        return None
    k = sum(x * y for x, y in xs) / den
    return k if k > 0 else None


def fit(runs: Sequence[Sequence[Figure]]) -> Fit:
    """The two factors fitting every run's figures (each run: its TTFT and TPOT, as far as they can be judged)."""
    rows = [f for run in runs for f in run if f.measured > 0]
    if not rows:
        raise ValueError("no measured figure to fit")
    before = max(abs(r.error(1, 1)) for r in rows)
    solved = _solve(rows)
    note = "both factors fitted by least squares"
    if solved is None:  # one factor is not fixed by these figures: fit each alone on the rows it dominates
        d = _ratio([r for r in rows if r.decode >= r.prefill], "decode")
        p = _ratio([r for r in rows if r.prefill > r.decode], "prefill")
        solved = (d or 1.0, p or 1.0)
        kept = [n for n, v in (("decode", d), ("prefill", p)) if v is None]
        note = (f"the {' and '.join(kept)} factor kept at 1: no measured figure it dominates" if kept
                else "each factor fitted on the figures it dominates")
    a, b = solved
    after = max(abs(r.error(a, b)) for r in rows)
    return Fit(a, b, len([r for r in runs if r]), len(rows), before, after, note)
