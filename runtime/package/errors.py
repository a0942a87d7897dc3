"""The one exception type of model packaging, publishing and unpacking."""

from __future__ import annotations

from pydantic import ValidationError

__all__ = ["PackageError", "field_error"]


class PackageError(ValueError):
    """A package, its source tree or its archive is refused; the message names file and fix."""


def field_error(where: str, exc: ValidationError) -> PackageError:
    """The first of pydantic's errors in one line: ``{where}: field {path}: {message}``, or
    ``{where}: {message}`` for a check of the whole model."""
    first = exc.errors()[0]
    # pydantic prefixes what a validator raised; the message is ours and says what to change.
    message = first["msg"].removeprefix("Value error, ")
    if not first["loc"]:
        return PackageError(f"{where}: {message}")
    field = ".".join(str(p) for p in first["loc"])
    return PackageError(f"{where}: field {field}: {message}")
