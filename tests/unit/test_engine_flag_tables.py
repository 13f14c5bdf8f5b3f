"""The packaged flag tables agree with the engines' real parsers, as extracted by scripts/engine_flag_tables.py.

CI cannot download the engine wheels, so the script also writes a compact extract of each parser
(tests/assets/engine-parsers/*.txt, built from the argparse actions, not from the table): every flag's
nargs, type and choices, each launcher form's positionals, required arguments and model passing, and
vLLM's parser-name registries. A hand edit of a table that disagrees with the parser fails here.
"""
from __future__ import annotations

import copy
from typing import Any

import pytest

from k3deploy.engines.flag_tables import flag_table
from tests.unit.engine_parser_check import ROOT, TABLES, table

pytestmark = pytest.mark.timeout(60)
EXTRACTS = ROOT / "tests" / "assets" / "engine-parsers"


def table_lines(tab: dict[str, Any]) -> list[str]:
    """The extract's lines, rebuilt from a table."""
    lines = []
    for a in tab["arguments"]:
        nargs = str(a.get("nargs") or 1) if a["takes_value"] else "0"
        choices = "|".join(a["choices"]) if a.get("choices") else "-"
        lines.append(f"{','.join(a['flags'])} nargs={nargs} type={a.get('type') or '-'} choices={choices}")
    for f in tab.get("forms", []):
        pos = ",".join(f"{p['dest']}{p['nargs']}{'@first' if p.get('first') else ''}" for p in f["positionals"])
        lines.append(f"form {f['name']}: model={f['model']} positionals={pos or '-'} "
                     f"required={','.join(f['required']) or '-'} headless={f.get('headless', '-')}")
    for dest, names in tab.get("registries", {}).items():
        if isinstance(names, list):
            lines.append(f"registry {dest}: {','.join(names)}")
    return lines


def extract_lines(name: str) -> list[str]:
    text = (EXTRACTS / TABLES[name].with_suffix(".txt").name).read_text(encoding="utf-8")
    return [line for line in text.splitlines() if not line.startswith("#")]


def disagreements(tab: dict[str, Any], name: str) -> list[str]:
    got, want = table_lines(tab), extract_lines(name)
    out = [f"table: {g}\nparser: {w}" for g, w in zip(got, want) if g != w]
    if len(got) != len(want):
        out.append(f"the table has {len(got)} entries, the parser {len(want)}")
    return out


@pytest.mark.parametrize("name", sorted(TABLES))
def test_tables_agree_with_the_real_parsers(name: str) -> None:
    problems = disagreements(table(name), name)
    assert not problems, ("regenerate with scripts/engine_flag_tables.py, never by hand:\n"
                          + "\n".join(problems[:10]))


@pytest.mark.parametrize("flag,edit", [
    ("--monokernel-backend", {"takes_value": False}),  # the table used to say it takes no value
    ("--tp-size", {"choices": ["1", "2"]}),
    ("--mamba-radix-cache-strategy", {"nargs": "+"}),
])
def test_a_hand_edit_that_disagrees_with_the_parser_is_caught(flag: str, edit: dict[str, Any]) -> None:
    tab = copy.deepcopy(table("sglang"))
    arg = next(a for a in tab["arguments"] if flag in a["flags"])
    arg.update(edit)
    problems = disagreements(tab, "sglang")
    assert len(problems) == 1 and flag in problems[0]


def test_a_hand_edit_of_a_launcher_form_is_caught() -> None:
    tab = copy.deepcopy(table("vllm"))
    tab["forms"][1]["model"] = "positional"  # the api_server entry point never copies a positional model
    assert any("api_server" in p for p in disagreements(tab, "vllm"))


def test_the_three_differences_of_issue_17_are_gone() -> None:
    sg, vl = flag_table("sglang"), flag_table("vllm")
    mono = sg.by_flag["--monokernel-backend"]
    assert mono.takes_value and mono.choices == ("amd",)
    assert vl.by_flag["--lora-dtype"].choices == ("auto", "bfloat16", "float16")
    assert vl.by_flag["--mm-processor-device"].choices == ("auto", "cpu", "cuda")
    assert sg.value_problem(mono, "amd") is None and sg.value_problem(mono, "intel") is not None


def test_launcher_forms_are_loaded_with_how_they_take_the_model() -> None:
    forms = {f.name: f for t in ("sglang", "vllm") for f in flag_table(t).forms}  # type: ignore[arg-type]
    assert forms["sglang serve"].model_argv("/m") == ("/m",)
    assert forms["python -m sglang.launch_server"].model_argv("/m") == ("--model-path", "/m")
    assert forms["python -m sglang.launch_server"].required == ("model_path",)
    assert forms["vllm serve"].model_argv("/m") == ("/m",) and forms["vllm serve"].headless is True
    api = forms["python -m vllm.entrypoints.openai.api_server"]
    assert api.model_argv("/m") == ("--model", "/m") and api.headless is False
