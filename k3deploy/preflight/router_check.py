"""What only a service needs before launch: the router's machine (`router.runs_on`) reachable, the router's
port and metrics port free there, and the router's interpreter able to find the router's module."""
from __future__ import annotations

from k3deploy.engines.context import host_port
from k3deploy.engines.router import RouterSettings, router_table
from k3deploy.executors.fleet import NodeFleet, NodeOutcome
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.preflight.report import CheckResult, Verdict
from k3deploy.probes import port_probe
from k3deploy.verdicts.timing import timed

PROBE_TIMEOUT_S = 30.0
FIND_TIMEOUT_S = 60.0


def router_checks(job: NodeJob, fleet: NodeFleet, settings: RouterSettings) -> tuple[CheckResult, ...]:
    """`router-port` and `router-python` on the router's machine (rank 0 of `fleet`); error rows when it
    cannot be reached, skip rows when its machine is a Slurm job's, placed only at launch."""
    module = router_table(settings.kind).module
    ports = (settings.port, settings.prometheus_port)
    asks_port = f"bind {', '.join(host_port(settings.listen, p) for p in ports)} (the router's port, its metrics)"
    asks_python = f"{job.engine_python} finds the module {module}"
    if job.target.capabilities.runs_in_job:
        why = "the router's node is the Slurm job's, known once launch holds it"
        return (_one("router-port", "Router port", asks_port, Verdict(rank=0, host=job.host, status="skip", detail=why)),
                _one("router-python", "Router interpreter", asks_python,
                     Verdict(rank=0, host=job.host, status="skip", detail=why)))
    reached = fleet.connect_all()[0]
    if not reached.ok:
        down = Verdict(rank=0, host=job.host, status="error",
                       detail=f"not checked: {str(reached.error).removeprefix(f'{job.host}: ')}")
        return _one("router-port", "Router port", asks_port, down), _one("router-python", "Router interpreter",
                                                                          asks_python, down)
    port_v, port_s = timed(_ports, job, fleet, settings.listen, ports)
    python_v, python_s = timed(_python, job, fleet, module)
    return (_one("router-port", "Router port", asks_port, port_v, port_s),
            _one("router-python", "Router interpreter", asks_python, python_v, python_s))


def _one(name: str, title: str, asks: str, v: Verdict, seconds: float = 0.0) -> CheckResult:
    return CheckResult(name=name, title=title, asks=asks, verdicts=(v,), elapsed_s=seconds)


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
