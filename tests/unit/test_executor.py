"""Executors: one public surface for every implementation; local process control; fan-out; targets."""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from k3deploy.errors import ExecError
from k3deploy.executors import ExecTarget, Executor, LocalTarget, NodeFleet, RayTarget, SshTarget
from k3deploy.executors.base import exit_record
from k3deploy.executors.fleet import require_all
from k3deploy.executors.local import LocalExecutor
from k3deploy.executors.ssh import SshExecutor
from k3deploy.executors.ssh_config import resolve, split_hop
from k3deploy.nodeplan.targets import ExecOverrides, targets_for
from k3deploy.topology.loader import parse_topology
from tests.ports import closed_port
from tests.unit.test_launch_support import tagged_pids


def test_detached_start_alive_signal_and_logs(tmp_path: Path) -> None:
    ex = LocalExecutor()
    log = str(tmp_path / "logs" / "a.log")
    h = ex.start("echo started; sleep 30 & sleep 30", log, workdir=str(tmp_path), tag="unit-exec.0.a")
    assert h.pid and h.start_ticks and h.log_path == log
    ps = subprocess.run(["ps", "-o", "pid=,pgid=,sid=", "-p", str(h.pid)], capture_output=True, text=True,
                        check=True)
    pid, pgid, sid = map(int, ps.stdout.split())
    assert pid == pgid == sid  # its own session and process group
    assert ex.alive(h)
    assert _wait(lambda: "started" in ex.read_log(h))
    assert len(tagged_pids("unit-exec.0.a")) >= 3  # wrapper, shell and both sleeps carry the tag
    assert ex.signal(h, 0) is True
    assert ex.signal(h, signal.SIGTERM) is True
    assert _wait(lambda: not ex.alive(h))
    assert _wait(lambda: tagged_pids("unit-exec.0.a") == [])
    assert ex.signal(h, signal.SIGKILL) is False  # nothing left to signal
    rec = exit_record(ex.read_log(h))
    assert rec is not None and rec[0] == 143


def test_previous_log_is_kept_and_exit_status_recorded(tmp_path: Path) -> None:
    ex = LocalExecutor()
    log = str(tmp_path / "b.log")
    first = ex.start("echo one; exit 7", log, tag="unit-exec.1.a")
    assert _wait(lambda: exit_record(ex.read_log(first)) is not None)
    assert exit_record(ex.read_log(first))[0] == 7  # type: ignore[index]
    ex.start("echo two; exit 0", log, tag="unit-exec.1.b")
    assert _wait(lambda: exit_record(Path(log).read_text()) is not None)
    assert "one" in Path(log + ".1").read_text() and "two" in Path(log).read_text()


def test_hostile_strings_are_data_not_code(tmp_path: Path) -> None:
    ex = LocalExecutor()
    marker = tmp_path / "pwned"
    evil = f"$(touch {marker}); `touch {marker}`; touch {marker} #'\""
    log = str(tmp_path / f"dir {evil}" / "x.log")
    h = ex.start(f"echo {evil!r} > /dev/null; sleep 5", log, workdir=str(tmp_path), tag="unit-exec.3.a")
    ex.signal(h, signal.SIGKILL)
    assert Path(log).exists() and not marker.exists()
    with pytest.raises(ValueError):
        ex.signal(h.model_copy(update={"tag": "x'; touch /tmp/y; '"}), 0)


def test_fleet_map_is_concurrent_per_rank_and_keeps_errors_per_node() -> None:
    made: list[str] = []

    def factory(target: ExecTarget) -> Executor:
        made.append(target.host)
        return LocalExecutor(target.host)

    all_in = threading.Barrier(8)  # passed only once all eight calls run at the same time (never if serial)

    def work(rank: int, ex: Executor) -> int:
        all_in.wait(timeout=60)
        if rank == 3:
            raise ExecError("boom", host=ex.host)
        return rank * 10

    targets = {r: LocalTarget(host=f"h{r}") for r in range(8)}
    with NodeFleet(targets, factory) as fleet:
        outs = fleet.map(work)
        assert not all_in.broken
        assert sorted(outs) == list(range(8)) and made == [f"h{r}" for r in range(8)]
        assert {r: o.value for r, o in outs.items() if o.ok} == {r: r * 10 for r in range(8) if r != 3}
        assert outs[3].host == "h3" and str(outs[3].error) == "h3: boom"
        with pytest.raises(ExecError, match=r"^h3: boom$"):
            require_all(outs)
        # A subset of ranks (no barrier: eight parties would wait out its 60 s for the two calls).
        some = fleet.map(lambda rank, ex: rank * 10, [1, 2])
        assert some.keys() == {1, 2} and {r: o.value for r, o in some.items()} == {1: 10, 2: 20}


def _topology(ssh_defaults: dict[str, object], nodes: list[dict[str, object]]) -> object:
    import yaml

    doc = {"name": "t", "model": {"id": "kimi-k3-tiny", "path": "/m"}, "hardware": {"gpu": "sim", "gpus_per_node": 1},
           "nodes": nodes, "engine": {"kind": "sim"}, "launch": {"ssh": ssh_defaults}}
    return parse_topology(yaml.safe_dump(doc), "t.yaml").topology


def test_targets_precedence_node_then_cli_then_topology_defaults() -> None:
    t = _topology({"user": "deploy", "key": "~/.ssh/k3", "connect_timeout_s": 4},
                  [{"host": "a", "ip": "10.0.0.1", "iface": "eth0", "rank": 1},
                   {"host": "b", "ip": "10.0.0.2", "iface": "eth0", "rank": 2,
                    "ssh": {"user": "ops", "port": 2222, "key": "/k"}},
                   {"host": "c", "ip": "10.0.0.3", "iface": "eth0", "rank": 0}])
    plain = targets_for(t)  # type: ignore[arg-type]
    assert [plain[r].host for r in sorted(plain)] == ["c", "a", "b"]  # explicit rank 0 first
    assert (plain[2].user, plain[2].port, plain[2].key) == ("ops", 2222, "/k")
    assert (plain[1].user, plain[1].key, plain[1].connect_timeout_s) == ("deploy", "~/.ssh/k3", 4)
    cli = targets_for(t, ExecOverrides(executor="ssh", ssh_user="cli", known_hosts="/kh",  # type: ignore[arg-type]
                                       connect_timeout_s=1, accept_new_host_keys=True))
    assert all(isinstance(x, SshTarget) for x in cli.values())
    assert (cli[1].user, cli[1].known_hosts, cli[1].connect_timeout_s) == ("cli", "/kh", 1)
    assert cli[2].user == "ops" and cli[1].accept_new_host_keys
    # Each kind gets its own target, with only its own settings.
    local = targets_for(t, ExecOverrides(executor="local", ssh_user="cli"))  # type: ignore[arg-type]
    assert local[2] == LocalTarget(host="b")
    ray = targets_for(t, ExecOverrides(executor="ray", ray_address="10.0.0.9:6379"))  # type: ignore[arg-type]
    assert ray[2] == RayTarget(host="b", node_ip="10.0.0.2", ray_address="10.0.0.9:6379")


def test_ssh_config_aliases_fill_what_the_topology_leaves_open(tmp_path: Path) -> None:
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host h01\n  HostName 10.9.0.1\n  User root\n  Port 2200\n  IdentityFile /keys/h01\n"
                   "  UserKnownHostsFile /kh/extra /kh/main\n")
    base = SshTarget(host="h01", ssh_config=str(cfg), known_hosts="/kh/main")
    ep = resolve(base)
    assert (ep.hostname, ep.user, ep.port, ep.key_files) == ("10.9.0.1", "root", 2200, ("/keys/h01",))
    assert ep.extra_known_hosts == ("/kh/extra",) and ep.known_hosts == "/kh/main"
    explicit = resolve(base.model_copy(update={"user": "ops", "port": 22, "key": "/k"}))
    assert (explicit.user, explicit.port, explicit.key_files) == ("ops", 22, ("/k",))
    other = resolve(base.model_copy(update={"host": "10.1.1.1"}))
    assert other.hostname == "10.1.1.1" and other.port == 22


def test_jump_hosts_from_the_topology_the_cli_or_ssh_config(tmp_path: Path) -> None:
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host gpu-*\n  ProxyJump ops@bastion:2222,inner\n"
                   "Host legacy\n  ProxyCommand ssh -W %h:%p gate\n  HostName 10.2.0.9\n")
    via_config = resolve(SshTarget(host="gpu-a", ssh_config=str(cfg)))
    assert via_config.jump == ("ops@bastion:2222", "inner") and via_config.proxy_command is None
    legacy = resolve(SshTarget(host="legacy", ssh_config=str(cfg)))
    assert legacy.jump == () and legacy.proxy_command == "ssh -W 10.2.0.9:22 gate"
    explicit = resolve(SshTarget(host="legacy", ssh_config=str(cfg), jump="root@[fd00::1]:2200"))
    assert explicit.jump == ("root@[fd00::1]:2200",) and explicit.proxy_command is None  # -J wins, like ssh
    off = resolve(SshTarget(host="gpu-a", ssh_config=str(cfg), jump="none"))
    assert off.jump == () and off.proxy_command is None
    assert split_hop("ops@bastion:2222") == ("ops", "bastion", 2222)
    assert split_hop("root@[fd00::1]:2200") == ("root", "fd00::1", 2200)
    assert split_hop("inner") == (None, "inner", None)

    t = _topology({"jump": "bastion"}, [{"host": "a", "ip": "10.0.0.1", "iface": "eth0"},
                                         {"host": "b", "ip": "10.0.0.2", "iface": "eth0", "ssh": {"jump": "none"}}])
    targets = targets_for(t)  # type: ignore[arg-type]
    assert (targets[0].jump, targets[1].jump) == ("bastion", "none")
    cli = targets_for(t, ExecOverrides(ssh_jump="ops@gate:22"))  # type: ignore[arg-type]
    assert (cli[0].jump, cli[1].jump) == ("ops@gate:22", "none")


@pytest.mark.parametrize("bad", ["bastion; rm -rf /", "a,,b", "ops@host:99999", "user@host:port", "$(x)", "a b"])
def test_a_jump_that_is_not_user_at_host_port_is_refused_at_load(bad: str) -> None:
    from k3deploy.topology.loader import TopologyError

    with pytest.raises(TopologyError) as err:
        _topology({"jump": bad}, [{"host": "a", "ip": "10.0.0.1", "iface": "eth0"}])
    assert "launch.ssh.jump" in str(err.value) and "is not [user@]host[:port]" in str(err.value)


def test_unreachable_ssh_host_is_one_exec_error_naming_it() -> None:
    port = closed_port()
    ex = SshExecutor(SshTarget(host="127.0.0.1", port=port, user="nobody", ssh_config=None,
                                connect_timeout_s=1))
    t0 = time.monotonic()
    with pytest.raises(ExecError) as err:
        ex.connect()
    assert err.value.host == "127.0.0.1" and err.value.exit_code == 3
    assert "after 3 attempts" in str(err.value) and "connection refused" in str(err.value)
    assert time.monotonic() - t0 < 30  # retries with 2 s of backoff, bounded (a loaded machine adds seconds)


def test_cli_help_and_plan_paths_do_not_import_paramiko() -> None:
    code = ("import sys; import k3deploy.cli, k3deploy.launch.deploy, k3deploy.launch.supervisor, "
            "k3deploy.executors; print(sorted(m for m in ('paramiko', 'torch', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _wait(pred: object, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    for _ in range(500):
        if pred():  # type: ignore[operator]
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return False


class _Conn:
    def __init__(self, n: int) -> None:
        self.n, self.open = n, True

    def close(self) -> None:
        self.open = False


def test_jump_connections_are_shared_counted_replaced_when_dead_and_closed_by_the_last_user() -> None:
    from k3deploy.executors.jumps import JumpPool

    made: list[_Conn] = []

    def connect() -> _Conn:
        made.append(_Conn(len(made)))
        return made[-1]

    pool = JumpPool(lambda c: c.open)
    a = pool.acquire("bastion", connect)
    b = pool.acquire("bastion", connect)
    assert a is b and len(made) == 1 and pool.users("bastion") == 2
    a.open = False  # the bastion dropped the connection: the next user gets a new one
    c = pool.acquire("bastion", connect)
    assert c is made[1] and not made[0].open and pool.users("bastion") == 3
    for _ in range(2):
        pool.release("bastion")
    assert made[1].open
    pool.release("bastion")
    assert not made[1].open and pool.users("bastion") == 0

    def refused() -> _Conn:
        raise OSError("connection refused")

    with pytest.raises(OSError):
        pool.acquire("other", refused)
    assert pool.users("other") == 0
    threads = [threading.Thread(target=pool.acquire, args=("burst", connect)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert pool.users("burst") == 8 and len(made) == 3  # eight nodes at once, one handshake


def test_a_known_hosts_file_that_cannot_be_written_is_a_host_key_error_not_a_connection_retry(
        tmp_path: Path) -> None:
    import paramiko

    from k3deploy.executors.hostkeys import AcceptNewPolicy, UnknownHostKey

    blocker = tmp_path / "file"
    blocker.write_text("")
    policy = AcceptNewPolicy(str(blocker / "known_hosts"))  # its directory cannot be made
    key = paramiko.RSAKey.generate(1024)
    with pytest.raises(UnknownHostKey, match="cannot save the new host key of h9 to .*known_hosts") as info:
        policy.missing_host_key(paramiko.SSHClient(), "h9", key)
    assert "--known-hosts" in info.value.hint
