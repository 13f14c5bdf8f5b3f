"""launch's wait for the router (launch/registration.py): a replica the router never lists healthy ends the
wait at its deadline with a LaunchError naming it, never a silent go-ahead (against the fake router, which
answers /workers as smg 1.13.0 does)."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from k3deploy.errors import LaunchError
from k3deploy.launch.registration import wait_registered
from tests.unit.fake_pd_router import FakeRouter, Worker, serving

pytestmark = pytest.mark.timeout(60)


def _router_job(url: str) -> Any:
    return SimpleNamespace(ready=SimpleNamespace(url=url))  # wait_registered reads only the router's URL


def test_a_replica_never_listed_healthy_fails_the_wait_naming_it() -> None:
    listed, missing = "http://127.0.0.1:18601", "http://127.0.0.1:18602"
    router = FakeRouter(workers=[Worker("w1", listed, "regular", None)], prompts={})
    with serving(router, []) as url, pytest.raises(LaunchError, match=rf"{missing} not healthy in /workers after 1 s"):
        wait_registered(_router_job(url), [listed, missing], timeout_s=1.0, rounds=0)


def test_every_replica_listed_healthy_ends_the_wait() -> None:
    urls = ["http://127.0.0.1:18611", "http://127.0.0.1:18612"]
    router = FakeRouter(workers=[Worker(f"w{i}", u, "regular", None) for i, u in enumerate(urls)], prompts={})
    with serving(router, []) as url:
        assert wait_registered(_router_job(url), urls, timeout_s=5.0, rounds=0) == set()
