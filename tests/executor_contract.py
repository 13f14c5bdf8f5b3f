"""The executor contract as behaviour: the same test functions run against every executor.

Test modules import these functions and provide a `node` fixture (a ContractNode): the local executor in
tests/unit/test_executor_contract.py, SSH and Ray on the namespace rig in
tests/integration/test_executor_contract_rig.py (the node they run on: tests/contract_node.py). The contract
itself is written down in k3deploy/executors/base.py.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import threading
import time
import uuid

import pytest

from k3deploy.errors import CommandTimeout, ExecError
from k3deploy.executors.base import CommandResult, exit_record
from k3deploy.executors.fleet import NodeFleet, ProbeError
from k3deploy.executors.http import NodeHttp
from tests.contract_node import ContractNode, opened
from tests.polling import wait_for

PROBE = '''
import json, os, sys
for i in range(3):
    print(json.dumps({"progress": i}), flush=True)
print(json.dumps({"args": sys.argv[1:], "env": os.environ.get("K3_CONTRACT", "")}))
'''


def test_run_returns_exit_code_stdout_stderr(node: ContractNode) -> None:
    with opened(node) as ex:
        for cmd in ("echo hi; echo err >&2; exit 3", ["sh", "-c", "echo hi; echo err >&2; exit 3"]):
            res = ex.run(cmd, 30)
            assert isinstance(res, CommandResult)
            assert (res.exit_code, res.stdout, res.stderr) == (3, "hi\n", "err\n")
        assert ex.run(["echo", "a b", "$(id)"], 30).stdout == "a b $(id)\n"  # argv is quoted, never expanded


def test_run_timeout_raises_the_same_error_everywhere_and_kills_the_command(node: ContractNode,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    marker, started = node.scratch / f"survived-{node.kind}", node.scratch / f"started-{node.kind}"
    caplog.set_level(logging.DEBUG, logger="k3deploy")  # what an executor did to end the command, if it says
    with opened(node) as ex:
        called = time.time()
        with pytest.raises(CommandTimeout, match=rf"^{node.target.host}: command timed out after 1 s"):
            ex.run(f"date +%s.%N >> {started}; sleep 4; date +%s.%N > {marker}", timeout_s=1)
        raised = time.time()
        time.sleep(4.5)
        # the whole command was killed, not just waited out (the times say when it started, if it did)
        starts = [float(t) - called for t in started.read_text().split()] if started.exists() else []
        assert not marker.exists(), (f"started at {starts} s, timed out at {raised - called:.1f} s, went on at "
                                     f"{float(marker.read_text() or 0) - called:.1f} s (from the call); log: {caplog.text}")
        assert ex.run("echo still usable", 30).stdout == "still usable\n"


def test_run_passes_environment_and_streams_lines(node: ContractNode) -> None:
    seen: list[str] = []
    with opened(node) as ex:
        res = ex.run('echo "$A|$B"; echo second', 30, env={"A": "x y", "B": "$(id)'\""}, on_line=seen.append)
        assert res.stdout == "x y|$(id)'\"\nsecond\n"
        assert seen == ["x y|$(id)'\"", "second"]
        with pytest.raises(ValueError):
            ex.run("true", 30, env={"BAD NAME": "1"})


def test_start_alive_signal_logs_follow(node: ContractNode) -> None:
    log = str(node.scratch / "logs" / f"{node.kind}-a.log")
    with opened(node) as ex:
        h = ex.start("echo started; for i in 1 2 3; do echo line$i; sleep 0.2; done; sleep 30", log,
                     workdir=str(node.scratch), tag=node.tag())
        assert h.pid and h.log_path == log
        assert ex.alive(h)
        assert wait_for(lambda: "line3" in ex.read_log(h), 20)
        stop = threading.Event()
        got: list[str] = []
        t = threading.Thread(target=lambda: got.extend(ex.follow(h, 10, stop)))
        t.start()
        assert wait_for(lambda: "line3" in got, 20)
        stop.set()
        t.join(10)
        assert not t.is_alive()  # follow ends when asked
        assert ex.signal(h, 0) is True
        assert ex.signal(h, signal.SIGTERM) is True
        assert wait_for(lambda: not ex.alive(h), 20)
        assert wait_for(lambda: ex.signal(h, 0) is False, 20)  # nothing of the group is left
        rec = exit_record(ex.read_log(h))
        assert rec is not None and rec[0] == 143


def test_terminate_stops_the_whole_group_in_one_call(node: ContractNode) -> None:
    with opened(node) as ex:
        polite = ex.start("sleep 30", str(node.scratch / f"{node.kind}-t1.log"), tag=node.tag())
        stubborn = ex.start("trap '' TERM; sleep 30 & sleep 30", str(node.scratch / f"{node.kind}-t2.log"),
                            tag=node.tag())
        try:
            assert ex.terminate(polite, 5.0) is True  # gone on SIGTERM
            assert not ex.alive(polite) and ex.signal(polite, 0) is False
            assert exit_record(ex.read_log(polite)) == (143, pytest.approx(time.time(), abs=60))
            assert ex.terminate(stubborn, 0.5) is True  # SIGTERM ignored: SIGKILL after the grace period
            assert not ex.alive(stubborn) and ex.signal(stubborn, 0) is False
            assert ex.terminate(stubborn, 0.5) is True  # nothing left: still stopped, nothing signalled
        finally:
            for h in (polite, stubborn):
                ex.signal(h, signal.SIGKILL)


def test_follow_ends_with_the_process(node: ContractNode) -> None:
    with opened(node) as ex:
        h = ex.start("for i in 1 2 3; do echo line$i; sleep 0.2; done", str(node.scratch / f"{node.kind}-f.log"),
                     tag=node.tag())
        lines: list[str] = []
        t = threading.Thread(target=lambda: lines.extend(ex.follow(h, tail_lines=10)))
        t.start()
        t.join(30)
        assert not t.is_alive()
        assert [x for x in lines if x.startswith("line")] == ["line1", "line2", "line3"]


def test_pid_reuse_guard_and_foreign_tags(node: ContractNode) -> None:
    with opened(node) as ex:
        h = ex.start("sleep 30", str(node.scratch / f"{node.kind}-c.log"), tag=node.tag())
        try:
            stale = h.model_copy(update={"start_ticks": (h.start_ticks or 0) - 1})
            assert ex.alive(h) and not ex.alive(stale)  # same PID, other start time: not ours
            assert ex.signal(h.model_copy(update={"tag": "someone-else"}), signal.SIGKILL) is False
            assert ex.alive(h)
        finally:
            ex.signal(h, signal.SIGKILL)
        assert wait_for(lambda: not ex.alive(h), 20)


def test_start_failure_is_an_exec_error_naming_the_host(node: ContractNode) -> None:
    blocker = node.scratch / f"file-{node.kind}"
    blocker.write_text("")
    with opened(node) as ex, pytest.raises(ExecError, match=f"^{node.target.host}: cannot create the log directory"):
        ex.start("true", str(blocker / "sub" / "x.log"), tag=node.tag())


def test_put_and_get_copy_whole_files(node: ContractNode) -> None:
    data = bytes(range(256)) * 4099  # binary, not a multiple of any buffer size
    src, there, back = (node.scratch / f"{node.kind}-{n}" for n in ("src", "there", "back"))
    src.write_bytes(data)
    with opened(node) as ex:
        ex.put(str(src), str(there))
        assert ex.run(["wc", "-c", str(there)], 30).stdout.split()[0] == str(len(data))
        ex.get(str(there), str(back))
        assert back.read_bytes() == data
        with pytest.raises(ExecError, match=node.target.host):
            ex.get(str(node.scratch / "no-such-file"), str(back))


def test_http_through_the_node_reaches_its_loopback(node: ContractNode, free_port: int) -> None:
    """A server bound to the node's own 127.0.0.1: reachable only as the node sees it (SSH: a tunnel;
    Ray: a request made on the node)."""
    stop_server = node.serve_http("127.0.0.1", free_port)
    try:
        with opened(node) as ex, NodeHttp(f"http://127.0.0.1:{free_port}", via=ex) as http:
            assert wait_for(lambda: _answers(http), 20)
            reply = http.get("/hello?x=1")
            assert reply.ok and reply.json() == {"path": "/hello?x=1", "served_by": node.target.host}
            assert http.get("/missing").status == 404
            events = list(http.stream("/v1/chat", {"n": 4}))
            assert [e.data for e in events] == [json.dumps({"i": i}) for i in range(4)] + ["[DONE]"]
            assert all(b.t_s >= a.t_s for a, b in itertools.pairwise(events))
            assert events[-1].t_s - events[0].t_s >= 0.15  # paced on the node, timed where it was read
    finally:
        stop_server()


def test_fleet_runs_a_stdlib_probe_by_source(node: ContractNode) -> None:
    probe = node.scratch / "probe_mod.py"
    probe.write_text(PROBE)
    lines: list[tuple[int, str]] = []
    with NodeFleet({0: node.target, 1: node.target}) as fleet:
        out = fleet.run_probe(probe, ["a b"], args_for=lambda r: [f"rank{r}"], env={"K3_CONTRACT": "yes"},
                              on_line=lambda rank, line: lines.append((rank, line)), timeout_s=60)
        assert {r: o.value for r, o in out.items()} == {
            r: {"args": ["a b", f"rank{r}"], "env": "yes"} for r in (0, 1)}
        for rank in (0, 1):  # progress lines reached the sink, in order
            assert [line for r, line in lines if r == rank and "progress" in line] == [
                json.dumps({"progress": i}) for i in range(3)]
        bad = node.scratch / "bad_probe.py"
        bad.write_text("print('not json')\n")
        failed = fleet.run_probe(bad, timeout_s=60)[0]
        assert isinstance(failed.error, ProbeError) and node.target.host in str(failed.error)
        timed = fleet.run_all("sleep 5", timeout_s=1)
        assert all(isinstance(o.error, CommandTimeout) for o in timed.values())


# Every ancestor's command line, the command's own shell first (ps may be missing on a node).
ANCESTRY = ("p=$$; while [ \"$p\" -gt 1 ] 2>/dev/null; do tr '\\0' ' ' < /proc/$p/cmdline; echo; "
            "p=$(sed 's/.*) //' /proc/$p/stat | cut -d' ' -f2); done")


def test_capabilities_say_what_the_executor_does(node: ContractNode, free_port: int) -> None:
    """Each capability callers decide by (instead of the executor's kind) holds as behaviour."""
    go = node.scratch / f"go-{node.kind}-{uuid.uuid4().hex[:6]}"

    def on_line(line: str) -> None:
        if line == "first":
            go.write_text("")

    with opened(node) as ex:
        caps = ex.capabilities
        assert caps == node.target.capabilities
        # streams_logs: a line reaches us while the command still runs (it waits up to 10 s for our answer)
        wait = f"echo first; i=0; while [ ! -e {go} ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; " \
               f"[ -e {go} ] && echo answered"
        assert ("answered" in ex.run(wait, 60, on_line=on_line).stdout) is caps.streams_logs
        # node_is_here: the node's processes share this process's network namespace (this machine)
        theirs = ex.run(["readlink", "/proc/self/ns/net"], 30).stdout.strip()
        assert (theirs == os.readlink("/proc/self/ns/net")) is caps.node_is_here
        # forwards_ports: forward gives a local endpoint, or None (HTTP then goes on the node)
        fwd = ex.forward("127.0.0.1", free_port)
        assert (fwd is not None) is caps.forwards_ports
        if fwd is not None:
            fwd.close()
        # ray_runtime: commands run under a Ray worker process
        chain = ex.run(ANCESTRY, 30).stdout
        assert ("ray::" in chain or "default_worker.py" in chain) is caps.ray_runtime, chain


def _answers(http: NodeHttp) -> bool:
    try:
        return http.get("/up", 2).ok
    except ExecError:
        return False


@pytest.fixture
def free_port() -> int:
    from tests import ports

    return ports.free_port()
