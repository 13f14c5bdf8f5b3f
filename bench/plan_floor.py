"""The least a `plan`-like command can do with the mandated stack; bench/plan_startup.py times it as a floor.

Reads the topology YAML, validates it into one strict pydantic model and prints one rich table: no
k3deploy code, no catalog, no arithmetic. `--typer` parses the argument with a one-command typer app
instead of argparse. Whatever this costs over the bare-import baseline, no real `plan` can avoid.
"""
import sys


def floor(path: str) -> None:
    """Load, validate, print."""
    import yaml
    from pydantic import BaseModel, ConfigDict, Field
    from rich.console import Console
    from rich.table import Table

    class Topology(BaseModel):
        model_config = ConfigDict(extra="allow", frozen=True)
        name: str = Field(description="deployment name")

    with open(path, encoding="utf-8") as f:
        topo = Topology.model_validate(yaml.safe_load(f))
    table = Table("field", "value", title=topo.name)
    table.add_row("name", topo.name)
    Console(highlight=False, markup=False, emoji=False).print(table)


def main() -> None:
    """argparse or typer, then `floor`."""
    if "--typer" in sys.argv:
        import typer

        app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

        @app.command()
        def plan(file: str) -> None:
            floor(file)

        app(args=[a for a in sys.argv[1:] if a != "--typer"])
    else:
        import argparse

        parser = argparse.ArgumentParser()
        parser.add_argument("file")
        floor(parser.parse_args().file)


if __name__ == "__main__":
    main()
