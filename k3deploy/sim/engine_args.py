"""The mimicked engine's own argument parser, rebuilt from its packaged flag table (stdlib only, no torch)."""

from __future__ import annotations

import argparse
import ast
import functools
import json
import re
from collections.abc import Callable, Sequence
from typing import Any, Literal

from k3deploy.engines.flag_tables import DATA_DIR
from k3deploy.engines.flag_tables import TABLE_FILES as FLAG_TABLES

Mimic = Literal["sglang", "vllm"]
MIMICS: tuple[Mimic, ...] = ("sglang", "vllm")
PROG = "python -m k3deploy.sim serve"

SERVE_DESCRIPTION = (
    "Stand-in engine for tests and demos, not a model server: it accepts the flags of the engine named by "
    "--mimic ({engine}), rendezvouses across nodes with torch.distributed over Gloo, logs, answers HTTP and "
    "fails like that engine, with deterministic replies computed on CPU. Env: K3SIM_GPU (hardware catalog id "
    "the node pretends to have, default sim), K3SIM_FAULT (crash_after_load, hang_at_rendezvous[:S], "
    "slow_load:S, wrong_kernel, oom, wrong_topology, no_reasoning_parser, no_tool_parser, transfer_kda_zeroed, transfer_kda_dropped, prefill_dies_mid_transfer[:N]; comma-separated), K3SIM_FAULT_RANK (only that node rank applies them), K3SIM_GROUP (gloo, default, or tcp: the same group without torch)."
)
SERVE_USAGE = f"{PROG} --mimic sglang|vllm MODEL_PATH [the engine's own flags]"

_SUFFIXES = {"k": 10**3, "K": 2**10, "m": 10**6, "M": 2**20, "g": 10**9, "G": 2**30, "t": 10**12, "T": 2**40}


def human_readable_int(text: str) -> int:
    """An int with an optional k/m/g/t (decimal) or K/M/G/T (binary) suffix, as both engines accept."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT]?)", text.strip())
    if match is None:
        raise ValueError(text)
    number, suffix = match.groups()
    value = float(number) * _SUFFIXES.get(suffix, 1)
    if not value.is_integer():
        raise ValueError(text)
    return int(value)


def human_readable_int_or_auto(text: str) -> int:
    """vLLM's --max-model-len: `auto` (-1) or a human-readable int."""
    return -1 if text.strip().lower() == "auto" else human_readable_int(text)


def loads(text: str) -> Any:
    """JSON, or a Python literal (some packaged defaults are reprs), else the text itself."""
    for parse in (json.loads, ast.literal_eval):
        try:
            return parse(text)
        except (ValueError, SyntaxError):
            continue
    return text


def nullable_str(text: str) -> str | None:
    """SGLang's nullable_str: the word None means no value."""
    return None if text in ("None", "") else text


# Engine-specific converters we cannot import stay strings; the sim reads only the values it needs.
_CONVERTERS: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "human_readable_int": human_readable_int,
    "human_readable_int_or_auto": human_readable_int_or_auto,
    "loads": loads,
    "json_list_type": loads,
    "nullable_str": nullable_str,
}


def _try(convert: Callable[[str], Any], text: Any) -> Any:
    try:
        return convert(str(text))
    except (ValueError, TypeError):
        return text


class _SwitchAction(argparse.Action):
    """A flag without a value whose negative spellings (--no-X, --disable-X for --enable-X) store False."""

    def __init__(
        self, option_strings: Sequence[str], dest: str, negatives: frozenset[str] = frozenset(), **kwargs: Any
    ) -> None:
        self.negatives = negatives
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, option_string not in self.negatives)


def _negatives(flags: list[str]) -> frozenset[str]:
    first = flags[0]
    out = set()
    for flag in flags[1:]:
        swapped = (first.startswith("--enable-") and flag.startswith("--disable-")) or (
            first.startswith("--disable-") and flag.startswith("--enable-")
        )
        if flag.startswith("--no-") or swapped:
            out.add(flag)
    return frozenset(out)


def _add_argument(parser: argparse.ArgumentParser, spec: dict[str, Any]) -> None:
    flags: list[str] = spec["flags"]
    default = spec.get("default")
    kwargs: dict[str, Any] = {"dest": spec["dest"]}
    kwargs["default"] = argparse.SUPPRESS if default == "==SUPPRESS==" else default
    if not spec["takes_value"]:
        if spec.get("boolean_optional"):
            # BooleanOptionalAction derives each --no-X itself from the positive spellings.
            positives = [f for f in flags if not f.startswith("--no-")]
            parser.add_argument(*positives, action=argparse.BooleanOptionalAction, **kwargs)
        else:
            parser.add_argument(*flags, action=_SwitchAction, negatives=_negatives(flags), **kwargs)
        return
    kwargs["type"] = convert = _CONVERTERS.get(spec.get("type") or "", str)
    if spec.get("choices") is not None:
        # The table stores choices as text; argparse compares them with the converted value.
        kwargs["choices"] = [_try(convert, c) for c in spec["choices"]]
    if spec.get("nargs") is not None:
        kwargs["nargs"] = spec["nargs"]
    parser.add_argument(*flags, **kwargs)


@functools.lru_cache(maxsize=2)
def flag_table(mimic: Mimic) -> dict[str, Any]:
    """The packaged flag table (parsed JSON) of the mimicked engine version."""
    data: dict[str, Any] = json.loads((DATA_DIR / FLAG_TABLES[mimic]).read_text(encoding="utf-8"))
    return data


def engine_version(mimic: Mimic) -> str:
    """The pinned version string of the mimicked engine, e.g. 0.5.23."""
    return str(flag_table(mimic)["engine"]).split()[-1]


def build_engine_parser(mimic: Mimic) -> argparse.ArgumentParser:
    """An argparse parser accepting exactly the mimicked engine's flags, plus --mimic."""
    table = flag_table(mimic)
    parser = argparse.ArgumentParser(
        prog=PROG, usage=SERVE_USAGE, description=SERVE_DESCRIPTION.format(engine=table["engine"])
    )
    parser.add_argument(
        "--mimic", choices=MIMICS, required=True, help="the engine whose flags and behaviour to copy"
    )
    if mimic == "sglang":
        # `sglang serve MODEL` turns the positional into --model-path.
        parser.add_argument(
            "model_path_positional",
            nargs="?",
            metavar="MODEL_PATH",
            default=None,
            help="checkpoint directory with config.json (or use --model-path)",
        )
    else:
        parser.add_argument(
            "model_tag",
            nargs="?",
            metavar="MODEL_PATH",
            default=None,
            help="checkpoint directory with config.json",
        )
    for spec in table["arguments"]:
        _add_argument(parser, spec)
    return parser


@functools.lru_cache(maxsize=2)
def engine_defaults(mimic: Mimic) -> dict[str, Any]:
    """Every dest's default after argparse's own conversion (what `non-default args` compares against)."""
    return vars(build_engine_parser(mimic).parse_args(["--mimic", mimic]))


def _vllm_spelling(arg: str) -> str:
    # vLLM's FlexibleArgumentParser accepts --max_model_len for --max-model-len.
    if not arg.startswith("--"):
        return arg
    name, sep, value = arg.partition("=")
    return name.replace("_", "-") + sep + value


def parse_engine_args(mimic: Mimic, argv: Sequence[str]) -> argparse.Namespace:
    """Parse argv like the engine would (unknown flag: argparse's own error, exit 2); --mimic must match."""
    args = [_vllm_spelling(a) for a in argv] if mimic == "vllm" else list(argv)
    parser = build_engine_parser(mimic)
    ns = parser.parse_args(args)
    if ns.mimic != mimic:
        parser.error(f"--mimic {ns.mimic} does not match the flag table in use ({mimic})")
    if mimic == "sglang":
        ns.model_path = ns.model_path_positional or ns.model_path
        if ns.model_path is None:
            parser.error("the following arguments are required: --model-path (or the positional MODEL_PATH)")
    elif ns.model_tag is None:
        ns.model_tag = ns.model
    return ns


def split_mimic(argv: Sequence[str]) -> Mimic | None:
    """The value of --mimic in argv (None when absent or not one of sglang|vllm)."""
    for i, arg in enumerate(argv):
        value = (
            arg.partition("=")[2]
            if arg.startswith("--mimic=")
            else (argv[i + 1] if arg == "--mimic" and i + 1 < len(argv) else None)
        )
        if value in MIMICS:
            return value
    return None
