"""Look at a deployment: find its record, per-node status, and logs (live from the nodes or local copies)."""
from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict

from k3deploy.errors import InputError
from k3deploy.executors.factory import ExecutorFactory
from k3deploy.executors.http import NodeHttp, serving
from k3deploy.launch.allocation import allocation_of
from k3deploy.launch.bringup import open_gang
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.records.deployment import Attempt, Deployment, Failure
from k3deploy.records.status import ACTIVE
from k3deploy.records.store import StateStore
from k3deploy.serving.readiness import choose_probe_from


class NodeStatus(BaseModel):
    """One node as `status` sees it now."""

    model_config = ConfigDict(frozen=True)

    rank: int
    host: str
    pid: int | None
    log_path: str
    alive: bool | None  # None: not started, or the host could not be asked
    error: str = ""
    phase: str = "pending"  # as recorded: `unknown` when a teardown could not reach it (it may still run)


class StatusReport(BaseModel):
    """`k3deploy status` (also its --json)."""

    model_config = ConfigDict(frozen=True)

    name: str
    status: str
    file: str
    plan_digest: str
    executor: str
    url: str | None
    ready: bool | None  # rank 0 answers every readiness path
    ready_detail: str = ""  # why not, when it does not
    probe_from: str = "here"  # where that was asked from: here, or on rank 0 itself (head)
    supervised: bool
    supervisor_pid: int | None
    uptime_s: float | None
    nodes: tuple[NodeStatus, ...]
    failure: Failure | None
    attempts: tuple[Attempt, ...]
    slurm: str = ""  # the Slurm job (scontrol show job: there may be no accounting database for sacct)


def status(store: StateStore, name: str, factory: ExecutorFactory) -> StatusReport:
    """The record plus a live look at every started node (one fan-out round) and rank 0's HTTP."""
    dep = store.require(name)
    started = {n.rank: n for n in dep.nodes if n.handle is not None}
    live: dict[int, tuple[bool | None, str]] = {}
    ready, why = None, ""
    ask_http = bool(dep.url) and dep.status in ("ready", "restarting", "starting")
    probe_from = dep.probe_from
    # A node the teardown could not reach may still run: it is asked again even after the deployment ended.
    unsure = any(n.phase == "unknown" for n in started.values())
    if started and (dep.status in ACTIVE or unsure):
        if ask_http and probe_from == "here":
            # Launched where rank 0's ip is reachable; this machine may not be (asking via rank 0 always works).
            probe_from = choose_probe_from("auto", dep.url)
        gang = open_gang(dep, factory)
        gang.probe_from = probe_from
        try:
            for p in gang.probe(with_logs=False):
                live[p.job.rank] = (p.alive, p.error)
            if ask_http:
                ready, why = gang.head_serving()
        finally:
            gang.close()
    elif ask_http and dep.url:
        with NodeHttp(dep.url) as http:
            ready, why = serving(http, dep.ready_paths)
    jobs = {j.rank: j for j in dep.jobs}
    nodes = []
    for n in dep.nodes:
        # An inactive deployment was stopped by k3deploy: its nodes are not asked again (but for `unsure`).
        alive, error = live.get(n.rank, (None if dep.status in ACTIVE else False, ""))
        nodes.append(NodeStatus(rank=n.rank, host=n.host, pid=n.handle.pid if n.handle else None,
                                log_path=jobs[n.rank].log_path, alive=alive, error=error, phase=n.phase))
    owner = dep.owner
    supervised = owner is not None and owner.role in ("supervisor", "attach") and owner.alive()
    uptime = time.time() - dep.attempts[-1].ready_at if dep.attempts and dep.attempts[-1].ready_at \
        and dep.status == "ready" else None
    return StatusReport(
        name=dep.name, status=dep.status, file=dep.file, plan_digest=dep.plan_digest, executor=dep.executor,
        url=dep.url, ready=ready, ready_detail=why, probe_from=probe_from, supervised=supervised,
        supervisor_pid=owner.pid if owner else None,
        uptime_s=uptime, nodes=tuple(nodes), failure=dep.failure, attempts=dep.attempts,
        slurm=allocation_of(dep).summary(),
    )  # fmt: skip


class NodeLog(BaseModel):
    """The end of one node's log and where it came from."""

    rank: int
    host: str
    source: str  # "node:PATH" or "local copy:PATH"
    text: str
    ip: str = ""  # the node's private address and interface: the failure catalog's fixes name them
    iface: str = ""


def logs(store: StateStore, name: str, factory: ExecutorFactory, ranks: list[int] | None,
         lines: int) -> list[NodeLog]:
    """Each selected node's log from the node, falling back to the local copy kept at stop."""
    dep = store.require(name)
    chosen = [j for j in dep.jobs if ranks is None or j.rank in ranks]
    if ranks is not None and len(chosen) != len(set(ranks)):
        raise InputError(f"no node rank {sorted(set(ranks) - {j.rank for j in chosen})} in {name} "
                         f"(ranks: {[j.rank for j in dep.jobs]})")
    # A deployment k3deploy stopped is not asked again: its logs are the local copies taken at stop.
    remote = _remote_logs(dep, chosen, factory, lines) if dep.status in ACTIVE else {}
    out = []
    for job in chosen:
        copy = store.logs_dir(name) / f"rank{job.rank}.log"
        node = {"rank": job.rank, "host": job.host, "ip": job.ip, "iface": job.iface}
        if remote.get(job.rank):
            out.append(NodeLog(**node, source=f"node:{job.log_path}", text=remote[job.rank]))
        elif copy.is_file():
            text = "\n".join(copy.read_text(errors="replace").splitlines()[-lines:])
            out.append(NodeLog(**node, source=f"local copy:{copy}", text=text))
        else:
            out.append(NodeLog(**node, source="none", text=""))
    return out


def _remote_logs(dep: Deployment, chosen: list[NodeJob], factory: ExecutorFactory, lines: int) -> dict[int, str]:
    gang = open_gang(dep, factory, ranks=[j.rank for j in chosen])
    try:
        return gang.logs(lines)
    finally:
        gang.close()
