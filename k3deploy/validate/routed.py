"""Who served a request sent through a router: the worker the router names in a response header (smg), else
the replica whose own finished-requests counter grew (vllm-router names none), else nobody (said so). A
deployment alone serves its own (validate/stage.py's Alone)."""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from k3deploy.validate.stage import Mark, StageResult

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

    def mark(self) -> Mark:
        """Where the record stands now (and each replica's finished count when the router names no worker)."""
        return len(self.seen), None if self.header else self._counts()

    def since(self, mark: Mark, expect: int = 1) -> list[str]:
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

    def served(self, result: StageResult, names: list[str]) -> StageResult:
        """The stage's result naming the replicas that served its requests."""
        line = served_line(names)
        counts = {n: names.count(n) for n in sorted(set(names))}
        return result.model_copy(update={
            "detail": f"{result.detail}; {line}", "evidence": f"{line} ({self.how})\n{result.evidence}".rstrip(),
            "results": {**result.results, "served_by": counts}})

    def kept_together(self, result: StageResult, who: list[list[str]], answered: bool) -> StageResult:
        """Turn 2 served by the replica that served turn 1 (that is what makes it hit), or a fail."""
        turns = [sorted(set(w)) for w in who]
        results = {**result.results, "served_by_turn": turns}
        if not answered or len(turns) < 2:
            return result.model_copy(update={"results": results})
        if not turns[0] or not turns[1]:
            line = "which replica served each turn is not known (the router names no worker, the replicas count none)"
            return result.model_copy(update={"results": results, "evidence": f"{line}\n{result.evidence}"})
        if turns[0] == turns[1]:
            line = f"turn 1 and turn 2 served by {', '.join(turns[0])}"
            return result.model_copy(update={"results": results, "detail": f"{result.detail}; {line}",
                                              "evidence": f"{line}\n{result.evidence}"})
        line = (f"turn 1 served by {', '.join(turns[0])}, turn 2 by {', '.join(turns[1])}: the router did not keep "
                "the conversation on one replica (router.policy cache_aware keeps a shared prefix together)")
        detail = line if result.status == "pass" else f"{line}; {result.detail}"
        return result.model_copy(update={"status": "fail", "detail": detail, "results": results,
                                         "evidence": f"{line}\n{result.evidence}"})


def served_line(names: Sequence[str]) -> str:
    """'served by NAME-r0 (3 requests), NAME-r1 (1)' or what is known when nothing names them."""
    if not names:
        return "served by: not known (the router names no worker and the replicas count no finished requests)"
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return "served by " + ", ".join(f"{n} ({c} request{'s' if c > 1 else ''})" for n, c in sorted(counts.items()))
