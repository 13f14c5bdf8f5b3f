"""The stand-in's flag parsing: every real flag accepted, unknown flags fail like argparse, help is fast."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from k3deploy.sim.engine_args import (
    flag_table,
    human_readable_int,
    parse_engine_args,
    split_mimic,
)

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
VALUES = {
    "int": "2",
    "human_readable_int": "2k",
    "human_readable_int_or_auto": "auto",
    "float": "0.5",
    "loads": "{}",
    "json_list_type": "[]",
}


def _value(spec: dict[str, Any]) -> str:
    if spec.get("choices"):
        return str(spec["choices"][0])
    return VALUES.get(spec.get("type") or "", "x")


def _every_flag_argv(mimic: str) -> list[str]:
    argv = ["--mimic", mimic, "/models/k3"]
    for spec in flag_table(mimic)["arguments"]:  # type: ignore[arg-type]
        argv.append(spec["flags"][0])
        if spec["takes_value"]:
            argv.append(_value(spec))
    return argv


@pytest.mark.parametrize("mimic", ["sglang", "vllm"])
def test_every_flag_of_the_real_engine_is_accepted(mimic: str) -> None:
    ns = parse_engine_args(mimic, _every_flag_argv(mimic))  # type: ignore[arg-type]
    table = flag_table(mimic)  # type: ignore[arg-type]
    assert len(table["arguments"]) > 300
    for spec in table["arguments"]:
        assert hasattr(ns, spec["dest"]), spec["flags"]


@pytest.mark.parametrize("mimic", ["sglang", "vllm"])
def test_unknown_flag_fails_like_argparse(mimic: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_engine_args(mimic, ["--mimic", mimic, "/m", "--tp-size-typo", "4"])  # type: ignore[arg-type]
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "error: unrecognized arguments: --tp-size-typo 4" in err
    assert err.startswith("usage: python -m k3deploy.sim serve")


def test_choices_and_types_are_enforced(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_engine_args("sglang", ["--mimic", "sglang", "/m", "--moe-runner-backend", "marlinn"])
    assert "invalid choice: 'marlinn'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_engine_args("sglang", ["--mimic", "sglang", "/m", "--tp-size", "four"])
    assert "argument --tp-size/--tensor-parallel-size: invalid int value: 'four'" in capsys.readouterr().err


def test_sglang_model_path_positional_or_flag() -> None:
    assert parse_engine_args("sglang", ["--mimic", "sglang", "/a"]).model_path == "/a"
    assert parse_engine_args("sglang", ["--mimic", "sglang", "--model-path", "/b"]).model_path == "/b"
    with pytest.raises(SystemExit):
        parse_engine_args("sglang", ["--mimic", "sglang"])


def test_sglang_values_and_switches() -> None:
    ns = parse_engine_args(
        "sglang",
        [
            "--mimic",
            "sglang",
            "/m",
            "--tp-size",
            "32",
            "--ep",
            "32",
            "--context-length",
            "128k",
            "--dist-init-addr",
            "10.0.0.1:5000",
            "--disable-radix-cache",
            "--enable-hicache",
            "--no-enable-tf32-matmul",
            "--mamba-ssm-dtype",
            "float32",
            "--kv-cache-dtype",
            "fp8_e4m3",
        ],
    )
    assert (ns.tp_size, ns.ep_size, ns.context_length) == (32, 32, 128000)
    assert ns.disable_radix_cache is True and ns.enable_hierarchical_cache is True
    assert ns.enable_tf32_matmul is False and ns.enable_cache_report is False


def test_vllm_spellings_and_negative_switches() -> None:
    ns = parse_engine_args(
        "vllm",
        [
            "--mimic",
            "vllm",
            "/m",
            "-tp",
            "8",
            "--max_model_len",
            "32K",
            "-dp",
            "4",
            "-dpl",
            "1",
            "--enable-prefix-caching",
            "--disable-expert-parallel",
            "--served-model-name",
            "k3",
            "alias",
        ],
    )
    assert ns.model_tag == "/m" and ns.tensor_parallel_size == 8
    assert ns.max_model_len == 32768 and ns.data_parallel_size == 4 and ns.data_parallel_size_local == 1
    assert ns.enable_prefix_caching is True and ns.enable_expert_parallel is False
    assert ns.served_model_name == ["k3", "alias"]
    assert (
        parse_engine_args("vllm", ["--mimic", "vllm", "/m", "--disable-prefix-caching"]).enable_prefix_caching
        is False
    )
    assert parse_engine_args("vllm", ["--mimic", "vllm", "/m"]).enable_prefix_caching is None


def test_human_readable_int() -> None:
    assert [human_readable_int(x) for x in ("42", "1k", "1K", "1.5k", "2M", "1m")] == [
        42,
        1000,
        1024,
        1500,
        2 * 2**20,
        10**6,
    ]
    with pytest.raises(ValueError):
        human_readable_int("1.5")


def test_split_mimic() -> None:
    assert split_mimic(["/m", "--mimic", "vllm"]) == "vllm"
    assert split_mimic(["--mimic=sglang"]) == "sglang"
    assert split_mimic(["--mimic", "trt"]) is None
    assert split_mimic([]) is None


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "k3deploy.sim", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=30,
    )


def test_serve_help_is_fast_and_says_stand_in() -> None:
    started = time.monotonic()
    out = _run("serve", "--help")
    elapsed = time.monotonic() - started
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "Stand-in engine for tests and demos, not a model server" in text
    assert "python -m k3deploy.sim serve --mimic sglang|vllm MODEL_PATH" in text
    assert elapsed < 5, elapsed
    top = _run("--help")
    assert "serve" in top.stdout and "not a model server" in " ".join(top.stdout.split())


def test_serve_help_per_engine_lists_its_flags() -> None:
    sglang = _run("serve", "--mimic", "sglang", "--help").stdout
    vllm = _run("serve", "--mimic", "vllm", "--help").stdout
    assert "--mem-fraction-static" in sglang and "--gpu-memory-utilization" not in sglang
    assert "--gpu-memory-utilization" in vllm and "--mem-fraction-static" not in vllm


def test_serve_parsing_does_not_import_torch() -> None:
    code = (
        "import sys\nfrom k3deploy.sim.cli import main\ntry:\n"
        "    main(['serve', '--mimic', 'vllm', '--help'])\n"
        "except SystemExit:\n    pass\nprint('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=ROOT, timeout=30
    )
    assert out.stdout.strip().endswith("False")


def test_serve_without_mimic_or_with_unknown_flag_exits_2() -> None:
    missing = _run("serve", "/m")
    assert missing.returncode == 2 and "the following arguments are required: --mimic" in missing.stderr
    unknown = _run("serve", "--mimic", "vllm", "/m", "--no-such-flag")
    assert unknown.returncode == 2 and "unrecognized arguments: --no-such-flag" in unknown.stderr
