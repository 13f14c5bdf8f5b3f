"""Who served a request sent through a router: the worker the router names in a response header (smg), else
the replica whose own finished-requests counter grew (vllm-router names none), else nobody (said so)."""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

POLL_S = 0.5
COUNT_LAG_S = 5.0  # an engine counts a request finished a moment after its answer went out


@dataclass
class Routed:
    """The replicas behind a router (worker URL -> replica name) and what it said of each answered request."""

    replicas: Mapping[str, str]
    header: str | None  # the router's served-by header, None when it sends none
    seen: list[str] = field(default_factory=list)  # replica names, one per answered request, in order

    def on_reply(self, path: str, headers: Mapping[str, str]) -> None:
        """A NodeHttp reply hook: note the replica the router named."""
        if self.header is None:
            return
        lowered = {k.lower(): v for k, v in headers.items()}
        url = lowered.get(self.header.lower(), "").rstrip("/")
        if url:
            self.seen.append(self.replicas.get(url, url))

    def mark(self) -> tuple[int, dict[str, float] | None]:
        """Where the record stands now (and each replica's finished count when the router names no worker)."""
        return len(self.seen), None if self.header else self._counts()

    def since(self, mark: tuple[int, dict[str, float] | None], expect: int = 1) -> list[str]:
        """The replicas that served since `mark`: named per request by the header, else those whose count grew
        (waited on briefly until `expect` requests are counted); [] when nothing says."""
        start, before = mark
        if self.header is not None:
            return self.seen[start:]
        if before is None:
            return []
        deadline = time.monotonic() + COUNT_LAG_S
        while True:
            after = self._counts() or {}
            grown = {u: after[u] - before.get(u, after[u]) for u in after}
            if sum(grown.values()) >= expect or time.monotonic() > deadline:
                return [self.replicas[u] for u, n in sorted(grown.items()) for _ in range(int(n))]
            time.sleep(POLL_S)

    def _counts(self) -> dict[str, float] | None:
        from k3deploy.serving.router_workers import finished_counts

        return finished_counts(set(self.replicas))

    @property
    def how(self) -> str:
        """How the serving replica is known, for evidence."""
        return (f"named by the router's {self.header} header" if self.header else
                "from each replica's own finished-requests counter (the router names no worker)")


def served_line(names: Sequence[str]) -> str:
    """'served by NAME-r0 (3 requests), NAME-r1 (1)' or what is known when nothing names them."""
    if not names:
        return "served by: not known (the router names no worker and the replicas count no finished requests)"
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return "served by " + ", ".join(f"{n} ({c} request{'s' if c > 1 else ''})" for n, c in sorted(counts.items()))
