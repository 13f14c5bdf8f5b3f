"""The executor contract (tests/executor_contract.py) against the recording executor (tests/rig/recording.py):
the fake the sequencing tests use is held to what the real executors do. Its nodes play scripts instead of
running shell text, so each command the contract starts or runs is scripted here as the shell would play it.
Left out, because they test what only a real node has (the fake runs no command and no probe): the run
timeout's kill of the command, HTTP through the node, the fleet's stdlib probe and the capabilities' behaviour."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from k3deploy.executors.base import Executor
from k3deploy.executors.target import LocalTarget
from tests.contract_node import ContractNode
from tests.executor_contract import (  # the shared behaviour tests that need no real shell on the node
    test_follow_ends_with_the_process,
    test_pid_reuse_guard_and_foreign_tags,
    test_put_and_get_copy_whole_files,
    test_run_passes_environment_and_streams_lines,
    test_run_returns_exit_code_stdout_stderr,
    test_start_alive_signal_logs_follow,
    test_start_failure_is_an_exec_error_naming_the_host,
    test_terminate_stops_the_whole_group_in_one_call,
)
from tests.rig.recording import Nodes, NodeScript, Reply

__all__ = [
    "test_follow_ends_with_the_process", "test_pid_reuse_guard_and_foreign_tags", "test_put_and_get_copy_whole_files",
    "test_run_passes_environment_and_streams_lines", "test_run_returns_exit_code_stdout_stderr",
    "test_start_alive_signal_logs_follow", "test_start_failure_is_an_exec_error_naming_the_host",
    "test_terminate_stops_the_whole_group_in_one_call",
]

LINES = tuple(f"line{i}" for i in (1, 2, 3))


def play(command: str, tag: str) -> NodeScript:
    """What /bin/sh would make of the contract's commands."""
    if command.startswith("echo started;"):  # three lines 0.2 s apart, then sleep 30
        return NodeScript(lines=("started", *LINES), line_every_s=0.2)
    if command.startswith("for i in 1 2 3"):  # the same lines, then the end
        return NodeScript(lines=LINES, line_every_s=0.2, exit_after_s=0.4, exit_status=0)
    if command.startswith("trap '' TERM"):
        return NodeScript(ignores_term=True)
    if command in ("sleep 30", "true"):
        return NodeScript(exit_after_s=None if command == "sleep 30" else 0.0)
    raise AssertionError(f"the contract started a command this script does not play: {command!r}")


REPLIES = [
    (r"echo hi; echo err >&2; exit 3", Reply(3, "hi\n", "err\n")),
    (r"^echo 'a b' '\$\(id\)'$", Reply(0, "a b $(id)\n")),  # the argv quoted: what the shell would print
    (r"^env 'A=x y' 'B=\$\(id\)'", Reply(0, "x y|$(id)'\"\nsecond\n")),
    (r"^wc -c ", Reply(0, f"{256 * 4099} there\n")),
]


@dataclass
class RecordingNode(ContractNode):
    nodes: Nodes | None = None

    def executor(self) -> Executor:
        assert self.nodes is not None
        ex = self.nodes.factory(self.target)
        ex.connect()
        return ex


@pytest.fixture
def node(tmp_path: Path) -> Iterator[ContractNode]:
    nodes = Nodes(play, REPLIES)
    yield RecordingNode(kind="recording", target=LocalTarget(host="nodeR"), scratch=tmp_path,
                        serve_http=lambda ip, port: lambda: None, node_ip="127.0.0.1", nodes=nodes)
    nodes.close()


def test_the_recording_is_the_calls_in_order(tmp_path: Path) -> None:
    nodes = Nodes({0: NodeScript(lines=("up",))})
    ex = nodes.factory(LocalTarget(host="n0"))
    h = ex.start("engine", str(tmp_path / "x.log"), tag="d.0.r1")
    assert ex.alive(h) and ex.read_log(h) == "up\n"
    assert ex.terminate(h, 1.0) and not ex.alive(h)
    assert nodes.ops("start", "terminate") == [("start", "engine"), ("terminate", "d.0.r1")]
    assert nodes.running() == []
