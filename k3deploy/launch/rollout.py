"""`k3deploy rollout`: one replica at a time out of the router (its requests drained, bounded), stopped,
started again (from the topology file as it is now), a real completion through it, back into the router and
healthy there; never fewer than N-1 serving. Between the completion and the router, the caller's checks (the
`short` validate stage, straight to the new replica) run. The first failure stops the rollout, naming replica and stage."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from k3deploy.errors import ExecError, LaunchError
from k3deploy.executors.factory import ExecutorFactory, open_executor
from k3deploy.executors.http import NodeHttp
from k3deploy.launch.membership import put_back, take_out
from k3deploy.launch.prepare import Unit
from k3deploy.launch.service import start_replica, stop_deployment
from k3deploy.records.service import Service, ServiceStore
from k3deploy.records.store import StateStore
from k3deploy.serving.router_workers import workers_of

DRAIN_TIMEOUT_S = 120.0
Say = Callable[[str], None]
# (stage name, check of replica index I: None when it passed, else why not), run before it is put back.
ReplicaCheck = tuple[str, Callable[[int], "str | None"]]


class RolloutFailed(LaunchError):
    """One replica (or prefill/decode instance) failed a stage: the rollout stopped there (the others serve)."""

    def __init__(self, replica: str, stage: str, cause: str, role: str = "") -> None:
        super().__init__(f"rollout stopped at {replica}" + (f" ({role})" if role else "") + f", stage {stage}: "
                         f"{cause}", hint=f"the other {'instances' if role else 'replicas'} still serve; see "
                         f"k3deploy status {replica} and k3deploy logs {replica}")
        self.replica, self.stage, self.role = replica, stage, role


@dataclass(frozen=True)
class InstanceOps:
    """Stopping and starting replica (or instance) I, its deployment: rollout's only side effects past the
    router."""

    stop: Callable[[int], None]
    start: Callable[[int], None]


def deployment_ops(unit: Unit, store: StateStore, factory: ExecutorFactory = open_executor,
                   skip_preflight: bool = True) -> InstanceOps:
    """Stop and start as launch does (start: gang, readiness with a real completion, supervisor; one try)."""
    def stop(index: int) -> None:
        stop_deployment(store, unit.instances[index].name, factory)

    def start(index: int) -> None:
        start_replica(unit, index, store, factory=factory, skip_preflight=skip_preflight, tries=1)

    return InstanceOps(stop=stop, start=start)


def healthy_others(http: NodeHttp, svc: Service, url: str, role: str | None = None) -> int:
    """How many of the service's other instances (of `role` only, when given) the router lists healthy."""
    rows, _ = workers_of(http)
    others = {r.url.rstrip("/") for r in svc.replicas if role is None or r.role == role} - {url}
    return sum(1 for w in rows if w.url in others and w.healthy)


def noting(index: int, cause: str) -> Callable[[Service], Service]:
    """The record change that says why replica or instance I is out of the router ("": it serves again)."""
    return lambda s: s.with_replica(index, cause=cause, **({} if cause else {"phase": "ready"}))


class Steps:
    """The stage under way for one replica or instance (a failure names it), each announced as it starts."""

    def __init__(self, label: str, say: Say) -> None:
        self.label, self.say, self.stage = label, say, "check"

    def __call__(self, stage: str, line: str) -> None:
        self.stage = stage
        self.say(f"{self.label}: {line}")


def restart(ops: InstanceOps, index: int, steps: Steps) -> None:
    """Stop replica or instance I, then start it."""
    steps("stop", "stopping")
    ops.stop(index)
    steps("start", "starting")
    ops.start(index)


def run_checks(checks: Sequence[ReplicaCheck], index: int, steps: Steps, how: str = "") -> None:
    """Each check of replica or instance I in turn; ExecError at the first that fails."""
    for stage, check in checks:
        steps(stage, f"validate stage {stage}{how}")
        why = check(index)
        if why is not None:
            raise ExecError(why)


def running(services: ServiceStore, unit: Unit) -> Service:
    """The service's record, when it is ready or degraded (LaunchError otherwise)."""
    svc = services.load(unit.name)
    if svc is None or svc.status not in ("ready", "degraded"):
        raise LaunchError(f"{unit.name} is not a running service ({svc.status if svc else 'no record'})",
                          hint=f"k3deploy launch {unit.plan.file}")
    return svc


def rollout(unit: Unit, store: StateStore, *, factory: ExecutorFactory = open_executor,
            say: Say = lambda _: None, drain_s: float = DRAIN_TIMEOUT_S, skip_preflight: bool = True,
            checks: Sequence[ReplicaCheck] = (), ops: InstanceOps | None = None) -> Service:
    """Restart every replica in turn behind the running router; RolloutFailed at the first failed stage (a
    failed check keeps the new replica out of the router)."""
    services = ServiceStore(store)
    svc = running(services, unit)
    ops = ops or deployment_ops(unit, store, factory, skip_preflight)
    kind, ready_s = svc.router_kind, unit.plan.topology.launch.ready_timeout_s
    with NodeHttp(svc.router_url) as http:
        for rep in svc.replicas:
            url, steps = rep.url.rstrip("/"), Steps(rep.name, say)
            try:
                if len(svc.replicas) > 1 and healthy_others(http, svc, url) < len(svc.replicas) - 1:
                    raise ExecError("another replica is not healthy in the router: taking this one out would "
                                    "leave fewer than N-1 serving")
                steps("drain", "out of the router, draining")
                take_out(http, kind, url, drain_s)
                restart(ops, rep.index, steps)
                run_checks(checks, rep.index, steps)
                steps("register", "back into the router")
                put_back(http, kind, url, ready_s)
            except (ExecError, LaunchError) as exc:
                services.update(unit.name, noting(rep.index, f"rollout {steps.stage}: {exc}"))
                raise RolloutFailed(rep.name, steps.stage, str(exc)) from None
            services.update(unit.name, noting(rep.index, ""))  # a cause left by an earlier rollout is gone
            say(f"{rep.name}: serving again")
    return services.update(unit.name, lambda s: s.model_copy(update={"status": "ready"}))
