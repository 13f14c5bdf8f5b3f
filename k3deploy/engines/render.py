"""render_nodes: render inputs in (a feasible plan's, `Plan.render_inputs`), one LaunchSpec per node out
(rank 0 first). Pure."""
from __future__ import annotations

from k3deploy.catalog.specs import VendorSpec
from k3deploy.engines.command_line import engine_argv
from k3deploy.engines.context import Inputs, Place, host_port, places
from k3deploy.engines.docker import container_name, docker_argv
from k3deploy.engines.envs import node_env
from k3deploy.engines.spec import LaunchSpec, ReadySpec

HEAD_READY_PATHS = ("/health", "/v1/models")


def ready_spec(inp: Inputs, place: Place) -> ReadySpec:
    """HTTP on rank 0; SGLang workers answer a dummy /health; vLLM headless workers serve nothing."""
    port = inp.topology.engine.port
    if place.head:
        return ReadySpec("http", f"http://{host_port(place.head_ip, port)}", HEAD_READY_PATHS)
    if inp.flavour == "sglang":
        return ReadySpec("dummy-health", f"http://{host_port(place.ip, port)}", ("/health",))
    return ReadySpec("none")


def launch_spec(inp: Inputs, place: Place, vendor: VendorSpec | None, *, docker: bool = True) -> LaunchSpec:
    """One node's process: the engine argv (docker-wrapped when an image is set), env and readiness."""
    t = inp.topology
    node = dict(t.ordered_nodes())[place.rank]
    argv = engine_argv(inp, place)
    env = node_env(inp, place, vendor)
    container = None
    if t.engine.image and docker:
        container = container_name(t.name, place.rank)
        argv = docker_argv(image=t.engine.image, name=container, model_path=t.model.path,
                           vendor=inp.hardware.vendor, gpus_per_node=t.hardware.gpus_per_node,
                           env=env, secret_names=t.engine.secrets, argv=argv)
    return LaunchSpec(rank=place.rank, host=node.host, ip=node.ip, head=place.head, argv=argv, env=env,
                      secret_env=dict(t.engine.secrets), ready=ready_spec(inp, place), container=container,
                      node=node)


def packaged_vendor(vendor: str) -> VendorSpec | None:
    """The packaged catalog's collective facts for a vendor (callers with --catalog pass their own)."""
    from k3deploy.catalog.loader import load_catalog

    return load_catalog().vendors.get(vendor)


def render_nodes(inp: Inputs, vendor: VendorSpec | None = None) -> tuple[LaunchSpec, ...]:
    """Every node's LaunchSpec, rank 0 first."""
    vend = vendor if vendor is not None else packaged_vendor(inp.hardware.vendor)
    return tuple(launch_spec(inp, place, vend) for place in places(inp.topology))
