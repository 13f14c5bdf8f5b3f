"""RayExecutor: reach the nodes through an existing Ray cluster, one pinned agent actor per started process.

With ray_session (the connection), ray_actors (the agents) and ray_io (logs, files), the only modules that
import ray; every Ray exception leaving them is an ExecError with one clear message.

Connecting: `launch.ray_address` (or `--ray-address`) is `auto`, a GCS address `HOST:6379`, or
`ray://HOST:10001`. A driver talking to a GCS address needs a raylet on its own machine, so with `auto` or a
GCS address k3deploy runs on a node of the cluster (the head, or a login node started with
`ray start --address=HEAD:6379 --num-cpus=0`). `ray://` goes through the Ray client server and needs
`ray[client]` (grpcio; our `ray` and `all` extras have it). The test rig uses the first form mostly: a
zero-CPU Ray node in the root namespace (measured: a CLI's ray.init 0.1-0.8 s); topology nodes
never map to it because placement is by each node's own IP. One process talks to one cluster: executors
share the connection, and the last one closed disconnects.

Per node: `connect` maps the topology node to the alive Ray node whose node IP equals the node's `ip`
(refused, listing every IP Ray sees, when none or several match). `start` creates a detached, named
actor (`k3-<tag>`, namespace `k3deploy`) pinned with NodeAffinitySchedulingStrategy(soft=False), waits a
bounded time for it to be placed, and has it run the same detached-start script as the SSH executor; the
actor's name follows from the handle's tag and `pid` is the engine's. The command is prefixed with a watchdog in
the engine's process group that stops the group when the actor dies (an actor killed by Ray cannot run
cleanup code of its own). Control calls (alive, signal, tail, follow) go to that actor by name, so the
supervisor and `status`/`logs`/`stop` find it again from the state file; when the actor is gone they run as
pinned one-off tasks instead. Once `signal` or `terminate` finds nothing left of the group, the actor is
killed at once, before the stop is recorded (the log's end is then read through a pinned task).
Not covered: a raylet run as a subreaper that kills orphaned processes
(`RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper=1`) would kill the detached engine.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from k3deploy.errors import CommandTimeout, ExecError
from k3deploy.executors import ray_agent, ray_io
from k3deploy.executors.base import CommandResult, LineSink, ProcessHandle, sh
from k3deploy.executors.posix import (
    CONTROL_TIMEOUT_S,
    alive_script,
    as_shell,
    check_tag,
    signal_script,
    start_script,
    started_handle,
    tail_script,
    terminate_script,
    with_env,
)
from k3deploy.executors.ray_actors import agent_name, kill_actor, place_agent, watchdog
from k3deploy.executors.ray_io import AgentGone
from k3deploy.executors.ray_session import CLUSTER, NAMESPACE, first_line, node_for_ip
from k3deploy.executors.target import RayTarget

_run_task = ray.remote(num_cpus=0, max_retries=0)(ray_agent.run_shell)


class RayExecutor:
    """One topology node reached through Ray; thread-safe (every call is a Ray call)."""

    capabilities = RayTarget.capabilities

    def __init__(self, target: RayTarget) -> None:
        self.target = target
        self.host = target.host
        self.address = target.ray_address or "auto"
        self.control_timeout_s = CONTROL_TIMEOUT_S
        self._node_id: str | None = None
        self._joined = False
        self._agents: dict[str, Any] = {}
        self._lock = threading.Lock()

    def connect(self) -> None:
        """Join the cluster (shared by every executor of this process) and find this node's Ray node."""
        with self._lock:
            if self._node_id is not None:
                return
            if not self._joined:
                CLUSTER.acquire(self.address, self.host)
                self._joined = True
            self._node_id = node_for_ip(self.target.node_ip, self.host, self.address)

    def run(self, command: str | Sequence[str], timeout_s: float = 60.0, *,
            env: Mapping[str, str] | None = None, on_line: LineSink | None = None) -> CommandResult:
        """Run a shell string or argv on the node as a pinned one-off task (its stdout lines reach
        `on_line` when it has ended: a task returns once)."""
        self.connect()
        ref = _run_task.options(scheduling_strategy=self.pin()).remote(with_env(as_shell(command), env), timeout_s)
        code, out, err = self.call(ref, timeout_s + self.control_timeout_s, "run a command")
        if code is None:
            raise CommandTimeout(f"command timed out after {timeout_s:g} s", host=self.host)
        if on_line is not None:
            for line in out.splitlines():
                on_line(line)
        return CommandResult(exit_code=code, stdout=out, stderr=err)

    def start(self, command: str, log_path: str, workdir: str = "/", tag: str = "") -> ProcessHandle:
        """Place a detached agent on the node, then start `command` detached through it."""
        self.connect()
        tag = check_tag(tag or "k3deploy")
        name = agent_name(tag)
        assert self._node_id is not None
        agent, info = place_agent(name, self._node_id, self.host, self.target.node_ip)
        try:
            script = sh(start_script(watchdog(info["pid"], info["start_ticks"], name) + command, log_path,
                                     workdir, tag))
            code, out, err = self.call(agent.run.remote(script, self.control_timeout_s),
                                       2 * self.control_timeout_s, "start the process")
        except AgentGone:
            raise ExecError(f"the Ray agent {name} died before it started the process", host=self.host) from None
        except BaseException:
            kill_actor(agent)
            raise
        if code is None:
            kill_actor(agent)
            raise CommandTimeout(f"the detached start timed out after {self.control_timeout_s:g} s", host=self.host)
        try:
            handle = started_handle(self.host, CommandResult(exit_code=code, stdout=out, stderr=err), log_path,
                                    workdir, tag)
        except ExecError:
            kill_actor(agent)
            raise
        self._agents[name] = agent
        return handle

    def alive(self, handle: ProcessHandle) -> bool:
        """The group leader runs and is the process that was started."""
        if handle.pid is None:
            return False
        return self._shell(handle, alive_script(handle.pid, handle.start_ticks))[0] == 0

    def signal(self, handle: ProcessHandle, sig: int) -> bool:
        """Signal the whole process group (tag-guarded); once nothing of it is left, its agent is killed."""
        if handle.pid is None:
            return False
        hit = self._shell(handle, signal_script(handle.pid, check_tag(handle.tag), sig))[0] == 0
        if not hit:
            self._retire(handle)
        return hit

    def terminate(self, handle: ProcessHandle, grace_s: float) -> bool:
        """The whole stop of the group through its agent in one call; once nothing of it is left, its agent
        is killed (as after `signal`)."""
        if handle.pid is None:
            return True
        script = terminate_script(handle.pid, check_tag(handle.tag), grace_s)
        gone = self._shell(handle, script, grace_s + self.control_timeout_s)[0] == 0
        if gone:
            self._retire(handle)
        return gone

    def read_log(self, handle: ProcessHandle, tail_lines: int = 50) -> str:
        """The last lines of the log."""
        return self._shell(handle, tail_script(handle.log_path, tail_lines))[1]

    def follow(
        self, handle: ProcessHandle, tail_lines: int = 10, stop: threading.Event | None = None
    ) -> Iterator[str]:
        """Stream the log (in chunks through the agent) until the process ends or `stop` is set."""
        return ray_io.follow(self, handle, tail_lines, stop)

    def put(self, local_path: str, remote_path: str) -> None:
        """Copy a local file to the node (in chunks that travel inside the task calls)."""
        ray_io.put(self, local_path, remote_path)

    def get(self, remote_path: str, local_path: str) -> None:
        """Copy a file of the node here (in chunks, as `put`)."""
        ray_io.get(self, remote_path, local_path)

    def forward(self, remote_host: str, remote_port: int) -> None:
        """Ray carries no TCP streams: HTTP checks run on the node instead."""

    def close(self) -> None:
        """Forget the agents (those of running processes live on) and leave the cluster once no executor of
        this process uses it."""
        with self._lock:
            self._agents.clear()
            self._node_id = None
            if self._joined:
                self._joined = False
                CLUSTER.release()

    # -- internals -----------------------------------------------------------------------------

    def _retire(self, handle: ProcessHandle) -> None:
        """Nothing of the handle's group is left: its agent is killed now, before the caller records the node
        stopped (a stop cut short after that record would leave it: a Ray worker process on the node for
        good). Looked up by name when this executor holds no handle of it (it may have answered no call
        here); what is read of the node afterwards (the log's end) goes through pinned tasks."""
        name = agent_name(handle.tag)
        agent = self._agents.get(name)
        if agent is None:
            try:
                agent = self._lookup(name)
            except ExecError:
                agent = None  # Ray cannot say now: it stays, an idle 0-CPU actor with nothing left to watch
        if agent is not None:
            kill_actor(agent)
        self._agents[name] = None

    def pin(self) -> NodeAffinitySchedulingStrategy:
        assert self._node_id is not None
        return NodeAffinitySchedulingStrategy(node_id=self._node_id, soft=False)

    def agent_of(self, handle: ProcessHandle) -> Any:
        """The live agent that started the handle's process, or None."""
        return self._agent(agent_name(handle.tag))

    def _agent(self, name: str | None) -> Any:
        """The live actor called `name`, or None."""
        if not name:
            return None
        if name in self._agents:
            return self._agents[name]
        agent = self._lookup(name)
        self._agents[name] = agent
        return agent

    def _lookup(self, name: str) -> Any:
        """The actor called `name` as the cluster knows it now, or None."""
        try:
            return ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            return None
        except RayError as exc:
            raise ExecError(f"cannot look up the Ray agent {name}: {first_line(exc)}", host=self.host) from None

    def _shell(self, handle: ProcessHandle, script: str, timeout_s: float | None = None) -> tuple[int, str, str]:
        """Run a control script through the handle's agent, or a pinned task when the agent is gone."""
        timeout_s = timeout_s or self.control_timeout_s
        self.connect()
        name = agent_name(handle.tag)
        agent = self._agent(name)
        result: tuple[int | None, str, str] | None = None
        if agent is not None:
            try:
                result = self.call(agent.run.remote(sh(script), timeout_s),
                                   timeout_s + self.control_timeout_s, "run a control command")
            except AgentGone as gone:
                if gone.dead:
                    self._agents[name] = None
        if result is None:
            ref = _run_task.options(scheduling_strategy=self.pin()).remote(sh(script), timeout_s)
            result = self.call(ref, timeout_s + self.control_timeout_s, "run a control command")
        code, out, err = result
        if code is None:
            raise CommandTimeout(f"control command timed out after {timeout_s:g} s", host=self.host)
        return code, out, err

    def call(self, ref: Any, timeout_s: float, what: str) -> Any:
        """ray.get with a deadline; every Ray error becomes an ExecError (a dead actor: AgentGone)."""
        try:
            return ray.get(ref, timeout=timeout_s)
        except GetTimeoutError:
            raise ExecError(f"Ray gave no answer within {timeout_s:g} s ({what} on node {self.target.node_ip})",
                            host=self.host) from None
        except ActorUnavailableError:  # a subclass of RayActorError: the actor may well be alive
            raise AgentGone(dead=False) from None
        except RayActorError:
            raise AgentGone() from None
        except RayTaskError as exc:
            raise ExecError(f"cannot {what}: {first_line(exc.cause or exc)}", host=self.host) from None
        except RayError as exc:
            raise ExecError(f"cannot {what} on node {self.target.node_ip} through Ray at {self.address}: "
                            f"{first_line(exc)}", host=self.host) from None


