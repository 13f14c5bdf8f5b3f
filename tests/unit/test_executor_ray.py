"""Ray executor without a cluster: node matching by IP, one message per Ray failure, the agent's shell and
log streams run as plain Python, and the watchdog that stops an engine whose agent died."""
from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from k3deploy.errors import ExecError
from k3deploy.executors import RayTarget, open_executor, ray_agent
from k3deploy.executors.base import ProcessHandle, exit_record
from k3deploy.executors.local import LocalExecutor
from k3deploy.nodeplan.targets import ExecOverrides, targets_for
from k3deploy.records.owner import start_ticks

pytest.importorskip("ray", reason="the Ray executor's tests need Ray installed (pip install 'k3deploy[ray]')")
from k3deploy.executors.ray_actors import watchdog
from k3deploy.executors.ray_exec import RayExecutor
from k3deploy.executors.ray_session import (
    CLIENT_INIT_TRIES,
    describe_nodes,
    init_error,
    init_retrying,
    match_node,
    probe,
)
from k3deploy.topology.loader import parse_topology
from tests.ports import closed_port
from tests.unit.test_launch_support import kill_tagged, tagged_pids


def _node(ip: str, alive: bool = True, node_id: str | None = None) -> dict[str, object]:
    return {"NodeID": node_id or f"id-{ip}-{alive}", "Alive": alive, "NodeManagerAddress": ip}


def _wait(pred: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / 0.05) + 2):
        if pred():
            return True
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return pred()


def test_a_node_maps_to_the_one_alive_ray_node_with_its_ip() -> None:
    nodes = [_node("10.0.0.1"), _node("10.0.0.2", alive=False, node_id="old"), _node("10.0.0.2", node_id="new")]
    assert match_node(nodes, "10.0.0.2", "h2") == "new"  # a restarted node: the dead entry stays in the table


def test_an_ip_ray_does_not_know_is_refused_listing_what_it_sees() -> None:
    nodes = [_node("10.0.0.10"), _node("10.0.0.9"), _node("192.168.1.5", alive=False)]
    with pytest.raises(ExecError) as err:
        match_node(nodes, "10.0.0.99", "h4")
    text = str(err.value)
    assert text.startswith("h4: no Ray node has IP 10.0.0.99")
    assert text.endswith("Ray sees: 10.0.0.9 (alive), 10.0.0.10 (alive), 192.168.1.5 (dead)")
    assert err.value.host == "h4" and "--node-ip-address" in (err.value.hint or "")


def test_a_dead_or_ambiguous_ray_node_is_refused() -> None:
    with pytest.raises(ExecError, match=r"^h1: the Ray node with IP 10.0.0.1 is dead; Ray sees: 10.0.0.1 \(dead\)"):
        match_node([_node("10.0.0.1", alive=False)], "10.0.0.1", "h1")
    with pytest.raises(ExecError, match=r"2 alive Ray nodes have IP 10.0.0.1"):
        match_node([_node("10.0.0.1", node_id="a"), _node("10.0.0.1", node_id="b")], "10.0.0.1", "h1")
    assert describe_nodes([]) == "no nodes"
    many = describe_nodes([_node(f"10.0.1.{i}") for i in range(40)])
    assert many.endswith("and 8 more") and many.startswith("10.0.1.0 (alive), 10.0.1.1 (alive)")


def test_version_mismatch_says_which_versions() -> None:
    from ray._private.utils import check_version_info

    with pytest.raises(RuntimeError) as raised:  # Ray's own check, with a cluster from another release
        check_version_info({"ray_version": "2.9.3", "python_version": "3.10.12"}, "node 10.0.0.1:6379")
    err = init_error(raised.value, "10.0.0.1:6379", "h1")
    import ray

    assert str(err).startswith("h1: Ray version mismatch with the cluster at 10.0.0.1:6379: the cluster runs "
                               "Ray 2.9.3, Python 3.10.12, this k3deploy runs Ray " + ray.__version__)
    assert "\n" not in str(err)


@pytest.mark.parametrize(("raised", "expected"), [
    (ConnectionError("Could not find any running Ray instance. Please specify the one to connect to by "
                     "setting `--address` flag or `RAY_ADDRESS` environment variable."),
     "no Ray cluster found from this machine (ray address auto)"),
    (ValueError("Ray Client requires pip package `ray[client]`. If you installed the minimal Ray ..."),
     "ray://h:10001 needs the Ray client, which this Ray install lacks"),
    (RuntimeError("No node info found matching attributes: '10.1.1.1' when trying to resolve node to connect to."),
     "this machine is not a node of the Ray cluster at ray://h:10001"),
    (RuntimeError("something else\nwith details"),
     "cannot connect to the Ray cluster at ray://h:10001: RuntimeError: something else"),
])
def test_each_way_ray_init_fails_is_one_message(raised: Exception, expected: str) -> None:
    err = init_error(raised, "ray://h:10001", "h1")
    assert isinstance(err, ExecError) and expected in str(err) and "\n" not in str(err)


SERVER_INIT_FAILED = ConnectionAbortedError(
    "Initialization failure from server:\nTraceback (most recent call last):\n  ...\nRuntimeError: Starting Ray "
    "client server failed. See ray_client_server_23000.err for detailed logs.")  # Ray's client, worker.py


def _failing_init(failures: list[Exception]) -> tuple[Callable[[], None], list[int]]:
    """An init that raises the given exceptions in turn, then succeeds; and the list of its calls."""
    calls: list[int] = []

    def init() -> None:
        calls.append(1)
        if len(calls) <= len(failures):
            raise failures[len(calls) - 1]

    return init, calls


def test_a_client_server_that_fails_to_set_up_this_client_is_asked_again() -> None:
    init, calls = _failing_init([SERVER_INIT_FAILED] * (CLIENT_INIT_TRIES - 1))
    init_retrying(init, "ray://h:10001", "h1", backoff_s=0)
    assert len(calls) == CLIENT_INIT_TRIES


def test_the_client_server_retry_is_bounded_and_other_failures_are_not_retried() -> None:
    init, calls = _failing_init([SERVER_INIT_FAILED] * (CLIENT_INIT_TRIES + 1))
    with pytest.raises(ExecError) as err:
        init_retrying(init, "ray://h:10001", "h1", backoff_s=0)
    assert len(calls) == CLIENT_INIT_TRIES
    assert str(err.value) == ("h1: cannot connect to the Ray cluster at ray://h:10001: ConnectionAbortedError: "
                              f"Initialization failure from server: ({CLIENT_INIT_TRIES} tries)")
    assert "ray_client_server" in (err.value.hint or "")
    init, calls = _failing_init([ConnectionError("Could not find any running Ray instance.")])
    with pytest.raises(ExecError, match="no Ray cluster found"):
        init_retrying(init, "auto", "h1", backoff_s=0)
    assert len(calls) == 1


def test_an_unreachable_gcs_fails_at_once_naming_the_address() -> None:
    port = closed_port()
    ex = RayExecutor(RayTarget(host="h1", node_ip="10.0.0.1", ray_address=f"127.0.0.1:{port}"))
    t0 = time.monotonic()
    with pytest.raises(ExecError) as err:
        ex.connect()  # ray.init itself would wait minutes here
    assert time.monotonic() - t0 < 30  # the probe's 5 s at most, on a busy machine too
    assert str(err.value) == f"h1: cannot reach the Ray cluster at 127.0.0.1:{port}: connection refused"
    assert "ray status --address" in (err.value.hint or "")
    with pytest.raises(ExecError, match="is not auto, HOST:PORT or ray://HOST:PORT"):
        probe("headnode", "h1")
    import ray

    assert not ray.is_initialized()


def test_targets_carry_the_node_ip_and_the_cli_ray_address() -> None:
    import yaml

    doc = {"name": "t", "model": {"id": "kimi-k3-tiny", "path": "/m"}, "hardware": {"gpu": "sim", "gpus_per_node": 1},
           "nodes": [{"host": "a", "ip": "10.0.0.1", "iface": "eth0"}, {"host": "b", "ip": "10.0.0.2", "iface": "eth0"}],
           "engine": {"kind": "sim"}, "launch": {"executor": "ray", "ray_address": "10.0.0.1:6379"}}
    t = parse_topology(yaml.safe_dump(doc), "t.yaml").topology
    plain = targets_for(t)
    assert [(x.kind, x.node_ip, x.ray_address) for x in plain.values()] == [
        ("ray", "10.0.0.1", "10.0.0.1:6379"), ("ray", "10.0.0.2", "10.0.0.1:6379")]
    cli = targets_for(t, ExecOverrides(ray_address="ray://head:10001"))
    assert {x.ray_address for x in cli.values()} == {"ray://head:10001"}
    assert isinstance(open_executor(plain[0]), RayExecutor)


def test_the_agent_module_needs_only_the_standard_library() -> None:
    # It is shipped to the nodes by value: a cluster needs Ray, not k3deploy.
    tree = ast.parse(Path(ray_agent.__file__).read_text())
    top = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    top |= {n.module.split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
    assert top - {"__future__"} <= set(sys.stdlib_module_names), top


def test_agent_shell_runs_scripts_and_times_out() -> None:
    agent = ray_agent.NodeAgent()
    assert agent.run("echo out; echo err >&2; exit 3", 10) == (3, "out\n", "err\n")
    t0 = time.monotonic()
    code, _, _ = agent.run("sleep 30", 0.3)
    assert code is None and time.monotonic() - t0 < 25  # not the 30 s sleep: the driver raises CommandTimeout


def test_agent_log_stream_delivers_chunks_then_ends(tmp_path: Path) -> None:
    agent = ray_agent.NodeAgent()
    sid = agent.stream_open("for i in 1 2 3; do echo line$i; sleep 0.1; done")
    data, ended = b"", False
    for _ in range(100):
        chunk, ended = agent.stream_read(sid, 0.2)
        data += chunk
        if ended:
            break
    assert ended and data.decode().split() == ["line1", "line2", "line3"]
    assert agent.stream_read(sid, 0) == (b"", True)  # closed once it ended
    other = agent.stream_open("sleep 30")
    assert agent.stream_read(other, 0.05) == (b"", False)
    agent.stream_close(other)
    agent.stream_close(other)  # idempotent


def test_agent_env_is_the_nodes_not_the_ray_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    raylet = subprocess.Popen(["sleep", "30"], env={"PATH": "/usr/bin:/bin", "NODE_VAR": "1"})
    try:
        # Until the child has exec'd, /proc/PID/environ is still the fork's copy of ours.
        assert _wait(lambda: Path(f"/proc/{raylet.pid}/cmdline").read_bytes().startswith(b"sleep"), 10)
        monkeypatch.setenv("RAY_RAYLET_PID", str(raylet.pid))
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what Ray sets in a zero-CPU worker
        env = ray_agent.node_env()
        assert env.get("NODE_VAR") == "1" and "OMP_NUM_THREADS" not in env
        monkeypatch.setenv("RAY_RAYLET_PID", "999999999")  # unreadable: the worker's own, minus Ray's throttle
        env = ray_agent.node_env()
        assert "OMP_NUM_THREADS" not in env and env["PATH"] == os.environ["PATH"]
    finally:
        raylet.kill()
        raylet.wait()


def test_the_watchdog_stops_the_group_when_the_agent_dies(tmp_path: Path) -> None:
    """The engine starts exactly as on a node (the shared start script); a `sleep` stands in for the actor."""
    fake_agent = subprocess.Popen(["sleep", "60"])
    ex = LocalExecutor("n1")
    tag = "unit-raywd.0.a"
    try:
        ticks = start_ticks(fake_agent.pid)
        handle = ex.start(watchdog(fake_agent.pid, ticks, "k3-x") + "echo up; exec sleep 60",
                          str(tmp_path / "e.log"), str(tmp_path), tag)
        assert _wait(lambda: "up" in ex.read_log(handle))
        time.sleep(1.5)
        assert ex.alive(handle)  # the agent lives: the watchdog only watches
        fake_agent.kill()
        fake_agent.wait()
        assert _wait(lambda: not ex.alive(handle), 30)
        log = ex.read_log(handle)
        assert "[k3deploy] the Ray agent k3-x is gone: stopping its process group" in log
        assert exit_record(log) is not None and exit_record(log)[0] == 143  # type: ignore[index]
        assert _wait(lambda: tagged_pids(tag) == [], 10)  # the watchdog's SIGKILL took the rest
    finally:
        fake_agent.kill()
        kill_tagged(tag)


def test_a_watchdog_with_a_stale_start_time_fires_at_once(tmp_path: Path) -> None:
    # A reused PID is not the agent: same PID, other start time.
    ex = LocalExecutor("n1")
    tag = "unit-raywd.1.a"
    try:
        h = ex.start(watchdog(os.getpid(), (start_ticks(os.getpid()) or 0) - 1, "k3-y") + "exec sleep 60",
                     str(tmp_path / "f.log"), str(tmp_path), tag)
        assert _wait(lambda: not ex.alive(h), 5)
        ex.signal(h, signal.SIGKILL)
    finally:
        kill_tagged(tag)


def test_the_agent_of_a_handle_follows_from_its_tag_as_old_records_named_it() -> None:
    """Handles no longer carry the agent's name; the name derived from the tag is the one records of 0.2
    kept in `container`, so `status`, `logs` and `stop` still find the agents those launches started."""
    from k3deploy.executors.ray_actors import agent_name
    from k3deploy.records.store import StateStore

    path = Path(__file__).resolve().parents[1] / "assets" / "state" / "old-ray.json"
    kept = [n["handle"] for n in json.loads(path.read_text())["nodes"] if n["handle"] is not None]
    assert kept and all(agent_name(h["tag"]) == h["container"] for h in kept)
    old = StateStore(path.parent).require("old-ray")  # and they still load, the name dropped
    assert [n.handle.tag for n in old.nodes if n.handle is not None] == [h["tag"] for h in kept]


class _Ray:
    """What the executor asks of Ray, scripted: an agent that answers or not, pinned tasks, names, kills."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, actors: dict[str, object]) -> None:
        import ray

        from k3deploy.executors import ray_exec

        self.actors, self.killed, self.agent_errors = actors, [], []  # type: ignore[var-annotated]
        self.tasks = 0

        class Method:
            def __init__(self, agent: object) -> None:
                self.agent = agent

            def remote(self, *_: object) -> tuple[str, object]:
                return ("agent", self.agent)

        class Task:
            def options(self, **_: object) -> Task:
                return self

            def remote(self, *_: object) -> tuple[str, None]:
                return ("task", None)

        def get(ref: tuple[str, object], timeout: float | None = None) -> tuple[int, str, str]:
            if ref[0] == "agent" and self.agent_errors:
                raise self.agent_errors.pop(0)
            self.tasks += ref[0] == "task"
            return 0, "", ""

        def get_actor(name: str, namespace: str | None = None) -> object:
            if self.actors.get(name) is None:
                raise ValueError(f"Failed to look up actor with name '{name}'")
            return self.actors[name]

        self.Method = Method
        monkeypatch.setattr(ray, "get", get)
        monkeypatch.setattr(ray, "get_actor", get_actor)
        monkeypatch.setattr(ray_exec, "_run_task", Task())
        monkeypatch.setattr(ray_exec, "kill_actor", self.killed.append)

    def agent(self) -> object:
        agent = type("Agent", (), {})()
        agent.run = self.Method(agent)  # type: ignore[attr-defined]
        return agent

    def executor(self, monkeypatch: pytest.MonkeyPatch) -> RayExecutor:
        ex = RayExecutor(RayTarget(host="h1", node_ip="10.0.0.1"))
        monkeypatch.setattr(ex, "connect", lambda: None)
        ex._node_id = "ab" * 28  # a node id as Ray writes one (hex)
        return ex


def test_an_agent_unavailable_for_a_moment_is_asked_again_and_killed_as_its_group_is_found_gone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's ActorUnavailableError (an RPC that failed under load) is a RayActorError, yet the actor lives:
    that call goes to a pinned task, the agent is kept, and it is killed by the call that finds its process
    group gone (a stop cut short right after it records the node stopped leaves no agent)."""
    from ray.exceptions import ActorUnavailableError

    from k3deploy.executors.ray_actors import agent_name

    handle = ProcessHandle(host="h1", pid=4242, tag="dep.r1.0", log_path="/tmp/x.log")
    fake = _Ray(monkeypatch, {})
    agent = fake.agent()
    fake.actors[agent_name(handle.tag)] = agent
    ex = fake.executor(monkeypatch)
    fake.agent_errors.append(ActorUnavailableError("failed to connect", None))
    assert ex.alive(handle) and fake.tasks == 1  # this call through a pinned task
    assert ex.terminate(handle, 1.0) and fake.tasks == 1  # the next one through the agent again
    assert fake.killed == [agent]  # killed as the stop returns, before anyone records the node stopped
    assert ex.read_log(handle) == "" and fake.tasks == 2  # the log's end through a pinned task
    ex.close()
    assert fake.killed == [agent]


def test_an_agent_this_executor_never_reached_is_killed_by_name_once_its_group_is_gone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The stop found the group gone through a pinned task (the agent was not found then): the agent Ray
    knows by that name is killed all the same; a dead one is not killed."""
    from ray.exceptions import ActorDiedError

    from k3deploy.executors.ray_actors import agent_name

    handle = ProcessHandle(host="h1", pid=4242, tag="dep.r2.0", log_path="/tmp/x.log")
    fake = _Ray(monkeypatch, {})
    ex = fake.executor(monkeypatch)
    late = fake.agent()
    ex.alive(handle)  # no agent by that name yet: a pinned task
    fake.actors[agent_name(handle.tag)] = late  # Ray names it now (a lookup that missed it, a late placement)
    assert ex.terminate(handle, 1.0) and fake.tasks == 2 and fake.killed == [late]

    died = ProcessHandle(host="h1", pid=4343, tag="dep.r2.1", log_path="/tmp/y.log")
    fake.actors[agent_name(died.tag)] = fake.agent()
    fake.agent_errors.append(ActorDiedError())
    assert ex.alive(died) and fake.tasks == 3  # the agent died: this call went to a pinned task
    fake.actors[agent_name(died.tag)] = None  # and Ray forgets the dead actor's name
    assert ex.terminate(died, 1.0) and fake.tasks == 4 and fake.killed == [late]
    ex.close()
