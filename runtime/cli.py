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


# --- versions of Versioned models (issue 8) ---
from pathlib import Path  # noqa: E402  (kept in this hunk so branches merge cleanly)
from typing import Annotated  # noqa: E402

versions_app = typer.Typer(help="Manage the versions of Versioned models.", no_args_is_help=True)
app.add_typer(versions_app, name="versions")


@versions_app.command("gc")
def versions_gc(
    stack: Annotated[str, typer.Option(help="Stack name: edits stacks/Pulumi.<stack>.yaml.")],
    prometheus: Annotated[str, typer.Option(help="Prometheus base URL with the serving metrics.")],
    idle: Annotated[
        str, typer.Option(help="Window without requests that makes a version idle.")
    ] = "24h",
    apply: Annotated[bool, typer.Option("--apply", help="Edit the stack file.")] = False,
    stacks_dir: Annotated[Path, typer.Option(help="Folder of the stack files.")] = Path("stacks"),
) -> None:
    """List, then with --apply remove, Versioned model versions idle for the whole window."""
    from runtime.versions_gc import GcError, format_decisions, run_gc

    try:
        decisions = run_gc(stack, prometheus, idle, apply=apply, stacks_dir=stacks_dir)
    except GcError as error:
        typer.secho(str(error), fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from error
    typer.echo(format_decisions(decisions, applied=apply))


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


@app.command("metrics-proxy")
def metrics_proxy() -> None:
    """Serve Triton's and vLLM's metrics as one /metrics (env: METRICS_PROXY_*, LLM_SERVING_*)."""
    from runtime.metrics_proxy.server import run_from_env

    raise typer.Exit(run_from_env())


def main() -> None:
    """Run the CLI (``python -m runtime.cli``)."""
    app()


if __name__ == "__main__":
    main()
