"""How the pod's programs, configured from the environment, name their variables: in the one
line a bad setting prints, and in ``--help``, both generated from the pydantic-settings model."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Sequence
from pathlib import Path

from pydantic import AliasChoices, ValidationError
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

__all__ = ["environment_help", "parse_command_line", "setting_errors", "variable_for"]


def variable_for(model: type[BaseSettings], field: str) -> str:
    """The environment variable (or variables, ``A or B``) that set ``field`` of ``model``."""
    info = model.model_fields.get(field)
    alias = info.validation_alias if info is not None else None
    if isinstance(alias, str):
        return alias
    if isinstance(alias, AliasChoices):
        return " or ".join(str(choice) for choice in alias.choices)
    return str(model.model_config.get("env_prefix", "")) + field.upper()


def setting_errors(model: type[BaseSettings], exc: ValidationError) -> str:
    """Every failed setting of ``exc`` on one line: the variable, what is wrong, the value."""
    problems = [
        f"{variable_for(model, str(error['loc'][0]))}: {error['msg']} (got {error['input']!r})"
        if error["loc"]
        else error["msg"]
        for error in exc.errors()
    ]
    return "; ".join(problems)


def _default(value: object) -> str:
    if value is PydanticUndefined:
        return "required"
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Path):
        return str(value)
    return repr(value) if isinstance(value, str) else str(value)


def environment_help(model: type[BaseSettings]) -> str:
    """The variables ``model`` reads, each with its default and its field's description."""
    lines = ["environment variables:"]
    for name, info in model.model_fields.items():
        default = _default(info.get_default(call_default_factory=True))
        lines.append(f"  {variable_for(model, name)} (default: {default})")
        if info.description:
            lines.extend(
                textwrap.wrap(
                    info.description, 96, initial_indent=" " * 6, subsequent_indent=" " * 6
                )
            )
    return "\n".join(lines)


def parse_command_line(
    prog: str, description: str, model: type[BaseSettings], argv: Sequence[str] | None = None
) -> None:
    """Take no arguments but ``--help`` (the description, then `environment_help`, exit 0); any
    other argument exits 2 with the usage line."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=textwrap.fill(description, 96),
        epilog=environment_help(model),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.parse_args(argv)
