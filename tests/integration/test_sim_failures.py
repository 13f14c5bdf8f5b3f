"""Failures: wrong Gloo interface, unreachable head, every K3SIM_FAULT mode, and memory admission with
the real K3 config on a declared H100 (Hopper `auto` upcasts to BF16 and runs out of memory; marlin fits).

All processes start together in one fixture (they are independent), so their torch imports overlap."""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.sim.checkpoint import write_checkpoint
from k3deploy.sim.local_nodes import NodeSet, SimNode
from k3deploy.sim.model_info import config_for
from tests import figures
from tests.ports import free_ports

pytestmark = pytest.mark.integration  # Gloo rendezvous between stand-in processes

IFNAME_TIMEOUT_S = 30
UNREACHABLE_TIMEOUT_S = 3
HANG_TIMEOUT_S = 4
# The nodes started with a fault (a wrong interface, an unreachable head, K3SIM_FAULT): the figures count them.
FAULTY = ("ifname-worker", "unreachable", "hang1", "crash", "oom", "wrong-kernel", "slow")
K3_FLAGS = [
    "--tp-size",
    "32",
    "--ep-size",
    "32",
    "--context-length",
    "131072",
    "--max-running-requests",
    "16",
    "--mem-fraction-static",
    "0.85",
    "--kv-cache-dtype",
    "bf16",
    "--mamba-ssm-dtype",
    "float32",
]
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)|^\(\w+ pid=\d+\) \w+ (\d\d-\d\d \d\d:\d\d:\d\d)")


def stamp(node: SimNode, text: str) -> datetime.datetime:
    """Time of the first log line containing text (second resolution, from the engine's own prefix)."""
    for line in node.text().splitlines():
        match = _STAMP.match(line)
        if match and text in line:
            if match.group(1):
                return datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")
            return datetime.datetime.strptime(f"2000-{match.group(2)}", "%Y-%m-%d %H:%M:%S")
    raise AssertionError(f"{node.name}: no line with {text!r}:\n{node.text()[-3000:]}")


def sglang_single(model: Path, port: int, *extra: str) -> list[str]:
    return [
        "--mimic",
        "sglang",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--context-length",
        "32768",
        *extra,
    ]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SimNode]]:
    tiny = tmp_path_factory.mktemp("kimi-k3-tiny")
    write_checkpoint(tiny)
    k3 = tmp_path_factory.mktemp("kimi-k3-config")  # config.json only: admission never reads the weights
    (k3 / "config.json").write_text(json.dumps(config_for(load_catalog().models["kimi-k3"]), indent=2))
    ports = iter(free_ports(16))
    lo = {"GLOO_SOCKET_IFNAME": "lo"}
    with NodeSet(tmp_path_factory.mktemp("logs")) as ns:
        dist = next(ports)
        pair = [
            "--nnodes",
            "2",
            "--tp-size",
            "2",
            "--dist-init-addr",
            f"127.0.0.1:{dist}",
            "--dist-timeout",
            str(IFNAME_TIMEOUT_S),
        ]
        # Gloo's own error for a wrong interface (the tcp group's copy of it is held to this text in
        # tests/unit/test_sim_socket_group.py)
        gloo = {"K3SIM_GROUP": "gloo"}
        ns.start("ifname-head", sglang_single(tiny, next(ports), *pair, "--node-rank", "0"), {**lo, **gloo})
        ns.start(
            "ifname-worker",
            sglang_single(tiny, next(ports), *pair, "--node-rank", "1"),
            {"GLOO_SOCKET_IFNAME": "nosuch0", **gloo},
        )
        ns.start(
            "unreachable",
            sglang_single(
                tiny,
                next(ports),
                "--nnodes",
                "2",
                "--node-rank",
                "1",
                "--dist-init-addr",
                f"127.0.0.9:{next(ports)}",
                "--dist-timeout",
                str(UNREACHABLE_TIMEOUT_S),
            ),
            lo,
        )
        hang_env = {
            **lo,
            "K3SIM_FAULT": "hang_at_rendezvous:120",
            "K3SIM_FAULT_RANK": "1",
            "VLLM_ENGINE_READY_TIMEOUT_S": str(HANG_TIMEOUT_S),
        }
        master, http = next(ports), next(ports)
        for rank in range(2):
            argv = [
                "--mimic",
                "vllm",
                str(tiny),
                "-tp",
                "2",
                "--nnodes",
                "2",
                "--node-rank",
                str(rank),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(master),
                "--port",
                str(http),
                "--host",
                "127.0.0.1",
                *(["--headless"] if rank else []),
            ]
            ns.start(f"hang{rank}", argv, hang_env)
        ns.start("crash", sglang_single(tiny, next(ports)), {**lo, "K3SIM_FAULT": "crash_after_load"})
        ns.start(
            "oom",
            ["--mimic", "vllm", str(tiny), "--host", "127.0.0.1", "--port", str(next(ports))],
            {**lo, "K3SIM_FAULT": "oom"},
        )
        ns.start(
            "wrong-kernel",
            sglang_single(tiny, next(ports), "--moe-runner-backend", "marlin"),
            {**lo, "K3SIM_FAULT": "wrong_kernel"},
        )
        ns.start("slow", sglang_single(tiny, next(ports)), {**lo, "K3SIM_FAULT": "slow_load:2"})
        hopper = {**lo, "K3SIM_GPU": "h100-80gb"}
        ns.start(
            "k3-auto",
            ["--mimic", "sglang", str(k3), "--host", "127.0.0.1", "--port", str(next(ports)), *K3_FLAGS],
            hopper,
        )
        ns.start(
            "k3-marlin",
            [
                "--mimic",
                "sglang",
                str(k3),
                "--host",
                "127.0.0.1",
                "--port",
                str(next(ports)),
                *K3_FLAGS,
                "--moe-runner-backend",
                "marlin",
                "--decode-attention-backend",
                "flashmla",
            ],
            hopper,
        )
        figures.add(figures.FAULTS_INJECTED, sum(n.name in FAULTY for n in ns.nodes))
        yield {n.name: n for n in ns.nodes}


@pytest.mark.timeout(120)
def test_wrong_gloo_socket_ifname_fails_with_a_clear_line(nodes: dict[str, SimNode]) -> None:
    worker = nodes["ifname-worker"]
    assert worker.wait_exit(90) != 0
    line = worker.wait_for(
        r"Rendezvous failed: node rank 1 of 2 at tcp://127\.0\.0\.1:\d+ "
        r"\(GLOO_SOCKET_IFNAME=nosuch0\): .*nosuch0.*",
        1,
    ).group(0)
    assert "Unable to find address for: nosuch0" in line
    took = stamp(worker, "Rendezvous failed") - stamp(worker, "Init parallel begin.")
    assert took.total_seconds() <= IFNAME_TIMEOUT_S


@pytest.mark.timeout(120)
def test_unreachable_head_fails_after_the_configured_timeout(nodes: dict[str, SimNode]) -> None:
    node = nodes["unreachable"]
    assert node.wait_exit(90) != 0
    node.wait_for(
        r"Rendezvous failed: node rank 1 of 2 at tcp://127\.0\.0\.9:\d+ \(GLOO_SOCKET_IFNAME=lo\) did not "
        rf"complete within {UNREACHABLE_TIMEOUT_S} s \(the configured timeout\)",
        1,
    )
    took = (stamp(node, "Rendezvous failed") - stamp(node, "Init parallel begin.")).total_seconds()
    # The configured 3 s, not Gloo's own tens of seconds; a busy machine may wake the watchdog late.
    assert UNREACHABLE_TIMEOUT_S - 1 <= took <= UNREACHABLE_TIMEOUT_S + 15


@pytest.mark.timeout(120)
def test_hang_at_rendezvous_makes_the_head_time_out(nodes: dict[str, SimNode]) -> None:
    head, hung = nodes["hang0"], nodes["hang1"]
    assert head.wait_exit(90) != 0
    head.wait_for(rf"Rendezvous failed: node rank 0 of 2 .* did not complete within {HANG_TIMEOUT_S} s", 1)
    took = (stamp(head, "Rendezvous failed") - stamp(head, "world_size=2 rank=0")).total_seconds()
    assert took <= HANG_TIMEOUT_S + 15  # the configured 4 s (a busy machine may wake it late)
    hung.wait_for(r"k3sim fault hang_at_rendezvous: node rank 1 never joins", 5)
    assert hung.popen.poll() is None  # still "hanging" (bounded by its 120 s); the fixture kills it


@pytest.mark.timeout(120)
def test_crash_after_load(nodes: dict[str, SimNode]) -> None:
    node = nodes["crash"]
    assert node.wait_exit(90) == 1
    log = node.text()
    assert log.index("Load weight end.") < log.index(
        "Scheduler hit an exception: Traceback (most recent call last):"
    )
    assert "RuntimeError: k3sim fault injection: crash_after_load" in log and "fired up" not in log


@pytest.mark.timeout(120)
def test_oom_fault_fails_at_weight_load(nodes: dict[str, SimNode]) -> None:
    node = nodes["oom"]
    assert node.wait_exit(90) == 1
    log = node.text()
    assert "EngineCore failed to start." in log
    assert re.search(r"torch\.OutOfMemoryError: CUDA out of memory\. Tried to allocate [\d.]+ GiB\.", log)
    assert "Model loading took" not in log and "Starting vLLM server" not in log


@pytest.mark.timeout(120)
def test_wrong_kernel_logs_another_moe_backend(nodes: dict[str, SimNode]) -> None:
    node = nodes["wrong-kernel"]
    node.wait_for(r"fired up and ready", 90)
    log = node.text()
    assert "moe_runner_backend=triton (asked for marlin)" in log and "Marlin W4A16" not in log
    port = node.wait_for(r"port=(\d+)", 1).group(1)
    info = httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=5).json()
    assert info["moe_runner_backend"] == "triton"


@pytest.mark.timeout(120)
def test_slow_load(nodes: dict[str, SimNode]) -> None:
    node = nodes["slow"]
    node.wait_for(r"fired up and ready", 90)
    elapsed = float(node.wait_for(r"Load weight end\. elapsed=(\d+\.\d\d) s", 1).group(1))
    assert 2.0 <= elapsed < 20.0  # the fault's 2 s are in the load time (a busy machine adds to them)


@pytest.mark.timeout(120)
def test_k3_on_hopper_with_auto_upcasts_and_runs_out_of_memory(nodes: dict[str, SimNode]) -> None:
    node = nodes["k3-auto"]
    assert node.wait_exit(90) == 1
    log = node.text()
    assert "moe_runner_backend=" not in log.split("Load weight begin.")[1]  # silent, as the real engine
    assert re.search(
        r"torch\.OutOfMemoryError: CUDA out of memory\. Tried to allocate [\d.]+ GiB\. GPU 0 has a "
        r"total capacity of 79\.65 GiB",
        log,
    )
    assert "Load weight end." not in log


@pytest.mark.timeout(120)
def test_k3_on_hopper_with_marlin_fits(nodes: dict[str, SimNode]) -> None:
    node = nodes["k3-marlin"]
    node.wait_for(r"fired up and ready", 90)
    log = node.text()
    assert "FlashMLA only supports a page_size of 64, change page_size to 64." in log
    assert "Kimi-K3 on SM90: moe_runner_backend=marlin (Marlin W4A16 kernels)." in log
    assert re.search(r"Load weight end\. .* avail mem=33\.76 GB, mem usage=45\.43 GB\.", log)
    assert re.search(r"max_total_num_tokens=\d+, .*context_len=131072", log)
