"""The routers' `/workers` answers (captured from smg 1.13.0 and vllm-router 0.1.17 fronting the stand-in here)
read as rows, and the membership routes each router takes."""
from __future__ import annotations

import pytest

from k3deploy.engines.router_api import (
    MEMBERSHIP,
    SERVED_BY_HEADER,
    finished_requests,
    router_workers,
    running_requests,
)

SMG = {"workers": [
    {"id": "01a231c0", "model_id": "kimi-k3-tiny", "url": "http://127.0.0.1:18500", "worker_type": "regular",
     "connection_mode": "http", "runtime_type": "sglang", "priority": 50, "cost": 1.0, "is_healthy": True,
     "status": "ready", "load": 0},
    {"id": "01a231c1", "url": "http://127.0.0.1:18600/", "is_healthy": False, "status": "draining", "load": 2}],
    "total": 2, "stats": {}}
VLLM_ROUTER = {"workers": [
    {"url": "http://127.0.0.1:18700", "model_id": "unknown", "worker_type": "regular", "is_healthy": True, "load": 0,
     "connection_mode": "Http", "priority": 50, "cost": 1.0}], "total": 1,
    "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": 1}}


@pytest.mark.timeout(10)
def test_smg_workers_read_as_rows() -> None:
    rows = router_workers(SMG)
    assert [(w.url, w.healthy, w.status, w.load) for w in rows] == [
        ("http://127.0.0.1:18500", True, "ready", 0), ("http://127.0.0.1:18600", False, "draining", 2)]


@pytest.mark.timeout(10)
def test_vllm_router_workers_and_its_url_list() -> None:
    assert [(w.url, w.healthy, w.status) for w in router_workers(VLLM_ROUTER)] == [("http://127.0.0.1:18700", True, "")]
    # /list_workers answers {"urls": [...]}: listed, no health verdict
    assert [(w.url, w.healthy) for w in router_workers({"urls": ["http://a:1"]})] == [("http://a:1", None)]
    assert router_workers("not json rows") == []


@pytest.mark.timeout(10)
def test_every_router_kind_has_membership_routes() -> None:
    assert set(MEMBERSHIP) == {"smg", "sglang-router", "vllm-router"}
    assert MEMBERSHIP["smg"].remove_method == "DELETE" and "{id}" in MEMBERSHIP["smg"].remove_path
    assert "vllm-router" not in SERVED_BY_HEADER  # it names no serving worker: launch does not claim one


@pytest.mark.timeout(10)
def test_running_requests_from_either_engines_metrics() -> None:
    page = ('# HELP vllm:num_requests_running x\nvllm:num_requests_running{model_name="m",engine="0"} 2.0\n'
            'vllm:num_requests_running{model_name="m",engine="1"} 1.0\nvllm:num_requests_waiting{m="m"} 7.0\n')
    assert running_requests(page) == 10.0  # waiting requests are still to be served: the drain waits for them
    assert running_requests('sglang:num_running_reqs{model_name="m"} 0.0\nsglang:num_queue_reqs 1.0\n') == 1.0
    assert running_requests("other_metric 1\n") is None


@pytest.mark.timeout(10)
def test_finished_requests_from_vllms_counter() -> None:
    page = ('# TYPE vllm:request_success_total counter\n'
            'vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 9.0\n'
            'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 1.0\n'
            'vllm:request_success_created{engine="0"} 1.7e9\n')
    assert finished_requests(page) == 10.0
    assert finished_requests("vllm:num_requests_running 0.0\n") is None
