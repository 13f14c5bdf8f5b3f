"""How far a prediction is known to hold: each engine's factors on the accelerator's family, calibrated on
published measurements (which, and the largest error over the ones held back as checks) or, where no
published measurement exists, the engine's own factors extrapolated, with a wider band that says so."""
from __future__ import annotations

from typing import Any, Literal, NamedTuple

from k3deploy.catalog.specs import EnginePerformance, HardwareSpec, PlannerDefaults


class Band(NamedTuple):
    """A prediction's band: TPOT (and throughput) from x / (1 + rel) to x (1 + rel), and why that wide."""

    kind: Literal["calibrated", "extrapolated", "derived"]
    rel: float
    why: str

    def low(self, x: float) -> float:
        """The band's lower edge for a figure predicted as x."""
        return x / (1 + self.rel)

    def high(self, x: float) -> float:
        """The band's upper edge for a figure predicted as x."""
        return x * (1 + self.rel)

    def label(self) -> str:
        """`calibrated ±30%` / `extrapolated x2`: the table's short form."""
        if self.kind == "extrapolated":
            return f"extrapolated x{1 + self.rel:g}"
        return f"{self.kind} ±{self.rel:.0%}"

    def model_dump(self) -> dict[str, Any]:
        """Field name -> value (`--json`)."""
        return self._asdict()


def family_performance(perf: EnginePerformance, hw: HardwareSpec, engine: str, planner: PlannerDefaults
                       ) -> tuple[EnginePerformance, Band]:
    """The engine's factors on `hw`'s family (its own entry overriding the engine's), and the band they carry."""
    fam = perf.families.get(hw.perf_family or "")
    if fam is None:
        return perf, Band("extrapolated", perf.extrapolated_band or planner.extrapolated_band,
                          f"no published {engine} measurement on {hw.perf_family or hw.id} is cited: the engine's own "
                          f"factors, not calibrated on this accelerator")
    update = {k: v for k, v in (("hbm_efficiency", fam.hbm_efficiency), ("compute_efficiency",
              fam.compute_efficiency), ("layer_overhead_us", fam.layer_overhead_us),
              ("moe_intermediate_align", fam.moe_intermediate_align), ("request_layer_us", fam.request_layer_us))
              if v is not None}
    merged = perf.model_copy(update=update)
    if fam.kind != "calibrated":
        why = "; ".join(f"{k}: {v}" for k, v in fam.sources.items() if k in (*update, "band"))
        return merged, Band(fam.kind, fam.band, f"{engine} on {hw.perf_family}: {why}")
    checks = f", checked on {len(fam.checked_on)} more" if fam.checked_on else ""
    return merged, Band("calibrated", fam.band, f"{engine} on {hw.perf_family}: fitted on "
                        f"{', '.join(fam.calibrated_on)}{checks} (published within x{1 + fam.band:.2f} either way)")
