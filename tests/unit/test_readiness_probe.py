"""Readiness checked here or as rank 0 sees it (a forwarded port, or a request made on the node), the
choice between them, and the log lines that end a launch at once."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from k3deploy.executors.http import HttpFailure, NodeHttp, serving
from k3deploy.executors.local import LocalExecutor
from k3deploy.executors.target import SshTarget
from k3deploy.launch.failures import Probe, first_failure
from k3deploy.nodeplan.jobs import NodeJob, ReadyCheck
from k3deploy.serving.readiness import choose_probe_from, fatal_line, reachable_from_here
from tests.ports import closed_port

PATHS = ("/health", "/v1/models")


class _Handler(BaseHTTPRequestHandler):
    health = 200

    def do_GET(self) -> None:
        code = type(self).health if self.path == "/health" else 200
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Handler]]]:
    handler = type("Handler", (_Handler,), {"health": 200})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


class _NoForwarding(LocalExecutor):
    """A node whose executor cannot forward ports (as Ray): HTTP checks run on the node itself."""

    def forward(self, remote_host: str, remote_port: int) -> None:  # type: ignore[override]
        return None


@pytest.mark.parametrize("via", [None, LocalExecutor("rank0-host"), _NoForwarding("rank0-host")],
                         ids=["here", "forwarded", "on-node"])
def test_serving_asked_here_through_a_forward_or_on_the_node(server: tuple[str, type[_Handler]],
                                                             via: LocalExecutor | None) -> None:
    url, handler = server
    with NodeHttp(url, via=via) as http:
        assert serving(http, PATHS) == (True, "")
        assert http.route == ("here" if via is None else "forwarded" if type(via) is LocalExecutor else "on-node")
        handler.health = 503
        assert serving(http, PATHS) == (False, "/health: HTTP 503")
    with NodeHttp(f"http://127.0.0.1:{closed_port()}", via=via) as http:
        ok, why = serving(http, PATHS)
        assert not ok and why.startswith("/health: ")


def test_a_node_request_takes_hostile_urls_and_bodies_as_data(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    with NodeHttp(f"http://127.0.0.1:{closed_port()}", via=_NoForwarding("n")) as http, \
            pytest.raises(HttpFailure, match="^n: "):
        http.post(f"/$(touch {marker});touch {marker}", {"x": f"`touch {marker}`'\""})
    assert not marker.exists()


def test_choice_of_where_readiness_is_asked(server: tuple[str, type[_Handler]]) -> None:
    url, _ = server
    assert choose_probe_from("head", url) == "head" and choose_probe_from("here", url) == "here"
    assert choose_probe_from("auto", None) == "here"
    assert choose_probe_from("auto", url) == "here"  # something listens
    refused = f"http://127.0.0.1:{closed_port()}"
    assert reachable_from_here(refused)  # refused: the host answered, so it is reachable from here
    assert choose_probe_from("auto", refused) == "here"
    assert not reachable_from_here("http:///health")


@pytest.mark.parametrize("line", [
    "[E socket.cpp:922] Unable to find address for: ens-bogus",
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:144] connectFullMesh failed",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity",
    "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.19 GiB total capacity)",
    "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 1.50 GiB",
    "torch.distributed.DistNetworkError: The client socket has timed out after 600s",
    "torch.distributed.DistStoreError: Timed out after 601 seconds waiting for clients. 3/4 clients joined.",
])
def test_fatal_lines_are_recognised(line: str) -> None:
    log = f"INFO starting\n{line}\nmore\n"
    assert fatal_line(log) == line


@pytest.mark.parametrize("line", [
    # vLLM says this at INFO in a healthy start-up (CUDA graph capture): not a crash.
    ("INFO 05-04 14:43:24 model_runner.py:980] CUDA graphs can take additional 1~3 GiB memory per GPU. If you are "
     "running out of memory, consider decreasing `gpu_memory_utilization` or enforcing eager mode."),
    "INFO Capturing cudagraphs. If out-of-memory error occurs during cudagraph capture, consider decreasing",
    "WARNING To avoid running out of memory, reduce --mem-fraction-static",
    "[W socket.cpp:464] The server socket has failed to listen on [::]:29500 (errno: 98 - Address in use).",
    # the stack torch prints with a store connection it retries (a worker up before the head's store)
    ("frame #2: c10::DistNetworkError::DistNetworkError(c10::SourceLocation, std::__cxx11::basic_string<char, "
     "std::char_traits<char>, std::allocator<char> >) + 0x72 (0x7fad08b7b022 in /usr/lib/torch/lib/libc10.so)"),
])
def test_advice_about_memory_is_not_a_crash(line: str) -> None:
    assert fatal_line(f"INFO starting\n{line}\n") is None


def _job(rank: int) -> NodeJob:
    return NodeJob(rank=rank, host=f"node-{rank}", ip=f"10.0.0.1{rank}", iface="ens-priv", head=rank == 0,
                   command="exec sleep 1", log_path="/tmp/x.log", target=SshTarget(host=f"node-{rank}"),
                   ready=ReadyCheck(kind="http", url="http://10.0.0.10:8000", paths=("/health",)))


def test_a_failed_node_is_named_with_the_catalogs_cause_and_fix() -> None:
    died = ("(EngineCore pid=18287) ERROR 12-04 16:31:35 [multiproc_executor.py:315] Worker proc VllmWorker-0 died "
            "unexpectedly (exit code: None), shutting down executor.")
    ended = f"INFO loading\n{died}\n[k3deploy] exited with status 0 at 12.5\n"
    failure = first_failure([Probe(_job(0), True, "INFO loading"), Probe(_job(1), False, ended)])
    assert failure is not None and failure.rank == 1
    assert f"its log says: {died}; cause: a worker process vanished" in failure.cause
    assert "in `dmesg` on node-1" in failure.cause and failure.cause.endswith("[worker-killed-no-status]")
    # a live node with a fatal line: the line, then its cause and fix with the node's values
    gloo = "RuntimeError: [enforce fail at gloo/transport/tcp/device.cc:84] ifa != nullptr. Unable to find address for: ens-bogus"
    live = first_failure([Probe(_job(0), True, "INFO loading"), Probe(_job(1), True, f"INFO a\n{gloo}\n")])
    assert live is not None and live.cause.startswith(f"fatal error in its log: {gloo}; cause: GLOO_SOCKET_IFNAME")
    assert "set nodes[1].iface to the interface that carries 10.0.0.11 on node-1" in live.cause


def test_an_unmatched_failure_keeps_the_engines_own_line() -> None:
    ended = "INFO loading\nRuntimeError: something new\n[k3deploy] exited with status 1 at 3.0\n"
    failure = first_failure([Probe(_job(0), False, ended)])
    assert failure is not None and failure.cause == "exited with status 1; its log says: RuntimeError: something new"
