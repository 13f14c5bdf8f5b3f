"""What only a service needs before launch: the router's machine (`router.runs_on`) reachable, the router's
port and metrics port free there, and the router's interpreter able to find the router's module; and the gate
launch of a service puts them in before any instance starts."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

from k3deploy.engines.context import host_port
from k3deploy.engines.router import RouterSettings, router_table
from k3deploy.errors import ExecError, LaunchError
from k3deploy.executors.factory import ExecutorFactory, open_executor
from k3deploy.executors.fleet import NodeFleet, NodeOutcome
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.preflight.report import REFUSED_HINT, CheckResult, Report, Verdict
from k3deploy.probes import port_probe
from k3deploy.verdicts.model import EXIT_HOST
from k3deploy.verdicts.timing import timed

PROBE_TIMEOUT_S = 30.0
FIND_TIMEOUT_S = 60.0


def router_gate(name: str, settings: RouterSettings, job: NodeJob, record: Callable[[Literal["passed", "failed"]], object],
                factory: ExecutorFactory = open_executor) -> None:
    """The router's checks as launch of the service `name` runs them, before starting any instance; `record` gets
    the verdict. A check failed: LaunchError (exit 4, nothing was started); its machine could not be asked:
    ExecError (exit 3, as for any node launch cannot reach)."""
    t0 = time.monotonic()
    report = Report(name=name, checks=router_checks(settings, job, factory), elapsed_s=round(time.monotonic() - t0, 3))
    record("failed" if report.exit_code else "passed")
    if report.exit_code == EXIT_HOST:
        raise ExecError(f"preflight could not ask the router's machine, nothing was started:\n{report.summary()}",
                        hint=f"reach it (router.runs_on), then: {REFUSED_HINT}")
    if report.exit_code:
        raise LaunchError(report.refusal(), hint=REFUSED_HINT)


def router_checks(settings: RouterSettings, job: NodeJob,
                  factory: ExecutorFactory = open_executor) -> tuple[CheckResult, ...]:
    """`router-port` and `router-python` on the machine `router.runs_on` names, in one pass: the router's job
    (`job`: where it runs, its interpreter, as the unit worked it out), its module, then its machine asked; error
    rows when it cannot be reached, skip rows when its machine is a Slurm job's, placed only at launch."""
    module = router_table(settings.kind).module
    ports = (settings.port, settings.prometheus_port)
    asks_port = f"bind {', '.join(host_port(settings.listen, p) for p in ports)} (the router's port, its metrics)"
    asks_python = f"{job.engine_python} finds the module {module}"
    with NodeFleet({0: job.target}, factory) as fleet:
        reached = None if job.target.capabilities.runs_in_job else fleet.connect_all()[0]
        if reached is None:
            skip = Verdict(rank=0, host=job.host, status="skip",
                           detail="the router's node is the Slurm job's, known once launch holds it")
            port, python = (skip, 0.0), (skip, 0.0)
        elif not reached.ok:
            down = Verdict(rank=0, host=job.host, status="error",
                           detail=f"not checked: {str(reached.error).removeprefix(f'{job.host}: ')}")
            port, python = (down, 0.0), (down, 0.0)
        else:
            port = timed(_ports, job, fleet, settings.listen, ports)
            python = timed(_python, job, fleet, module)
    rows = (("router-port", "Router port", asks_port, *port),
            ("router-python", "Router interpreter", asks_python, *python))
    return tuple(CheckResult(name=name, title=title, asks=asks, verdicts=(v,), elapsed_s=seconds)
                 for name, title, asks, v, seconds in rows)


def _ports(job: NodeJob, fleet: NodeFleet, listen: str, ports: tuple[int, ...]) -> Verdict:
    """Bind each port on the router's listen address (nothing waits for a connection); who holds a taken one."""
    taken = []
    for port in ports:
        got: NodeOutcome[object] = fleet.run_probe(port_probe, ["listen", listen, str(port), "0", "0"],
                                                   timeout_s=PROBE_TIMEOUT_S)[0]
        answer = got.value if got.ok and isinstance(got.value, dict) else None
        if answer is None:
            return Verdict(rank=0, host=job.host, status="error", detail=f"not checked: {got.error}")
        if not answer["ok"]:
            taken.append(f"cannot listen on {host_port(listen, port)}: {answer['error']}{port_probe.held_by(answer)}")
    if taken:
        return Verdict(rank=0, host=job.host, status="fail", detail="; ".join(taken), problems=taken,
                       fix="stop what holds the port on the router's machine, or set router.port / "
                           "router.metrics_port to free ports")
    return Verdict(rank=0, host=job.host, status="pass",
                   detail=f"{' and '.join(host_port(listen, p) for p in ports)} free")


def _python(job: NodeJob, fleet: NodeFleet, module: str) -> Verdict:
    """The router's interpreter runs there and finds the router's module (importlib, nothing started)."""
    python = job.engine_python or "python3"
    # find_spec of a dotted name imports its parents: a missing parent package raises instead of saying None.
    code = (f"import importlib.util, sys\ntry:\n    found = importlib.util.find_spec({module!r})\n"
            "except ImportError:\n    found = None\nsys.exit(0 if found else 5)")
    got = fleet.run_all([python, "-c", code], FIND_TIMEOUT_S)[0]
    if not got.ok or got.value is None:
        return Verdict(rank=0, host=job.host, status="error", detail=f"not checked: {got.error}")
    res = got.value
    if res.exit_code == 0:
        return Verdict(rank=0, host=job.host, status="pass", detail=f"{python} finds {module}")
    said = (res.stderr.strip().splitlines() or [f"exit {res.exit_code}"])[-1]
    detail = f"{python} has no module {module}" if res.exit_code == 5 else f"{python} does not run: {said}"
    return Verdict(rank=0, host=job.host, status="fail", detail=detail,
                   fix=f"install the router in {python} on that machine, or set router.python to the "
                       "interpreter that has it")
