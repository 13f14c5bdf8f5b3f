"""launch.slurm in the topology, the Slurm job text its settings become, and the Slurm target and executor
as far as they work without a cluster (the rig tier runs the rest against a real one)."""
from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml
from pydantic import TypeAdapter

from k3deploy.engines.exports import export
from k3deploy.errors import ExecError
from k3deploy.executors.factory import open_executor
from k3deploy.executors.slurm import STEP_MARKS, SlurmExecutor, bounded, kill_tagged, step_argv
from k3deploy.executors.target import ExecTarget, SlurmTarget
from k3deploy.topology.loader import TopologyError, parse_topology
from tests.polling import wait_for
from tests.unit.plan_helpers import plan_of, topology_dict


def _with_slurm(**slurm: object) -> dict[str, object]:
    doc = copy.deepcopy(topology_dict())
    doc["launch"] = {"executor": "slurm", "slurm": slurm}
    return doc


def _sbatch(**slurm: object) -> list[str]:
    text = export(plan_of(_with_slurm(**slurm)).render_inputs(), "slurm")[0].content
    return [line for line in text.splitlines() if line.startswith("#SBATCH")]


def test_settings_become_sbatch_directives_and_gres_replaces_gpus_per_node() -> None:
    assert _sbatch() == ["#SBATCH --job-name=t", "#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1",
                         "#SBATCH --exclusive", "#SBATCH --gpus-per-node=8"]
    lines = _sbatch(partition="gpu", account="proj-7", time_limit="1-12:00:00", gres="gpu:h100:8",
                    constraint="h100&ib", nodelist=["gpu[01-04]"])
    assert lines[4:] == ["#SBATCH --partition=gpu", "#SBATCH --account=proj-7", "#SBATCH --time=1-12:00:00",
                         "#SBATCH --gres=gpu:h100:8", "#SBATCH --constraint=h100&ib",
                         "#SBATCH --nodelist=gpu[01-04]"]


@pytest.mark.parametrize(("key", "bad", "says"), [
    ("time_limit", "two hours", "not an sbatch --time value"),
    ("partition", "gpu --account=other", "must be one word"),
    ("account", "a'b", "must be one word"),
    ("nodelist", ["gpu01", "$(reboot)"], "is not a Slurm node name"),
])
def test_a_bad_slurm_setting_is_a_located_error(key: str, bad: object, says: str) -> None:
    text = yaml.safe_dump(_with_slurm(**{key: bad}), sort_keys=False)
    with pytest.raises(TopologyError) as info:
        parse_topology(text, "t.yaml")
    shown = info.value.issues[0].render("t.yaml")
    assert shown.startswith("t.yaml:") and f"launch.slurm.{key}" in shown and says in shown, shown


def test_ranks_and_addresses_are_read_on_the_node_not_in_the_batch_shell() -> None:
    text = export(plan_of(_with_slurm()).render_inputs(), "slurm")[0].content
    batch, node = text.split("\nK3_NODE_SCRIPT='", 1)
    # The batch shell never sees SLURM_NODEID: only the node script (single-quoted here) reads it.
    assert "$SLURM_NODEID" not in batch and "${SLURM_NODEID" not in batch
    assert 'case "${SLURM_NODEID:?run under srun}" in' in node
    assert "10.0.0.1" not in text  # no planned address: the head's and each node's come from the allocation
    assert "--dist-init-addr \"${K3_HEAD_IP}\":20000" in node and 'SGLANG_HOST_IP="${K3_NODE_IP}"' in node
    assert text.rstrip().endswith('srun --nodes=4 --ntasks=4 --ntasks-per-node=1 --kill-on-bad-exit=1 '
                                  'sh -c "${K3_NODE_SCRIPT}"')


def test_a_slurm_target_round_trips_and_opens_the_slurm_executor() -> None:
    adapter: TypeAdapter[ExecTarget] = TypeAdapter(ExecTarget)
    t = adapter.validate_python({"kind": "slurm", "host": "gpu01", "job_id": 42, "slurm_conf": "/etc/x.conf"})
    assert isinstance(t, SlurmTarget) and adapter.validate_json(json.dumps(adapter.dump_python(t))) == t
    ex = open_executor(t)
    assert isinstance(ex, SlurmExecutor) and ex.capabilities == SlurmTarget.capabilities
    assert ex.forward("127.0.0.1", 80) is None  # HTTP checks run on the node
    assert step_argv(42, "gpu01", "true") == ["srun", "--overlap", "--jobid=42", "--nodelist=gpu01",
                                               "--nodes=1", "--ntasks=1", "--quiet", "sh", "-c", "true"]


def test_without_an_allocation_every_call_is_an_exec_error_naming_the_node() -> None:
    ex = SlurmExecutor(SlurmTarget(host="gpu01"))
    with pytest.raises(ExecError) as err:
        ex.run("true")
    assert err.value.host == "gpu01" and "no Slurm allocation" in str(err.value)


def test_a_timed_out_step_command_that_left_the_step_is_found_by_its_tag_and_killed(tmp_path: Path) -> None:
    """What a timed-out run leaves on the node when its `timeout` wrapper was killed first (the step's own
    kill reached the parent, not the orphaned children): `kill_tagged` finds those by their environment."""
    marker = tmp_path / "survived"
    tag = uuid.uuid4().hex
    proc = subprocess.Popen(["sh", "-c", bounded(f"sleep 20; touch {marker}", 60, tag)], start_new_session=True)
    try:
        kids = wait_for_children(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)  # `timeout` gone: its shell and sleep are orphans now
        proc.wait(10)
        assert any(_alive(k) for k in kids)
        said = subprocess.run(["sh", "-c", kill_tagged(tag)], check=True, timeout=60, capture_output=True, text=True)
        assert set(said.stdout.splitlines()) == {f"killed {k}" for k in kids}, said.stdout  # each named
        assert wait_for(lambda: not any(_alive(k) for k in kids), 10)
        assert not marker.exists()
        late = subprocess.run(["sh", "-c", bounded(f"touch {marker}", 60, tag)], check=False, timeout=60)
        assert late.returncode == 124 and not marker.exists()  # a start after the kill does not run
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        Path(STEP_MARKS, tag).unlink(missing_ok=True)


def test_the_timed_out_commands_whole_process_group_goes_at_once(tmp_path: Path) -> None:
    """`kill_tagged` kills the group `timeout` leads in one signal: a member that dropped the tag from its
    environment (`env -i`, `env -u`) goes too, and no shell in it lives to run its next command."""
    marker = tmp_path / "survived"
    tag = uuid.uuid4().hex
    untagged = f"env -u K3_STEP sh -c 'sleep 20; touch {marker}'"
    proc = subprocess.Popen(["sh", "-c", bounded(f"{untagged} & wait", 60, tag)], start_new_session=True)
    try:
        found: list[int] = []

        def three() -> bool:  # timeout's shell, the untagged shell and its sleep
            found[:] = descendants(proc.pid)
            return len(found) >= 3
        assert wait_for(three, 10), found
        said = subprocess.run(["sh", "-c", kill_tagged(tag)], check=True, timeout=60, capture_output=True, text=True)
        assert said.stdout, "the tagged processes were found"
        assert wait_for(lambda: not any(_alive(k) for k in found), 10), [k for k in found if _alive(k)]
        assert proc.wait(10) == -signal.SIGKILL
        assert not marker.exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        Path(STEP_MARKS, tag).unlink(missing_ok=True)


def wait_for_children(pid: int) -> list[int]:
    """The processes under `pid` (its shell and the shell's sleep), once both exist."""
    found: list[int] = []

    def both() -> bool:
        found[:] = descendants(pid)
        return len(found) >= 2
    assert wait_for(both, 10), found
    return found


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        out += [int(k) for k in kids]
        todo += [int(k) for k in kids]
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False
