"""One status model: a unit's status now, as one function of its record's, its instances' and its router's."""
from __future__ import annotations

import pytest

from k3deploy.records.status import InstanceStatus, Status, unit_status

REPLICA_UP, REPLICA_OUT = InstanceStatus("", True), InstanceStatus("", False)


@pytest.mark.parametrize("recorded", ["starting", "ready", "restarting", "failed", "stopping", "stopped"])
def test_one_instance_without_a_router_is_as_its_record_says(recorded: Status) -> None:
    serving = InstanceStatus("", recorded == "ready")
    assert unit_status(recorded, [serving], None) == recorded


def test_every_replica_serving_keeps_the_recorded_status() -> None:
    assert unit_status("ready", [REPLICA_UP, REPLICA_UP], True) == "ready"


def test_some_replicas_out_is_degraded_and_none_serving_is_failed() -> None:
    assert unit_status("ready", [REPLICA_UP, REPLICA_OUT], True) == "degraded"
    assert unit_status("ready", [REPLICA_OUT, REPLICA_OUT], True) == "failed"


def test_a_router_that_does_not_answer_fails_the_service_whatever_its_replicas() -> None:
    assert unit_status("ready", [REPLICA_UP, REPLICA_UP], False) == "failed"


def test_a_role_with_no_instance_serving_fails_the_service() -> None:
    prefill_up, decode_up, decode_out = (InstanceStatus("prefill", True), InstanceStatus("decode", True),
                                         InstanceStatus("decode", False))
    assert unit_status("ready", [prefill_up, decode_out], True) == "failed"
    assert unit_status("ready", [prefill_up, decode_up, decode_out], True) == "degraded"


@pytest.mark.parametrize("recorded", ["failed", "stopped"])
def test_an_ended_unit_is_as_recorded_whatever_is_seen_now(recorded: Status) -> None:
    assert unit_status(recorded, [REPLICA_OUT], False) == recorded
