"""How stages reach a running deployment: rank 0's HTTP API (from here, or as rank 0 sees it when this
machine cannot reach its ip: a login node) and each node's engine log, both through the fleet."""
from __future__ import annotations

from typing import TYPE_CHECKING

from k3deploy.errors import StateError

if TYPE_CHECKING:
    from k3deploy.executors.http import NodeHttp
    from k3deploy.validate.stage import ValidateContext

LOG_LINES = 5000


def rank0_http(ctx: ValidateContext, timeout_s: float = 30.0) -> NodeHttp:
    """A client for rank 0's API (close it); asked where launch asked, re-decided when that was here."""
    from k3deploy.executors.http import NodeHttp
    from k3deploy.serving.readiness import choose_probe_from

    dep = ctx.deployment
    if dep is None or not dep.url:
        raise StateError(f"{ctx.name} is not running: no rank 0 to ask", hint=f"k3deploy launch {ctx.name}")
    where = dep.probe_from if dep.probe_from == "head" else choose_probe_from("auto", dep.url)
    head = min(j.rank for j in dep.jobs)
    return NodeHttp(dep.url, via=ctx.fleet.executor(head) if where == "head" else None, timeout_s=timeout_s,
                    on_reply=ctx.routed.on_reply)


def node_logs(ctx: ValidateContext, lines: int = LOG_LINES) -> dict[int, str]:
    """The end of every started node's engine log, read on the node (rank -> text; '' when unreadable)."""
    dep = ctx.deployment
    if dep is None:
        return {}
    out: dict[int, str] = {}
    for node in dep.nodes:
        if node.handle is None:
            continue
        try:
            out[node.rank] = ctx.fleet.executor(node.rank).read_log(node.handle, lines)
        except Exception:  # noqa: BLE001 - a node whose log cannot be read is judged on what is there
            out[node.rank] = ""
    return out


def deployment_failure(ctx: ValidateContext) -> str | None:
    """Why the deployment no longer serves when any of its engines has ended, asked on each node (rank 0's
    /health answers 200 long after a worker node is gone, and the supervisor's record may lag); the node that
    ended first is named (the supervisor stops the others after it). None while every node that answers runs."""
    from k3deploy.errors import ExecError
    from k3deploy.executors.base import exit_record
    from k3deploy.serving.readiness import cause_line, known_cause

    dep = ctx.deployment
    if dep is None:
        return None
    dead: list[tuple[tuple[int, float], str]] = []
    for node in sorted(dep.nodes, key=lambda n: n.rank):
        if node.handle is None:
            continue
        try:
            ex = ctx.fleet.executor(node.rank)
            if ex.alive(node.handle):
                continue
            tail = ex.read_log(node.handle, 400)  # vLLM's shutdown prints dozens of lines after the cause
        except ExecError:
            continue  # a node that cannot be asked is not called dead
        rec = exit_record(tail)
        why = f"its engine exited with status {rec[0]}" if rec is not None else "its engine process is gone"
        line = cause_line(tail)
        order = (0, 0.0) if rec is None else (1, rec[1])  # killed outright (no exit line) first, then by time
        said = (f"; its log says: {line}" if line else "") + known_cause(tail, node.rank, node.host)
        dead.append((order, f"rank {node.rank} ({node.host}): {why}{said}"))
    return min(dead)[1] if dead else None
