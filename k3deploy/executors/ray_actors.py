"""The per-process agent actors of the Ray executor: their names, creating one pinned to a node and waiting
for its placement, the watchdog that stops the engine's group once its agent is gone, and killing one."""
from __future__ import annotations

from typing import Any

import ray
import ray.cloudpickle
from ray.exceptions import GetTimeoutError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from k3deploy.errors import ExecError
from k3deploy.executors import ray_agent
from k3deploy.executors.posix import alive_script, check_tag
from k3deploy.executors.ray_session import NAMESPACE, first_line

PLACEMENT_TIMEOUT_S = 60.0
# After the actor dies, the engine group gets SIGTERM, then SIGKILL this much later.
WATCHDOG_GRACE_S = 5

# Ship the agent's code with its class: the nodes need Ray, not k3deploy.
ray.cloudpickle.register_pickle_by_value(ray_agent)
_Agent = ray.remote(ray_agent.NodeAgent)
# Zero CPUs: the agent only waits on the node; threaded, so a log read never blocks a control call.
_AGENT_OPTIONS: dict[str, Any] = {"num_cpus": 0, "max_restarts": 0, "max_task_retries": 0, "max_concurrency": 16,
                                  "lifetime": "detached", "namespace": NAMESPACE}


def place_agent(name: str, node_id: str, host: str, ip: str | None) -> tuple[Any, dict[str, Any]]:
    """A detached agent called `name` pinned to Ray node `node_id`, once it runs there: (actor, its info)."""
    pin = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    try:
        agent: Any = _Agent.options(name=name, scheduling_strategy=pin, **_AGENT_OPTIONS).remote()
    except ValueError as exc:  # the name is taken
        raise ExecError(f"cannot create the Ray agent {name}: {exc}", host=host) from None
    try:
        info: dict[str, Any] = ray.get(agent.ready.remote(), timeout=PLACEMENT_TIMEOUT_S)
    except GetTimeoutError:
        kill_actor(agent)
        raise ExecError(f"Ray did not place the agent {name} on node {ip} within {PLACEMENT_TIMEOUT_S:g} s",
                        host=host, hint="`ray status` on the head lists pending demands; the node "
                        "may be dead, full, or unable to start workers") from None
    except RayError as exc:
        kill_actor(agent)
        raise ExecError(f"Ray could not start the agent {name} on node {ip}: {first_line(exc)}", host=host) from None
    except BaseException:
        kill_actor(agent)
        raise
    if info.get("node_id") != node_id:
        kill_actor(agent)
        raise ExecError(f"the agent {name} runs on Ray node {info.get('node_id')}, not on {node_id} ({ip})",
                        host=host)
    return agent, info


def agent_name(tag: str) -> str:
    """The agent actor of the process started with `tag` (one per start: the tag names the run)."""
    return f"k3-{check_tag(tag or 'k3deploy')}"


def watchdog(pid: int, start_ticks: int | None, name: str) -> str:
    """Shell text run in the background of the engine's process group: while the agent process runs,
    nothing; once it is gone, note it in the log, SIGTERM the group, SIGKILL it after a grace period."""
    check = alive_script(pid, start_ticks)
    return (
        f"( while ( {check}); do sleep 1; done\n"
        "  trap '' TERM\n"
        f"  echo '[k3deploy] the Ray agent {name} is gone: stopping its process group'\n"
        f"  kill -TERM 0; sleep {WATCHDOG_GRACE_S}; kill -KILL 0 ) < /dev/null &\n"
    )


def kill_actor(agent: Any) -> None:
    """Kill an agent actor (already gone: nothing to do)."""
    try:
        ray.kill(agent, no_restart=True)
    except (RayError, ValueError):
        pass

