"""render_nodes: per-engine, per-GPU-generation commands, env, readiness, docker, launcher."""
from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

import pytest
import yaml

from k3deploy.catalog.loader import load_catalog
from k3deploy.engines.render import render_nodes
from k3deploy.engines.shell import command_text, node_shell
from k3deploy.engines.spec import LaunchSpec
from k3deploy.errors import InfeasibleError
from k3deploy.planning.plan import make_plan
from k3deploy.topology.loader import parse_topology
from tests.unit.plan_helpers import topology_dict
from tests.unit.test_render_support import CASES, doc_of, plan_file, plan_for, plan_of, sim_doc

FAST = pytest.mark.timeout(30)


def opt(spec: LaunchSpec, flag: str) -> str | None:
    """The value after `flag` in argv (None when absent)."""
    argv = list(spec.argv)
    return argv[argv.index(flag) + 1] if flag in argv else None


def pairs(argv: tuple[str, ...]) -> list[str]:
    return [f"{a} {b}" for a, b in itertools.pairwise(argv)]


@FAST
def test_h100_sglang_head_command() -> None:
    specs = render_nodes(plan_file(Path("topologies/h100-4x8-sglang.yaml")).render_inputs())
    head = specs[0]
    assert [s.rank for s in specs] == [0, 1, 2, 3] and head.head and not any(s.head for s in specs[1:])
    assert head.argv[:3] == ("sglang", "serve", "/models/Kimi-K3")
    p = pairs(head.argv)
    for want in ("--tp-size 32", "--ep-size 32", "--nnodes 4", "--node-rank 0",
                 "--dist-init-addr 10.0.0.10:20000", "--dist-timeout 3600", "--mem-fraction-static 0.85",
                 "--context-length 131072", "--moe-runner-backend marlin",
                 "--decode-attention-backend flashmla", "--reasoning-parser kimi_k3",
                 "--tool-call-parser kimi_k3", "--host 0.0.0.0", "--port 8000"):
        assert want in p, want
    assert "--enable-cache-report" in head.argv and "--enable-metrics" in head.argv
    assert head.env["SGLANG_HOST_IP"] == "10.0.0.10"
    assert head.env["NCCL_SOCKET_IFNAME"] == head.env["GLOO_SOCKET_IFNAME"] == "ens-priv"
    assert head.env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert head.secret_env == {"HF_TOKEN": "env:HF_TOKEN"} and "HF_TOKEN" not in head.env
    assert head.container is None


# Seed 000, "How to launch it": the cookbook's flags on every node (rank 0 here), with its values.
COOKBOOK_FLAGS = {"--tp-size": "32", "--ep-size": "32", "--nnodes": "4", "--node-rank": "0",
                  "--dist-init-addr": "10.0.0.10:20000", "--moe-runner-backend": "marlin",
                  "--decode-attention-backend": "flashmla", "--mem-fraction-static": "0.85", "--dist-timeout": "3600",
                  "--reasoning-parser": "kimi_k3", "--tool-call-parser": "kimi_k3", "--host": "0.0.0.0",
                  "--port": "8000"}
COOKBOOK_ENV = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "SGLANG_HOST_IP": "10.0.0.10",
                "NCCL_SOCKET_IFNAME": "ens-priv", "GLOO_SOCKET_IFNAME": "ens-priv"}


@FAST
def test_the_reference_topology_renders_the_cookbooks_command() -> None:
    """Every flag and variable of seed 000's command with its value, and nothing that changes how SGLang splits or
    caps its pools: no --mamba-full-memory-ratio (SGLang's own 0.9), no --max-running-requests."""
    head = render_nodes(plan_file(Path("topologies/h100-4x8-sglang.yaml")).render_inputs())[0]
    for flag, value in COOKBOOK_FLAGS.items():
        assert opt(head, flag) == value, flag
    assert {k: head.env[k] for k in COOKBOOK_ENV} == COOKBOOK_ENV
    assert head.secret_env == {"HF_TOKEN": "env:HF_TOKEN"}
    assert "--mamba-full-memory-ratio" not in head.argv and "--max-running-requests" not in head.argv


@FAST
def test_a_ratio_the_topology_asks_for_is_rendered() -> None:
    for asked in ("calculator", 0.5):
        plan = plan_of(topology_dict(mamba_full_memory_ratio=asked))
        assert plan.memory is not None and plan.memory.pool_ratio is not None
        value = opt(render_nodes(plan.render_inputs())[0], "--mamba-full-memory-ratio")
        assert value is not None and float(value) == pytest.approx(plan.memory.pool_ratio, rel=1e-5)
        assert asked == "calculator" or plan.memory.pool_ratio == asked


@FAST
def test_readiness_per_engine() -> None:
    sg = render_nodes(plan_file(Path("topologies/h100-4x8-sglang.yaml")).render_inputs())
    assert sg[0].ready.kind == "http" and sg[0].ready.url == "http://10.0.0.10:8000"
    assert sg[0].ready.paths == ("/health", "/v1/models")
    assert sg[1].ready.kind == "dummy-health" and sg[1].ready.url == "http://10.0.0.11:8000"
    vl = render_nodes(plan_file(Path("topologies/ascend-a3-4x16-vllm.yaml")).render_inputs())
    assert vl[0].ready.kind == "http" and all(s.ready.kind == "none" and s.headless for s in vl[1:])


@FAST
def test_blackwell_uses_engine_defaults_and_dcp_backend() -> None:
    gb = render_nodes(plan_file(Path("topologies/gb200-4x4-sglang.yaml")).render_inputs())[0]
    assert "--moe-runner-backend" not in gb.argv and "--decode-attention-backend" not in gb.argv
    b2 = render_nodes(plan_file(Path("topologies/b200-2x8-sglang.yaml")).render_inputs())[0]
    assert opt(b2, "--dcp-size") == "16" and opt(b2, "--decode-attention-backend") == "cutedsl_mla"


@FAST
def test_amd_dcp_uses_aiter() -> None:
    spec = render_nodes(plan_of(doc_of("mi355x-1x8-sglang", **{"parallel.dcp": 8})).render_inputs())[0]
    assert opt(spec, "--decode-attention-backend") == "aiter"
    assert "--nnodes" not in spec.argv  # single node: no rendezvous flags


@FAST
def test_vllm_ascend_per_node_dp_ranks() -> None:
    specs = render_nodes(plan_file(Path("topologies/ascend-a3-4x16-vllm.yaml")).render_inputs())
    for s in specs:
        assert opt(s, "--data-parallel-size") == "4" and opt(s, "--data-parallel-size-local") == "1"
        # A start rank on the head turns on vLLM's hybrid load balancing, which refuses headless nodes.
        assert opt(s, "--data-parallel-start-rank") == (str(s.rank) if s.rank else None)
        assert opt(s, "--data-parallel-address") == "10.0.0.10"
        assert opt(s, "--data-parallel-rpc-port") == "13345"  # the tutorial's RPC_PORT
        assert ("--headless" in s.argv) == (s.rank > 0)
        assert "--nnodes" not in s.argv and "--master-addr" not in s.argv
        assert opt(s, "--quantization") == "ascend" and "--enable-expert-parallel" in s.argv
        assert s.env["HCCL_IF_IP"] == s.env["VLLM_HOST_IP"] == s.ip
        for name in ("HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
            assert s.env[name] == "ens-priv"
        assert s.env["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True"
        assert s.env["ASCEND_RT_VISIBLE_DEVICES"] == ",".join(str(i) for i in range(16))
        assert s.env["VLLM_ENGINE_READY_TIMEOUT_S"] == "7200"  # the tutorial's


@FAST
def test_vllm_one_group_over_nnodes_on_hopper() -> None:
    specs = render_nodes(plan_of(doc_of("h100-4x8-sglang", **{"engine.kind": "vllm", "serving.max_running_requests": 32})).render_inputs())
    for s in specs:
        p = pairs(s.argv)
        assert "--nnodes 4" in p and f"--node-rank {s.rank}" in p and "--master-addr 10.0.0.10" in p
        assert ("--headless" in s.argv) == (s.rank > 0)
        assert not any(a.startswith("--data-parallel") for a in s.argv)
        assert "--moe-backend marlin" in p and "--attention-backend FLASHMLA" in p
        assert "--enable-prefix-caching" in s.argv and "--enable-prompt-tokens-details" in s.argv
        assert "--enable-auto-tool-choice" in s.argv and "--quantization" not in s.argv
        assert s.env["VLLM_HOST_IP"] == s.ip and "SGLANG_HOST_IP" not in s.env


@FAST
def test_vllm_prefix_caching_follows_serving() -> None:
    spec = render_nodes(plan_of(doc_of("h100-4x8-sglang", **{"engine.kind": "vllm", "serving.max_running_requests": 32,
                                                               "serving.prefix_cache": False})).render_inputs())[0]
    assert "--enable-prefix-caching" not in spec.argv


@FAST
def test_sglang_attention_dp_and_no_radix_cache() -> None:
    spec = render_nodes(plan_of(doc_of("h200-4x8-sglang", **{"parallel.dp": 4, "parallel.attention_dp": True,
                                                               "serving.prefix_cache": False})).render_inputs())[0]
    assert opt(spec, "--attn-dp-size") == "4" and "--disable-radix-cache" in spec.argv
    assert "--mamba-radix-cache-strategy" not in spec.argv


@FAST
def test_sim_mimics_the_engine_flags_on_the_declared_hardware() -> None:
    real = render_nodes(plan_file(Path("topologies/h100-4x8-sglang.yaml")).render_inputs())
    sim = render_nodes(plan_of(doc_of("h100-4x8-sglang", **{"engine.kind": "sim", "engine.mimic": "sglang"})).render_inputs())
    for r, s in zip(real, sim):
        assert s.argv[:7] == ("python3", "-m", "k3deploy.sim", "serve", "--mimic", "sglang",
                              "/models/Kimi-K3")
        assert s.argv[7:] == r.argv[3:]
        assert s.env == {**r.env, "K3SIM_GPU": "h100-80gb"}
    vsim = render_nodes(plan_of(sim_doc(**{"engine.mimic": "vllm", "parallel.tp": 1, "parallel.dp": 4})).render_inputs())
    assert vsim[0].argv[4:6] == ("--mimic", "vllm") and vsim[1].ready.kind == "none"


@FAST
def test_launcher_replaces_only_the_prefix() -> None:
    launcher = ["/opt/venv/bin/sglang", "serve"]
    spec = render_nodes(plan_of(doc_of("h100-4x8-sglang", **{"engine.launcher": launcher})).render_inputs())[0]
    default = render_nodes(plan_file(Path("topologies/h100-4x8-sglang.yaml")).render_inputs())[0]
    assert spec.argv == ("/opt/venv/bin/sglang", "serve", *default.argv[2:])
    sim_launcher = ["/usr/bin/python3", "-m", "k3deploy.sim", "serve", "--mimic", "sglang"]
    sim = render_nodes(plan_of(sim_doc(**{"engine.launcher": sim_launcher})).render_inputs())[0]
    assert sim.argv[:7] == ("/usr/bin/python3", "-m", "k3deploy.sim", "serve", "--mimic", "sglang",
                            "/tmp/k3/kimi-k3-tiny")


@FAST
def test_engine_args_replace_in_place_append_or_remove() -> None:
    args = {"--mem-fraction-static": 0.8, "--enable-metrics": False, "--enable-symm-mem": True,
            "--served-model-name": "k3"}
    spec = render_nodes(plan_of(doc_of("h100-4x8-sglang", **{"engine.args": args})).render_inputs())[0]
    default = render_nodes(plan_file(Path("topologies/h100-4x8-sglang.yaml")).render_inputs())[0]
    assert opt(spec, "--mem-fraction-static") == "0.8"
    assert spec.argv.index("--mem-fraction-static") == default.argv.index("--mem-fraction-static")
    assert "--enable-metrics" not in spec.argv
    assert spec.argv[-1:] == ("--enable-symm-mem",)
    assert opt(spec, "--served-model-name") == "k3"  # the rendered stable name, replaced in place
    assert spec.argv.index("--served-model-name") == default.argv.index("--served-model-name")
    assert spec.argv.count("--mem-fraction-static") == 1


@FAST
def test_docker_wrap_nvidia() -> None:
    image = "lmsysorg/sglang@sha256:" + "ab" * 32
    specs = render_nodes(plan_of(doc_of("h100-4x8-sglang", **{"engine.image": image,
                                                                "engine.env": {"EXTRA": "1"}})).render_inputs())
    s = specs[1]
    assert s.container == "k3-k3-h100-4x8-r1"
    argv = s.argv
    assert argv[:5] == ("docker", "run", "-d", "--name", "k3-k3-h100-4x8-r1")
    p = pairs(argv)
    for want in ("--network host", "--ipc host", "--shm-size 32g", "--ulimit memlock=-1",
                 "--ulimit stack=67108864", "-v /models/Kimi-K3:/models/Kimi-K3:ro", "--gpus all",
                 "-e SGLANG_HOST_IP=10.0.0.11", "-e NCCL_SOCKET_IFNAME=ens-priv", "-e EXTRA=1", "-e HF_TOKEN",
                 "--entrypoint sglang", f"{image} serve"):
        assert want in p, want
    i = argv.index(image)
    bare = render_nodes(plan_of(doc_of("h100-4x8-sglang", **{"engine.env": {"EXTRA": "1"}})).render_inputs())[1]
    assert (argv[i - 1], *argv[i + 1:]) == bare.argv[:1] + bare.argv[1:]


@FAST
@pytest.mark.parametrize("stem,gpu,want", [
    ("mi355x-1x8-sglang", "mi355x", ["--device /dev/kfd", "--device /dev/dri", "--group-add video"]),
    ("ascend-a3-4x16-vllm", "ascend-a3", ["--device /dev/davinci0", "--device /dev/davinci15",
                                          "--device /dev/davinci_manager", "--device /dev/devmm_svm",
                                          "--device /dev/hisi_hdc", "-v /usr/local/dcmi:/usr/local/dcmi:ro"]),
])
def test_docker_devices_per_vendor(stem: str, gpu: str, want: list[str]) -> None:
    spec = render_nodes(plan_of(doc_of(stem, **{"engine.image": "img@sha256:" + "cd" * 32})).render_inputs())[0]
    p = pairs(spec.argv)
    assert all(w in p for w in want) and "--gpus" not in spec.argv


@FAST
def test_infeasible_plan_is_not_rendered() -> None:
    doc = doc_of("h100-4x8-sglang", **{"engine.args": {"--moe-runner-backend": "auto"}})
    plan = make_plan(parse_topology(yaml.safe_dump(doc), "t.yaml"), load_catalog())
    with pytest.raises(InfeasibleError, match="SGLANG_HOPPER_MOE_AUTO"):
        render_nodes(plan.render_inputs())


@FAST
@pytest.mark.parametrize("name,source", CASES, ids=[c[0] for c in CASES])
def test_node_shell_round_trips_argv(name: str, source: Path | dict) -> None:
    for spec in render_nodes(plan_for(source).render_inputs()):
        text = node_shell(spec)
        assert text.startswith("set -eu\n") and text.count("\nexec ") == 1
        # shlex does not do the shell's backslash-newline continuation; drop it first.
        assert tuple(shlex.split(command_text(spec.argv).replace("\\\n", ""))) == spec.argv


@FAST
@pytest.mark.parametrize("name,source", CASES, ids=[c[0] for c in CASES])
def test_nodes_differ_only_in_rank_and_ip(name: str, source: Path | dict) -> None:
    """Normalize rank- and IP-dependent items; what is left must be identical on every node."""
    specs = render_nodes(plan_for(source).render_inputs())
    rank_flags = {"--node-rank", "--data-parallel-start-rank"}
    head_ip = specs[0].ip

    def own(s: LaunchSpec, value: str) -> str:
        return "<IP>" if value == s.ip else "<IFACE>" if value == s.node.iface else value

    normal = []
    for s in specs:
        argv, out = list(s.argv), []
        for i, tok in enumerate(argv):
            if tok == "--data-parallel-start-rank":
                assert s.rank > 0  # headless nodes only, like --headless
                continue
            if i and argv[i - 1] == "--data-parallel-start-rank":
                continue
            if i and argv[i - 1] in rank_flags:
                tok = "<RANK>"
            elif tok == "--headless":
                assert s.rank > 0
                continue
            elif re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tok):  # docker -e NAME=value: the node's env
                name, _, value = tok.partition("=")
                tok = f"{name}={own(s, value)}"
            else:
                tok = tok.replace(head_ip, "<HEAD>")
            out.append(re.sub(rf"-r{s.rank}$", "-r<RANK>", tok))
        env = {k: own(s, v) for k, v in s.env.items()}
        normal.append((tuple(out), env, s.secret_env))
    assert all(n == normal[0] for n in normal[1:])
    for s in specs:
        for flag in rank_flags & set(s.argv):
            local = int(opt(s, "--data-parallel-size-local") or 1)
            assert int(s.argv[s.argv.index(flag) + 1]) in (s.rank, s.rank * local)
