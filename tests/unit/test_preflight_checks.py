"""Preflight judgements on recorded node facts (what the facts probe prints), and the command end to end on
four local nodes: table, --json, --junit, exit codes; launch records whether preflight ran."""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.nodeplan.jobs import engine_python, jobs_for
from k3deploy.planning.files import catalog_for, require_feasible
from k3deploy.preflight.checks_host import HOST_CHECKS
from k3deploy.preflight.checks_stack import STACK_CHECKS
from k3deploy.preflight.context import Context
from tests.k3deploy_cli import run_k3deploy as cli
from tests.unit.test_launch_support import fake_topology, kill_tagged

CHECKS = {c.name: c for c in (*HOST_CHECKS, *STACK_CHECKS)}
# Checks that do not apply on the local rig's `sim` hardware and local executor, with the reason they give;
# every other check must pass on healthy nodes (a check that always skips fails these tests), and these three
# must pass on healthy nodes where they apply (test_checks_that_skip_here_pass_where_they_apply).
NOT_HERE = {"accelerators": "hardware is sim", "driver": "hardware is sim", "ray": "not launched through Ray"}
IDLE_H100S = [{"exit": 0, "err": "", "out": "".join(f"{i}, NVIDIA H100 80GB HBM3, 81559, 4, 550.54.15\n"
                                                    for i in range(8))},
              {"exit": 0, "err": "", "out": ""},
              {"exit": 0, "err": "", "out": "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: "
                                            "12.4     |\n"}]
ENGINE_OK = {"python": "3.11.2", "executable": "/usr/bin/python3", "torch": "2.13.0", "ray": "2.60.0",
             "version": "0.5.23", "known_archs": ["KimiK3ForConditionalGeneration"], "error": ""}


def facts(ip: str, **changes: Any) -> dict[str, Any]:
    """What a healthy node's facts probe prints (lo holding `ip`)."""
    f: dict[str, Any] = {
        "time": time.time(), "python": "3.11.2",
        "host": {"hostname": "n1", "resolves_to": ["10.0.0.5"], "resolve_error": ""},
        "iface": {"present": True, "operstate": "unknown", "flags": "0x9", "mtu": "65536",
                  "ip_addr": f"1: lo    inet {ip}/8 scope host lo\n"},
        "checkpoint": {"path": "/ckpt", "is_dir": True, "index": True, "shards": 4, "missing_shards": [],
                       "architectures": ["KimiK3ForConditionalGeneration"], "revision": None, "free_bytes": 10},
        "shm": {"total": 2**34, "free": 2**34}, "tools": {},
        "engine": {"exit": 0, "out": json.dumps(ENGINE_OK), "err": ""},
    }
    f["time"] += changes.pop("time_offset_s", 0.0)
    for path, value in changes.items():
        *parents, last = path.split("__")
        target = f
        for p in parents:
            target = target[p]
        target[last] = value
    return f


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> Context:
    tmp = tmp_path_factory.mktemp("pf")
    topo = fake_topology(tmp, "pf-unit", model={"id": "kimi-k3-tiny", "path": "/ckpt", "revision": "abc123"})
    cat = catalog_for(None)
    plan = require_feasible(topo, cat)
    jobs = jobs_for(plan, None, cat)
    return Context(plan=plan, catalog=cat, nodes={j.rank: j for j in jobs})


def healthy(check: str, status: str, detail: str) -> bool:
    """A healthy node's verdict: pass, or the skip (with its reason) of a check that does not apply here."""
    return status == "skip" and NOT_HERE[check] in detail if check in NOT_HERE else status == "pass"


def judge(ctx: Context, check: str, odd: dict[str, Any]) -> dict[int, tuple[str, str, str]]:
    """Rank 2 with `odd` facts, the others healthy: rank -> (status, detail, fix)."""
    c = copy.copy(ctx)
    now = time.time()
    c.clock = {r: (now - 0.05, now + 0.05) for r in ctx.nodes}
    c.facts = {r: facts(n.ip, **(dict(odd) if r == 2 else {})) for r, n in ctx.nodes.items()}
    c.errors = {}
    if check == "hostname":  # a loopback hostname is only wrong where the node's ip is not loopback itself
        c.nodes = {**ctx.nodes, 2: ctx.nodes[2].model_copy(update={"ip": "10.0.0.3"})}
    return {v.rank: (v.status, v.detail, v.fix) for v in CHECKS[check].run(c).verdicts}


@pytest.mark.parametrize(("check", "odd", "says", "fix"), [
    ("hostname", {"host__resolves_to": ["127.0.1.1"]}, "resolves to 127.0.1.1 (loopback)", "/etc/hosts"),
    ("iface", {"iface__flags": "0x1002"}, "lo is down", "ip link set dev lo up"),
    ("iface", {"iface": {"present": False, "all": ["eth0", "lo"]}}, "has no interface lo (it has: eth0, lo)",
     "nodes[].iface"),
    ("mtu", {"iface__mtu": "1500"}, "MTU 1500; the other nodes have 65536", "mtu"),
    ("clock", {"time_offset_s": 30.0}, "30.0 s ahead of this machine", "chrony"),
    ("checkpoint", {"checkpoint__revision": ["fff000"]}, "revision fff000 but model.revision pins abc123",
     "--revision abc123"),
    ("checkpoint", {"checkpoint__missing_shards": ["model-00002-of-00004.safetensors"]}, "1 shard(s) listed",
     "k3deploy weights sync"),
    ("shm", {"shm": {"total": 2**20, "free": 2**20}}, "/dev/shm is 0.00 GiB", "--shm-size"),
    ("engine", {"engine__out": json.dumps({**ENGINE_OK, "known_archs": []})},
     "no model class for KimiK3ForConditionalGeneration", "K3-enabled"),
    ("engine", {"engine__out": json.dumps({**ENGINE_OK, "error": "ModuleNotFoundError: No module named 'sglang'"})},
     "cannot load the engine", "engine.launcher"),
    ("engine", {"engine": {"exit": 127, "out": "", "err": "sh: /opt/venv/bin/python3: not found"}},
     "could not run", "engine.launcher"),
])
def test_one_odd_node_fails_alone_with_a_fix(ctx: Context, check: str, odd: dict[str, Any], says: str,
                                             fix: str) -> None:
    got = judge(ctx, check, odd)
    assert got[2][0] == "fail" and says in got[2][1] and fix in got[2][2], got[2]
    assert all(healthy(check, *got[r][:2]) for r in (0, 1, 3)), got


def test_healthy_facts_pass_and_unreachable_nodes_are_errors(ctx: Context) -> None:
    c = copy.copy(ctx)
    c.facts = {r: facts(n.ip) for r, n in ctx.nodes.items() if r != 1}
    c.clock = {r: (time.time() - 0.05, time.time() + 0.05) for r in c.facts}
    c.errors = {1: "cannot connect to root@n2:22 after 3 attempts"}
    for check in CHECKS.values():
        verdicts = {v.rank: v for v in check.run(c).verdicts}
        assert verdicts[1].status == "error" and "cannot connect" in verdicts[1].detail
        assert all(healthy(check.name, verdicts[r].status, verdicts[r].detail) for r in (0, 2, 3)), \
            (check.name, verdicts)


@pytest.fixture(scope="module")
def h100_ctx() -> Context:
    """Four H100 nodes (a plan of the h100-4x8 shape), each reporting eight idle GPUs and one driver."""
    from tests.unit.plan_helpers import plan_of, topology_dict

    cat = catalog_for(None)
    plan = plan_of(topology_dict())
    c = Context(plan=plan, catalog=cat, nodes={j.rank: j for j in jobs_for(plan, None, cat)})
    c.facts = {r: {**facts(n.ip), "tools": {"nvidia": IDLE_H100S}} for r, n in c.nodes.items()}
    return c


def test_checks_that_skip_here_pass_where_they_apply(ctx: Context, h100_ctx: Context) -> None:
    on_ray = copy.copy(ctx)
    on_ray.ray_runtime = True
    on_ray.facts = {r: facts(n.ip) for r, n in ctx.nodes.items()}
    for check, c in (("accelerators", h100_ctx), ("driver", h100_ctx), ("ray", on_ray)):
        verdicts = CHECKS[check].run(c).verdicts
        assert len(verdicts) == len(c.nodes) and all(v.status == "pass" for v in verdicts), (check, verdicts)


def test_an_a3_node_passes_the_accelerator_checks_and_a_busy_die_fails_it() -> None:
    """The A3 topology against npu-smi's A3 table (tests/assets/vendor-tools): 16 logical NPUs per node."""
    cat = catalog_for(None)
    plan = require_feasible(Path(__file__).parents[2] / "topologies" / "ascend-a3-4x16-vllm.yaml", cat)
    a3 = (Path(__file__).parents[1] / "assets" / "vendor-tools" / "npu-smi-info-a3.txt").read_text()
    c = Context(plan=plan, catalog=cat, nodes={j.rank: j for j in jobs_for(plan, None, cat)})
    c.facts = {r: {**facts(n.ip), "tools": {"huawei": [{"exit": 0, "err": "", "out": a3}]}}
               for r, n in c.nodes.items()}
    for check in ("accelerators", "driver"):
        assert all(v.status == "pass" for v in CHECKS[check].run(c).verdicts), check
    assert CHECKS["accelerators"].run(c).verdicts[0].detail == "16 x Ascend910"
    c.facts[1] = {**c.facts[1], "tools": {"huawei": [{"exit": 0, "err": "", "out": a3.replace(
        "3196 / 65536", "60196 / 65536")}]}}
    odd = CHECKS["accelerators"].run(c).verdicts[1]
    assert odd.status == "fail" and "accelerator 1 has 58.8 GiB in use" in odd.detail, odd


class ProbeAnswers:
    """An executor that records each argv and answers as the collective probe does on a node without torch_npu:
    Gloo measured, HCCL skipped with the probe's own reason (collective_probe.no_torch_npu, run here)."""

    def __init__(self, rank: int, calls: list[list[str]]) -> None:
        self.rank, self.calls, self.host = rank, calls, f"node-{rank}"

    def run(self, argv: list[str], timeout_s: float = 60.0, **_: object) -> Any:
        from k3deploy.executors.base import CommandResult
        from k3deploy.probes import collective_probe

        self.calls.append(list(argv))
        gloo = {"seconds": 0.05, "bytes": 2**24, "algbw_gbps": 0.33, "busbw_gbps": 0.5, "wrong_elements": 0}
        skipped = f"no torch_npu in the engine's interpreter ({collective_probe.no_torch_npu()}): HCCL not probed"
        answer = {"ok": True, "rank": self.rank, "results": {"gloo": gloo, "hccl": {"skipped": skipped}},
                  "stage": "destroy", "ifname": {}, "elapsed_s": 3.1}
        return CommandResult(exit_code=0, stdout=json.dumps(answer) + "\n", stderr="")

    def close(self) -> None:
        pass


def test_the_rendezvous_probe_asks_for_hccl_on_ascend_and_says_when_it_was_skipped() -> None:
    from k3deploy.executors.fleet import NodeFleet
    from k3deploy.preflight import rendezvous
    from k3deploy.preflight.runner import _backends

    cat = catalog_for(None)
    plan = require_feasible(Path(__file__).parents[2] / "topologies" / "ascend-a3-4x16-vllm.yaml", cat)
    jobs = jobs_for(plan, None, cat)
    c = Context(plan=plan, catalog=cat, nodes={j.rank: j for j in jobs})
    assert _backends(c) == "gloo,hccl"
    calls: list[list[str]] = []
    ranks = iter(range(len(jobs)))
    fleet = NodeFleet({j.rank: j.target for j in jobs}, lambda _: ProbeAnswers(next(ranks), calls))  # type: ignore[arg-type,return-value]
    try:
        verdicts, measured = rendezvous.collective_check(fleet, c.nodes, 13345, nbytes=2**24, timeout_s=20,
                                                         backends=_backends(c))
    finally:
        fleet.close()
    assert {call[-1] for call in calls} == {"gloo,hccl"} and len(calls) == 4
    assert all(v.status == "pass" for v in verdicts), verdicts
    assert verdicts[0].detail == ("gloo all_reduce of 16 MiB correct in 50 ms, busbw 0.50 GB/s; hccl skipped: no "
                                  "torch_npu in the engine's interpreter (ModuleNotFoundError: No module named "
                                  "'torch_npu'): HCCL not probed")
    assert measured[0]["hccl"] == {"skipped": verdicts[0].detail.split("hccl skipped: ")[1]}


def test_engine_interpreter_from_the_argv() -> None:
    assert engine_python(["/opt/venv/bin/sglang", "serve"]) == "/opt/venv/bin/python3"
    assert engine_python(["/usr/bin/python3.11", "-m", "sglang.launch_server"]) == "/usr/bin/python3.11"
    assert engine_python(["vllm", "serve"]) == "python3"
    assert engine_python(["docker", "run", "img"]) is None


@pytest.mark.timeout(180)
@pytest.mark.torch  # the rendezvous probe runs torch.distributed (Gloo) on the four local nodes
def test_preflight_and_launch_on_local_nodes(tmp_path: Path, checkpoint: Path) -> None:
    topo = fake_topology(tmp_path, "pf-local", model={"id": "kimi-k3-tiny", "path": str(checkpoint)})
    run = cli("preflight", str(topo), "--json", "--junit", str(tmp_path / "pf.xml"))
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["exit_code"] == 0 and sorted(report["measurements"]) == ["0", "1", "2", "3"]
    elapsed = {c["name"]: c["elapsed_s"] for c in report["checks"]}
    assert elapsed["rendezvous"] > 0 and elapsed["port"] > 0, elapsed  # the runner times each check
    assert "preflight.rendezvous" in (tmp_path / "pf.xml").read_text()
    table = cli("preflight", str(topo))
    assert table.returncode == 0 and "rendezvous" in table.stdout and "busbw" in table.stdout, table.stdout

    doc = yaml.safe_load(topo.read_text())
    doc["model"]["path"] = str(tmp_path / "nowhere")
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(doc))
    bad = cli("preflight", str(broken))
    assert bad.returncode == 1 and f"no checkpoint at {tmp_path / 'nowhere'}" in bad.stdout
    assert "fix: download the checkpoint" in bad.stdout and "rendezvous: skipped: skipped until these pass: " \
                                                              "checkpoint" in bad.stdout, bad.stdout
    try:
        refused = cli("launch", str(broken))
        assert refused.returncode == 4 and "preflight failed, nothing was started" in refused.stderr
        assert "checkpoint: rank 0 (localhost): no checkpoint at" in refused.stderr, refused.stderr
        rec = json.loads((tmp_path / "state" / "pf-local.json").read_text())
        assert rec["preflight"] == "failed" and rec["status"] == "failed"
        assert "(preflight check checkpoint)" in rec["failure"]["cause"]
        ok = cli("launch", str(topo), "--json")
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout)["preflight"] == "passed"
        assert cli("stop", "pf-local", "--state-dir", str(tmp_path / "state")).returncode == 0
        skipped = cli("launch", str(broken), "--skip-preflight", "--json")
        assert skipped.returncode == 0 and json.loads(skipped.stdout)["preflight"] == "skipped", skipped.stderr
        assert cli("stop", "pf-local", "--state-dir", str(tmp_path / "state")).returncode == 0
    finally:
        assert kill_tagged("pf-local.") == []


def test_container_engines_compare_image_digests(ctx: Context) -> None:
    c = copy.copy(ctx)
    engine = ctx.plan.topology.engine.model_copy(update={"image": "lmsys/sglang:k3"})
    topology = ctx.plan.topology.model_copy(update={"engine": engine})
    c.plan = ctx.plan._replace(topology=topology)
    docker = {0: {"exit": 0, "out": "sha256:aaa\n", "err": ""}, 1: {"exit": 0, "out": "sha256:aaa\n", "err": ""},
              2: {"exit": 0, "out": "sha256:bbb\n", "err": ""},
              3: {"exit": 1, "out": "", "err": "Error: No such image: lmsys/sglang:k3"}}
    c.facts = {r: facts(n.ip, tools={"docker": [docker[r]]}) for r, n in ctx.nodes.items()}
    c.errors = {}
    got = {v.rank: v for v in CHECKS["engine"].run(c).verdicts}
    assert got[0].status == "pass" and got[1].status == "pass"
    assert got[2].status == "fail" and "sha256:bbb; the other nodes have sha256:aaa" in got[2].detail
    assert got[3].status == "fail" and "not on the node" in got[3].detail and "docker pull" in got[3].fix
