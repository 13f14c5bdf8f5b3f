"""Argument parsing for `python -m k3deploy.sim`: one registrar per subcommand."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# argparse exposes no public name for the object add_subparsers() returns.
Subparsers = Any
Registrar = Callable[[Subparsers], None]

DESCRIPTION = (
    "k3deploy stand-in engine, for tests and demos only: it imitates a Kimi K3 engine's interfaces "
    "on CPU with tiny K3-shaped checkpoints. It is not a model server."
)


def _add_make_checkpoint(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "make-checkpoint",
        help="write a tiny K3-shaped checkpoint (kimi-k3-tiny) with a sha256 manifest",
        description="Write safetensors shards, the index, config.json and k3-manifest.json into DIR.",
    )
    parser.add_argument("directory", metavar="DIR", type=Path, help="output directory (created if missing)")
    parser.add_argument("--revision", default="tiny-r1", help="revision label; changes contents, not sizes")
    parser.add_argument("--shards", type=int, default=4, help="number of safetensors shards")
    parser.add_argument("--seed", type=int, default=0, help="seed for the deterministic tensor contents")
    parser.add_argument(
        "--corrupt",
        choices=("truncate", "flip", "missing-tensor", "wrong-dtype"),
        default=None,
        help="damage one shard after writing the manifest (for integrity-check tests)",
    )
    parser.set_defaults(handler=_run_make_checkpoint)


def _run_make_checkpoint(args: argparse.Namespace) -> int:
    # Imported here so `--help` never pays for numpy.
    from k3deploy.sim.checkpoint import write_checkpoint

    manifest = write_checkpoint(
        args.directory, revision=args.revision, shards=args.shards, seed=args.seed, corrupt=args.corrupt
    )
    size_b = sum(d.size for d in manifest.files.values())
    note = f", then corrupted one shard ({args.corrupt})" if args.corrupt else ""
    print(
        f"wrote {args.directory}: revision {manifest.revision}, {len(manifest.files)} files, {size_b} B{note}"
    )
    return 0


def _add_serve(subparsers: Subparsers) -> None:
    # The flags depend on --mimic, so this parser only routes: the engine's own parser (built from its
    # flag table) sees everything after `serve`, including -h and unknown flags.
    from k3deploy.sim.engine_args import SERVE_USAGE

    parser = subparsers.add_parser(
        "serve",
        add_help=False,
        help="run a stand-in engine node with SGLang's or vLLM's flags (tests and demos; not a model server)",
        usage=SERVE_USAGE,
    )
    parser.set_defaults(handler=_run_serve, passthrough=True)


def _run_serve(args: argparse.Namespace) -> int:
    from k3deploy.sim.engine_args import (
        MIMICS,
        PROG,
        SERVE_DESCRIPTION,
        SERVE_USAGE,
        engine_version,
        split_mimic,
    )

    argv: list[str] = args.extra
    mimic = split_mimic(argv)
    if mimic is None:
        # No valid --mimic: this parser prints the stand-in's help or argparse's error (exit 0 or 2).
        both = " or ".join(f"{m} {engine_version(m)}" for m in MIMICS)
        generic = argparse.ArgumentParser(
            prog=PROG, usage=SERVE_USAGE, description=SERVE_DESCRIPTION.format(engine=both)
        )
        generic.add_argument(
            "--mimic", choices=MIMICS, required=True, help="the engine whose flags and behaviour to copy"
        )
        generic.parse_args(argv)
        return 2
    from k3deploy.sim.serve import serve_main

    return serve_main(mimic, argv)


# Append a registrar here to add a subcommand; each one sets `handler` on its parser
# (and `passthrough=True` to receive the arguments it does not parse itself as `args.extra`).
SUBCOMMANDS: tuple[Registrar, ...] = (_add_make_checkpoint, _add_serve)


def build_parser() -> argparse.ArgumentParser:
    """Build the `python -m k3deploy.sim` parser with every registered subcommand."""
    parser = argparse.ArgumentParser(prog="python -m k3deploy.sim", description=DESCRIPTION)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in SUBCOMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse argv, run the chosen subcommand and return its exit code."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    try:
        code: int = args.handler(args)
    except ImportError as exc:  # the stand-in's own packages (the sim extra) missing: name the install
        from k3deploy.extras import missing_dependency

        missing = missing_dependency(exc)
        if missing is None:
            raise
        print(f"error: {missing}\nhint: {missing.hint}", file=sys.stderr)
        return missing.exit_code
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return code
