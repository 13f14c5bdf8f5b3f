"""Generated shell: shellcheck-clean, hostile topology values arrive verbatim, secrets never written."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.engines.exports import export, stdout_text
from k3deploy.engines.render import render_nodes
from k3deploy.engines.spec import LaunchSpec
from k3deploy.topology.loader import TopologyError, parse_topology
from tests.unit.test_render_support import CASES, FORMATS, plan_for, plan_of, sim_doc

SHELLCHECK = shutil.which("shellcheck")
needs_shellcheck = pytest.mark.skipif(SHELLCHECK is None,
                                      reason="shellcheck is not installed (CI installs it)")
RECORDER = ("import json, os, sys; json.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, "
            "open(os.environ['REC'], 'w'))")
FAKE_TOKEN = "hf_" + "Zq9" * 10  # a made-up token-shaped value; must never appear in any output
FAKE_KEY = "wandb-fake-" + "K3y9" * 6


def scripts_of(plan: Any) -> dict[str, str]:
    """Every shell program k3deploy writes for a plan: node scripts, sbatch (+ its node body), LWS pods."""
    out = {f.name: f.content for f in export(plan.render_inputs(), "script")}
    sbatch = export(plan.render_inputs(), "slurm")[0].content
    out["k3deploy.sbatch"] = sbatch
    out["sbatch-node-body.sh"] = "#!/bin/sh\n" + sbatch_body(sbatch)
    for i, pod in enumerate(lws_commands(plan)):
        out[f"lws-{i}.sh"] = "#!/bin/sh\n" + pod
    return out


def sbatch_body(sbatch: str) -> str:
    """The K3_NODE_SCRIPT value, as the shell would see it."""
    assignment = "K3_NODE_SCRIPT=" + sbatch.split("\nK3_NODE_SCRIPT=", 1)[1].split("\nsrun ")[0]
    probe = assignment + '\nprintf %s "$K3_NODE_SCRIPT"\n'
    return subprocess.run(["sh", "-c", probe], capture_output=True, text=True, check=True).stdout


def lws_commands(plan: Any) -> list[str]:
    doc = yaml.safe_load(export(plan.render_inputs(), "lws")[0].content)
    t = doc["spec"]["leaderWorkerTemplate"]
    pods = [t[k] for k in ("leaderTemplate", "workerTemplate") if k in t]
    return [p["spec"]["containers"][0]["command"][2] for p in pods]


@needs_shellcheck
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name,source", CASES, ids=[c[0] for c in CASES])
def test_shellcheck_clean(name: str, source: Any, tmp_path: Path) -> None:
    for fname, text in scripts_of(plan_for(source)).items():
        path = tmp_path / fname
        path.write_text(text)
        res = subprocess.run([str(SHELLCHECK), "-s", "sh", "-o", "all", str(path)], capture_output=True,
                             text=True, check=False)
        assert res.returncode == 0, f"{fname}:\n{res.stdout}{res.stderr}"


def hostile_doc(tmp: Path, **extra: Any) -> dict[str, Any]:
    secret_file = tmp / "secret dir; $(touch pwned-f)" / "token"
    secret_file.parent.mkdir()
    secret_file.write_text("file-secret-value\n")
    mark = tmp / "pwned"
    evil = f"; touch {mark}-1 $(touch {mark}-2) `touch {mark}-3` 'q' \"dq\" \\ * ? ~ $HOME &| >{mark}-4"
    return sim_doc(**{
        "model.path": f"/tmp/k3 x/m{evil}",
        "engine.env": {"WEIRD": f"a'b\"c $(touch {mark}-5) `touch {mark}-6` {evil}\nline2\ttab",
                       "EMPTY": "", "WANDB_API_KEY": FAKE_KEY},
        "engine.args": {"--served-model-name": f"x{evil}"},
        "engine.secrets": {"HF_TOKEN": "env:K3_TEST_SRC", "FILE_TOKEN": f"file:{secret_file}"},
        "engine.launcher": ["python3", "-c", RECORDER],
        **extra,
    })


def run_recorded(cmd: list[str], tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    rec = tmp / "rec.json"
    full = {"PATH": os.environ["PATH"], "REC": str(rec), "K3_TEST_SRC": FAKE_TOKEN, "WANDB_API_KEY": FAKE_KEY,
            "HOME": str(tmp), **env}
    res = subprocess.run(cmd, capture_output=True, text=True, env=full, cwd=tmp, timeout=30, check=False)
    assert res.returncode == 0, res.stderr
    data: dict[str, Any] = json.loads(rec.read_text())
    rec.unlink()
    return data


def assert_verbatim(rec: dict[str, Any], spec: LaunchSpec, tmp: Path) -> None:
    assert rec["argv"] == list(spec.argv[3:])  # past `python3 -c RECORDER`
    for k, v in spec.env.items():
        assert rec["env"][k] == v, k
    assert rec["env"]["HF_TOKEN"] == FAKE_TOKEN and rec["env"]["FILE_TOKEN"] == "file-secret-value"
    assert not list(tmp.glob("pwned*")), "an injected command ran"


@pytest.mark.timeout(60)
def test_hostile_values_arrive_verbatim_through_the_node_script(tmp_path: Path) -> None:
    plan = plan_of(hostile_doc(tmp_path))
    specs = render_nodes(plan.render_inputs())
    for f, spec in zip(export(plan.render_inputs(), "script"), specs):
        path = tmp_path / f.name
        path.write_text(f.content)
        assert_verbatim(run_recorded(["sh", str(path)], tmp_path, {}), spec, tmp_path)


@pytest.mark.timeout(60)
def test_hostile_values_arrive_verbatim_through_slurm(tmp_path: Path) -> None:
    plan = plan_of(hostile_doc(tmp_path))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    srun = bindir / "srun"  # a stand-in srun: drop its options, run the step on "this node"
    srun.write_text('#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')
    srun.chmod(0o755)
    # A stand-in `ip`: the batch shell (node 0) asks first, for the head's address; then the task, for its own.
    asked = tmp_path / "head-asked"
    ip = bindir / "ip"
    ip.write_text(f'#!/bin/sh\nif [ -e {asked} ]; then a=$NODE_ADDR; else : > {asked}; a=$HEAD_ADDR; fi\n'
                  'echo "2: $6    inet $a/24 brd 10.0.0.255 scope global $6"\n')
    ip.chmod(0o755)
    sbatch = tmp_path / "k3deploy.sbatch"
    sbatch.write_text(export(plan.render_inputs(), "slurm")[0].content)
    specs = render_nodes(plan.render_inputs())
    for spec in specs:
        asked.unlink(missing_ok=True)
        env = {"PATH": f"{bindir}:{os.environ['PATH']}", "SLURM_NODEID": str(spec.rank),
               "SLURM_JOB_NUM_NODES": str(len(specs)), "HEAD_ADDR": specs[0].ip, "NODE_ADDR": spec.ip}
        assert_verbatim(run_recorded(["sh", str(sbatch)], tmp_path, env), spec, tmp_path)


@pytest.mark.timeout(60)
def test_lws_pods_get_their_rank_and_addresses_from_lws(tmp_path: Path) -> None:
    plan = plan_of(hostile_doc(tmp_path))
    leader, worker = lws_commands(plan)
    specs = render_nodes(plan.render_inputs())
    for spec in specs:
        script = leader if spec.rank == 0 else worker
        env = {"LWS_WORKER_INDEX": str(spec.rank), "LWS_LEADER_ADDRESS": "leader.k3.svc",
               "LWS_GROUP_SIZE": str(len(specs)), "K3_POD_IP": "10.9.9.9", "HF_TOKEN": FAKE_TOKEN, "FILE_TOKEN": "file-secret-value"}
        rec = run_recorded(["sh", "-c", script], tmp_path, env)
        want = [a.replace("127.0.0.1:29500", "leader.k3.svc:29500") for a in spec.argv[3:]]
        assert rec["argv"] == want
        assert rec["env"]["SGLANG_HOST_IP"] == "10.9.9.9" and rec["env"]["WEIRD"] == spec.env["WEIRD"]
        assert not list(tmp_path.glob("pwned*"))


@pytest.mark.timeout(30)
def test_lws_pods_refuse_a_group_of_another_size(tmp_path: Path) -> None:
    leader, _ = lws_commands(plan_of(sim_doc()))
    env = {"PATH": os.environ["PATH"], "LWS_GROUP_SIZE": "2", "LWS_LEADER_ADDRESS": "l", "K3_POD_IP": "10.9.9.9"}
    res = subprocess.run(["sh", "-c", leader], capture_output=True, text=True, env=env, timeout=30, check=False)
    assert res.returncode == 1 and "rendered for 4 pods, LWS_GROUP_SIZE=2" in res.stderr


@pytest.mark.timeout(30)
def test_secret_looking_env_must_come_from_the_node(tmp_path: Path) -> None:
    plan = plan_of(hostile_doc(tmp_path))
    path = tmp_path / "node-0.sh"
    path.write_text(export(plan.render_inputs(), "script")[0].content)
    env = {"PATH": os.environ["PATH"], "REC": str(tmp_path / "rec.json")}
    res = subprocess.run(["sh", str(path)], capture_output=True, text=True, env=env, timeout=30, check=False)
    assert res.returncode != 0 and "WANDB_API_KEY" in res.stderr and "set it on the node" in res.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("image", [None, "lmsysorg/sglang:v0.5.23"])
def test_no_secret_value_in_any_output(tmp_path: Path, image: str | None) -> None:
    plan = plan_of(hostile_doc(tmp_path, **({"engine.image": image} if image else {})))
    outputs = [stdout_text(export(plan.render_inputs(), fmt)) for fmt in FORMATS]  # type: ignore[arg-type]
    for text in outputs:
        for secret in (FAKE_TOKEN, FAKE_KEY, "file-secret-value"):
            assert secret not in text
    joined = "\n".join(outputs)
    assert "env:K3_TEST_SRC" in joined and "<redacted>" in joined
    if image:
        docker = render_nodes(plan.render_inputs())[0].argv
        assert "WANDB_API_KEY" in docker and not any(FAKE_KEY in a for a in docker)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("field,value", [
    ("nodes.0.host", "gpu-a; rm -rf /"),
    ("nodes.0.iface", "eth0$(id)"),
    ("name", "k3 `id`"),
    ("engine.env", {"BAD NAME": "x"}),
    ("engine.secrets", {"HF_TOKEN": "hf_inline_value_not_a_reference"}),
    ("model.path", "relative/path"),
])
def test_hostile_values_in_names_are_rejected_at_validation(field: str, value: Any) -> None:
    doc = sim_doc()
    *parents, last = field.split(".")
    cur: Any = doc
    for p in parents:
        cur = cur[int(p)] if p.isdigit() else cur[p]
    cur[int(last) if last.isdigit() else last] = value
    with pytest.raises(TopologyError):
        parse_topology(yaml.safe_dump(doc), "t.yaml")
