"""The real vLLM on the namespace rig: topologies of the real-engine tier's models (catalog tests/assets/catalog),
one engine per host, the CLI with that catalog, and what runs on a host (to kill one process of an engine)."""
from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.integration.sim_deployments import ROOT, SimDeployments, cli
from tests.polling import wait_for
from tests.realengine.server import inductor_env
from tests.rig import HostRig

CATALOG = ROOT / "tests" / "assets" / "catalog"
# Start-up: 30-80 s per engine (real-engines.md), 7-8 min on the loaded 2-core machine with other tests running.
READY_TIMEOUT_S = 900
MODELS = {"llama": "tiny-llama", "llama16": "tiny-llama", "deepseek": "tiny-deepseek-v3"}


@dataclass(frozen=True)
class Proc:
    """A process inside a host, as the host sees it."""

    pid: int
    ppid: int
    args: str


def dist_files(tmp: Path = Path("/tmp")) -> set[str]:
    """vLLM's file-store rendezvous files in a temp dir (network_utils.get_file_store_init_method: one per
    engine start, removed by a clean stop, left by a killed engine)."""
    return {p.name for p in tmp.glob("vllm_dist_*")}


def host_procs(rig: HostRig, host: str) -> list[Proc]:
    """Every process of a host but its sshd."""
    out = rig.exec(host, ["ps", "-ww", "-eo", "pid=,ppid=,args="]).stdout  # -ww: whole command lines
    procs = []
    for line in out.splitlines():
        pid, ppid, args = line.split(None, 2)
        if "sshd" not in args and not args.startswith("ps "):
            procs.append(Proc(int(pid), int(ppid), args))
    return procs


def engine_main(rig: HostRig, host: str) -> Proc:
    """The `vllm serve` process of a host (the one the launch wrapper runs)."""
    found = [p for p in host_procs(rig, host) if "bin/vllm serve " in p.args and not p.args.startswith("sh ")]
    assert len(found) == 1, host_procs(rig, host)
    return found[0]


def children(rig: HostRig, host: str, pid: int) -> list[Proc]:
    """Direct children of a process of a host."""
    return [p for p in host_procs(rig, host) if p.ppid == pid]


def kill(rig: HostRig, host: str, pid: int) -> None:
    """SIGKILL one process of a host, by its host-local PID."""
    done = rig.exec(host, ["kill", "-KILL", str(pid)])
    assert done.returncode == 0, done.stderr


class RealVllm(SimDeployments):
    """Real-vLLM topologies for a two-host rig over SSH (or Ray); nothing may be left on a host afterwards."""

    def __init__(self, rig: HostRig, vllm: Path, checkpoints: Mapping[str, Path], tmp: Path,
                 launch: Mapping[str, Any], env: Mapping[str, str] | None = None, *, cache_root: Path) -> None:
        super().__init__(rig, checkpoints["llama"], tmp, launch, env)
        self.vllm, self.checkpoints, self.cache_root = vllm, checkpoints, cache_root
        # The engines' TMPDIR (the hosts share this machine's file system): vLLM's file-store rendezvous
        # (vllm_dist_<uuid>) lands here, not in /tmp, where every killed engine left one; removed by cleanup.
        self.engine_tmp = tmp / "engine-tmp"
        self.engine_tmp.mkdir()
        self.dist_before = dist_files()

    def real_topology(self, name: str, model: str = "llama", *, tp: int = 2, dp: int = 1, hosts: int = 2,
                      args: dict[str, Any] | None = None, validate: dict[str, Any] | None = None,
                      launch: dict[str, Any] | None = None) -> Path:
        """One engine per host: TP across the hosts (`--nnodes`) or DP ranks per host."""
        doc = {
            "name": name,
            "model": {"id": MODELS[model], "path": str(self.checkpoints[model])},
            "hardware": {"gpu": "cpu-host", "gpus_per_node": 1},
            "nodes": [{"host": h.mgmt_ip, "ip": h.priv_ip, "iface": h.priv_iface} for h in self.rig.hosts[:hosts]],
            "engine": {"kind": "vllm", "port": 18000, "launcher": [str(self.vllm), "serve"],
                       # eager: 20-40 s less start-up (the test catalog names no parsers: none are rendered)
                       "args": {"--enforce-eager": True, **(args or {})},
                       # KV cache by size, not a share of host RAM; no CPU pinning (2 shared cores); the run's
                       # cache root, as a user's ~/.cache/vllm (tests/conftest.py vllm_cache_root)
                       "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                               "VLLM_CACHE_ROOT": str(self.cache_root), **inductor_env(self.cache_root),
                               "TMPDIR": str(self.engine_tmp)}},
            "parallel": {"tp": tp, "dp": dp},
            "serving": {"context_length": 2048, "max_running_requests": 4},
            "launch": {"port": 29500, "ready_timeout_s": READY_TIMEOUT_S, "stop_grace_s": 5,
                       "log_dir": str(self.tmp / "logs"), "state_dir": str(self.state_dir),
                       **self.launch_defaults, **(launch or {})},
            # A random-weights model never stops on its own and decodes at 1-5 tokens/s here: small budgets.
            "validate": {"concurrency": 2, "effort_requests": 2, "effort_prompt_tokens": 64, "effort_max_tokens": 8,
                         "answer_max_tokens": 16, "short_max_tokens": 16, "request_timeout_s": 300,
                         "cache_block_tokens": 128, "prefix_cache_tokens": 1600, **(validate or {})},
        }
        self.names.append(name)
        path = self.tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def run(self, *args: str, timeout_s: float = READY_TIMEOUT_S + 300) -> subprocess.CompletedProcess[str]:
        """The CLI with the tier's catalog on the commands that take it."""
        extra = ("--catalog", str(CATALOG)) if args[0] in ("plan", "launch", "preflight", "validate", "rollout") else ()
        return cli(*args, *extra, timeout_s=timeout_s, env=self.cli_env)

    def validate(self, topo: Path, *more: str) -> dict[str, Any]:
        """`validate --json` of a running deployment: stage name -> its result."""
        done = self.run("validate", str(topo), "--json", *more)
        assert done.returncode in (0, 1), done.stdout + done.stderr
        report: dict[str, Any] = json.loads(done.stdout)
        return {s["name"]: s for s in report["stages"]}

    def left_on_hosts(self) -> dict[str, list[str]]:
        """Every process on a host but its sshd (closed SSH sessions and stopping engines get a moment)."""
        wait_for(lambda: not any(host_procs(self.rig, h.name) for h in self.rig.hosts), 20.0)
        return {h.name: [f"{p.pid} {p.args[:80]}" for p in host_procs(self.rig, h.name)] for h in self.rig.hosts}

    def cleanup(self) -> list[str]:
        """SimDeployments.cleanup, then: no vLLM rendezvous file left in /tmp by this test's engines (their
        TMPDIR is engine_tmp, removed here with what killed engines left in it)."""
        problems = super().cleanup()
        leaked = sorted(dist_files() - self.dist_before)
        if leaked:
            problems.append(f"vLLM rendezvous files left in /tmp (an engine without the topology's TMPDIR): {leaked}")
        shutil.rmtree(self.engine_tmp, ignore_errors=True)
        return problems

    def remove(self, left: dict[str, list[str]]) -> None:
        for h in self.rig.hosts:
            self.rig.kill_host_processes(h)
