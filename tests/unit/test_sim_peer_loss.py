"""The vLLM stand-in's head after its worker node is lost, without processes: as real vLLM 0.32.0 (measured in
tests/realengine/test_health_peer_gone.py), /health 200 until a request finds the peer gone, that request
500 with vLLM's body and lines, then the engine's death (the process shuts down unless kept alive)."""

from __future__ import annotations

import pytest

from k3deploy.sim.chat_service import ApiError
from k3deploy.sim.http_api import ApiServer
from k3deploy.sim.peer_loss import LostPeer, keep_alive
from tests.unit.test_sim_chat import ask, service

pytestmark = pytest.mark.timeout(30)


def test_a_lost_peer_is_found_by_the_next_request_not_by_health() -> None:
    svc = service("vllm")
    api = ApiServer(svc, svc.log, "127.0.0.1", 0)
    try:
        deaths: list[int] = []
        svc.lost_peer = LostPeer(1, "RuntimeError: Connection closed by peer [127.0.0.1]:4242")
        svc.on_death = lambda: deaths.append(1)
        svc.state = "peer_lost"
        assert api.get("/health")[0] == api.get("/ping")[0] == 200 and deaths == []
        for _ in range(2):
            with pytest.raises(ApiError) as err:
                ask(svc, max_tokens=1)
            assert (err.value.status, err.value.kind) == (500, "InternalServerError")
            assert svc.error_body(err.value)["error"]["message"].startswith("EngineCore encountered an issue.")
        assert deaths == [1]  # the engine dies once, at the first request
        assert api.get("/health")[0] == 503  # what a kept-alive server answers afterwards
        text = svc.log.stream.getvalue()  # type: ignore[attr-defined]
        assert "Worker failed with error 'Connection closed by peer [127.0.0.1]:4242'" in text, text
        assert "EngineDeadError: EngineCore encountered an issue." in text
    finally:
        api.httpd.server_close()  # never started: nothing to shut down


def test_sglang_head_with_a_lost_peer_stays_healthy_and_stalls() -> None:
    svc = service("sglang")
    api = ApiServer(svc, svc.log, "127.0.0.1", 0)
    try:
        svc.state = "peer_lost"  # never set on SGLang (it stalls instead): not healthy there
        assert api.get("/health")[0] == 503
        svc.state = "stalled"
        assert api.get("/health")[0] == 200
    finally:
        api.httpd.server_close()  # never started: nothing to shut down


@pytest.mark.parametrize(("value", "kept"), [("1", True), ("0", False), ("", False), ("yes", False)])
def test_keep_alive_reads_vllms_integer_flag(value: str, kept: bool) -> None:
    assert keep_alive({"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": value}) is kept
    assert keep_alive({}) is False
