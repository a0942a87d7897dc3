"""The serving image's commands of ``llm-serving`` (package, metrics proxy, version): each parses
options and hands off to one function. ``operations.cli`` adds the operator's commands to these
and is the installed ``llm-serving``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from runtime.constraints import default_num_threads, engine_version

app = typer.Typer(
    name="llm-serving",
    help="Build and inspect model packages, serve metrics, report the engine.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Build and inspect model packages, serve metrics, report the engine."""


@app.command()
def version() -> None:
    """Print the package version and the native engine's build and thread count."""
    from importlib.metadata import version as dist_version

    typer.echo(
        f"llm-serving {dist_version('llm-serving')} "
        f"(engine {engine_version}, {default_num_threads()} threads)"
    )


@app.command("metrics-proxy")
def metrics_proxy() -> None:
    """Serve Triton's and vLLM's metrics as one /metrics (env: METRICS_PROXY_*, LLM_SERVING_*)."""
    from runtime.metrics_proxy.server import run_from_env

    raise typer.Exit(run_from_env())


package_app = typer.Typer(help="Build, inspect and verify model packages.", no_args_is_help=True)
app.add_typer(package_app, name="package")


def _fail(exc: Exception) -> typer.Exit:
    typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
    return typer.Exit(1)


@package_app.command("build")
def package_build(
    source: Annotated[Path, typer.Argument(help="source tree with package.yaml")],
    out: Annotated[Path, typer.Option(help="new, empty version folder to write")],
    triton: Annotated[
        str | None, typer.Option(help="Triton release (default: the image's)")
    ] = None,
    constraints: Annotated[
        Path | None, typer.Option(help="extra pins, e.g. the image's constraints file")
    ] = None,
) -> None:
    """Check a model's source tree and write its version folder (manifest last)."""
    from runtime.compat import CompatError
    from runtime.package import PackageError, build_package

    try:
        manifest = build_package(source, out, triton=triton, constraints=constraints)
    except (PackageError, CompatError) as exc:
        raise _fail(exc) from exc
    typer.echo(
        f"built {manifest.model_id}/{manifest.model_version} in {out}: "
        f"{len(manifest.archive_files)} archive files, {len(manifest.weight_files)} weight files"
    )


@package_app.command("inspect")
def package_inspect(
    folder: Annotated[Path, typer.Argument(help="version folder or manifest.json")],
) -> None:
    """Print a version's manifest summary as JSON."""
    import json

    from runtime.package import PackageError, describe

    try:
        typer.echo(json.dumps(describe(folder), indent=2))
    except PackageError as exc:
        raise _fail(exc) from exc


@package_app.command("verify")
def package_verify(
    folder: Annotated[Path, typer.Argument(help="version folder")],
    quick: Annotated[
        bool,
        typer.Option(help="check sizes, not sha256 (archive members are checked all the same)"),
    ] = False,
    constraints: Annotated[Path | None, typer.Option(help="extra pins to check plugins")] = None,
    jobs: Annotated[
        int,
        typer.Option(
            min=1,
            help="files read and hashed at once (on FSx for Lustre, also loaded from S3 at once)",
        ),
    ] = 1,
) -> None:
    """Check every file's size and sha256, every archive member as the pod's unpack does, the
    plugins against the pins and python tensors."""
    from runtime.compat import CompatError
    from runtime.package import PackageError, verify_package

    try:
        manifest = verify_package(folder, full=not quick, constraints=constraints, jobs=jobs)
    except (PackageError, CompatError) as exc:
        raise _fail(exc) from exc
    typer.echo(f"ok: {manifest.model_id}/{manifest.model_version}")


def main() -> None:
    """Run the serving image's commands (``python -m runtime.cli``)."""
    app()


if __name__ == "__main__":
    main()
