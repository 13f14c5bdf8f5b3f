"""A replica of a running service started again with a stand-in fault (validate's and top's tests)."""
from __future__ import annotations

from pathlib import Path

import yaml

from k3deploy.records.store import StateStore


def with_fault(topo: Path, fault: str) -> Path:
    """A copy of the topology whose engine runs with K3SIM_FAULT=fault (a new version of the replicas)."""
    doc = yaml.safe_load(topo.read_text())
    doc["engine"]["env"] = {**doc["engine"].get("env", {}), "K3SIM_FAULT": fault}
    out = topo.with_name(f"{topo.stem}-{fault}.yaml")
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def restart_replica(topo: Path, index: int, store: StateStore) -> None:
    """Replica `index` alone stopped and started again from `topo` (the router keeps its URL and health-checks
    it back in)."""
    from k3deploy.launch.prepare import prepare
    from k3deploy.launch.service import start_replica, stop_deployment
    from k3deploy.nodeplan.targets import ExecOverrides

    unit = prepare(topo, None, ExecOverrides())
    assert unit.router is not None
    stop_deployment(store, f"{unit.name}-r{index}")
    start_replica(unit, index, store, skip_preflight=True, tries=1)
