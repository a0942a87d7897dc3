"""JSON schemas that structured-output tests ask a random tiny model to fill."""

from __future__ import annotations

__all__ = ["FILM"]

#: Nested and strict, with every string, number and array bounded, as a schema must be for a
#: model that never chooses to close a string by itself.
FILM = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 16},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
        "tags": {"type": "array", "items": {"enum": ["drama", "comedy"]}, "maxItems": 3},
        "cast": {
            "type": "array",
            "maxItems": 2,
            "items": {
                "type": "object",
                "properties": {
                    "actor": {"type": "string", "maxLength": 12},
                    "lead": {"type": "boolean"},
                },
                "required": ["actor", "lead"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["title", "year", "tags", "cast"],
    "additionalProperties": False,
}
