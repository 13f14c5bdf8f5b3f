"""The real vLLM through k3deploy's Ray executor: a Ray cluster on two namespace hosts, the dense model at TP 2
across them (the same `vllm serve` processes, started by the agent actors), ready only after a completion,
validated from real log lines; then the headless node's worker child killed: every node stopped, the node named
with the failure catalog's cause and fix, no engine and no agent left (Ray's own processes stay). Five real
failures launched through Ray, each named with its cause and fix."""
from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from k3deploy.records.store import StateStore
from tests.integration.real_vllm import RealVllm, host_procs, kill_worker_child
from tests.polling import wait_for
from tests.rig import HostRig
from tests.rig.ray_cluster import RAY_ENV, RayRig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def vllm() -> Path:
    from tests.realengine.venv import require_vllm

    return require_vllm()


@pytest.fixture(scope="module")
def ray2(vllm: Path) -> Iterator[tuple[HostRig, RayRig]]:
    from tests.integration.conftest import _require_root

    _require_root()
    with HostRig(2) as rig, RayRig(rig) as cluster:
        yield rig, cluster


class RayRealVllm(RealVllm):
    """What may be left on a host is Ray itself: no engine, no agent actor."""

    def left_on_hosts(self) -> dict[str, list[str]]:
        def ours(host: str) -> list[str]:
            return [p.args[:80] for p in host_procs(self.rig, host)
                    if "bin/vllm" in p.args or "ray::NodeAgent" in p.args or "VLLM" in p.args]

        wait_for(lambda: not any(ours(h.name) for h in self.rig.hosts), 20.0)
        return {h.name: ours(h.name) for h in self.rig.hosts}


@pytest.fixture
def real(ray2: tuple[HostRig, RayRig], vllm: Path, tmp_path: Path, vllm_cache_root: Path) -> Iterator[RayRealVllm]:
    from tests.realengine.checkpoints import write_llama

    rig, cluster = ray2
    d = RayRealVllm(rig, vllm, {"llama": write_llama(tmp_path / "tiny-llama")}, tmp_path,
                    {"executor": "ray", "ray_address": cluster.address}, env={**os.environ, **RAY_ENV},
                    cache_root=vllm_cache_root)
    yield d
    problems = d.cleanup()
    assert problems == [], problems


def test_dense_tp2_through_ray_serves_and_a_killed_worker_stops_the_group_named(
        real: RayRealVllm, capsys: pytest.CaptureFixture[str]) -> None:
    topo = real.real_topology("rvr-dense")
    t0 = time.monotonic()
    run = real.run("launch", str(topo), "--json", "--skip-preflight")  # as over SSH: vLLM's import outlasts it
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    rec = json.loads(run.stdout)
    assert rec["status"] == "ready" and rec["executor"] == "ray"
    with capsys.disabled():
        print(f"\nRay: dense TP 2, launch to ready {time.monotonic() - t0:.0f} s")
    stages = real.validate(topo, "--only", "kernels,topology")
    assert stages["kernels"]["status"] == "pass" and stages["topology"]["status"] == "pass", stages
    assert [n["detail"] for n in stages["topology"]["nodes"]] == ["DP0 PP0 TP0 EPN/A", "DP0 PP0 TP1 EPN/A"]

    # The headless node's worker child (VLLM::Worker_TP1): its main process logs the death and exits 0 (the
    # killed main process itself is the SSH DP test's fault).
    kill_worker_child(real.rig, real.rig.hosts[1].name)
    t0 = time.monotonic()
    store = StateStore(real.state_dir)  # Ray's supervisor polls (no streams); its calls are slow under load
    assert wait_for(lambda: store.require("rvr-dense").status == "failed", 180), store.require("rvr-dense")
    status = real.failed_status(topo, "rvr-dense", 1, real.rig.hosts[1].mgmt_ip)
    assert status["failure"]["cause"].startswith("exited with status 0 (a serving engine never ends"), status
    seconds = real.killed_worker_named("rvr-dense", 1)
    with capsys.disabled():
        print(f"Ray: worker child killed, group stopped after {time.monotonic() - t0:.0f} s, "
              f"named {seconds:.1f} s after its node ended")
    left = real.left_on_hosts()
    assert not any(left.values()), left


def test_real_failures_through_ray_are_named_with_their_cause_and_fix(
        real: RayRealVllm, capsys: pytest.CaptureFixture[str]) -> None:
    seconds = real.real_failures("rvrf")
    with capsys.disabled():
        print("\nRay: node end to failure named: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))
