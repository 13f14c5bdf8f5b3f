"""The real vLLM on the namespace rig: topologies of the real-engine tier's models (catalog tests/assets/catalog),
one engine per host, the CLI with that catalog, and what runs on a host (to kill one process of an engine)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from k3deploy.executors.base import exit_record
from k3deploy.records.store import StateStore
from tests.integration.sim_deployments import ROOT, SimDeployments, cli
from tests.polling import wait_for
from tests.realengine.server import inductor_env
from tests.rig import HostRig

CATALOG = ROOT / "tests" / "assets" / "catalog"
# Start-up: 30-80 s per engine (real-engines.md), 7-8 min on the loaded 2-core machine with other tests running.
READY_TIMEOUT_S = 900
MODELS = {"llama": "tiny-llama", "llama16": "tiny-llama", "deepseek": "tiny-deepseek-v3"}
# The bound (39): a failure line names the cause within 10 s of the node's end.
NAMED_WITHIN_S = 10.0
# vLLM's log prefix time (vllm/logger.py: "%m-%d %H:%M:%S", local time, no year).
_VLLM_TIME_RE = re.compile(r"\b(\d\d-\d\d \d\d:\d\d:\d\d)\b")


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


def node_end_s(log_tail: str, line: str) -> float:
    """When a failed node ended (epoch s): its wrapper's exit record, else (an engine that hangs after a fatal
    line, stopped by the teardown) the time vLLM printed on that line (to the second)."""
    rec = exit_record(log_tail)
    if rec is not None:
        return rec[1]
    stamp = _VLLM_TIME_RE.search(line)
    assert stamp, f"no exit record and no vLLM time on the failure's line: {line!r}"
    year = time.localtime().tm_year
    return time.mktime(time.strptime(f"{year}-{stamp.group(1)}", "%Y-%m-%d %H:%M:%S"))


def children(rig: HostRig, host: str, pid: int) -> list[Proc]:
    """Direct children of a process of a host."""
    return [p for p in host_procs(rig, host) if p.ppid == pid]


def kill(rig: HostRig, host: str, pid: int) -> None:
    """SIGKILL one process of a host, by its host-local PID."""
    done = rig.exec(host, ["kill", "-KILL", str(pid)])
    assert done.returncode == 0, done.stderr


def kill_worker_child(rig: HostRig, host: str) -> None:
    """SIGKILL the worker child (VLLM::Worker_TPn) of a host's engine: its main process logs the death, exits 0."""
    main = engine_main(rig, host)
    child = [p for p in children(rig, host, main.pid) if "Worker" in p.args]
    assert child, children(rig, host, main.pid)
    kill(rig, host, child[0].pid)


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

    def run(self, *args: str, timeout_s: float = READY_TIMEOUT_S + 300,
            catalog: Path = CATALOG) -> subprocess.CompletedProcess[str]:
        """The CLI with the tier's catalog on the commands that take it."""
        extra = ("--catalog", str(catalog)) if args[0] in ("plan", "launch", "preflight", "validate", "rollout") else ()
        return cli(*args, *extra, timeout_s=timeout_s, env=self.cli_env)

    def validate(self, topo: Path, *more: str) -> dict[str, Any]:
        """`validate --json` of a running deployment: stage name -> its result."""
        done = self.run("validate", str(topo), "--json", *more)
        assert done.returncode in (0, 1), done.stdout + done.stderr
        report: dict[str, Any] = json.loads(done.stdout)
        return {s["name"]: s for s in report["stages"]}

    def named_failure(self, name: str, signature: str, *texts: str) -> tuple[str, float]:
        """The failed record's cause ends with the catalog signature's cause and fix (with the texts given: the
        filled values); (that cause, seconds from the failed node's end to the record naming it)."""
        failure = StateStore(self.state_dir).require(name).failure
        assert failure is not None and failure.rank is not None, name
        cause = failure.cause
        assert "; cause: " in cause and cause.endswith(f"[{signature}]"), cause
        for text in texts:
            assert text in cause, (text, cause)
        return cause, failure.at - node_end_s(failure.log_tail, cause)

    def killed_worker_named(self, name: str, rank: int) -> float:
        """After kill_worker_child: the catalog names it, within the bound; seconds from the node's end to the
        record naming it. Which of two lines vLLM prints depends on whether its executor read the child's exit
        status before it saw the child gone (both seen here: "died unexpectedly (exit code: -9)", or none)."""
        failure = StateStore(self.state_dir).require(name).failure
        read_status = failure is not None and failure.cause.endswith("[worker-killed-sigkill]")
        signature, cause = (("worker-killed-sigkill", "cause: a worker process was killed by SIGKILL") if read_status
                            else ("worker-killed-no-status", "cause: a worker process vanished before its executor could read"))
        _, seconds = self.named_failure(
            name, signature, cause,
            f"Fix: look for `Out of memory: Killed process` in `dmesg` on {self.rig.hosts[rank].mgmt_ip}")
        assert seconds < NAMED_WITHIN_S, seconds
        return seconds

    def failed_launch(self, topo: Path, name: str, signature: str, *texts: str,
                      catalog: Path = CATALOG) -> float:
        """`launch` of a one-host start that fails: exit 4; launch's failure line, `status` and `logs` name the
        catalog's cause and fix for the node; seconds from its end to the record."""
        run = self.run("launch", str(topo), "--json", "--skip-preflight", catalog=catalog)
        assert run.returncode == 4, run.stdout[-2000:] + run.stderr[-4000:]
        rec = json.loads(run.stdout)
        assert rec["status"] == "failed" and rec["ready_at"] is None, rec
        cause, seconds = self.named_failure(name, signature, *texts)
        host = self.rig.hosts[0].mgmt_ip
        assert f"rank 0 ({host}): {cause}" in run.stderr, run.stderr[-4000:]  # the failure line
        assert self.failed_status(topo, name, 0, host)["failure"]["cause"] == cause
        logs = self.run("logs", str(topo), "-n", "400")
        named = f"==> rank 0 {host}: {cause.split('; cause: ')[-1]} <=="  # the same cause and fix
        assert logs.returncode == 0 and named in logs.stderr.splitlines(), (named, logs.stderr[-2000:])
        return seconds

    def real_failures(self, prefix: str) -> dict[str, float]:
        """Five real failures of vLLM, each launched here (one host, TP 1 or 2): four before its weights load (a
        taken port, a missing checkpoint, a checkpoint whose heads TP does not divide, a wrong interface) and a
        KV cache too small; signature id -> seconds from the failed node's end to its failure being named (each
        within the bound), and nothing left on a host."""
        h0 = self.rig.hosts[0]
        seconds = {}
        # The engine port taken: sshd listens on port 22 of every host (the asset's taker was a second engine).
        topo = self._edited(self.real_topology(f"{prefix}-port", tp=1, hosts=1),
                            lambda d: d["engine"].update(port=22))
        seconds["http-port-in-use"] = self.failed_launch(
            topo, f"{prefix}-port", "http-port-in-use", "cause: the engine's HTTP port is already taken on this node",
            f"Fix: change engine.port, or stop what listens there (`ss -ltnp` on {h0.mgmt_ip}")
        missing = self.tmp / "no-such-model"
        topo = self._edited(self.real_topology(f"{prefix}-ckpt", tp=1, hosts=1),
                            lambda d: d["model"].update(path=str(missing)))
        seconds["checkpoint-missing"] = self.failed_launch(
            topo, f"{prefix}-ckpt", "checkpoint-missing", "cause: the model path does not exist on this node",
            f"Fix: put the checkpoint at {missing} on {h0.mgmt_ip}")
        # A checkpoint that is not what the plan read: 3 heads (the catalog's tiny-llama has 4, so the planner
        # passes TP 2); vLLM refuses the layout at configuration. One host of two "GPUs" (one vLLM import, not
        # one per host). Hidden 96 and one KV head keep transformers' own check (hidden a multiple of the
        # heads) quiet: it would refuse first.
        three = self.tmp / "tiny-llama-3-heads"
        shutil.copytree(self.checkpoints["llama"], three)
        config = json.loads((three / "config.json").read_text())
        (three / "config.json").write_text(json.dumps(
            {**config, "num_attention_heads": 3, "num_key_value_heads": 1, "hidden_size": 96}))
        def three_heads(doc: dict[str, Any]) -> None:
            doc["model"]["path"] = str(three)
            doc["hardware"]["gpus_per_node"] = 2

        topo = self._edited(self.real_topology(f"{prefix}-heads", hosts=1), three_heads)
        seconds["tp-not-dividing-heads"] = self.failed_launch(
            topo, f"{prefix}-heads", "tp-not-dividing-heads",
            "cause: the model's 3 attention heads cannot be split evenly over tensor parallel size 2.",
            "Fix: set parallel.tp to a divisor of 3 (1, 3)")
        topo = self._edited(self.real_topology(f"{prefix}-iface", tp=1, hosts=1),
                            lambda d: d["nodes"][0].update(iface="k3-noiface"))
        seconds["gloo-iface-unknown"] = self.failed_launch(
            topo, f"{prefix}-iface", "gloo-iface-unknown",
            "cause: GLOO_SOCKET_IFNAME names an interface this node does not have",
            f"Fix: set nodes[0].iface to the interface that carries {h0.priv_ip} on {h0.mgmt_ip}")
        seconds["kv-cache-too-small-vllm"] = self._kv_too_small(f"{prefix}-kv")
        assert all(s < NAMED_WITHIN_S for s in seconds.values()), seconds
        left = self.left_on_hosts()
        assert not any(left.values()), left
        return seconds

    def _kv_too_small(self, name: str) -> float:
        """vLLM's KV cache too small for its context length, launched here (one host, TP 1): the plan reads a
        catalog that overstates the host (8 GiB, as a hardware entry that does not match the node) and a model of
        8M positions, so it passes the 8M context the planner would refuse with the true 1 GiB (MEM_KV_CONTEXT);
        the engine, given 1 GiB (VLLM_CPU_KVCACHE_SPACE), refuses after the weights load and hangs (a fatal
        line: launch stops it). Seconds from that line to the failure being named."""
        catalog = self.tmp / "catalog-8g"
        shutil.copytree(CATALOG, catalog)
        for file, old, new in (("hardware.yaml", "memory_gib: 1.0", "memory_gib: 8.0"),
                               ("hardware.yaml", "usable_gib: 1.0", "usable_gib: 8.0"),
                               ("models.yaml", "max_position_embeddings: 4096", "max_position_embeddings: 8388608")):
            text = (catalog / file).read_text()
            assert old in text, (file, old)
            (catalog / file).write_text(text.replace(old, new, 1))
        long = self.tmp / "tiny-llama-8m"
        shutil.copytree(self.checkpoints["llama"], long)
        config = json.loads((long / "config.json").read_text())
        (long / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 8388608}))

        def change(doc: dict[str, Any]) -> None:
            doc["model"]["path"] = str(long)
            doc["serving"]["context_length"] = 8388608

        topo = self._edited(self.real_topology(name, tp=1, hosts=1), change)
        return self.failed_launch(
            topo, name, "kv-cache-too-small-vllm", "fatal error in its log: ",
            "cause: the KV cache left after the weights cannot hold one request of the configured context length "
            "(8388608 tokens).", "Fix: lower serving.context_length to ", catalog=catalog)

    @staticmethod
    def _edited(topo: Path, change: Callable[[dict[str, Any]], None]) -> Path:
        doc = yaml.safe_load(topo.read_text())
        change(doc)
        topo.write_text(yaml.safe_dump(doc, sort_keys=False))
        return topo

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
