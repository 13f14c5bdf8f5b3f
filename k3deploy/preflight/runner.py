"""Run every check on every node at once: connect, one facts probe per node, judge, then the port and
the collective probe with the engine's environment; a Report."""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from k3deploy.catalog.specs import Catalog
from k3deploy.executors.base import Executor
from k3deploy.executors.fleet import NODE_PYTHON, NodeFleet, parse_probe_output, probe_source
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.planning.plan import Plan
from k3deploy.preflight import rendezvous
from k3deploy.preflight.accelerators import TOOL_OF_VENDOR, TOOL_QUERIES
from k3deploy.preflight.checks_host import HOST_CHECKS
from k3deploy.preflight.checks_stack import STACK_CHECKS
from k3deploy.preflight.context import Context
from k3deploy.preflight.report import CheckResult, Report, Verdict
from k3deploy.probes import engine_probe, node_facts
from k3deploy.verdicts.timing import timed

FACTS_TIMEOUT_S = 90.0
COLLECTIVE_BYTES = 16 * 2**20
COLLECTIVE_TIMEOUT_S = 20.0
CheckSink = Callable[[CheckResult], None]


def facts_spec(ctx: Context, node: NodeJob) -> dict[str, Any]:
    """What the facts probe asks this node."""
    t = ctx.plan.topology
    tools = {name: [list(q) for q in TOOL_QUERIES[name]] for name in TOOL_OF_VENDOR.get(ctx.vendor, ())}
    if t.engine.image:  # the engine's version is the image's: compare what each node would run
        tools["docker"] = [["docker", "image", "inspect", "--format", "{{.Id}}", t.engine.image]]
    query = None
    if node.engine_python is not None:
        mimic = getattr(t.engine, "mimic", "")
        query = [node.engine_python, "-c", probe_source(engine_probe), t.engine.kind, mimic]
    return {"iface": node.iface, "model_path": t.model.path, "tools": tools, "engine_query": query}


def gather(ctx: Context, fleet: NodeFleet, ranks: Sequence[int]) -> None:
    """Run the facts probe on the given ranks; fill ctx.facts, ctx.errors and ctx.clock."""
    source = probe_source(node_facts)

    def one(rank: int, ex: Executor) -> tuple[float, Any, float]:
        before = time.time()
        spec = json.dumps(facts_spec(ctx, ctx.nodes[rank]))
        value = parse_probe_output(ex.run([NODE_PYTHON, "-c", source, spec], FACTS_TIMEOUT_S), ex.host)
        return before, value, time.time()

    for rank, o in fleet.map(one, ranks).items():
        if o.ok and o.value is not None:
            before, ctx.facts[rank], after = o.value
            ctx.clock[rank] = (before, after)
        else:
            ctx.errors[rank] = str(o.error).removeprefix(f"{fleet.host(rank)}: ")


def run_preflight(plan: Plan, catalog: Catalog, jobs: Sequence[NodeJob], fleet: NodeFleet, *,
                  on_check: CheckSink | None = None, collective_bytes: int = COLLECTIVE_BYTES,
                  collective_timeout_s: float = COLLECTIVE_TIMEOUT_S) -> Report:
    """Every check on every node (the fleet may already be connected: connecting again is a no-op)."""
    t0 = time.monotonic()
    nodes = {j.rank: j for j in jobs}
    ctx = Context(plan=plan, catalog=catalog, nodes=nodes,
                  ray_runtime=any(fleet.executor(r).capabilities.ray_runtime for r in nodes))
    for rank, o in fleet.connect_all().items():
        if not o.ok:
            ctx.errors[rank] = str(o.error).removeprefix(f"{fleet.host(rank)}: ")
    gather(ctx, fleet, [r for r in sorted(nodes) if r not in ctx.errors])
    results: list[CheckResult] = []

    def add(result: CheckResult, seconds: float) -> None:
        result = result.model_copy(update={"elapsed_s": seconds})
        results.append(result)
        if on_check is not None:
            on_check(result)

    for check in (*HOST_CHECKS, *STACK_CHECKS):
        add(*timed(check.run, ctx))
    reachable = [r for r in sorted(nodes) if r not in ctx.errors]
    port = plan.topology.launch.port

    def port_check() -> CheckResult:
        if min(nodes) in reachable:
            verdicts = rendezvous.port_check(fleet, nodes, port, reachable)
        else:
            verdicts = _skipped(nodes, "the head is unreachable")
        return CheckResult(name="port", title="Rendezvous port", asks=f"listen on the head's ip:{port}; connect "
                           "from every worker", verdicts=_fill(nodes, verdicts, ctx.errors))

    add(*timed(port_check))
    measured: dict[int, dict[str, Any]] = {}
    failed = [r.name for r in results if r.status in ("fail", "error")]

    def collective_check() -> CheckResult:
        if failed:
            verdicts = _skipped(nodes, f"skipped until these pass: {', '.join(failed)}")
        elif any(n.engine_python is None for n in nodes.values()):
            verdicts = _skipped(nodes, "the engine runs in a container image: its interpreter is not on the host")
        else:
            verdicts, found = rendezvous.collective_check(fleet, nodes, port, nbytes=collective_bytes,
                                                          timeout_s=collective_timeout_s, backends=_backends(ctx))
            measured.update(found)
        return CheckResult(name="rendezvous", title="Rendezvous probe", asks=f"torch.distributed "
                           f"{_backends(ctx)} all_reduce at the engine's rendezvous address with its env",
                           verdicts=verdicts)

    add(*timed(collective_check))
    return Report(name=plan.topology.name, checks=tuple(results), elapsed_s=round(time.monotonic() - t0, 3),
                  measurements=measured)


def _backends(ctx: Context) -> str:
    """Gloo always (the engines' CPU group); NCCL too where NVIDIA or AMD accelerators are used, HCCL on Ascend
    (the probe skips it, saying so, where the engine's interpreter has no torch_npu)."""
    accel = {"nvidia": ",nccl", "amd": ",nccl", "huawei": ",hccl"}.get(ctx.vendor, "")
    return f"gloo{accel}"


def _skipped(nodes: dict[int, NodeJob], why: str) -> tuple[Verdict, ...]:
    return tuple(Verdict(rank=r, host=n.host, status="skip", detail=why) for r, n in sorted(nodes.items()))


def _fill(nodes: dict[int, NodeJob], verdicts: tuple[Verdict, ...], errors: dict[int, str]) -> tuple[Verdict, ...]:
    """Add an error verdict for every unreachable node the verdicts leave out."""
    have = {v.rank for v in verdicts}
    extra = [Verdict(rank=r, host=nodes[r].host, status="error", detail=f"not checked: {errors[r]}")
             for r in errors if r not in have]
    return tuple(sorted((*verdicts, *extra), key=lambda v: v.rank))
