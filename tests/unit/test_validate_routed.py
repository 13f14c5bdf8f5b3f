"""Who served through a router: the served-by header (smg), else each replica's finished count; the prefix-cache
stage fails when turn 2 leaves turn 1's replica."""
from __future__ import annotations

import pytest

from k3deploy.validate.routed import Routed, served_line
from k3deploy.validate.stage import StageResult

URLS = {"http://10.0.0.1:8000": "svc-r0", "http://10.0.0.3:8001": "svc-r1"}
PASSED = StageResult(name="prefix-cache", status="pass", detail="turn 2 cached 4,096 of 4,200 tokens")


class Counted(Routed):
    """A router that names no worker, over replicas whose finished counts are scripted."""

    def __init__(self, counts: list[dict[str, float]]) -> None:
        super().__init__(URLS, None)
        self.counts = counts

    def _counts(self) -> dict[str, float] | None:
        return self.counts.pop(0) if len(self.counts) > 1 else self.counts[0]


@pytest.mark.timeout(10)
def test_the_served_by_header_names_the_replica_per_request() -> None:
    routed = Routed(URLS, "x-smg-routed-worker-id")
    mark = routed.mark()
    routed.on_reply("/v1/chat/completions", {"X-SMG-Routed-Worker-Id": "http://10.0.0.3:8001/"})
    routed.on_reply("/v1/models", {"content-type": "application/json"})  # no header: nothing noted
    routed.on_reply("/v1/chat/completions", {"x-smg-routed-worker-id": "http://10.0.0.1:8000"})
    routed.on_reply("/v1/chat/completions", {"x-smg-routed-worker-id": "http://10.9.9.9:1"})  # not ours: its URL
    assert routed.since(mark) == ["svc-r1", "svc-r0", "http://10.9.9.9:1"]
    assert served_line(routed.since(mark)[:2] + ["svc-r1"]) == "served by svc-r0 (1 request), svc-r1 (2 requests)"


@pytest.mark.timeout(30)
def test_without_a_header_the_replica_whose_count_grew_served() -> None:
    routed = Counted([{"http://10.0.0.1:8000": 5, "http://10.0.0.3:8001": 7},
                      {"http://10.0.0.1:8000": 5, "http://10.0.0.3:8001": 9}])
    mark = routed.mark()
    assert routed.since(mark, expect=2) == ["svc-r1", "svc-r1"]
    assert "counter" in routed.how
    assert served_line([]).startswith("served by: not known")


@pytest.mark.timeout(10)
def test_prefix_cache_through_a_router_fails_when_turn_two_changes_replica() -> None:
    kept = Routed(URLS, None).kept_together(PASSED, [["svc-r1"], ["svc-r1"]], answered=True)
    assert kept.status == "pass" and "turn 1 and turn 2 served by svc-r1" in kept.detail
    moved = Routed(URLS, None).kept_together(PASSED, [["svc-r0"], ["svc-r1"]], answered=True)
    assert moved.status == "fail" and moved.detail.startswith("turn 1 served by svc-r0, turn 2 by svc-r1")
    assert moved.results["served_by_turn"] == [["svc-r0"], ["svc-r1"]]
    unknown = Routed(URLS, None).kept_together(PASSED, [[], []], answered=True)
    assert unknown.status == "pass" and "not known" in unknown.evidence
