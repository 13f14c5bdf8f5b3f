"""A broken group blamed on the node whose private link is down, whichever node's collective gave up first."""
from __future__ import annotations

from collections.abc import Sequence

from k3deploy.executors.base import Executor
from k3deploy.executors.fleet import NodeFleet
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.records.deployment import Failure

# /sys/class/net/IFACE/operstate of a pulled cable, a port the switch shut, or `ip link set down`.
DOWN = ("down", "lowerlayerdown")
CHECK_TIMEOUT_S = 10.0


def links_down(fleet: NodeFleet, jobs: Sequence[NodeJob]) -> dict[int, str]:
    """Rank -> operstate of each node whose `iface` is down (asked on every node at once; a node that cannot
    be asked is left out)."""
    ifaces = {j.rank: j.iface for j in jobs if j.iface}

    def one(rank: int, ex: Executor) -> str:
        res = ex.run(["cat", f"/sys/class/net/{ifaces[rank]}/operstate"], timeout_s=CHECK_TIMEOUT_S)
        return res.stdout.strip() if res.exit_code == 0 else ""

    outs = fleet.map(one, ifaces)
    return {rank: o.value for rank, o in sorted(outs.items()) if o.value in DOWN}


def blame_link(failure: Failure, fleet: NodeFleet, jobs: Sequence[NodeJob]) -> Failure:
    """`failure`, or the failure of the node whose private interface is down (its peers' collectives time out
    waiting for it, and one of them may well report first). The log tail is left to the caller."""
    if failure.cause.startswith("unreachable"):  # asking again would only wait on the lost host
        return failure
    down = links_down(fleet, jobs)
    if not down:
        return failure
    rank = failure.rank if failure.rank in down else min(down)
    job = next(j for j in jobs if j.rank == rank)
    state = "" if down[rank] == "down" else f" ({down[rank]})"
    first = "" if rank == failure.rank else f"rank {failure.rank} ({failure.host}): "
    return Failure(rank=rank, host=job.host,
                   cause=f"its private interface {job.iface} is down{state}; seen first: {first}{failure.cause}",
                   log_tail=failure.log_tail if rank == failure.rank else "")
