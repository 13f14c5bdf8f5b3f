"""Launch on Slurm without a cluster: the launch's job text (tasks wait for their go, the allocation is held),
what scontrol and the batch output say parsed into a failure named by node, and the Slurm clients as fakes on
PATH (a missing client is exit 6; a refused partition is exit 3 with the fix). The rig tier runs the rest."""
from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import pytest

from k3deploy.catalog.loader import load_catalog
from k3deploy.cli.common import exec_overrides
from k3deploy.errors import ExecError, InputError, MissingDependency
from k3deploy.executors.slurm_jobs import JobInfo, SlurmClient, bad_node, duration_s, parse_fields
from k3deploy.launch import slurm_allocation
from k3deploy.launch.allocation import StaticHosts, allocation_for, allocation_of
from k3deploy.launch.slurm_allocation import SlurmAllocation
from k3deploy.nodeplan.jobs import jobs_for
from k3deploy.planning.plan import Plan
from k3deploy.records.deployment import Failure, SlurmJob
from tests.unit.plan_helpers import plan_of, topology_dict

pytestmark = pytest.mark.timeout(60)


def _plan(**launch: object) -> Plan:
    doc = copy.deepcopy(topology_dict())
    doc["launch"] = {"executor": "slurm", "log_dir": "/var/log/k3", **launch}
    return plan_of(doc)


def _fake(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


@pytest.mark.parametrize(("state", "flag"), [
    ("ALLOCATED", None), ("MIXED", None), ("IDLE+DRAIN", "DRAIN"), ("ALLOCATED+DRAIN", "DRAIN"),
    ("DOWN*", "NOT_RESPONDING"), ("DOWN", "DOWN"), ("ALLOCATED+NOT_RESPONDING", "NOT_RESPONDING"),
])
def test_node_states_that_take_a_node_from_the_job(state: str, flag: str | None) -> None:
    assert bad_node(state) == flag


def test_scontrol_fields_and_durations() -> None:
    f = parse_fields("JobId=7 JobName=t JobState=PENDING Reason=Resources Dependency=(null) RunTime=00:00:59 "
                     "TimeLimit=00:01:00 NodeList=(null)")
    assert (f["JobState"], f["Reason"], f["NodeList"]) == ("PENDING", "Resources", "(null)")
    assert duration_s("1-02:03:04") == 93784 and duration_s("05:30") == 330 and duration_s("UNLIMITED") is None
    info = JobInfo(job_id=7, state="RUNNING", reason="None", nodes=(), time_limit="00:01:00", run_time_s=60)
    assert info.at_time_limit and not info.ended
    assert not JobInfo(job_id=7, state="RUNNING", reason="None", nodes=(), time_limit="UNLIMITED",
                       run_time_s=10**6).at_time_limit


def test_the_launch_job_text_waits_for_each_go_tags_each_engine_and_holds_the_allocation(tmp_path: Path) -> None:
    plan = _plan()
    jobs = jobs_for(plan)
    wrap = slurm_allocation.task_wrap(jobs, "t", "run1")
    from k3deploy.engines.slurm_job import job_text

    text = job_text(plan.render_inputs(), None, gpus=True, wrap=wrap, hold=True)
    script = tmp_path / "job.sh"
    script.write_text(text)
    assert subprocess.run(["sh", "-n", str(script)], check=False, capture_output=True).returncode == 0
    for job in jobs:
        tag = job.tag("t", "run1")
        assert slurm_allocation.go_file(tag) in text and f"K3DEPLOY_RUN={tag}" in text and job.log_path in text
    assert text.rstrip().endswith("while :; do sleep 3600; done")
    # The export (no launch to cancel it) ends with its engines.
    exported = job_text(plan.render_inputs(), None, gpus=True)
    assert "sleep 3600" not in exported and "k3deploy-go-" not in exported


def test_a_restart_budget_is_refused_for_slurm() -> None:
    plan = _plan(restart={"max": 2})
    with pytest.raises(InputError, match="launch.restart.max"):
        allocation_for(jobs_for(plan)).check(plan)


def test_the_allocation_is_chosen_by_the_executors_capabilities_and_read_back_from_the_record() -> None:
    slurm = jobs_for(_plan())
    static = jobs_for(plan_of(topology_dict()))
    assert isinstance(allocation_for(slurm), SlurmAllocation) and isinstance(allocation_for(static), StaticHosts)
    StaticHosts().check(_plan(restart={"max": 2}))  # static hosts restart in place
    from k3deploy.launch.deploy import new_record
    from k3deploy.records.owner import Identity

    plan = _plan()
    record = new_record(plan, slurm, Identity.me("launch"))
    assert isinstance(allocation_of(record), StaticHosts)  # not submitted yet: nothing to release
    held = allocation_of(record.model_copy(update={"slurm_job": SlurmJob(job_id=7)}))
    assert held == SlurmAllocation(SlurmJob(job_id=7))
    seen = Failure(rank=0, host="n1", cause="gone")
    assert StaticHosts().release(seen) == (seen, False) and StaticHosts().explain(seen, slurm) is seen


def test_executor_slurm_is_a_command_line_choice() -> None:
    params: dict[str, object] = {"executor": "slurm", "ssh_user": None, "ssh_key": None, "known_hosts": None, "ssh_config": None,
              "accept_new_host_keys": False, "connect_timeout_s": None, "ray_address": None, "ssh_jump": None}
    assert exec_overrides(params).executor == "slurm"
    with pytest.raises(InputError, match="ray or slurm"):
        exec_overrides({**params, "executor": "pbs"})


def test_without_sbatch_here_launch_names_the_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MissingDependency) as info:
        SlurmClient().submit("#!/bin/sh\n")
    assert info.value.exit_code == 6 and "slurm-client" in str(info.value.hint)


def test_an_unknown_partition_is_a_host_error_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(tmp_path, "sbatch", "cat > /dev/null\necho 'sbatch: error: invalid partition specified: nope' >&2\n"
          "echo 'sbatch: error: Batch job submission failed: Invalid partition name specified' >&2\nexit 1\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    plan = _plan(slurm={"partition": "nope"})
    with pytest.raises(ExecError) as info:
        slurm_allocation.submit(plan, jobs_for(plan), tmp_path / "out", "r1", load_catalog())
    assert info.value.exit_code == 3 and "Invalid partition name" in str(info.value)
    assert "launch.slurm.partition" in str(info.value.hint)


def test_sbatch_gets_the_job_text_and_the_job_id_comes_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(tmp_path, "sbatch", f'printf "%s\\n" "$@" > {tmp_path}/args\ncat > {tmp_path}/script\necho "42;rig"\n')
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    plan = _plan()
    job = slurm_allocation.submit(plan, jobs_for(plan), tmp_path / "out", "r1", load_catalog())
    assert job.job_id == 42 and job.batch_log == f"{tmp_path}/out/slurm-42.out"
    assert (tmp_path / "args").read_text().split() == ["--parsable", f"--output={tmp_path}/out/slurm-%j.out",
                                                       "--chdir=/"]
    assert "#SBATCH --nodes=4" in (tmp_path / "script").read_text()


@pytest.mark.parametrize(("output", "rank", "says"), [
    ("srun: error: Node failure on n3\nsrun: error: n1: task 0: Terminated\n", 2, "node failure on n3"),
    ("slurmstepd-n1: error: *** JOB 5 ON n1 CANCELLED AT 2026-12-01T13:34:03 ***\n", 0, "scancel"),
    ("slurmstepd-n1: error: *** JOB 5 ON n1 CANCELLED AT 2026-12-01T13:34:03 DUE TO TIME LIMIT ***\n", 0,
     "time limit"),
    ("srun: error: n2: task 1: Killed\nsrun: error: n1: task 0: Terminated\n", 1, "task 1 on n2: Killed first"),
])
def test_the_batch_output_names_what_slurm_did_and_to_which_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 output: str, rank: int, says: str) -> None:
    _fake(tmp_path, "scontrol", "echo 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    log = tmp_path / "slurm-5.out"
    log.write_text("281 1473485\n" + output)
    plan = _plan()
    jobs = [j.model_copy(update={"host": f"n{j.rank + 1}"}) for j in jobs_for(plan)]
    seen = Failure(rank=0, host="n1", cause="its process is gone (killed; no exit status was recorded)")
    got = SlurmAllocation(SlurmJob(job_id=5, batch_log=str(log))).explain(seen, jobs)
    assert (got.rank, got.host) == (rank, f"n{rank + 1}") and says in got.cause, got
