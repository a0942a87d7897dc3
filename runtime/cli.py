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
