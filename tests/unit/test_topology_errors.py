"""Topology loading: every problem at once, as file:line:col with a did-you-mean."""
from __future__ import annotations

from pathlib import Path

import pytest

from k3deploy.topology.loader import TopologyError, load_topology, parse_topology

pytestmark = pytest.mark.timeout(30)
ASSETS = Path(__file__).resolve().parent.parent / "assets" / "invalid"


def _issues(path: Path) -> list[str]:
    with pytest.raises(TopologyError) as exc:
        load_topology(path)
    return [i.render(str(path)) for i in exc.value.issues]


def test_five_mistakes_all_reported_with_positions() -> None:
    f = ASSETS / "five-mistakes.yaml"
    lines = _issues(f)
    assert len(lines) == 5, lines
    joined = "\n".join(lines)
    assert f"{f}:3:45: model.revison: unknown key 'revison' (did you mean 'revision'?)" in joined
    assert f"{f}:7:12: nodes[1].host: not a valid host name" in joined
    assert f"{f}:8:23: nodes[2].ip: must be an IP address" in joined
    assert f"{f}:10:16: engine.kind: unknown engine kind 'sglng'" in joined and "did you mean 'sglang'?" in joined
    assert f"{f}:13:17: serving.mem_fraction: Input should be less than 1" in joined


def test_one_mistake_points_at_the_value() -> None:
    f = ASSETS / "broken-port.yaml"
    assert _issues(f) == [(f"{f}:13:9: launch.port: Input should be a valid integer, unable to parse string as an "
                           "integer (got 'twenty-thousand')")]


def test_yaml_syntax_error_has_position() -> None:
    with pytest.raises(TopologyError) as exc:
        parse_topology("name: x\nnodes: [\n", "s.yaml")
    issue = exc.value.issues[0]
    assert issue.code == "YAML" and issue.line == 3


def test_missing_section_and_duplicate_key() -> None:
    text = "name: x\nname: y\nmodel: {id: kimi-k3, path: /m}\nhardware: {gpu: h100-80gb, gpus_per_node: 8}\n" \
           "engine: {kind: sglang}\n"
    with pytest.raises(TopologyError) as exc:
        parse_topology(text, "d.yaml")
    rendered = [i.render("d.yaml") for i in exc.value.issues]
    assert "d.yaml:2:1: name: duplicate key 'name'" in rendered
    assert any("missing required key 'nodes'" in r and r.startswith("d.yaml:1:1") for r in rendered)


def test_unreadable_file() -> None:
    with pytest.raises(TopologyError, match="cannot read"):
        load_topology("/nonexistent/topology.yaml")


@pytest.mark.parametrize("bad", ["gpu-b; rm -rf /", "$(id)", "a`b`", "a b", "-oProxyCommand=x"])
def test_hostile_hosts_rejected(bad: str) -> None:
    text = ("name: x\nmodel: {id: kimi-k3, path: /m}\nhardware: {gpu: h100-80gb, gpus_per_node: 8}\n"
            f"nodes:\n  - {{host: '{bad}', ip: 10.0.0.1, iface: eth0}}\nengine: {{kind: sglang}}\n")
    with pytest.raises(TopologyError, match="host"):
        parse_topology(text, "h.yaml")


@pytest.mark.parametrize("bad", ["eth0;reboot", "averyveryverylongname0", "$(x)"])
def test_hostile_iface_rejected(bad: str) -> None:
    text = ("name: x\nmodel: {id: kimi-k3, path: /m}\nhardware: {gpu: h100-80gb, gpus_per_node: 8}\n"
            f"nodes:\n  - {{host: a, ip: 10.0.0.1, iface: '{bad}'}}\nengine: {{kind: sglang}}\n")
    with pytest.raises(TopologyError, match="iface"):
        parse_topology(text, "i.yaml")


def test_secret_must_be_a_reference() -> None:
    text = ("name: x\nmodel: {id: kimi-k3, path: /m}\nhardware: {gpu: h100-80gb, gpus_per_node: 8}\n"
            "nodes:\n  - {host: a, ip: 10.0.0.1, iface: eth0}\n"
            "engine: {kind: sglang, secrets: {HF_TOKEN: hf_abcdefabcdef}}\n")
    with pytest.raises(TopologyError, match="reference"):
        parse_topology(text, "s.yaml")
