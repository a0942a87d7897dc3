"""``llm-serving``, the installed command: the serving image's commands (``runtime.cli``) and the
operator's ones (publish, versions gc, plan). Each parses options and hands off to one function.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from runtime import cli as runtime_cli

__all__ = ["app", "main"]

app = typer.Typer(
    name="llm-serving",
    help="Build, publish, plan and operate the llm-serving platform.",
    no_args_is_help=True,
    add_completion=False,
)
# The image's commands, registered on this app as they are (not as a sub-group).
app.registered_commands += runtime_cli.app.registered_commands
app.registered_groups += runtime_cli.app.registered_groups


@app.callback()
def _root() -> None:
    """Build, publish, plan and operate the llm-serving platform."""


def _fail(exc: Exception) -> typer.Exit:
    typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
    return typer.Exit(1)


versions_app = typer.Typer(help="Manage the versions of Versioned models.", no_args_is_help=True)
app.add_typer(versions_app, name="versions")


@versions_app.command("gc")
def versions_gc(
    stack: Annotated[str, typer.Option(help="Stack name: edits stacks/Pulumi.<stack>.yaml.")],
    prometheus: Annotated[
        str,
        typer.Option(
            help="Base URL of the Prometheus of the stack's cluster (serving metrics and "
            "kube-state-metrics; gc stops if it watches nodes of another region)."
        ),
    ],
    idle: Annotated[
        str, typer.Option(help="Window without requests that makes a version idle.")
    ] = "24h",
    apply: Annotated[bool, typer.Option("--apply", help="Edit the stack file.")] = False,
    stacks_dir: Annotated[Path, typer.Option(help="Folder of the stack files.")] = Path("stacks"),
) -> None:
    """List, then with --apply remove, Versioned model versions idle for the whole window."""
    from operations.versions_gc import GcError, format_decisions, run_gc

    try:
        decisions = run_gc(stack, prometheus, idle, apply=apply, stacks_dir=stacks_dir)
    except GcError as error:
        typer.secho(str(error), fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from error
    typer.echo(format_decisions(decisions, applied=apply))


@app.command()
def plan(
    stack: str = typer.Option(..., "--stack", "-s", help="Stack name, e.g. prod-us-east-1."),
    out: str | None = typer.Option(None, "--out", help="Folder for the Kubernetes YAML."),
    against: str | None = typer.Option(None, "--against", help="Git revision to diff with."),
) -> None:
    """Plan a stack offline: resource tree, Kubernetes YAML, validation, diff to a revision."""
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


@app.command("publish")
def publish_command(
    folder: Annotated[Path, typer.Argument(help="built version folder (package build --out)")],
    bucket: Annotated[str, typer.Option(envvar="LLM_SERVING_MODEL_BUCKET", help="model bucket")],
    dry_run: Annotated[bool, typer.Option(help="print the plan, upload nothing")] = False,
    endpoint_url: Annotated[
        str | None, typer.Option(envvar="AWS_ENDPOINT_URL", help="S3 endpoint override")
    ] = None,
    region: Annotated[str | None, typer.Option(envvar="AWS_REGION", help="bucket region")] = None,
    workers: Annotated[int, typer.Option(min=1, help="parallel uploads")] = 8,
    part_size_mb: Annotated[int, typer.Option(min=5, help="multipart part size in MiB")] = 64,
    wait_replication: Annotated[
        bool,
        typer.Option(
            help="write the manifest once replication has copied every file (without: replica "
            "regions may see it early)"
        ),
    ] = True,
    replication_timeout: Annotated[
        float, typer.Option(min=0, help="seconds to wait for replication before giving up")
    ] = 3600,
) -> None:
    """Upload a version to s3://BUCKET/models/<id>/<version>/, manifest.json last, once
    replicated."""
    from operations.publish import PublishError, run_publish

    try:
        plan = run_publish(
            folder,
            bucket,
            endpoint_url=endpoint_url,
            region=region,
            dry_run=dry_run,
            workers=workers,
            part_size=part_size_mb << 20,
            wait_replication=wait_replication,
            replication_timeout=replication_timeout,
            echo=typer.echo,
        )
    except PublishError as exc:
        raise _fail(exc) from exc
    if not dry_run:
        typer.echo(f"published s3://{bucket}/{plan.manifest_key}")


def main() -> None:
    """Run the CLI (``python -m operations.cli``)."""
    app()


if __name__ == "__main__":
    main()
