"""One status model for every unit of deployment: a single deployment is the one-instance case, and a service's
status now is one function of its instances' (as SkyPilot's `ServiceStatus.from_replica_statuses`)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

# "restarting": a deployment's supervisor starts its nodes again; "degraded": some of a service's instances serve.
Status = Literal["starting", "ready", "restarting", "degraded", "failed", "stopping", "stopped"]
ACTIVE: tuple[Status, ...] = ("starting", "ready", "restarting", "degraded", "stopping")


class InstanceStatus(NamedTuple):
    """One instance as a unit's status sees it: its role (empty for a replica) and whether it serves now."""

    role: str
    serving: bool


def unit_status(recorded: Status, instances: Sequence[InstanceStatus], router_up: bool | None) -> Status:
    """The unit's status now from its recorded status, its instances' and its router's (None: it has none). An
    active unit of which nothing answers clients (the router down, no instance serving, or a role with none) has
    failed; one with some instances out is degraded. Without a router the unit is its one instance, whose record
    is the unit's: as recorded (its supervisor keeps it true)."""
    if recorded not in ACTIVE or router_up is None:
        return recorded
    serving = [i for i in instances if i.serving]
    # With roles a request needs a prefill and a decode: a role with no instance serving serves nobody.
    role_down = any(not any(i.role == role for i in serving) for role in {i.role for i in instances if i.role})
    if not router_up or not serving or role_down:
        return "failed"
    if len(serving) < len(instances):
        return "degraded"
    return recorded
