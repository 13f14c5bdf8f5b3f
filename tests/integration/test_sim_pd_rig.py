"""Prefill and decode on two namespace hosts, the real smg in PD mode in front: the decode pulls the KV and
KDA state from the prefill host across the rig's private network (the prefill host's NIC sent it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from k3deploy.sim.checkpoint import write_checkpoint
from k3deploy.sim.local_nodes import PACKAGE_ROOT
from tests.integration.test_sim_pd import FACTS, FLAGS, QUESTION, RIGHT, VENV, needs_routers
from tests.ports import free_ports
from tests.rig import HostRig
from tests.rig.netns import PRIV_IFACE

pytestmark = pytest.mark.integration


def _spawn(rig: HostRig, host: str, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A stand-in node inside a rig host (its network, PID and mount namespaces), detached, logging to log."""
    full = {**os.environ, **env, "PYTHONPATH": str(PACKAGE_ROOT), "PYTHONUNBUFFERED": "1"}
    inside = ["nsenter", "--target", str(rig.sshd_pid(host)), "--pid", "--mount", "--uts", "--net", "--",
              sys.executable, "-m", "k3deploy.sim", "serve", *argv]
    with log.open("wb") as out:
        return subprocess.Popen(inside, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full,
                                start_new_session=True)


def _wait_log(log: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        time.sleep(0.3)
    raise AssertionError(f"no {text!r} in {log}:\n{log.read_text(errors='replace')[-3000:]}")


@needs_routers
@pytest.mark.timeout(400)
def test_decode_pulls_the_state_from_the_prefill_host(root_only: None, tmp_path: Path) -> None:
    model = tmp_path / "kimi-k3-tiny"
    write_checkpoint(model)
    procs: list[subprocess.Popen[bytes]] = []
    with HostRig(2, prefix="pdsim") as rig:
        try:
            prefill_host, decode_host = rig.hosts
            api, boot, router_port, metrics_port = free_ports(4)
            env = {"K3SIM_SPEED": "50", "GLOO_SOCKET_IFNAME": PRIV_IFACE}
            common = ["--mimic", "sglang", str(model), "--host", "0.0.0.0", "--port", str(api), *FLAGS,
                      "--disaggregation-bootstrap-port", str(boot)]
            logs = {role: tmp_path / f"{role}.log" for role in ("prefill", "decode", "router")}
            prefill = _spawn(rig, prefill_host.name, [*common, "--disaggregation-mode", "prefill"],
                             {**env, "SGLANG_HOST_IP": prefill_host.priv_ip}, logs["prefill"])
            decode = _spawn(rig, decode_host.name, [*common, "--disaggregation-mode", "decode",
                                                    "--disaggregation-decode-enable-radix-cache"],
                            {**env, "SGLANG_HOST_IP": decode_host.priv_ip}, logs["decode"])
            procs += [prefill, decode]
            for role, proc in (("prefill", prefill), ("decode", decode)):
                _wait_log(logs[role], "fired up and ready", proc, 120)
            # The router runs in the root namespace, which reaches the hosts' private addresses.
            argv = [str(VENV / "bin" / "python"), "-m", "smg.launch_router", "--host", "127.0.0.1",
                    "--port", str(router_port), "--pd-disaggregation",
                    "--prefill", f"http://{prefill_host.priv_ip}:{api}", str(boot),
                    "--decode", f"http://{decode_host.priv_ip}:{api}", "--policy", "random",
                    "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)]
            with logs["router"].open("wb") as out:
                router = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            procs.append(router)
            url = f"http://127.0.0.1:{router_port}"
            deadline = time.monotonic() + 120
            while True:
                try:
                    workers = httpx.get(f"{url}/workers", timeout=5).json().get("workers", [])
                    if len(workers) == 2 and all(w.get("is_healthy") for w in workers):
                        break
                except (httpx.HTTPError, ValueError):
                    pass
                assert router.poll() is None and time.monotonic() < deadline, logs["router"].read_text()[-3000:]
                time.sleep(0.5)
            sent_before = rig.iface_bytes(prefill_host, PRIV_IFACE)[1]
            body = {"model": "m", "messages": [{"role": "user", "content": f"{FACTS} {QUESTION}"}], "max_tokens": 400}
            reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
            assert reply.status_code == 200, reply.text
            answer = reply.json()["choices"][0]["message"]["content"]
            assert all(value in answer for value in RIGHT), answer
            # The prefill host sent at least the prompt's KV (its token ids) over the private network.
            sent = rig.iface_bytes(prefill_host, PRIV_IFACE)[1] - sent_before
            assert sent > 3000 * 2, sent
            assert "Prefill batch" not in logs["decode"].read_text()
        finally:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)


@needs_routers
@pytest.mark.timeout(400)
@pytest.mark.parametrize("side_channel_host_set", [True, False])
def test_vllm_nixl_side_channel_host_across_hosts(root_only: None, tmp_path: Path, side_channel_host_set: bool) -> None:
    """Unset, VLLM_NIXL_SIDE_CHANNEL_HOST is localhost: the prefill advertises it, and on the decode's host
    localhost:5600 is the decode's own side channel, another engine (vllm#27083: an engine-ID mismatch)."""
    model = tmp_path / "kimi-k3-tiny"
    write_checkpoint(model)
    procs: list[subprocess.Popen[bytes]] = []
    with HostRig(2, prefix="pdsim") as rig:
        try:
            prefill_host, decode_host = rig.hosts
            api, router_port, metrics_port = free_ports(3)
            config = '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'
            argv = ["--mimic", "vllm", str(model), "--host", "0.0.0.0", "--port", str(api), "--max-model-len",
                    "32768", "--served-model-name", "m", "--reasoning-parser", "kimi_k3", "--kv-transfer-config", config]
            logs = {role: tmp_path / f"{role}.log" for role in ("prefill", "decode", "router")}
            for role, host in (("prefill", prefill_host), ("decode", decode_host)):
                env = {"K3SIM_SPEED": "50", "VLLM_HOST_IP": host.priv_ip}
                if side_channel_host_set:
                    env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = host.priv_ip
                procs.append(_spawn(rig, host.name, argv, env, logs[role]))
            for role, proc in zip(("prefill", "decode"), procs, strict=True):
                _wait_log(logs[role], "Application startup complete", proc, 120)
            router_argv = [str(VENV / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(router_port),
                           "--vllm-pd-disaggregation", "--kv-connector", "nixl", "--policy", "random",
                           "--prefill", f"http://{prefill_host.priv_ip}:{api}",
                           "--decode", f"http://{decode_host.priv_ip}:{api}",
                           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)]
            with logs["router"].open("wb") as out:
                router = subprocess.Popen(router_argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            procs.append(router)
            _wait_log(logs["router"], "Starting server on", router, 120)
            body = {"model": "m", "messages": [{"role": "user", "content": f"{FACTS} {QUESTION}"}], "max_tokens": 400}
            reply = httpx.post(f"http://127.0.0.1:{router_port}/v1/chat/completions", json=body, timeout=120)
            if side_channel_host_set:
                assert reply.status_code == 200, reply.text
                assert all(value in reply.json()["choices"][0]["message"]["content"] for value in RIGHT)
            else:
                assert reply.status_code == 500 and "Internal server error" in reply.text, reply.text
                _wait_log(logs["decode"], "handshake with localhost:5600: engine_id is", procs[1], 30)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
