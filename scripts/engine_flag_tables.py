"""Regenerate k3deploy/engines/data/*.json and tests/assets/engine-parsers/*.txt from the engines' real parsers.

The tables are what k3deploy renders and checks flags against; the .txt files are a compact extract of the
same parsers (flags, nargs, type, choices, launcher forms, registries) that the unit tier compares the
committed tables with, so a hand edit that disagrees with the parser fails CI without the wheels.

Run it in a throwaway venv that sees the system torch (2.13.0 CPU) and has a few small pure-Python or
small binary deps (msgspec, psutil, pybase64, starlette, cachetools, cbor2, fastapi, openai-harmony,
uvicorn):

    python3 -m venv --system-site-packages /tmp/engine-venv
    /tmp/engine-venv/bin/pip install msgspec psutil pybase64 starlette cachetools cbor2 fastapi openai-harmony \
        uvicorn
    pip download --no-deps sglang==0.5.23 vllm==0.33.0 -d /tmp/engine-wheels
    /tmp/engine-venv/bin/python scripts/engine_flag_tables.py /tmp/engine-wheels

Only the argument-parser modules are imported (SGLang: `ServerArgs.add_cli_args`, as `prepare_server_args`
builds it; vLLM: `make_arg_parser`, which both `vllm serve` and the api_server entry point use). What is
stubbed (an empty module whose attributes are further stubs), and why:
- vllm._C, vllm._C_stable_libtorch: compiled CUDA kernels (only the .py files are unpacked);
- triton (SGLang only; vLLM must not see a stub, torch's inductor reads triton.__version__), zmq, aiohttp,
  uvloop: transport/GPU-compiler modules imported at module level, never called while building a parser;
- transformers, PIL, xgrammar, llguidance, partial_json_parser: large model/grammar libraries that the
  parser modules import for type annotations and request handling, not for flags.
vLLM's platform is set to its real CudaPlatform class: some choices depend on the device type
(`--mm-processor-device` adds `cuda`), and k3deploy renders for GPU nodes. torch is the real CPU build, so
`torch.dtype | Literal[...]` types keep their choices (`--lora-dtype auto|float16|bfloat16`).
How each launcher form takes the model is read from the engines' own code and checked here (the script
fails if that code changed): `sglang serve` rewrites a first positional into --model-path; vLLM's serve
subcommand copies the positional model_tag into --model, the api_server entry point never does (and
ignores --headless).
"""
from __future__ import annotations

import argparse
import ast
import importlib.abc
import importlib.machinery
import inspect
import json
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path
from typing import Any, ClassVar

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "k3deploy" / "engines" / "data"
ASSETS = ROOT / "tests" / "assets" / "engine-parsers"
VERSIONS = {"sglang": "0.5.23", "vllm": "0.33.0"}
STUBS = {"sglang": ("triton", "PIL", "zmq", "aiohttp"),
         "vllm": ("vllm._C", "vllm._C_stable_libtorch", "zmq", "transformers", "aiohttp", "PIL", "uvloop",
                  "partial_json_parser", "xgrammar", "llguidance")}


class _Stub(types.ModuleType):
    """A module whose every attribute is another stub; decorators pass functions through."""

    __path__: ClassVar[list[str]] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        stub = _Stub(f"{self.__name__}.{name}")
        setattr(self, name, stub)
        return stub

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _Stub(self.__name__ + "()")

    def __iter__(self) -> Any:
        return iter(())

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)

    def __getitem__(self, key: Any) -> Any:
        return _Stub(self.__name__ + "[]")

    def __or__(self, other: Any) -> Any:
        return self

    __ror__ = __or__


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if any(name == n or name.startswith(n + ".") for n in self.names):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _Stub(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _default(value: Any) -> Any:
    return value if value is None or isinstance(value, (str, int, float, bool)) else repr(value)


def _choices(a: argparse.Action) -> list[str] | None:
    if a.choices is None:
        return None
    out = [str(c) for c in a.choices]
    return sorted(out) if isinstance(a.choices, (set, frozenset)) else out


def _type(a: argparse.Action) -> str | None:
    return None if a.type is None else getattr(a.type, "__name__", type(a.type).__name__)


def _entry(a: argparse.Action) -> dict[str, Any]:
    e: dict[str, Any] = {"flags": list(a.option_strings), "dest": a.dest, "takes_value": a.nargs != 0}
    if a.type is not None:
        e["type"] = _type(a)
    if type(a) is argparse.BooleanOptionalAction:  # vLLM's --enable/--disable pairs are a subclass
        e["boolean_optional"] = True
    e["default"] = _default(a.default)
    if a.choices is not None:
        e["choices"] = _choices(a)
    if a.nargs not in (None, 0):
        e["nargs"] = a.nargs
    return e


def _flag_actions(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def _fingerprint(p: argparse.ArgumentParser, forms: list[dict[str, Any]], registries: dict[str, Any]) -> str:
    """One line per argument straight from the parser's actions (not from the table entries)."""
    lines = []
    for a in _flag_actions(p):
        nargs = "0" if a.nargs == 0 else ("1" if a.nargs is None else str(a.nargs))
        lines.append(f"{','.join(a.option_strings)} nargs={nargs} type={_type(a) or '-'} "
                     f"choices={'|'.join(_choices(a) or ['-'])}")
    for f in forms:
        pos = ",".join(f"{x['dest']}{x['nargs']}{'@first' if x.get('first') else ''}" for x in f["positionals"])
        lines.append(f"form {f['name']}: model={f['model']} positionals={pos or '-'} "
                     f"required={','.join(f['required']) or '-'} headless={f.get('headless', '-')}")
    for dest, names in registries.items():
        if isinstance(names, list):
            lines.append(f"registry {dest}: {','.join(names)}")
    return "\n".join(lines) + "\n"


def _required(p: argparse.ArgumentParser) -> list[str]:
    return [a.dest for a in p._actions if a.required and a.option_strings]


def _positionals(p: argparse.ArgumentParser) -> list[dict[str, Any]]:
    return [{"dest": a.dest, "nargs": a.nargs or "1"} for a in p._actions if not a.option_strings]


def _expect(ok: bool, what: str) -> None:
    if not ok:
        raise SystemExit(f"engine_flag_tables: the engine changed: {what}; update the launcher forms")


def _function_source(path: Path, name: str) -> str:
    """The source of the first function `name` defined in a file (methods included)."""
    text = path.read_text(encoding="utf-8")
    node = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(text, node) or ""


def sglang_parser() -> tuple[argparse.ArgumentParser, list[dict[str, Any]], dict[str, Any]]:
    """SGLang's server parser and its two launcher forms."""
    from sglang.cli import serve
    from sglang.srt.server_args import ServerArgs

    p = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(p)
    _expect(not _positionals(p), "ServerArgs grew a positional")
    rewritten, positional = serve._normalize_positional_model_path(["/m", "--tp-size", "2"])
    _expect(positional and rewritten == ["--model-path", "/m", "--tp-size", "2"], "sglang serve MODEL")
    _expect(serve._normalize_positional_model_path(["--tp-size", "2", "/m"])[1] is False,
            "sglang serve takes the model only as the first argument")
    src = Path(inspect.getfile(serve)).parent.parent / "launch_server.py"
    _expect("prepare_server_args(sys.argv[1:])" in src.read_text(), "launch_server parses sys.argv[1:]")
    required = _required(p)
    model_flag = next(a.option_strings[0] for a in p._actions if a.dest == "model_path")
    forms = [
        {"name": "sglang serve", "script": "sglang", "modules": [], "subcommand": ["serve"],
         "model": "positional", "positionals": [{"dest": "model_path", "nargs": "?", "first": True}],
         "required": required},
        {"name": "python -m sglang.launch_server", "script": None, "modules": ["sglang.launch_server"],
         "subcommand": [], "model": model_flag, "positionals": [], "required": required},
    ]
    return p, forms, {}


def vllm_parser() -> tuple[argparse.ArgumentParser, list[dict[str, Any]], dict[str, Any]]:
    """vLLM's serve parser (on a CUDA platform), its launcher forms and its parser-name registries."""
    import vllm.platforms
    from vllm.platforms.cuda import CudaPlatform

    vllm.platforms._current_platform = CudaPlatform()
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    p = make_arg_parser(FlexibleArgumentParser())
    # Read, not imported: the serving modules pull in the whole HTTP stack.
    entrypoints = Path(inspect.getfile(make_arg_parser)).parents[1]
    serve_src = _function_source(entrypoints / "cli" / "serve.py", "cmd")
    entry_path = entrypoints / "launchers" / "api_server" / "entry.py"
    entry_src = _function_source(entry_path, "main")
    _expect("args.model = args.model_tag" in serve_src and "args.headless" in serve_src, "vllm serve")
    _expect("make_arg_parser(parser)" in entry_src and "model_tag" not in entry_src, "api_server main")
    _expect("headless" not in entry_path.read_text(), "the api_server entry point ignores --headless")
    shim = (entrypoints / "openai" / "api_server.py").read_text()
    _expect("from vllm.entrypoints.launchers.api_server.entry import main" in shim, "openai.api_server")
    required, positionals = _required(p), _positionals(p)
    model_flag = next(a.option_strings[0] for a in p._actions if a.dest == "model")
    forms = [
        {"name": "vllm serve", "script": "vllm", "modules": ["vllm.entrypoints.cli.main"], "subcommand": ["serve"],
         "model": "positional", "positionals": positionals, "required": required, "headless": True},
        {"name": "python -m vllm.entrypoints.openai.api_server", "script": None,
         "modules": ["vllm.entrypoints.openai.api_server", "vllm.entrypoints.launchers.api_server.entry"],
         "subcommand": [], "model": model_flag, "positionals": positionals, "required": required,
         "headless": False},
    ]
    registries = {"reasoning_parser": sorted(ReasoningParserManager.list_registered()),
                  "tool_call_parser": sorted(ToolParserManager.list_registered()),
                  "note": "vLLM checks these names at start-up, not in argparse"}
    return p, forms, registries


def extract(engine: str, src: Path) -> None:
    """In this process: import one engine's parser from unpacked sources, write its table and extract."""
    sys.path.insert(0, str(src))
    sys.meta_path.insert(0, _StubFinder(STUBS[engine]))
    import warnings

    warnings.simplefilter("ignore")  # pydantic warns about stubbed annotation types
    p, forms, registries = sglang_parser() if engine == "sglang" else vllm_parser()
    name = f"{engine}-{VERSIONS[engine]}"
    table: dict[str, Any] = {"engine": f"{engine} {VERSIONS[engine]}",
                             "source": "argument parser of the PyPI release (scripts/engine_flag_tables.py)",
                             "positionals": [x["dest"] for x in _positionals(p)],
                             "arguments": [_entry(a) for a in _flag_actions(p)], "forms": forms}
    if registries:
        table["registries"] = registries
    (DATA / f"{name}.json").write_text(json.dumps(table, indent=1), encoding="utf-8")
    ASSETS.mkdir(parents=True, exist_ok=True)
    header = f"# {name}: generated by scripts/engine_flag_tables.py from the real parser; do not edit\n"
    (ASSETS / f"{name}.txt").write_text(header + _fingerprint(p, forms, registries), encoding="utf-8")
    print(f"{name}: {len(table['arguments'])} flags, {len(forms)} launcher forms")


def main() -> None:
    """Unpack each wheel's Python sources into a temp dir and extract each engine in its own process."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheels", type=Path, help="directory with the sglang and vllm wheels (pip download --no-deps)")
    ap.add_argument("--engine", choices=sorted(VERSIONS), help=argparse.SUPPRESS)
    ap.add_argument("--src", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.engine:
        extract(args.engine, args.src)
        return
    with tempfile.TemporaryDirectory(prefix="engine-src-") as tmp:
        for engine, version in VERSIONS.items():
            wheel = next(args.wheels.glob(f"{engine}-{version}-*.whl"), None)
            if wheel is None:
                raise SystemExit(f"no {engine}-{version} wheel in {args.wheels}")
            dest = Path(tmp) / engine
            with zipfile.ZipFile(wheel) as z:
                z.extractall(dest, [n for n in z.namelist() if n.endswith(".py")])
            subprocess.run([sys.executable, __file__, str(args.wheels), "--engine", engine, "--src", str(dest)],
                           check=True, timeout=600)


if __name__ == "__main__":
    main()
