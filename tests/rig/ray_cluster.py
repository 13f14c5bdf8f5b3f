"""RayRig: a real Ray cluster on a HostRig, one Ray node per fake host, plus a driver node for k3deploy.

Each host runs `ray start` inside its own namespaces with its priv IP as node IP and its own temp dir (nodes
sharing one race on socket names); the head (first host) starts first, the others join as soon as its GCS
port answers, a few at a time (too many at once on 2 cores hit Ray's 30 s start-up timeout). A driver must
run where a raylet is reachable, so a zero-CPU Ray node also runs in the root namespace (where k3deploy and
its supervisor run), `ray start --block` as PID 1 of a PID namespace of its own: SIGKILL to its
`unshare` removes it.

Teardown never uses `ray stop` (it kills every Ray process on the machine): it SIGKILLs what runs in each
host's namespaces (gcs_server ignores SIGTERM anyway) and the root node's PID namespace, then removes the
temp dirs.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from typing_extensions import Self

from .hosts import HostRig, RigHost
from .netns import RigError
from .registry import registry_path

GCS_PORT = 6379
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
# Small nodes: 1 CPU (the engine itself runs outside Ray), an 80 MB object store, no dashboard.
NODE_FLAGS = ["--num-cpus=1", "--object-store-memory=80000000", "--disable-usage-stats"]
JOIN_BATCH = 4

# Run by a Ray driver inside the head host: waits (bounded) until `want` nodes are alive, prints them.
_WAIT_NODES = textwrap.dedent("""
    import json, sys, time, ray
    address, want, timeout_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    deadline = time.monotonic() + timeout_s
    for _ in range(10000):
        nodes = [(n["NodeManagerAddress"], bool(n["Alive"])) for n in ray.nodes()]
        if sum(alive for _, alive in nodes) >= want or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    print(json.dumps(nodes))
""")


class RayRig:
    """Context manager: Ray on the first `n` hosts of `rig` (head on the first) and a root-namespace node."""

    def __init__(self, rig: HostRig, n: int | None = None, *, timeout_s: float = 120.0) -> None:
        self.rig = rig
        self.hosts: list[RigHost] = rig.hosts[: n or len(rig.hosts)]
        self.head = self.hosts[0]
        self.address = f"{self.head.priv_ip}:{GCS_PORT}"
        self.driver_ip = rig.root_priv_ip
        self.timings: dict[str, float] = {}
        self._root: subprocess.Popen[bytes] | None = None
        self._closed = False
        self._dirs = [self.temp_dir(h.name) for h in self.hosts] + [self.temp_dir("root")]
        _sweep_stale_dirs()
        atexit.register(self.close)
        t0 = time.monotonic()
        try:
            self._start(timeout_s)
        except BaseException:
            self.close()
            raise
        self.timings["up_s"] = time.monotonic() - t0

    def temp_dir(self, who: str) -> Path:
        """The Ray temp dir of one host (or 'root'): unique to this rig."""
        return Path(f"/tmp/k3ray-{self.rig.ident}-{who}")

    def _env(self) -> dict[str, str]:
        return {**os.environ, **RAY_ENV}

    def _in_host(self, host: RigHost, argv: list[str]) -> subprocess.Popen[str]:
        """Popen of argv inside the host's namespaces (like HostRig.exec, without waiting)."""
        full = ["nsenter", "--target", str(self.rig.sshd_pid(host)), "--pid", "--mount", "--uts", "--net", "--", *argv]
        return subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True, cwd="/", env=self._env())

    def _start(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        t0 = time.monotonic()
        head = self._in_host(self.head, [
            "ray", "start", "--head", f"--node-ip-address={self.head.priv_ip}", f"--port={GCS_PORT}",
            "--include-dashboard=false", *NODE_FLAGS, f"--temp-dir={self.temp_dir(self.head.name)}"])
        if not _wait_port(self.head.priv_ip, GCS_PORT, deadline, head):
            _, err = _finish(head, 5)
            raise RigError(f"Ray head on {self.head.name} did not open {self.address}: {err[-1500:]}")
        self.timings["gcs_s"] = time.monotonic() - t0
        self._root = self._start_root_node()
        pending = list(self.hosts[1:])
        retries = {h.name: 1 for h in pending}
        running: list[tuple[RigHost, subprocess.Popen[str]]] = [(self.head, head)]
        for _ in range(2 * len(self.hosts) + 1):  # at most JOIN_BATCH `ray start`s at once, the head's included
            while pending and len(running) < JOIN_BATCH:
                host = pending.pop(0)
                running.append((host, self._join(host)))
            if not running:
                break
            host, proc = running.pop(0)
            code, err = _finish(proc, max(1.0, deadline - time.monotonic()))
            if code != 0 and retries.get(host.name, 0) > 0 and "timed out during startup" in err:
                # A loaded machine can push a raylet past Ray's fixed 30 s start-up wait: start it over once.
                retries[host.name] -= 1
                self.timings["retries"] = self.timings.get("retries", 0) + 1
                self.rig.kill_host_processes(host)
                shutil.rmtree(self.temp_dir(host.name), ignore_errors=True)
                pending.append(host)
                continue
            if code != 0:
                raise RigError(f"ray start on {host.name} failed (exit {code}): {err[-1500:]}")
        if self._root.poll() is not None:  # the driver node gave up (same start-up wait): once more
            self.timings["retries"] = self.timings.get("retries", 0) + 1
            shutil.rmtree(self.temp_dir("root"), ignore_errors=True)
            self._root = self._start_root_node()
        self.timings["nodes_s"] = time.monotonic() - t0
        want = len(self.hosts) + 1
        nodes = self.nodes(want, max(5.0, deadline - time.monotonic()))
        alive = {ip for ip, ok in nodes if ok}
        missing = [h.priv_ip for h in self.hosts if h.priv_ip not in alive]
        if self.driver_ip not in alive:
            missing.append(f"{self.driver_ip} (root namespace)")
        if missing:
            raise RigError(f"Ray nodes missing after {timeout_s:g} s: {missing}; seen {nodes}")
        self.timings["all_alive_s"] = time.monotonic() - t0

    def _join(self, host: RigHost) -> subprocess.Popen[str]:
        """`ray start` of a worker host's node, joining the head."""
        return self._in_host(host, [
            "ray", "start", f"--address={self.address}", f"--node-ip-address={host.priv_ip}", *NODE_FLAGS,
            "--include-log-monitor=false", f"--temp-dir={self.temp_dir(host.name)}"])

    def rejoin(self, host: RigHost, timeout_s: float = 90.0) -> None:
        """Start a worker host's Ray node again once a test has killed it (every process of the host): a fresh temp
        dir, `ray start` as at the rig's start, then wait until every node is alive again."""
        self.rig.kill_host_processes(host)  # whatever of the old node is left
        shutil.rmtree(self.temp_dir(host.name), ignore_errors=True)
        code, err = _finish(self._join(host), timeout_s)
        if code != 0:
            raise RigError(f"ray start on {host.name} failed (exit {code}): {err[-1500:]}")
        alive = sum(ok for _, ok in self.nodes(len(self.hosts) + 1, timeout_s))
        if alive < len(self.hosts) + 1:
            raise RigError(f"Ray node on {host.name} did not come back within {timeout_s:g} s")

    def _start_root_node(self) -> subprocess.Popen[bytes]:
        log = self.rig.workdir / "ray-root.log"
        # pdeathsig: if this process dies without closing the rig, unshare and with it the node go too.
        argv = ["setpriv", "--pdeathsig", "KILL", "unshare", "--pid", "--fork", "--kill-child", "--mount-proc",
                "ray", "start", "--block", f"--address={self.address}", f"--node-ip-address={self.driver_ip}",
                "--num-cpus=0", "--object-store-memory=80000000", "--disable-usage-stats",
                "--include-log-monitor=false", f"--temp-dir={self.temp_dir('root')}"]
        with open(log, "ab") as out:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    start_new_session=True, cwd="/", env=self._env())

    def nodes(self, want: int = 0, timeout_s: float = 30.0) -> list[tuple[str, bool]]:
        """(node IP, alive) of every node GCS knows, asked by a driver inside the head host; waits up to
        timeout_s for `want` alive nodes."""
        run = self.rig.exec(self.head, [sys.executable, "-c", _WAIT_NODES, self.address, str(want), str(timeout_s)],
                            timeout_s=timeout_s + 60, env=self._env())
        if run.returncode != 0:
            raise RigError(f"listing Ray nodes failed: {run.stderr[-1500:]}")
        return [(ip, alive) for ip, alive in json.loads(run.stdout.strip().splitlines()[-1])]

    def close(self) -> None:
        """SIGKILL every process of the Ray nodes (host namespaces, root node), remove temp dirs; idempotent."""
        if self._closed:
            return
        self._closed = True
        t0 = time.monotonic()
        problems = []
        if self._root is not None and self._root.poll() is None:
            self._root.kill()  # unshare --kill-child: PID 1 of the node's namespace dies, and with it the rest
            try:
                self._root.wait(timeout=10)
            except subprocess.TimeoutExpired:
                problems.append(f"root Ray node (unshare {self._root.pid}) did not exit")
        for host in self.hosts:
            try:
                self.rig.kill_host_processes(host)
            except RigError as exc:
                problems.append(str(exc))
        for d in self._dirs:
            shutil.rmtree(d, ignore_errors=True)
        atexit.unregister(self.close)
        self.timings["down_s"] = time.monotonic() - t0
        if problems:
            raise RigError("Ray rig teardown: " + "; ".join(problems))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _sweep_stale_dirs() -> None:
    """Remove Ray temp dirs of rigs that no longer exist (their creator died before closing them)."""
    for d in Path("/tmp").glob("k3ray-*-*"):
        ident = d.name.split("-")[1]
        if not registry_path(ident).exists():
            shutil.rmtree(d, ignore_errors=True)


def _wait_port(ip: str, port: int, deadline: float, proc: subprocess.Popen[str]) -> bool:
    """True once ip:port accepts a TCP connection; False at the deadline or when `proc` failed."""
    for _ in range(100_000):
        try:
            with socket.create_connection((ip, port), timeout=0.5):
                return True
        except OSError:
            pass
        if time.monotonic() > deadline or (proc.poll() is not None and proc.returncode != 0):
            return False
        time.sleep(0.1)
    return False


def _finish(proc: subprocess.Popen[str], timeout_s: float) -> tuple[int, str]:
    """Wait for a `ray start`; (exit code, stderr), killing its group on timeout."""
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        _, err = proc.communicate(timeout=5)
        return -9, (err or "") + f"\n(timed out after {timeout_s:.0f} s)"
    return proc.returncode, err or ""

