"""Hostile values in every topology string that reaches a node, table-driven: each is rejected at load or
arrives verbatim, as one argv element (or one environment value), through every format and the local
executor; a run that executed any of them would leave a marker file."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.engines.exports import export, stdout_text
from k3deploy.engines.render import render_nodes
from k3deploy.executors.local import LocalExecutor
from k3deploy.topology.loader import TopologyError, parse_topology
from tests import figures
from tests.unit.test_render_support import FORMATS, plan_of, sim_doc

pytestmark = pytest.mark.timeout(120)
RECORDER = "import json, os, sys; json.dump(sys.argv[1:], open(os.environ['REC'], 'w'))"


def hostile(mark: Path) -> dict[str, str]:
    """Each way a shell could be made to run `touch MARK`, or an option be smuggled in."""
    return {"subst": f"$(touch {mark})", "backticks": f"`touch {mark}`", "semicolon": f"a; touch {mark}",
            "and": f"a && touch {mark}", "newline": f"a\ntouch {mark}", "quotes": f"a'\"b' \"; touch {mark}",
            "flag": "--help", "dash-rf": "-rf", "nul": "a\x00b", "long": "v" * 20_000,
            "glob-var": "* ~ $HOME ${PATH} \\"}


# (dotted topology path, how the value is placed there); every string a node receives from a topology.
FIELDS = {
    "engine.args": lambda v: {"--served-model-name": v},
    "engine.env": lambda v: {"K3_HOSTILE": v},
    "model.path": lambda v: f"/tmp/k3 x/{v}",
    "model.revision": lambda v: v,
    "launch.log_dir": lambda v: f"/tmp/k3 logs/{v}",
    "name": lambda v: f"k3-{v}",
    "nodes.0.host": lambda v: v,
    "nodes.0.iface": lambda v: v,
}


def doc_with(field: str, value: Any, logs: Path | None = None) -> dict[str, Any]:
    """The stand-in topology with `value` at `field`; its nodes log under `logs` (a test's own dir) when given."""
    doc = sim_doc(**{"engine.launcher": [sys.executable, "-c", RECORDER]})
    if logs is not None:
        doc.setdefault("launch", {})["log_dir"] = str(logs)
    *parents, last = field.split(".")
    cur: Any = doc
    for p in parents:
        cur = cur[int(p)] if p.isdigit() else cur.setdefault(p, {})
    cur[int(last) if last.isdigit() else last] = value
    return doc


def accepted(field: str, value: Any, kind: str) -> bool:
    """Whether the loader takes `value` at `field`; a refusal must point at a line (counted as a fuzzed input)."""
    figures.add(figures.INPUTS_FUZZED)
    try:
        parse_topology(yaml.safe_dump(doc_with(field, value), allow_unicode=True), "t.yaml")
    except TopologyError as exc:
        assert all(i.line for i in exc.issues if i.severity == "error"), (field, kind, exc)
        return False
    return True


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_each_hostile_value_is_refused_or_arrives_verbatim_as_one_element(field: str, tmp_path: Path) -> None:
    mark = tmp_path / "pwned"
    local = LocalExecutor()
    for kind, raw in hostile(mark).items():
        value = FIELDS[field](raw)
        if field == "launch.log_dir":  # under the test's own dir: the run below writes the node's log there
            value = value.replace("/tmp/", f"{tmp_path}/", 1)
        if not accepted(field, value, kind):
            continue  # rejected at load, with a position
        plan = plan_of(doc_with(field, value, tmp_path / "logs"))
        outputs = {fmt: stdout_text(export(plan.render_inputs(), fmt)) for fmt in FORMATS}  # type: ignore[arg-type]
        json.loads(outputs["json"])
        spec = render_nodes(plan.render_inputs())[0]
        expected = value if isinstance(value, str) else raw
        if field == "engine.env":
            assert spec.env["K3_HOSTILE"] == raw, kind
            continue
        if field in ("engine.args", "model.path"):
            hits = [a for a in spec.argv if expected in a]
            assert hits == [expected], (kind, hits[:3])
            rec = tmp_path / "rec.json"
            result = local.run(list(spec.argv), timeout_s=30, env={"REC": str(rec)})
            assert result.exit_code == 0, result.stderr
            assert expected in json.loads(rec.read_text()), kind
        assert not mark.exists(), f"{field} {kind}: a shell ran it"
