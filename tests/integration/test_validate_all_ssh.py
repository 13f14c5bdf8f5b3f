"""`k3deploy validate` (all seven stages, no --only) against the stand-in launched over SSH on four
network-namespace hosts as a simulated H100 cluster (TP4/EP4): a clean deployment passes every stage, and the
faults whose evidence takes the executor's own path fail exactly their stage, with the evidence shown
(tests/integration/validate_all.py). From this machine against a stand-in mimicking SGLang, and from the rig's
login-node namespace through a jump host against one mimicking vLLM (every log read through the jump, every
request through rank 0's tunnel)."""
from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from tests.integration.sim_deployments import Deployments, hosts_empty
from tests.integration.validate_all import SLOW, fault_id, launch_validate_stop, topology
from tests.k3deploy_cli import run_k3deploy as cli
from tests.rig import HostRig

pytestmark = pytest.mark.integration
Cli = Callable[..., subprocess.CompletedProcess[str]]


def login_cli(rig: HostRig) -> Cli:
    """The CLI run in the login-node namespace (management network only)."""
    ctl = rig.controller()

    def run(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        return cli(*args, timeout_s=timeout_s, prefix=("ip", "netns", "exec", ctl))
    return run


# (route, fault): the clean run per route, a log's evidence read over SSH and through the jump host
# (wrong_kernel), and the load forwarded through rank 0's tunnel (slow_decode). Every other fault, on both
# dialects, fails its stage at unit level (tests/unit/test_validate_fault_grid.py, test_validate_live_stages.py).
GRID = [("here", ""), ("here", "wrong_kernel"), ("login", ""), ("login", "wrong_kernel"),
        ("login", f"slow_decode:{SLOW}")]


@pytest.mark.timeout(200)
@pytest.mark.parametrize(("route", "fault"), GRID, ids=[f"{r}-{fault_id(f)}" for r, f in GRID])
def test_every_stage_passes_clean_and_each_fault_fails_exactly_its_stage(deployments: Deployments, rig4: HostRig,
                                                                         fault: str, route: str) -> None:
    name = f"va-{route}-{fault_id(fault).replace('_', '-')}"
    if route == "here":
        mimic, run, nodes, extra = "sglang", cli, None, []
    else:  # the login node reaches h01's management address only: everything goes through it
        mimic, run, extra = "vllm", login_cli(rig4), ["--ssh-jump", f"root@{rig4.hosts[0].mgmt_ip}"]
        nodes = [{"host": h.priv_ip, "ip": h.priv_ip, "iface": h.priv_iface} for h in rig4.hosts]
    stages = launch_validate_stop(run, topology(deployments, name, fault, mimic, nodes), fault, mimic, *extra)
    assert hosts_empty(rig4), {h.name: rig4.pids(h) for h in rig4.hosts}
    hosts = [n["host"] for n in stages["kernels"]["nodes"]]
    assert hosts == [h.mgmt_ip if route == "here" else h.priv_ip for h in rig4.hosts]  # every node's log read
    assert [n["status"] for n in stages["shards"]["nodes"]] == ["pass"] * 4
    assert stages["effort"]["results"]["route"] == ("forwarded" if route == "login" else "here")
    if not fault:
        assert "moe marlin (marlin w4a16), attention flashmla" in stages["kernels"]["detail"].lower()
        assert "world_size=4, nnodes=4, tp=4, ep=4, dp=1, pp=1, experts_per_rank=8" in stages["topology"]["detail"]
        assert [n["detail"] for n in stages["topology"]["nodes"]] == [f"DP0 PP0 TP{r} EP{r}" for r in range(4)]
        assert "facts retrieved at every depth (10%, 50%, 90%)" in stages["long"]["detail"], stages["long"]["detail"]
        assert stages["effort"]["results"]["cold"]["completed"] == 8
