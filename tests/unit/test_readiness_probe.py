"""Readiness checked here or on rank 0 itself: the HTTP probe, its node-side script (python3, else curl),
and the choice between them."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from k3deploy.errors import LaunchError
from k3deploy.executors.local import LocalExecutor
from k3deploy.launch import http_probe
from k3deploy.launch.readiness import (
    choose_probe_from,
    fatal_line,
    probe_script,
    reachable_from_here,
    serving_through,
)

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


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bin_dir(tmp_path: Path, *tools: str) -> str:
    """A PATH with only these tools: a node without python3 (or without anything to probe with)."""
    d = tmp_path / ("bin-" + "-".join(tools))
    d.mkdir()
    for tool in tools:
        (d / tool).symlink_to(f"/usr/bin/{tool}" if os.path.exists(f"/usr/bin/{tool}") else f"/bin/{tool}")
    return str(d)


def test_probe_script_is_the_module_itself(server: tuple[str, type[_Handler]]) -> None:
    url, handler = server
    run = subprocess.run([sys.executable, http_probe.__file__, url, "2", *PATHS], capture_output=True, text=True,
                         timeout=30, check=False)
    assert run.returncode == 0 and run.stdout == ""
    handler.health = 503
    run = subprocess.run([sys.executable, http_probe.__file__, url, "2", *PATHS], capture_output=True, text=True,
                         timeout=30, check=False)
    assert run.returncode == 1 and run.stdout.strip() == "/health: HTTP 503"


@pytest.mark.parametrize("tools", [("sh", "python3"), ("sh", "curl")])
def test_node_script_with_python3_or_only_curl(server: tuple[str, type[_Handler]], tmp_path: Path,
                                               tools: tuple[str, ...]) -> None:
    url, handler = server
    env = {"PATH": _bin_dir(tmp_path, *tools)}

    def run(target: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["/bin/sh", "-c", probe_script(target, PATHS, 2.0)], capture_output=True, text=True,
                              timeout=30, check=False, env=env)

    ok = run(url)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    handler.health = 503
    down = run(url)
    assert down.returncode == 1 and down.stdout.strip() == "/health: HTTP 503"
    refused = run(f"http://127.0.0.1:{_closed_port()}")
    assert refused.returncode == 1 and refused.stdout.startswith("/health: ")


def test_serving_through_an_executor_and_a_node_with_nothing_to_probe_with(
        server: tuple[str, type[_Handler]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url, handler = server
    node = LocalExecutor("rank0-host")
    assert serving_through(node, url, PATHS) == (True, "")
    handler.health = 503
    assert serving_through(node, url, PATHS) == (False, "/health: HTTP 503")
    monkeypatch.setenv("PATH", _bin_dir(tmp_path, "sh"))  # no python3, no curl on this "node"
    with pytest.raises(LaunchError, match="rank0-host: cannot check readiness on rank 0: neither python3 nor curl"):
        serving_through(node, url, PATHS)


def test_hostile_url_and_paths_are_arguments_not_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    script = probe_script(f"http://127.0.0.1:{_closed_port()}/$(touch {marker})", (f"/x;touch {marker}",), 1.0)
    for tools in (("sh", "python3"), ("sh", "curl")):
        subprocess.run(["/bin/sh", "-c", script], capture_output=True, timeout=30, check=False,
                       env={"PATH": _bin_dir(tmp_path, *tools)})
    assert not marker.exists()


def test_choice_of_where_readiness_is_asked(server: tuple[str, type[_Handler]]) -> None:
    url, _ = server
    assert choose_probe_from("head", url) == "head" and choose_probe_from("here", url) == "here"
    assert choose_probe_from("auto", None) == "here"
    assert choose_probe_from("auto", url) == "here"  # something listens
    refused = f"http://127.0.0.1:{_closed_port()}"
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
])
def test_advice_about_memory_is_not_a_crash(line: str) -> None:
    assert fatal_line(f"INFO starting\n{line}\n") is None
