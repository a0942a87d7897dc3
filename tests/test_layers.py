"""Imports point one way: contracts <- components <- stacks; the serving image (``runtime``)
never reaches the deployment code or the operator tools; the policy pack reads only contracts.

The check reads every module's AST (imports inside functions included), so it needs none of the
packages' dependencies; it is run on a temporary tree too, to show that it fails on a bad import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OURS = frozenset({"contracts", "components", "stacks", "runtime", "operations", "policy"})
# For each package, the packages of ours it must never import.
FORBIDDEN: Mapping[str, frozenset[str]] = {
    "contracts": OURS - {"contracts"},
    "components": frozenset({"stacks", "runtime", "operations", "policy"}),
    "runtime": frozenset({"components", "stacks", "operations", "policy"}),
    "policy": OURS - {"policy", "contracts"},
    "stacks": frozenset({"runtime", "operations", "policy"}),
}


def _imported(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``(line, top-level package)`` of every absolute import in ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.partition(".")[0]


def violations(root: Path) -> list[str]:
    """``path:line: package imports other`` for every forbidden import under ``root``."""
    found = []
    for package, forbidden in FORBIDDEN.items():
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for line, target in _imported(tree):
                if target in forbidden:
                    where = path.relative_to(root)
                    found.append(f"{where}:{line}: {package} imports {target}")
    return found


def test_the_repository_imports_point_one_way() -> None:
    assert violations(ROOT) == []


def test_every_layer_is_checked() -> None:
    for package in FORBIDDEN:
        assert any((ROOT / package).rglob("*.py")), f"{package}/ has no modules to check"


def test_a_bad_import_is_reported(tmp_path: Path) -> None:
    for package in FORBIDDEN:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "components" / "bad.py").write_text(
        "import json\nfrom stacks.config import RegionStackConfig\n", encoding="utf-8"
    )
    (tmp_path / "runtime" / "deep.py").write_text(
        "def lazy() -> None:\n    import operations.publish\n", encoding="utf-8"
    )
    (tmp_path / "contracts" / "naming.py").write_text(
        "from components import gateway\n", encoding="utf-8"
    )
    (tmp_path / "stacks" / "fine.py").write_text(
        "from components.gateway import GatewayRef\nfrom contracts import labels\n",
        encoding="utf-8",
    )
    assert violations(tmp_path) == [
        "contracts/naming.py:1: contracts imports components",
        "components/bad.py:2: components imports stacks",
        "runtime/deep.py:2: runtime imports operations",
    ]
