"""`k3deploy manifest`: pin a checkpoint revision as sizes and sha256 of every file (from a directory or the hub)."""
# No `from __future__ import annotations`: typer evaluates the commands' annotations on every run.
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from k3deploy.checkpoint.manifest import Manifest

manifest = typer.Typer(help="Make checkpoint manifests (per-file size and sha256, weight map, config hash, revision) "
                       "for `validate.manifest`.", no_args_is_help=True, add_completion=False)
OutputOpt = Annotated[Path | None, typer.Option("-o", "--output", help="write here instead of stdout")]


def _emit(made: "Manifest", output: Path | None) -> None:
    size_b = sum(d.size for d in made.files.values())
    if output is None:
        sys.stdout.write(made.dump())
    else:
        made.save(output)
    where = f" -> {output}" if output else ""
    print(f"manifest: {len(made.files)} files, {size_b:,} bytes, revision {made.revision or 'unknown'}{where}",
          file=sys.stderr)


@manifest.command("create")
def create(
    directory: Annotated[Path, typer.Argument(help="checkpoint directory (with model.safetensors.index.json)",
                                              show_default=False)],
    revision: Annotated[str | None, typer.Option(help="revision the files belong to (default: the hub download "
                                                 "metadata or snapshot path, if any)")] = None,
    output: OutputOpt = None,
    threads: Annotated[int, typer.Option(help="files hashed at once (0 = all cores)")] = 0,
) -> None:
    """Hash every file of a local checkpoint directory."""
    from k3deploy.checkpoint.manifest import create_manifest

    _emit(create_manifest(directory, revision=revision, threads=threads), output)


@manifest.command("from-hub")
def from_hub(
    repo: Annotated[str, typer.Argument(help="hub repo, e.g. moonshotai/Kimi-K3", show_default=False)],
    revision: Annotated[str, typer.Option(help="commit sha to pin (a branch is resolved to its commit)",
                                          show_default=False)],
    output: OutputOpt = None,
) -> None:
    """Build the manifest from the hub's per-file LFS sha256 (needs the `hub` extra; small files are fetched)."""
    from k3deploy.checkpoint.hub import manifest_from_hub

    _emit(manifest_from_hub(repo, revision), output)
