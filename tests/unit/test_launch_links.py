"""A broken group is blamed on the node whose private interface is down (links.blame_link), and a failure
whose teardown could not reach a node says so (GroupFailed)."""
from __future__ import annotations

from collections.abc import Sequence

import pytest

from k3deploy.executors.base import CommandResult
from k3deploy.executors.fleet import NodeFleet
from k3deploy.executors.target import ExecTarget
from k3deploy.launch.gang import GroupFailed
from k3deploy.launch.links import blame_link
from k3deploy.nodeplan.jobs import NodeJob, jobs_for
from k3deploy.records.deployment import Failure
from tests.unit.test_render_support import plan_of, sim_doc

pytestmark = pytest.mark.timeout(60)


class Sysfs:
    """An executor that answers `cat /sys/class/net/IFACE/operstate` with one state and records the commands."""

    def __init__(self, state: str, calls: list[object]) -> None:
        self.state, self.calls = state, calls

    def run(self, command: str | Sequence[str], timeout_s: float = 60.0, **_: object) -> CommandResult:
        self.calls.append(command)
        return CommandResult(exit_code=0, stdout=f"{self.state}\n", stderr="")

    def close(self) -> None:
        pass


def fleet_with(states: list[str], calls: list[object]) -> tuple[NodeFleet, tuple[NodeJob, ...]]:
    """Four stand-in jobs whose nodes report these interface states, rank by rank."""
    jobs = jobs_for(plan_of(sim_doc()))
    given = iter(states)

    def factory(_: ExecTarget) -> Sysfs:
        return Sysfs(next(given), calls)

    return NodeFleet({j.rank: j.target for j in jobs}, factory), jobs  # type: ignore[arg-type]


def test_a_worker_whose_link_is_down_is_blamed_for_what_rank_0_reported() -> None:
    calls: list[object] = []
    fleet, jobs = fleet_with(["up", "unknown", "down", "up"], calls)
    first = Failure(rank=0, host="localhost", cause="fatal error in its log: DistStoreError: 3/4 clients joined",
                    log_tail="rank 0's lines")
    blamed = blame_link(first, fleet, jobs)
    fleet.close()
    assert (blamed.rank, blamed.host) == (2, "localhost")
    assert blamed.cause == ("its private interface lo is down; seen first: rank 0 (localhost): "
                            "fatal error in its log: DistStoreError: 3/4 clients joined")
    assert blamed.log_tail == ""  # rank 0's lines are not rank 2's
    assert calls == [["cat", "/sys/class/net/lo/operstate"]] * 4  # one argv per node, nothing for a shell


def test_the_failing_node_itself_down_keeps_its_cause_and_log() -> None:
    fleet, jobs = fleet_with(["up", "lowerlayerdown", "down", "up"], [])
    first = Failure(rank=1, host="localhost", cause="exited with status 1", log_tail="its lines")
    blamed = blame_link(first, fleet, jobs)
    fleet.close()
    assert blamed.rank == 1 and blamed.log_tail == "its lines"
    assert blamed.cause == "its private interface lo is down (lowerlayerdown); seen first: exited with status 1"


def test_no_link_down_or_an_unreachable_host_leaves_the_failure_alone() -> None:
    calls: list[object] = []
    fleet, jobs = fleet_with(["up"] * 4, calls)
    first = Failure(rank=3, host="localhost", cause="exited with status 137 (killed by SIGKILL)")
    assert blame_link(first, fleet, jobs) == first
    lost = Failure(rank=3, host="localhost", cause="unreachable: cannot connect")
    calls.clear()
    assert blame_link(lost, fleet, jobs) == lost and calls == []  # nothing asked of a host already lost
    fleet.close()


def test_a_failure_names_the_nodes_its_teardown_could_not_reach() -> None:
    failure = Failure(rank=2, host="h03", cause="unreachable: connection refused")
    assert str(GroupFailed(failure)) == "rank 2 (h03): unreachable: connection refused; every node was stopped"
    left = GroupFailed(failure, ["rank 2 (h03)"], "rank 2 (h03) may still run")
    assert str(left).endswith("every node was stopped except rank 2 (h03), which could not be reached")
    assert left.hint == "rank 2 (h03) may still run" and left.exit_code == 4
