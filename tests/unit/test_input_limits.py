"""Regression tests for what fuzzing found: inputs that crashed, hung or flooded the terminal, now refused
with a located message (exit 2)."""
from __future__ import annotations

from pathlib import Path

import pytest

from k3deploy.planning.arith import divisors
from k3deploy.topology.loader import TopologyError, parse_topology
from tests.fuzz_inputs import SHIPPED, billion_laughs, run_cli

pytestmark = pytest.mark.timeout(60)
DEMO = Path(SHIPPED[0]).parent / "local-demo.yaml"


def only_issue(text: str) -> str:
    with pytest.raises(TopologyError) as info:
        parse_topology(text, "t.yaml")
    return info.value.issues[0].render("t.yaml")


def test_deep_nesting_is_refused_before_libyaml_recurses() -> None:
    # 100,000 open brackets used to crash the interpreter (segfault in libyaml's composer). PyYAML 6.0.4's
    # scanner refuses past 1,000 levels itself; below that, our own limit speaks.
    deepest = only_issue("name: " + "[" * 100_000 + "]" * 100_000)
    assert deepest.startswith("t.yaml:1:")
    assert "nested more than 64 levels deep" in deepest or "exceeded maximum nesting depth" in deepest
    assert "nested more than 64 levels deep" in only_issue("name: " + "[" * 500 + "]" * 500)


def test_an_alias_bomb_stops_at_the_value_limit() -> None:
    # 9 levels of 9 aliases named 387 million values and never returned.
    assert "more than 50,000 values" in only_issue(billion_laughs())


@pytest.mark.parametrize(("text", "kind", "column"), [
    ('{"name": "x", "nodes":, [{"host": "h"}]}', "list", 25),  # what the fuzzer wrote: a stray comma
    ("? [a, b]\n: 1\n", "list", 3),
    ("? {a: 1}\n: 1\n", "mapping", 3),
])
def test_a_list_or_mapping_as_a_key_is_a_located_error(text: str, kind: str, column: int) -> None:
    # YAML allows complex keys; hashing one raised TypeError (a traceback) before.
    assert only_issue(text).startswith(f"t.yaml:1:{column}: invalid YAML: a key here is a {kind}, not a name")


def test_a_file_over_a_mebibyte_is_refused_unread() -> None:
    assert "a topology or catalog file is at most" in only_issue("name: " + "x" * 2**21)


def test_a_long_wrong_value_is_quoted_short() -> None:
    message = only_issue(DEMO.read_text().replace("port: 18000", f"port: {'9' * 5000}x"))
    assert "(5,00" in message and len(message) < 400


@pytest.mark.parametrize("gpus", ["1000000007", "99999999999999999999", "0", "-8"])
def test_search_refuses_a_gpu_count_it_would_take_hours_to_list(gpus: str) -> None:
    result = run_cli("plan", "--search", "--hardware", "h200", "--gpus", gpus)
    assert result.code == 2 and "expected 1 to 65,536" in result.err


def test_divisors_pair_up_to_the_square_root() -> None:
    assert divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]
    assert divisors(1_000_000_007) == [1, 1_000_000_007]
    assert divisors(1) == [1]


@pytest.mark.parametrize(("content", "message"), [
    (b"\xff\xfe binary", "cannot read catalog file"),
    (b"hardware: {id: x}\n", "`hardware` must be a list"),
    (b"vendors: [a, b]\n", "`vendors` must be a mapping"),
    (b"hardware:\n  - {id: [1, 2]}\n", "needs an `id` (a string)"),
    (b"hardware: []\nhardware: []\n", "duplicate key 'hardware'"),
    (b"models: " + b"[" * 500 + b"]" * 500 + b"\n", "nested more than 64 levels deep"),
])
def test_bad_catalog_files_are_input_errors_naming_the_file(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / "extra.yaml").write_bytes(content)
    result = run_cli("plan", "--check", "--catalog", tmp_path, DEMO)
    assert result.code == 2, result.err
    assert str(tmp_path / "extra.yaml") in result.err and message in result.err, result.err


def test_a_nul_in_any_string_is_refused_at_its_position() -> None:
    # It loaded, rendered, and then failed inside the local executor (ValueError: embedded null byte).
    text = DEMO.read_text().replace("port: 18000", "port: 18000, args: {--served-model-name: \"a\\0b\"}")
    assert "engine.args.--served-model-name: contains a NUL character" in only_issue(text)


@pytest.mark.timeout(30)
def test_a_huge_pipeline_size_is_judged_without_a_list_per_stage(tmp_path: Path) -> None:
    """pp: 10**12 used to build one layer range per stage in the memory step (found by the CLI fuzzer:
    gigabytes before any verdict)."""
    import yaml

    doc = yaml.safe_load((SHIPPED[0]).read_text(encoding="utf-8"))
    doc.setdefault("parallel", {})["pp"] = 10**12
    path = tmp_path / "huge-pp.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = run_cli("plan", path)
    assert result.code in (1, 2), result.out + result.err
    assert "Traceback" not in result.out + result.err
