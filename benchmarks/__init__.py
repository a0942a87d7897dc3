"""Runnable benchmarks, each ``python -m benchmarks.<name>`` printing a table.

Every benchmark takes ``--json PATH`` (flat rows with an ``impl`` key and unit-suffixed
fields) and ``--quick``; ratios between implementations come from the same run.
"""

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["write_rows"]


def write_rows(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """``--json PATH``: the rows as one JSON list, the folder made if missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(list(rows), indent=2) + "\n")
