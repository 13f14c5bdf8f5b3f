"""The Ray side of connecting: one shared connection per process, and which Ray node is a topology node.

With ray_exec, ray_actors and ray_io, the only modules that import ray. Every failure is an ExecError with
one clear message: an unreachable GCS or client port (probed first: ray.init itself waits minutes where
nothing listens), a version mismatch, no local raylet for a GCS address, a missing Ray client, a node IP Ray
does not know.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray._private import ray_constants
from ray.exceptions import RayError

from k3deploy.errors import ExecError

NAMESPACE = "k3deploy"
GCS_PROBE_TIMEOUT_S = 5.0
SEEN_MAX = 32
# The Ray client server starts one server process per client, and answers "Initialization failure from
# server" when that process dies or is not ready within 30 s (ray/util/client/server/proxier.py), as on a
# busy head node: the next client is given a new one, so the connect is tried again, a bounded number of times.
CLIENT_INIT_TRIES = 3
CLIENT_INIT_BACKOFF_S = 2.0
# Ray's C++ failure-signal handler (absl's) takes SIGTERM in every driver: it prints a stack trace, hands the
# signal on, and arms a 3 s alarm that aborts the process (SIGABRT), so a supervisor or launch asked to stop by
# SIGTERM died 3 s into stopping the nodes (measured with Ray 2.60). k3deploy handles SIGTERM itself.
# RAY_DISABLE_FAILURE_SIGNAL_HANDLER is read when ray is imported: set before that, the user's value stands.
RAY_SIGNAL_HANDLER_ENV = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"


def node_for_ip(ip: str | None, host: str, address: str) -> str:
    """The id of the one alive Ray node whose node IP is `ip`; ExecError listing what Ray sees otherwise."""
    if not ip:
        raise ExecError("the Ray executor needs the node's `ip` to find its Ray node", host=host)
    try:
        nodes = ray.nodes()
    except RayError as exc:
        raise ExecError(f"cannot list the nodes of the Ray cluster at {address}: {first_line(exc)}",
                        host=host) from None
    return match_node(nodes, ip, host)


def match_node(nodes: Sequence[dict[str, Any]], ip: str, host: str) -> str:
    """Pure part of node_for_ip (unit-tested): `nodes` as `ray.nodes()` returns them."""
    alive = [n for n in nodes if n.get("Alive") and n.get("NodeManagerAddress") == ip]
    if len(alive) == 1:
        return str(alive[0]["NodeID"])
    seen = describe_nodes(nodes)
    if len(alive) > 1:
        ids = ", ".join(str(n["NodeID"])[:12] for n in alive)
        raise ExecError(f"{len(alive)} alive Ray nodes have IP {ip} ({ids}); k3deploy needs exactly one",
                        host=host, hint="run one Ray node per machine")
    if any(n.get("NodeManagerAddress") == ip for n in nodes):
        raise ExecError(f"the Ray node with IP {ip} is dead; Ray sees: {seen}", host=host,
                        hint=f"restart Ray on that machine (ray start --address=... --node-ip-address={ip})")
    raise ExecError(f"no Ray node has IP {ip} (the node's `ip`); Ray sees: {seen}", host=host,
                    hint="Ray names a node by the IP it was started with; on a machine with several NICs it may "
                    "have picked another one: restart it with `ray start --node-ip-address=IP`, or set the "
                    "node's `ip` to the one Ray reports")


def describe_nodes(nodes: Sequence[dict[str, Any]]) -> str:
    """`10.0.0.1 (alive), 10.0.0.2 (dead), ...`: alive first, each IP once."""
    state: dict[str, bool] = {}
    for n in nodes:
        ip = str(n.get("NodeManagerAddress"))
        state[ip] = state.get(ip, False) or bool(n.get("Alive"))
    order = sorted(state, key=lambda ip: (not state[ip], _ip_key(ip)))
    text = ", ".join(f"{ip} ({'alive' if state[ip] else 'dead'})" for ip in order[:SEEN_MAX])
    more = len(order) - SEEN_MAX
    return (text + (f" and {more} more" if more > 0 else "")) or "no nodes"


def _ip_key(ip: str) -> tuple[int, ...] | tuple[str]:
    parts = ip.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else (ip,)


class _Cluster:
    """This process's one Ray connection, shared by its executors (reference-counted)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.address: str | None = None
        self._refs = 0
        self._owned = False
        self._failed: tuple[str, float, ExecError] | None = None

    def acquire(self, address: str, host: str) -> None:
        """Connect on first use; later users of the same address share the connection."""
        with self._lock:
            if self._refs:
                if address != self.address:
                    raise ExecError(f"this process is already connected to the Ray cluster at {self.address}, "
                                    f"not {address}", host=host, hint="one deployment talks to one Ray cluster")
                self._refs += 1
                return
            if self._failed and self._failed[0] == address and time.monotonic() - self._failed[1] < 5.0:
                failed = self._failed[2]  # the executors of one fan-out round share one failure
                raise ExecError(str(failed).removeprefix(f"{failed.host}: "), host=host, hint=failed.hint)
            if ray.is_initialized():
                self._owned = False  # connected by someone else in this process (a test): leave it be
            else:
                try:
                    connect(address, host)
                except ExecError as exc:
                    self._failed = (address, time.monotonic(), exc)
                    raise
                self._owned = True
            self.address, self._refs, self._failed = address, 1, None

    def release(self) -> None:
        """Drop one user; the last one disconnects."""
        with self._lock:
            self._refs = max(0, self._refs - 1)
            if self._refs == 0 and self.address is not None:
                if self._owned:
                    ray.shutdown()
                self.address = None


CLUSTER = _Cluster()


def connect(address: str, host: str) -> None:
    """ray.init with every failure translated; a GCS or client address is probed first (ray.init itself
    waits minutes on an address where nothing listens)."""
    if address != "auto":
        probe(address, host)
    if not address.startswith("ray://") and _no_local_raylet():
        raise ExecError(f"no Ray node runs on this machine, and a driver using the GCS address {address} needs one",
                        host=host, hint="run k3deploy on a node of the cluster (e.g. the head), or connect "
                        "through the Ray client: ray://HEAD:10001 (needs `pip install 'ray[client]'`)")
    if RAY_SIGNAL_HANDLER_ENV not in os.environ:
        ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True  # read by the core worker ray.init starts
    main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if main else None
    worker_log = logging.getLogger("ray._private.worker")
    level = worker_log.level
    worker_log.setLevel(logging.ERROR)  # "SIGTERM handler is not set" when connecting from a pool thread
    try:
        init_retrying(lambda: ray.init(address=address, namespace=NAMESPACE, logging_level=logging.ERROR,
                                       log_to_driver=False), address, host)
        # The driver prints the errors any node publishes ("Raylet is terminated" when one dies) on stdout, which
        # `--json` owns; log_to_driver does not cover them. A lost node is named by the command itself.
        ray._private.worker._worker_logs_enabled = False
    finally:
        worker_log.setLevel(level)
        if main and sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)  # ray.init installs sys.exit on SIGTERM: keep ours


def init_retrying(init: Callable[[], object], address: str, host: str, backoff_s: float = CLIENT_INIT_BACKOFF_S) -> None:
    """`init()`, tried again (up to CLIENT_INIT_TRIES in all) while the Ray client server fails to set up
    this client's server; any failure translated (init_error)."""
    for attempt in range(1, CLIENT_INIT_TRIES + 1):
        try:
            init()
            return
        except Exception as exc:  # noqa: BLE001 - ray.init raises plain RuntimeError/ConnectionError/ValueError
            transient = isinstance(exc, ConnectionAbortedError) and "Initialization failure from server" in str(exc)
            if not transient or attempt == CLIENT_INIT_TRIES:
                err = init_error(exc, address, host)
                if transient:
                    err = ExecError(f"{str(err).removeprefix(f'{host}: ')} ({attempt} tries)", host=host,
                                    hint="the Ray client server on the head could not start a server for "
                                    "this client: see ray_client_server_*.err in the head's Ray session logs")
                raise err from None
        time.sleep(backoff_s * attempt)


def probe(address: str, host: str) -> None:
    """A TCP connect to the GCS or client server port, bounded; ExecError naming the address if it fails."""
    hostport = address.removeprefix("ray://")
    name, _, port = hostport.rpartition(":")
    if not name or not port.isdigit():
        raise ExecError(f"Ray address {address!r} is not auto, HOST:PORT or ray://HOST:PORT", host=host)
    try:
        with socket.create_connection((name.strip("[]"), int(port)), timeout=GCS_PROBE_TIMEOUT_S):
            return
    except socket.gaierror as exc:
        why = f"cannot resolve {name}: {exc.strerror}"
    except TimeoutError:
        why = f"no answer within {GCS_PROBE_TIMEOUT_S:g} s"
    except ConnectionRefusedError:
        why = "connection refused"
    except OSError as exc:
        why = exc.strerror or str(exc)
    raise ExecError(f"cannot reach the Ray cluster at {address}: {why}", host=host,
                    hint=f"is Ray running there? On the head node, `ray status --address {hostport}` lists its "
                    "nodes; set launch.ray_address or --ray-address")


def init_error(exc: BaseException, address: str, host: str) -> ExecError:
    """One clear message per way ray.init fails."""
    text = str(exc)
    if "Version mismatch" in text:
        cluster, mine = _versions(text)
        return ExecError(f"Ray version mismatch with the cluster at {address}: the cluster runs {cluster}, "
                         f"this k3deploy runs {mine}", host=host,
                         hint="install the cluster's Ray (and Python) version where k3deploy runs")
    if "Could not find any running Ray instance" in text:
        return ExecError("no Ray cluster found from this machine (ray address auto)", host=host,
                         hint="pass --ray-address HEAD:6379 (or ray://HEAD:10001), or set launch.ray_address")
    if "ray[client]" in text:
        return ExecError(f"{address} needs the Ray client, which this Ray install lacks", host=host,
                         hint="pip install 'ray[client]', or run k3deploy on a cluster node with the GCS address")
    if "No node info found matching attributes" in text:
        return ExecError(f"this machine is not a node of the Ray cluster at {address} ({first_line(exc)})",
                         host=host, hint="run k3deploy on a node of the cluster, or use ray://HEAD:10001")
    return ExecError(f"cannot connect to the Ray cluster at {address}: {type(exc).__name__}: {first_line(exc)}",
                     host=host)


def _versions(text: str) -> tuple[str, str]:
    """('Ray 2.9.3, Python 3.10.12', 'Ray 2.60.0, Python 3.11.7') from Ray's mismatch message."""
    found = [line.split(":", 1)[1].strip() for line in text.splitlines()
             if line.strip().startswith(("Ray:", "Python:"))]
    if len(found) >= 4:
        return f"Ray {found[0]}, Python {found[1]}", f"Ray {found[2]}, Python {found[3]}"
    return "another version", f"Ray {ray.__version__}"


def _no_local_raylet() -> bool:
    """Ray finds the driver's raylet by looking for raylet processes on this machine; none means ray.init
    would wait a minute for nothing."""
    try:
        from ray._private.services import find_node_ids
    except ImportError:
        return False  # a Ray without this helper: let ray.init decide
    try:
        return not find_node_ids()
    except Exception:  # noqa: BLE001 - a best-effort pre-check; ray.init gives the real answer
        return False


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
