"""The hostile-values table (tests/unit/test_hostile_values.py) through the real SSH and Ray executors: every
value the loader accepts, in every topology string that reaches a node, is started on a rig host exactly as
`launch` starts a node (its rendered shell text, log path and working directory) and arrives there verbatim: the
recorded argv and environment equal the rendered ones element for element, the log lands at the hostile
path, and no shell ever ran any of it (the marker file never appears)."""
from __future__ import annotations

import json
import posixpath
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from k3deploy.engines.render import render_nodes
from k3deploy.executors import RayTarget, SshTarget, open_executor
from k3deploy.executors.base import Executor
from k3deploy.nodeplan.jobs import jobs_for
from k3deploy.nodeplan.targets import ExecOverrides
from tests.integration.sim_deployments import nothing_left, tagged
from tests.polling import wait_for
from tests.rig import HostRig
from tests.rig.ray_cluster import RayRig
from tests.unit.test_hostile_values import FIELDS, accepted, doc_with, hostile
from tests.unit.test_render_support import plan_of

pytestmark = [pytest.mark.integration, pytest.mark.ray_cluster]
# The node's engine: records its arguments (after the record path) and environment, then exits.
RECORDER = "import json, os, sys; json.dump({'argv': sys.argv[2:], 'env': dict(os.environ)}, open(sys.argv[1], 'w'))"


def on_node(doc: dict[str, Any], rec: Path) -> dict[str, Any]:
    """The topology with the recorder as its engine, its /tmp paths moved under the test's folder."""
    doc["engine"]["launcher"] = [sys.executable, "-c", RECORDER, str(rec)]
    for section, key in (("launch", "log_dir"), ("model", "path")):
        value = doc.get(section, {}).get(key)
        if isinstance(value, str) and value.startswith("/tmp/"):
            doc[section][key] = str(rec.parent / value.removeprefix("/tmp/"))
    return doc


@pytest.fixture(params=["ssh", "ray"])
def node(request: pytest.FixtureRequest, make_rig: Callable[..., HostRig]) -> Iterator[tuple[str, HostRig, Executor]]:
    """(executor kind, its rig, an executor to the rig's first host), closed after the test: over SSH a one-host
    rig of its own, over Ray the run's Ray cluster (ray4)."""
    if request.param == "ssh":
        rig = make_rig(1)
        host = rig.hosts[0]
        target = SshTarget(host=host.mgmt_ip, user="root", key=str(rig.key_path),
                            known_hosts=str(rig.known_hosts_path), ssh_config=None)
        executor = open_executor(target)
        yield "ssh", rig, executor
        executor.close()
        return
    cluster: RayRig = request.getfixturevalue("ray4")  # this process is its Ray driver
    host = cluster.rig.hosts[0]
    executor = open_executor(RayTarget(host=host.name, node_ip=host.priv_ip, ray_address=cluster.address))
    yield "ray", cluster.rig, executor
    executor.close()


@pytest.mark.timeout(300)
def test_each_accepted_hostile_value_arrives_verbatim_on_the_node(node: tuple[str, HostRig, Executor],
                                                                  tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    executor_kind, rig, executor = node
    host = rig.hosts[0]
    mark = tmp_path / "pwned"
    outcomes: dict[str, int] = {"refused at load": 0, "arrived verbatim": 0}
    for field in sorted(FIELDS):
        for kind, raw in hostile(mark).items():
            value = FIELDS[field](raw)
            if not accepted(field, value, kind):
                outcomes["refused at load"] += 1
                continue
            rec = tmp_path / f"{field}-{kind}" / "rec.json"
            rec.parent.mkdir()
            plan = plan_of(on_node(doc_with(field, value, rec.parent / "logs"), rec))  # logs under the test
            spec = render_nodes(plan.render_inputs())[0]
            job = jobs_for(plan, ExecOverrides(executor=executor_kind, ray_address="auto"))[0]
            # A value the loader took must start (no refusal on the node: a 20,000-character log folder
            # passed the kernel's limit on one argument until the loader capped paths at PATH_MAX).
            handle = executor.start(job.command, job.log_path, workdir=posixpath.dirname(job.log_path) or "/",
                                    tag=f"hostile.{sum(outcomes.values())}")
            assert wait_for(lambda h=handle: not executor.alive(h), 30), (field, kind)
            assert rec.is_file(), (field, kind, executor.read_log(handle))
            got = json.loads(rec.read_text())
            assert got["argv"] == list(spec.argv[4:]), (field, kind)  # element for element
            assert {k: got["env"].get(k) for k in spec.env} == dict(spec.env), (field, kind)
            assert Path(job.log_path).is_file(), (field, kind)  # the log at the hostile path, verbatim
            assert not mark.exists(), f"{field} {kind}: a shell ran it"
            assert executor.terminate(handle, 1.0)  # nothing of it left (over Ray: its agent is retired)
            outcomes["arrived verbatim"] += 1
    executor.close()  # idempotent: the fixture closes it again
    assert not mark.exists()
    assert outcomes["arrived verbatim"] >= len(FIELDS), outcomes  # the executor was exercised in earnest
    if executor_kind == "ssh":
        assert wait_for(lambda: not rig.pids(host), 10), rig.pids(host)
    else:  # Ray's own processes stay; nothing k3deploy started may
        assert nothing_left(rig), tagged(rig, host.name)
    with capsys.disabled():
        print(f"\nhostile values over {executor_kind}: {outcomes}")
