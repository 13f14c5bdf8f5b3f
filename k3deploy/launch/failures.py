"""Which node of a group failed first, and the error that tears the group down naming it."""
from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass

from k3deploy.errors import LaunchError
from k3deploy.executors.base import exit_record
from k3deploy.nodeplan.jobs import NodeJob
from k3deploy.records.deployment import Failure
from k3deploy.serving.readiness import cause_line, fatal_line, known_cause

ENDED_CAUSE = "; its log says: "  # before the line that says why an engine ended


class GroupFailed(LaunchError):
    """The group was torn down; `failure` names the node that failed first (when there is one), `left` the
    nodes the teardown could not reach (`rank N (host)`), which may still run."""

    def __init__(self, failure: Failure, left: Sequence[str] = (), hint: str | None = None) -> None:
        self.failure = failure
        who = f"rank {failure.rank} ({failure.host})" if failure.rank is not None else "the deployment"
        but = f" except {', '.join(left)}, which could not be reached" if left else ""
        text = f"{who}: {failure.cause}; every node was stopped{but}"
        if failure.log_tail.strip():
            text += f"\n--- last lines of {failure.host}'s log ---\n{failure.log_tail.rstrip()}"
        super().__init__(text, hint=hint)


@dataclass(frozen=True)
class Probe:
    """One node seen in one polling round; alive None means the host could not be asked."""

    job: NodeJob
    alive: bool | None
    log: str = ""
    error: str = ""


def first_failure(probes: Sequence[Probe], unreachable_counts: bool = True) -> Failure | None:
    """The node that failed first: earliest exit (a node killed outright, with no exit record, first), then
    a fatal log line, then an unreachable host."""
    dead = [p for p in probes if p.alive is False]
    if dead:
        def order(p: Probe) -> tuple[int, float]:
            rec = exit_record(p.log)
            return (0, 0.0) if rec is None else (1, rec[1])

        p = min(dead, key=order)
        rec = exit_record(p.log)
        cause = (f"exited with status {rec[0]}" + _signal_note(rec[0]) if rec is not None
                 else "its process is gone (killed; no exit status was recorded)")
        if rec is not None and rec[0] == 0:  # vLLM's headless node exits 0 after its worker died
            cause += " (a serving engine never ends on its own: it failed)"
        why = cause_line(p.log)
        if why:
            cause += ENDED_CAUSE + why
        cause += known_cause(p.log, p.job.rank, p.job.host, p.job.ip, p.job.iface)
        return Failure(rank=p.job.rank, host=p.job.host, cause=cause, log_tail=p.log)
    for p in probes:
        line = fatal_line(p.log) if p.alive else None
        if line:
            named = known_cause(line, p.job.rank, p.job.host, p.job.ip, p.job.iface)
            return Failure(rank=p.job.rank, host=p.job.host, cause=f"fatal error in its log: {line}{named}",
                           log_tail=p.log)
    lost = [p for p in probes if p.alive is None]
    if lost and unreachable_counts:
        return Failure(rank=lost[0].job.rank, host=lost[0].job.host, cause=f"unreachable: {lost[0].error}")
    return None


def _signal_note(status: int) -> str:
    if status > 128:
        try:
            return f" (killed by {signal.Signals(status - 128).name})"
        except ValueError:
            return ""
    return ""
