"""Reading engine logs for evidence: the last line matching a pattern, an excerpt of it, and the stage result
that per-node log findings add up to."""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from k3deploy.validate.stage import StageResult
from k3deploy.verdicts.model import NodeRow, Status

EXCERPT_CHARS = 160  # argument dumps run to thousands of characters: show the part that decided


@dataclass(frozen=True)
class Found:
    """A pattern's last match in a log, with the line it is in."""

    match: re.Match[str]
    line: str

    def group(self, name: str) -> str:
        """A named group of the match ('' when it did not take part, or the pattern has no such group)."""
        return self.match.groupdict().get(name) or ""

    @property
    def evidence(self) -> str:
        """The line, cut around the match when it is long."""
        line = self.line.rstrip()
        if len(line) <= EXCERPT_CHARS:
            return line
        end = self.match.end()
        lo = max(end - EXCERPT_CHARS + 40, 0)  # the match ends at what it names: keep that and what follows
        hi = min(lo + EXCERPT_CHARS, len(line))
        return ("…" if lo else "") + line[lo:hi] + ("…" if hi < len(line) else "")


def last_match(lines: Sequence[str], patterns: Sequence[re.Pattern[str]]) -> Found | None:
    """The last line matching the first pattern that matches anywhere (patterns in order of preference)."""
    for pattern in patterns:
        for line in reversed(lines):
            match = pattern.search(line)
            if match:
                return Found(match, line)
    return None


def every_match(lines: Sequence[str], pattern: re.Pattern[str]) -> list[Found]:
    """Every line matching a pattern, in order."""
    return [Found(m, line) for line in lines if (m := pattern.search(line))]


def row(rank: int, host: str, problems: Sequence[str], detail: str, unreadable: str | None = None) -> NodeRow:
    """A node's row: error when its log could not be read, fail with problems, else pass with detail."""
    if unreadable is not None:
        return NodeRow(rank=rank, host=host, status="error", detail=unreadable, problems=[unreadable])
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return NodeRow(rank=rank, host=host, status="fail", detail=problems[0] + more, problems=list(problems))
    return NodeRow(rank=rank, host=host, status="pass", detail=detail)


def node_result(name: str, rows: list[NodeRow], passed: str, evidence: str,
                cluster_problems: Sequence[str] = ()) -> StageResult:
    """A stage over node rows (plus problems of the whole cluster); on failure every problem is evidence."""
    failed = [r for r in rows if r.status == "fail"]
    broken = [r for r in rows if r.status == "error"]
    status: Status = "fail" if failed or cluster_problems else "error" if broken else "pass"
    if status == "pass":
        return StageResult(name=name, status=status, detail=passed, nodes=rows,
                           evidence=evidence)
    bad = failed or broken
    parts = list(cluster_problems[:1]) + [f"node {r.rank} ({r.host}): {r.detail}" for r in bad[:3]]
    detail = "; ".join(parts) + (f"; and {len(bad) - 3} more nodes" if len(bad) > 3 else "")
    lines = list(cluster_problems) + [f"node {r.rank} ({r.host}): {p}" for r in bad for p in r.problems]
    return StageResult(name=name, status=status, detail=detail, nodes=rows,
                       evidence="\n".join(lines))
