"""The deployment record: atomic private writes, locking, clear errors; its one writer (the recorder)."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from k3deploy.errors import StateError
from k3deploy.executors.base import ProcessHandle
from k3deploy.executors.target import SshTarget
from k3deploy.nodeplan.jobs import NodeJob, ReadyCheck
from k3deploy.records.deployment import Attempt, Deployment, Failure, NodeState
from k3deploy.records.files import default_state_dir
from k3deploy.records.owner import Identity
from k3deploy.records.recorder import Recorder
from k3deploy.records.store import StateStore
from tests.polling import wait_for


def record(name: str = "demo") -> Deployment:
    job = NodeJob(rank=0, host="h01", ip="10.0.0.1", head=True, command="exec sleep 1", log_path="/tmp/x.log",
                  ready=ReadyCheck(kind="http", url="http://10.0.0.1:8000", paths=("/health",)),
                  target=SshTarget(host="h01"))
    return Deployment(name=name, file="/t.yaml", plan_digest="abc", executor="ssh", status="starting",
                      created_at=time.time(), stop_grace_s=1, ready_timeout_s=5, jobs=(job,),
                      nodes=(NodeState(rank=0, host="h01"),), owner=Identity.me("launch"),
                      attempts=(Attempt(number=1, started_at=time.time()),))


def test_save_is_private_atomic_and_round_trips(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    dep = record()
    store.save(dep)
    path = store.path("demo")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.directory.stat().st_mode) == 0o700
    assert store.load("demo") == dep
    assert [p.name for p in store.directory.iterdir() if p.name.endswith(".tmp")] == []
    json.loads(path.read_text())  # plain JSON for people and scripts


def test_update_changes_under_the_lock(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save(record())
    out = store.update("demo", lambda d: d.with_node(0, phase="ready").model_copy(update={"status": "ready"}))
    assert out.status == "ready" and out.nodes[0].phase == "ready"
    assert store.require("demo") == out


def test_concurrent_updates_lose_nothing(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save(record().model_copy(update={"attempts": ()}))

    def add(i: int) -> None:
        store.update("demo", lambda d: d.model_copy(update={"attempts": (*d.attempts, Attempt(number=i, started_at=0))}))

    threads = [threading.Thread(target=add, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(a.number for a in store.require("demo").attempts) == list(range(20))


def test_lock_excludes_other_processes(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    # The other process holds the lock until told to let go (a line on its stdin), on a machine of any speed.
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys; from k3deploy.records.store import StateStore\n"
        f"s = StateStore({str(tmp_path)!r})\n"
        "with s.lock('demo'):\n    print('held', flush=True); sys.stdin.readline()\n")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    assert holder.stdin is not None and holder.stdout is not None and holder.stdout.readline().strip() == "held"
    with pytest.raises(StateError, match="locked by another"), store.lock("demo", timeout_s=0.3):
        pass
    told = threading.Event()

    def let_go() -> None:
        told.set()
        assert holder.stdin is not None
        holder.stdin.write("go\n")
        holder.stdin.flush()

    timer = threading.Timer(0.5, let_go)
    timer.start()
    with store.lock("demo", timeout_s=120):
        assert told.is_set()  # got it only once the other process was told to let go
    timer.join()
    assert holder.wait(60) == 0


def test_missing_and_corrupt_records_are_state_errors(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save(record("other"))
    with pytest.raises(StateError, match=r"no deployment named demo .*known: other") as err:
        store.require("demo")
    assert err.value.exit_code == 5
    store.path("demo").write_text("{not json")
    with pytest.raises(StateError, match="not a k3deploy deployment record"):
        store.load("demo")


def test_default_state_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", "/x/state")
    assert default_state_dir() == Path("/x/state/k3deploy")
    monkeypatch.delenv("XDG_STATE_HOME")
    assert default_state_dir() == Path(os.path.expanduser("~/.local/state/k3deploy"))


def test_identity_tells_a_process_from_a_reused_pid() -> None:
    me = Identity.me("launch")
    assert me.alive()
    assert not me.model_copy(update={"start_ticks": (me.start_ticks or 0) + 1}).alive()
    child = subprocess.Popen(["sleep", "30"])
    other = Identity(pid=child.pid, start_ticks=None, role="supervisor")
    try:
        assert other.alive()
        assert other.terminate(timeout_s=2)
    finally:
        child.kill()
        child.wait(5)
    assert not other.alive()


@pytest.mark.timeout(60)
def test_lock_of_a_name_without_record_leaves_no_file_and_still_excludes(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    holders, most, rounds, done = [0], [0], 40, [0]
    guard = threading.Lock()
    errors: list[BaseException] = []

    def contend() -> None:
        try:
            for _ in range(rounds):
                with store.lock("ghost", timeout_s=20):
                    with guard:
                        holders[0] += 1
                        most[0] = max(most[0], holders[0])
                    time.sleep(0.002)  # hold it a moment, so the others wait on the file being removed
                    with guard:
                        holders[0] -= 1
                        done[0] += 1
        except BaseException as exc:  # noqa: BLE001 - a waiter must never fail: record it for the assert
            errors.append(exc)

    threads = [threading.Thread(target=contend) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert errors == [] and done[0] == 3 * rounds  # every round of every waiter got the lock
    assert most[0] == 1  # a waiter that locked a removed file re-opened instead of sharing the name
    assert list(tmp_path.iterdir()) == []


ASSETS = Path(__file__).resolve().parents[1] / "assets" / "state"


@pytest.mark.parametrize("kind", ["local", "ssh", "ray"])
def test_records_written_before_the_per_kind_targets_still_load(tmp_path: Path, kind: str) -> None:
    """Records written by 0.2 (one flat target with every kind's fields; Ray's agent name in the handle's
    `container`) load as the target of their kind, with the settings they had, and save in the new shape."""
    from k3deploy.executors.target import LocalTarget, RayTarget

    store = StateStore(tmp_path)
    store.path(f"old-{kind}").write_text((ASSETS / f"old-{kind}.json").read_text())
    dep = store.require(f"old-{kind}")
    targets = [j.target for j in dep.jobs]
    if kind == "local":
        assert targets == [LocalTarget(host="h01"), LocalTarget(host="h02")]
    elif kind == "ssh":
        assert targets == [SshTarget(host="h01", user="deploy", jump="bastion"),
                           SshTarget(host="h02", user="deploy", port=2222, jump="bastion")]
    else:
        assert targets == [RayTarget(host="h01", node_ip="10.0.0.1", ray_address="10.0.0.9:6379"),
                           RayTarget(host="h02", node_ip="10.0.0.2", ray_address="10.0.0.9:6379")]
    # Fields the records of 0.2 did not have take the defaults preflight used for them then.
    assert all(j.argv == () and j.env == {} and j.engine_python == "python3" for j in dep.jobs)
    store.save(dep)
    saved = json.loads(store.path(f"old-{kind}").read_text())
    assert set(saved["jobs"][0]["target"]) == {"kind", "host", *type(targets[0]).model_fields} - {"capabilities"}
    assert store.require(f"old-{kind}") == dep


def test_a_target_with_a_field_no_kind_has_is_refused() -> None:
    """Dropping other kinds' fields (for old records) does not make the targets accept anything."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="no_such_field"):
        SshTarget.model_validate({"kind": "ssh", "host": "h", "no_such_field": 1})


class CountingStore(StateStore):
    """A real store that counts the records it writes."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.saves = 0

    def save(self, dep: Deployment) -> None:
        """Write, and count it."""
        self.saves += 1
        super().save(dep)


def four_nodes() -> Deployment:
    one = record()
    jobs = tuple(one.jobs[0].model_copy(update={"rank": r, "head": r == 0}) for r in range(4))
    return one.model_copy(update={"jobs": jobs, "nodes": tuple(NodeState(rank=r, host="h01") for r in range(4))})


@pytest.mark.timeout(60)
def test_a_started_handle_is_on_disk_when_its_start_returns_and_a_wave_is_one_write(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)
    recorder = Recorder(store, "demo")
    recorder.created(four_nodes())
    jobs = store.require("demo").jobs
    handles = {j.rank: ProcessHandle(host="h01", pid=100 + j.rank, tag=f"t.{j.rank}", log_path="/tmp/x.log")
               for j in jobs}
    on_disk: dict[int, ProcessHandle | None] = {}

    def start(job: NodeJob) -> None:
        recorder.started(job, handles[job.rank])
        on_disk[job.rank] = store.require("demo").nodes[job.rank].handle  # as its start returns

    with store.lock("demo"):  # the head's write waits here; the workers' handles queue behind it
        head = threading.Thread(target=start, args=(jobs[0],))
        head.start()
        assert wait_for(lambda: recorder._writing.locked() and not recorder._pending, 10)  # its write under way
        workers = [threading.Thread(target=start, args=(j,)) for j in jobs[1:]]
        for t in workers:
            t.start()
        assert wait_for(lambda: len(recorder._pending) == 3, 10)
        saves_before = store.saves
    for t in (head, *workers):
        t.join(30)
    assert on_disk == handles
    assert store.saves - saves_before == 2  # the head's write, then one for the three workers together
    assert {n.phase for n in store.require("demo").nodes} == {"started"}


def test_a_name_still_active_is_not_created_again(tmp_path: Path) -> None:
    recorder = Recorder(StateStore(tmp_path), "demo")
    recorder.created(record())
    with pytest.raises(StateError, match="deployment demo is already starting") as err:
        recorder.created(record())
    assert err.value.hint == "stop it first: k3deploy stop demo"
    recorder.stopped(None, "stopped", {}, release_owner=True)
    recorder.created(record())  # a stopped one is replaced


def test_stopped_keeps_the_logs_and_closes_the_record_in_one_write(tmp_path: Path) -> None:
    store = CountingStore(tmp_path)
    recorder = Recorder(store, "demo")
    recorder.created(four_nodes())
    failure = Failure(rank=2, host="h01", cause="exited with status 3")
    saves_before = store.saves
    dep = recorder.stopped(failure, "failed", {0: "stopped", 1: "stopped", 2: "stopped", 3: "survived"},
                           {0: "rank 0 log\n", 1: ""}, release_owner=True)
    assert store.saves - saves_before == 1 and store.require("demo") == dep
    assert dep.status == "failed" and dep.owner is None and dep.failure == failure
    assert dep.attempts[-1].ended_at is not None and dep.attempts[-1].cause == "exited with status 3"
    assert [n.phase for n in dep.nodes] == ["stopped", "stopped", "stopped", "unknown"]
    logs = store.logs_dir("demo")
    assert [p.name for p in logs.iterdir()] == ["rank0.log"]  # an empty log keeps its earlier copy
    assert (logs / "rank0.log").read_text() == "rank 0 log\n" and stat.S_IMODE((logs / "rank0.log").stat().st_mode) == 0o600
