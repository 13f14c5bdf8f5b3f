"""`calibrate NAME`: a cluster's own constants from its effort measurements. Validate's effort stage keeps each
cold run it compared with the prediction (the workload, what was measured, what was predicted) beside the
deployment's record; `calibrate` fits the decode and prefill factors (planning/calibration) to those runs,
stores them there, and reports each run's error before and after. `plan --workload` on a topology of that name
applies them."""
from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from k3deploy.errors import InputError, StateError
from k3deploy.planning.calibration import Calibration, Figure, fit
from k3deploy.records import calibration as stored
from k3deploy.validate.predicted import JUDGED_TTFT_MS

if TYPE_CHECKING:
    from k3deploy.catalog.specs import Catalog
    from k3deploy.records.deployment import Deployment
    from k3deploy.topology.schema import Topology
    from k3deploy.validate.pipeline import Report

MEASURED = ("mean_ttft_ms", "mean_tpot_ms", "output_throughput")
REFITS = 3


def keep_effort(state_dir: Path, deployment: Deployment, report: Report) -> None:
    """Keep the effort stage's cold run with the deployment's records, when it was compared with a prediction."""
    from k3deploy.records.store import StateStore

    for stage in report.stages:
        r = stage.results
        if stage.name != "effort" or "workload" not in r.get("predicted", {}) or "cold" not in r:
            continue
        run = {"at": time.time(), "plan_digest": deployment.plan_digest, "workload": r["predicted"]["workload"],
               "measured": {k: r["cold"][k] for k in (*MEASURED, "completed")},
               "predicted": r["predicted"]}
        with StateStore(state_dir).lock(deployment.name):
            stored.add_measurement(state_dir, deployment.name, run)


def _workload(run: dict[str, Any]) -> Any:
    """The run's workload as the planner takes it (TypeError/ValueError when the stored one is not)."""
    from k3deploy.planning.workload import Workload

    w = run["workload"]
    if not isinstance(w, dict):
        raise TypeError(f"workload {w!r} is not an object")
    return Workload(**{k: w[k] for k in Workload._fields if k in w})


def _figures(t: Topology, catalog: Catalog, run: dict[str, Any], around: tuple[float, float] = (1.0, 1.0)
             ) -> tuple[Any, list[Figure]]:
    """The run's workload and its judged figures (TPOT; TTFT when predicted long enough to be the prefill's; judged
    on the catalog's prediction), each split into its decode and prefill parts at the factors `around`: the
    prediction is linear in the two factors but for the batch a stand-in's staggered requests see, so two
    predictions give the split, and `calibrate` refits around its last fit until it settles."""
    from k3deploy.planning.prediction import predict_topology

    w = _workload(run)
    a, b = around
    catalog_ttft = predict_topology(t, catalog, w).ttft_s
    base = predict_topology(t, catalog, w, Calibration("split", a, b, 0, 0, 0.0, True, 0.0))
    twice = predict_topology(t, catalog, w, Calibration("split", 2 * a, b, 0, 0, 0.0, True, 0.0))
    m = run["measured"]
    out = []
    for name, key, one, two in (("tpot", "mean_tpot_ms", base.tpot_s, twice.tpot_s),
                                ("ttft", "mean_ttft_ms", base.ttft_s, twice.ttft_s)):
        if name == "ttft" and catalog_ttft * 1000 < JUDGED_TTFT_MS:
            continue  # as effort judges it: a TTFT this short is mostly HTTP, tokenizer and scheduling cost
        decode = (two - one) * 1000
        out.append(Figure(name, float(m[key]), decode / a, (one * 1000 - decode) / b))
    return w, out


def _row(t: Topology, catalog: Catalog, run: dict[str, Any], cal: Calibration | None) -> dict[str, Any]:
    """A run's measured figures beside the prediction with (or without) the factors, and each one's error."""
    from k3deploy.planning.prediction import predict_topology

    f = predict_topology(t, catalog, _workload(run), cal).bench_fields()
    return {k: {"predicted": f[k], "error": f[k] / run["measured"][k] - 1} for k in MEASURED if run["measured"][k]}


def calibrate(name: str, state_dir: Path, topology: Topology, catalog: Catalog,
              deployment: Deployment | None) -> dict[str, Any]:
    """Fit NAME's factors to its effort runs (of its current plan), store them, and return the report."""
    from k3deploy.planning.perf_model import PerfUnknown

    runs = stored.load_measurements(state_dir, name)
    if deployment is not None:
        runs = [r for r in runs if r.get("plan_digest") in (None, deployment.plan_digest)]
    if not runs:
        raise StateError(f"no effort measurements for {name} (of its current plan) in {state_dir / name}",
                         hint=f"run `k3deploy validate {name} --only effort` first")
    try:
        split = [_figures(topology, catalog, r) for r in runs]
        result = first = fit([figs for _w, figs in split])
        for _ in range(REFITS):  # the split moves a little with the factors (see _figures): refit around the fit
            split = [_figures(topology, catalog, r, (result.decode_factor, result.prefill_factor)) for r in runs]
            result = fit([figs for _w, figs in split])._replace(error_before=first.error_before)
        cal = Calibration(name, result.decode_factor, result.prefill_factor, result.runs, result.figures,
                          result.error_after, result.exact, time.time())
        rows = [{"workload": r["workload"], "measured": {k: r["measured"][k] for k in MEASURED},
                 "fitted": [f.name for f in figs], "before": _row(topology, catalog, r, None),
                 "after": _row(topology, catalog, r, cal)} for r, (_w, figs) in zip(runs, split)]
    except PerfUnknown as exc:
        raise InputError(f"{name}: the prediction cannot be timed, so nothing can be calibrated: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        path = stored.effort_path(state_dir, name)
        raise StateError(f"{path} holds an effort run that cannot be read ({exc!r})",
                         hint=f"remove {path}, then run `k3deploy validate {name} --only effort` again") from None
    doc = {"deployment": name, "calibration": cal.as_json(), "band": cal.band(None).why,
           "fit": {"note": result.note, "error_before": result.error_before, "error_after": result.error_after},
           "runs": rows}
    doc["file"] = str(stored.save_calibration(state_dir, name, doc))
    return doc


def show(name: str, state_dir: Path) -> dict[str, Any]:
    """What `calibrate NAME` stored; StateError when it has not run."""
    doc = stored.load_calibration_doc(state_dir, name)
    if doc is None:
        raise StateError(f"{name} has no calibration in {state_dir / name}",
                         hint=f"run `k3deploy calibrate {name}` (after `k3deploy validate {name} --only effort`)")
    stored.load_calibration(state_dir, name)  # a file that is not a calibration says so
    return doc


def where(target: str, state_dir: str | None) -> tuple[str, Path]:
    """NAME or FILE -> (the deployment's name, its state directory), as status and validate resolve it."""
    from k3deploy.records.locate import locate

    found = locate(target, state_dir)
    return found.name, found.store.directory


def calibrate_target(target: str, state_dir: str | None, catalog_dirs: list[Path]) -> dict[str, Any]:
    """`calibrate NAME|FILE`: the deployment's topology (the file given, else the one it was launched from), its
    record when there is one, and `calibrate` of its runs."""
    from k3deploy.planning.files import catalog_for
    from k3deploy.records.locate import load_topology_file, locate

    found = locate(target, state_dir)
    record = found.store.load(found.name)
    topology = found.topology
    if topology is None:
        record = found.store.require(found.name)
        file = Path(record.file)
        if not file.is_file():
            raise StateError(f"deployment {found.name} was launched from {file}, which is gone",
                             hint="pass the topology file instead of the name")
        topology = load_topology_file(file)
    if topology.roles is not None or topology.replicas > 1:
        what = "prefill/decode roles" if topology.roles is not None else f"{topology.replicas} replicas"
        raise InputError(f"{found.name} is a service ({what}): calibrating a service is not supported (validate "
                         f"keeps no effort runs per role or replica, and plan predicts a service per role)",
                         hint="calibrate one instance of the shape: a topology with its `parallel` and nodes, no "
                         "roles, replicas 1; launch it, run `k3deploy validate NAME --only effort`, then `k3deploy "
                         "calibrate NAME`")
    return calibrate(found.name, found.store.directory, topology, catalog_for(catalog_dirs), record)
