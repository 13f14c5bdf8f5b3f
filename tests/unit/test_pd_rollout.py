"""Rollout of prefill/decode roles against a fake router in PD mode (tests/unit/fake_pd_router.py, answering as
smg 1.13.0 was seen to) and recorded instance stops and starts: prefills first, then decodes; each out of the
router and back with its role and a prefill's bootstrap port; never 0 healthy of a role; the first failure named
with its role and stage, the rest untouched; refused up front (exit 2) for a role with one instance, through
vllm-router, or for instances that moved."""
from __future__ import annotations

from pathlib import Path

import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.engines.router_api import MEMBERSHIP
from k3deploy.errors import InputError, LaunchError
from k3deploy.launch.pd_rollout import refuse, rollout_roles
from k3deploy.launch.prepare import Unit, unit_of
from k3deploy.launch.rollout import InstanceOps, RolloutFailed
from k3deploy.nodeplan.targets import ExecOverrides
from k3deploy.planning.files import require_feasible
from k3deploy.records.service import ReplicaEntry, Service, ServiceStore
from k3deploy.records.store import StateStore
from tests.k3deploy_cli import run_k3deploy
from tests.unit.fake_pd_router import FakeRouter, Worker, free_base, serving

pytestmark = pytest.mark.timeout(60)
LOCAL = Path(__file__).resolve().parents[2] / "tests" / "assets" / "pd" / "local-1p1d-smg.yaml"
ONE_P = "prefill: {instances: 1, nodes: [127.0.0.1, 127.0.0.2], parallel: {tp: 2, ep: 2}}"
ONE_D = "decode: {instances: 1, nodes: [127.0.0.3, 127.0.0.4], parallel: {tp: 2, ep: 2}}"


def _unit(tmp_path: Path, prefills: int = 2, decodes: int = 2, router: str = "smg") -> Unit:
    text = LOCAL.read_text(encoding="utf-8").replace("port: 18000", f"port: {free_base()}")
    if prefills == 2:
        text = text.replace(ONE_P, "prefill: {instances: 2, nodes: [127.0.0.1, 127.0.0.2], parallel: {tp: 1}}")
    if decodes == 2:
        text = text.replace(ONE_D, "decode: {instances: 2, nodes: [127.0.0.3, 127.0.0.4], parallel: {tp: 1}}")
    if router == "vllm-router":  # the vLLM form: the stand-in's vLLM mimic over NIXL
        text = text.replace("kind: smg", "kind: vllm-router").replace("mimic: sglang", "mimic: vllm").replace(
            "transfer: {backend: mooncake, bootstrap_port: 18998}", "transfer: {backend: nixl, side_channel_port: 5600}")
    path = tmp_path / "pd.yaml"
    path.write_text(text, encoding="utf-8")
    cat = load_catalog()
    return unit_of(require_feasible(path, cat), ExecOverrides(), cat)


def _service(unit: Unit, store: StateStore, router_url: str) -> Service:
    assert unit.plan.router is not None
    urls = unit.plan.router.settings.worker_urls
    svc = Service(name=unit.name, file=unit.plan.file, status="ready", router_kind="smg", router_url=router_url,
                  replicas=tuple(ReplicaEntry(index=i, name=p.name, url=urls[i], role=p.role, phase="ready")
                                for i, p in enumerate(unit.instances)))
    ServiceStore(store).save(svc)
    return svc


def _router(unit: Unit) -> FakeRouter:
    assert unit.plan.router is not None
    boot = dict(unit.plan.router.settings.prefill)
    return FakeRouter(workers=[Worker(f"id{i}", u, unit.roles[i], boot.get(u))
                               for i, u in enumerate(unit.plan.router.settings.worker_urls)], prompts={})


class Recorder:
    """InstanceOps that record each stop and start (and fail the start of one instance when told)."""

    def __init__(self, fail_start: int | None = None) -> None:
        self.done: list[tuple[str, int]] = []
        self.fail_start = fail_start
        self.ops = InstanceOps(stop=lambda i: self.done.append(("stop", i)), start=self._start)

    def _start(self, index: int) -> None:
        self.done.append(("start", index))
        if index == self.fail_start:
            raise LaunchError("rank 0 (127.0.0.3): engine exited during start-up (exit 1)")


def test_prefills_then_decodes_each_back_with_its_role_and_bootstrap_port(tmp_path: Path) -> None:
    unit = _unit(tmp_path)
    store = StateStore(tmp_path / "state")
    router = _router(unit)
    rec = Recorder()
    said: list[str] = []
    with serving(router, list(unit.plan.router.settings.worker_urls)) as url:  # type: ignore[union-attr]
        _service(unit, store, url)
        done = rollout_roles(unit, store, say=said.append, drain_s=10, ops=rec.ops)
    assert rec.done == [(op, i) for i in (0, 1, 2, 3) for op in ("stop", "start")]
    urls = unit.plan.router.settings.worker_urls  # type: ignore[union-attr]
    posts = [body for method, path, body in router.calls if method == "POST"]
    assert posts == [{"url": urls[0], "worker_type": "prefill", "bootstrap_port": 18998},
                     {"url": urls[1], "worker_type": "prefill", "bootstrap_port": 18999},
                     {"url": urls[2], "worker_type": "decode"}, {"url": urls[3], "worker_type": "decode"}]
    assert [m for m, _, _ in router.calls] == ["DELETE", "POST"] * 4  # each out, then back, one at a time
    assert router.fewest_healthy == {"prefill": 1, "decode": 1}
    assert sorted((w.url, w.worker_type) for w in router.workers) == sorted(zip(urls, unit.roles))
    assert done.status == "ready" and all(r.cause == "" for r in done.replicas)
    assert "prefill k3-pd-prefill0: takes part in requests through the router (its prompt-token count grew, 1 " \
        "sent)" in said, said
    assert said[-1] == "decode k3-pd-decode1: serving again"


def test_a_failed_start_stops_the_rollout_naming_instance_role_and_stage(tmp_path: Path) -> None:
    unit = _unit(tmp_path)
    store = StateStore(tmp_path / "state")
    router = _router(unit)
    rec = Recorder(fail_start=2)
    with serving(router, list(unit.plan.router.settings.worker_urls)) as url:  # type: ignore[union-attr]
        _service(unit, store, url)
        with pytest.raises(RolloutFailed, match=r"rollout stopped at k3-pd-decode0 \(decode\), stage start: "
                                                r"rank 0 \(127.0.0.3\): engine exited") as err:
            rollout_roles(unit, store, drain_s=10, ops=rec.ops)
    assert (err.value.replica, err.value.role, err.value.stage) == ("k3-pd-decode0", "decode", "start")
    assert rec.done[-1] == ("start", 2) and ("stop", 3) not in rec.done  # decode1 untouched
    svc = ServiceStore(store).load(unit.name)
    assert svc is not None and svc.status == "degraded"
    assert svc.replicas[2].cause.startswith("rollout start: ") and svc.replicas[3].cause == ""
    decode1 = unit.plan.router.settings.worker_urls[3]  # type: ignore[union-attr]
    assert [(w.worker_type, w.status) for w in router.workers if w.url == decode1] == [("decode", "ready")]


def test_no_instance_is_taken_out_while_its_role_has_no_other_healthy(tmp_path: Path) -> None:
    unit = _unit(tmp_path)
    store = StateStore(tmp_path / "state")
    router = _router(unit)
    router.workers[1].status = "unhealthy"  # prefill1 fails its health checks
    rec = Recorder()
    with serving(router, list(unit.plan.router.settings.worker_urls)) as url:  # type: ignore[union-attr]
        _service(unit, store, url)
        with pytest.raises(RolloutFailed, match=r"k3-pd-prefill0 \(prefill\), stage check: no other prefill "
                                                "instance is healthy in the router"):
            rollout_roles(unit, store, drain_s=10, ops=rec.ops)
    assert rec.done == [] and router.calls == []


def test_a_new_instance_that_fails_its_check_is_taken_out_again(tmp_path: Path) -> None:
    unit = _unit(tmp_path)
    store = StateStore(tmp_path / "state")
    router = _router(unit)
    with serving(router, list(unit.plan.router.settings.worker_urls)) as url:  # type: ignore[union-attr]
        _service(unit, store, url)
        with pytest.raises(RolloutFailed, match=r"k3-pd-prefill0 \(prefill\), stage short: fail: tool calls "
                                                "unparsed; it runs, out of the router"):
            rollout_roles(unit, store, drain_s=10, ops=Recorder().ops,
                          checks=[("short", lambda i: "fail: tool calls unparsed")])
    assert [m for m, _, _ in router.calls] == ["DELETE", "POST", "DELETE"]
    prefill0 = unit.plan.router.settings.worker_urls[0]  # type: ignore[union-attr]
    assert not any(w.url == prefill0 for w in router.workers)


def test_an_instance_out_while_the_rest_cannot_serve_goes_back_unchanged(tmp_path: Path) -> None:
    unit = _unit(tmp_path)
    store = StateStore(tmp_path / "state")
    router = _router(unit)
    router.broken = True
    rec = Recorder()
    with serving(router, list(unit.plan.router.settings.worker_urls)) as url:  # type: ignore[union-attr]
        _service(unit, store, url)
        with pytest.raises(RolloutFailed, match=r"k3-pd-prefill0 \(prefill\), stage others-serve: with "
                                                r"k3-pd-prefill0 out, a completion through the router failed "
                                                r"\(/v1/completions: HTTP 502.*k3-pd-prefill0 is back in the router"):
            rollout_roles(unit, store, drain_s=10, ops=rec.ops)
    prefill0 = unit.plan.router.settings.worker_urls[0]  # type: ignore[union-attr]
    assert rec.done == [] and [(m, b) for m, _, b in router.calls] == [
        ("DELETE", None), ("POST", {"url": prefill0, "worker_type": "prefill", "bootstrap_port": 18998})]


def test_membership_bodies_carry_the_role_and_a_prefills_bootstrap_port() -> None:
    smg = MEMBERSHIP["smg"]
    assert smg.add_json("http://a:1") == {"url": "http://a:1"}  # a replica: regular
    assert smg.add_json("http://a:1", "decode", 9) == {"url": "http://a:1", "worker_type": "decode"}
    assert smg.add_json("http://a:1", "prefill", 9) == {"url": "http://a:1", "worker_type": "prefill",
                                                        "bootstrap_port": 9}
    assert MEMBERSHIP["vllm-router"].add_json("http://a:1", "decode") is None  # its URL goes in the query
    assert MEMBERSHIP["smg"].pd_refused == "" and "add_prefill_server" in MEMBERSHIP["vllm-router"].pd_refused


@pytest.mark.parametrize(("prefills", "decodes", "role", "name"), [(1, 2, "prefill", "k3-pd-prefill0"),
                                                                    (2, 1, "decode", "k3-pd-decode0")])
def test_a_role_with_one_instance_is_refused_naming_it(tmp_path: Path, prefills: int, decodes: int, role: str,
                                                       name: str) -> None:
    unit = _unit(tmp_path, prefills, decodes)
    with pytest.raises(InputError, match=rf"roles.{role} has a single instance \({name}\): taking it out of the "
                                         "router would stop serving") as err:
        refuse(unit, None)
    assert err.value.hint is not None and "add an instance of that role" in err.value.hint


def test_rollout_through_vllm_router_is_refused_naming_its_limit(tmp_path: Path) -> None:
    unit = _unit(tmp_path, router="vllm-router")
    with pytest.raises(InputError, match="through vllm-router is refused: vllm-router 0.1.17 cannot put a "
                                         "prefill or decode worker back at runtime"):
        refuse(unit, None)


def test_instances_that_moved_since_launch_are_refused(tmp_path: Path) -> None:
    unit = _unit(tmp_path)
    store = StateStore(tmp_path / "state")
    svc = _service(unit, store, "http://127.0.0.1:1")
    moved = svc.model_copy(update={"replicas": (*svc.replicas[:3], svc.replicas[3].model_copy(
        update={"url": "http://127.0.0.4:9"}))})
    with pytest.raises(InputError, match="differ from the running service k3-pd's .*decode k3-pd-decode1 at "
                                         "http://127.0.0.4:9"):
        refuse(unit, moved)


def test_cli_refuses_rollout_of_a_single_instance_role_with_exit_2(tmp_path: Path) -> None:
    r = run_k3deploy("rollout", str(LOCAL), "--state-dir", str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert "roles.prefill has a single instance (k3-pd-prefill0)" in r.stderr, r.stderr
    assert "add an instance of that role" in r.stderr and "Traceback" not in r.stderr
