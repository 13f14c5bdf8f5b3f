"""Bad input, fuzzed: mutated shipped topologies and catalogs, YAML attacks and random options through the
loader, the planner and the CLI entry points. Every input ends in a result or a located error, exit 0, 1
or 2: never a traceback, never exit 70, never a hang (each test has a timeout)."""
from __future__ import annotations

import functools
import itertools
import json
import os
import re
import resource
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from k3deploy.catalog.loader import DATA_DIR
from k3deploy.planning.files import catalog_for, plan_path
from tests import figures, fuzz_seed
from tests.fuzz_inputs import (
    PAST_LIMITS,
    SHIPPED,
    attacks,
    dump_yaml,
    mutated_documents,
    run_cli,
    topology_text_sets,
    topology_texts,
    unraw,
    values,
)


def fuzz(examples: int) -> Callable[[Any], Any]:
    """A per-run budget of `examples` (scaled by K3_FUZZ_SCALE), drawn from this run's seed (tests/fuzz_seed.py:
    a new one each run, printed in the header and the summary, K3_FUZZ_SEED replays it), so runs add up to new
    inputs instead of replaying the same ones; no timed deadline (the test's timeout bounds it). The inputs
    earlier runs found are explicit cases (attacks(), PAST_LIMITS)."""
    budget = settings(database=None, deadline=None, derandomize=False, print_blob=True,
                      max_examples=fuzz_seed.examples(examples), suppress_health_check=list(HealthCheck),
                      phases=(Phase.explicit, Phase.generate, Phase.shrink))

    def apply(test: Any) -> Any:
        return seed(fuzz_seed.SEED)(budget(test))
    return apply
CATALOG_DOCS = {p.name: yaml.safe_load(p.read_text(encoding="utf-8")) for p in sorted(DATA_DIR.glob("*.yaml"))}
DEMO = Path(SHIPPED[0]).parent / "local-demo.yaml"
LOCATED = re.compile(r":\d+:\d+: ")  # file:line:col


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    """One folder for the whole module (hypothesis runs many examples per test function)."""
    with tempfile.TemporaryDirectory(prefix="k3fuzz-") as d:
        yield Path(d)


@pytest.fixture(scope="module", autouse=True)
def bounded_memory() -> Iterator[None]:
    """No input may make the process grow by more than 1 GiB (an alias bomb would take tens): an address
    space limit turns a runaway allocation into a MemoryError (exit 70, a failed example) rather than the
    machine's OOM killer."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024
    assert grown_mib < 1024, f"fuzzing grew the process by {grown_mib} MiB"


def counted(fn: Any) -> Any:
    """Count each input tried (a list of texts is that many inputs), and each one that escaped as an
    exception (a traceback a user would see)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        texts = kwargs.get("texts")
        figures.add(figures.INPUTS_FUZZED, len(texts) if isinstance(texts, list) else 1)
        try:
            fn(*args, **kwargs)
        except AssertionError:
            raise
        except Exception:
            figures.add(figures.TRACEBACKS)
            raise
    return wrapper


def assert_clean(result: Any, *files: Path) -> None:
    """Exit 0, 1 or 2; no internal error; an exit 2 says what was wrong, located."""
    text = result.out + result.err
    if "Traceback" in text or "internal error" in text or result.code not in (0, 1, 2):
        figures.add(figures.TRACEBACKS)
    assert "Traceback" not in text and "internal error" not in text, text[-2000:]
    assert result.code in (0, 1, 2), text[-2000:]
    if result.code == 2:
        assert text.strip(), "exit 2 without a message"
        if files:
            assert any(str(f) in text for f in files) or "--" in result.err, text[-2000:]


_n = itertools.count()


def write(scratch: Path, data: str | bytes, name: str = "topology.yaml") -> Path:
    """The input as a file (one name per test, rewritten: ten thousand files would be slow to remove)."""
    path = scratch / name
    path.write_bytes(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    return path


@pytest.mark.timeout(240)
@fuzz(int(os.environ.get("K3_FUZZ_EXAMPLES", "2000")))
@given(texts=topology_text_sets())
@counted
def test_loader_and_planner_end_in_a_plan_or_located_issues(texts: list[str], scratch: Path) -> None:
    for text in texts:
        result = plan_path(write(scratch, text), catalog_for(None))
        assert result.exit_code in (0, 1, 2)
        for issue in result.load_issues:
            assert issue.severity != "error" or issue.code == "FILE" or issue.line is not None, issue
        if result.plan is None:
            assert result.exit_code == 2 and result.load_issues


COMMANDS = (("plan",), ("plan", "--check"), ("plan", "--json"), ("render",), ("render", "--format", "json"),
            ("render", "--format", "script"), ("render", "--format", "slurm"), ("render", "--format", "lws"),
            ("launch", "--dry-run"), ("launch", "--dry-run", "--json"))


@pytest.mark.timeout(240)
@fuzz(1500)
@given(text=topology_texts(), command=st.sampled_from(COMMANDS))
@counted
def test_cli_entry_points_exit_0_1_or_2_with_the_file_named(text: str, command: tuple[str, ...],
                                                            scratch: Path) -> None:
    path = write(scratch, text)
    result = run_cli(*command, path)
    assert_clean(result, path)
    if command[-1] == "--json" and result.code in (0, 1) and command[0] == "plan":
        json.loads(result.out)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", sorted(attacks()))
def test_yaml_attacks_are_refused_quickly_with_a_position(name: str, scratch: Path) -> None:
    path = write(scratch, attacks()[name], f"{name}.yaml")
    for command in COMMANDS:
        figures.add(figures.INPUTS_FUZZED)
        result = run_cli(*command, path)
        assert_clean(result, path)
        if name in ("billion-laughs", "deep-flow", "deep-map", "deep-block", "binary", "empty", "huge-line",
                    "many-keys", "python-tag", "utf16", "latin1", "list-document", "int-past-limit",
                    "int-key-past-limit", "float-past-range", "float-past-range-in-timeout", "date-that-is-not"):
            assert result.code == 2, result.out + result.err
            assert command[0] == "launch" or "--json" in command or str(path) in result.out + result.err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["billion-laughs", "deep-flow", "deep-block", "binary", "huge-line", "python-tag"])
def test_catalog_attacks_are_input_errors_naming_the_file(name: str, scratch: Path) -> None:
    folder = scratch / f"cat-{name}"
    folder.mkdir()
    (folder / "extra.yaml").write_bytes(attacks()[name])
    figures.add(figures.INPUTS_FUZZED)
    result = run_cli("plan", "--check", "--catalog", folder, DEMO)
    assert_clean(result)
    assert result.code == 2 and str(folder / "extra.yaml") in result.err, result.err


@pytest.mark.timeout(240)
@fuzz(150)
@given(name=st.sampled_from(sorted(CATALOG_DOCS)), data=st.data())
@counted
def test_mutated_catalog_files_are_input_errors_or_plans(name: str, data: st.DataObject, scratch: Path) -> None:
    doc = data.draw(mutated_documents([CATALOG_DOCS[name]]))
    folder = scratch / f"cat{next(_n)}"
    folder.mkdir()
    (folder / name).write_text(dump_yaml(doc), encoding="utf-8")
    assert_clean(run_cli("plan", "--check", "--catalog", folder, DEMO))


OPTION_WORDS = ("--json", "--check", "--search", "--hardware", "--gpus", "--gpus-per-node", "--engine",
                "--model", "--node", "--format", "--out", "--catalog", "--executor", "--help", "--",
                "h200", "sim", "vllm", "-1", "0", "99999999999999999999", "ssh", "ray", "local")


@pytest.mark.timeout(240)
@fuzz(500)
@given(command=st.sampled_from(("plan", "render", "launch", "schema")),
       words=st.lists(st.one_of(st.sampled_from(OPTION_WORDS), st.text(max_size=10),
                                st.integers(-(2**70), 2**70).map(str)), max_size=6))
@counted
def test_random_options_are_usage_errors_not_crashes(command: str, words: list[str], scratch: Path) -> None:
    # --out only ever inside the scratch folder; launch only ever as a dry run.
    args = ([command, "--dry-run", *words, DEMO] if command == "launch"
            else [command, *words] if command in ("plan", "schema") else [command, *words, DEMO])
    if "--out" in args:
        args.insert(args.index("--out") + 1, scratch / f"out{next(_n)}")
    assert_clean(run_cli(*args))


@pytest.mark.timeout(120)
@fuzz(100)
@given(value=values())
@counted
def test_search_numbers_of_any_size_answer_or_refuse(value: Any) -> None:
    assert_clean(run_cli("plan", "--search", "--hardware", "h200", "--gpus", unraw(str(value)), "--json"))


HARDWARE_TEXT = (DATA_DIR / "hardware.yaml").read_text(encoding="utf-8")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("field", ["memory_gib", "usable_gib", "bandwidth_tbps", "bf16_tflops"])
@pytest.mark.parametrize("number", PAST_LIMITS, ids=lambda n: n if len(n) < 12 else f"{n[:6]}..{len(n)}")
def test_catalog_numbers_past_python_limits_are_input_errors(field: str, number: str, scratch: Path) -> None:
    folder = scratch / f"cat-past{next(_n)}"
    folder.mkdir()
    line = next(x for x in HARDWARE_TEXT.splitlines() if x.strip().startswith(f"{field}:"))
    (folder / "hardware.yaml").write_text(HARDWARE_TEXT.replace(line, f"{line.split(':')[0]}: {number}", 1))
    figures.add(figures.INPUTS_FUZZED)
    for command in (("plan", "--check"), ("plan", "--json"), ("render",), ("launch", "--dry-run")):
        result = run_cli(*command, "--catalog", folder, DEMO)
        assert_clean(result)
        assert result.code == 2 and str(folder / "hardware.yaml") in result.err, result.err
