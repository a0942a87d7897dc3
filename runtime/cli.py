"""The ``llm-serving`` command line: each command parses options and hands off to one function."""

from __future__ import annotations

import typer

from runtime.constraints import default_num_threads, engine_version

app = typer.Typer(
    name="llm-serving",
    help="Build, publish, plan and operate the llm-serving platform.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Keep ``app`` a command group even while it has a single command."""


@app.command()
def version() -> None:
    """Print the package version and the native engine's build and thread count."""
    from importlib.metadata import version as dist_version

    typer.echo(
        f"llm-serving {dist_version('llm-serving')} "
        f"(engine {engine_version}, {default_num_threads()} threads)"
    )


@app.command()
def plan(
    stack: str = typer.Option(..., "--stack", "-s", help="Stack name, e.g. prod-us-east-1."),
    out: str | None = typer.Option(None, "--out", help="Folder for the Kubernetes YAML."),
    against: str | None = typer.Option(None, "--against", help="Git revision to diff with."),
) -> None:
    """Plan a stack offline: resource tree, Kubernetes YAML, validation, diff to a revision."""
    from pathlib import Path

    # Imported here: the serving image has no Pulumi, and the other commands must still run.
    try:
        from stacks.plan import PlanError, run_plan
    except ImportError as exc:
        typer.secho(
            f"error: plan needs the deploy extra (pip install 'llm-serving[deploy]'): {exc}",
            fg=typer.colors.RED,
            err=True,
        )
        raise typer.Exit(1) from exc

    try:
        run_plan(stack, Path(out) if out is not None else None, against, echo=typer.echo)
    except PlanError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from exc


def main() -> None:
    """Run the CLI (``python -m runtime.cli``)."""
    app()


if __name__ == "__main__":
    main()
