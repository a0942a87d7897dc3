"""The committed type stubs of the native modules (``*.pyi``) match the built extensions.

pybind11 functions carry no inspectable signature, only a first docstring line such as
``fill(self: Engine, bitmask: Buffer, wait: bool = True) -> None``; these tests parse that line
and the stub with ``ast`` and compare names, parameters and defaults, so that a binding changed
without its stub fails here instead of misleading mypy.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = [
    "runtime.constraints._engine",
]


def _parameters(function: ast.FunctionDef) -> list[tuple[str, bool]]:
    """(name, has a default) for each parameter, ``self`` and ``cls`` left out."""
    args = function.args
    positional = [*args.posonlyargs, *args.args]
    defaults = [False] * (len(positional) - len(args.defaults)) + [True] * len(args.defaults)
    named = list(zip((a.arg for a in positional), defaults, strict=True))
    named += [
        (a.arg, d is not None) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
    ]
    return [(name, default) for name, default in named if name not in ("self", "cls")]


def _stub(module: str) -> dict[str, Any]:
    """Top-level names of a stub: functions as FunctionDef, classes as {member: node}."""
    tree = ast.parse((ROOT / (module.replace(".", "/") + ".pyi")).read_text())
    names: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = {
                n.name: n for n in node.body if isinstance(n, ast.FunctionDef | ast.AnnAssign)
            }
        elif isinstance(node, ast.FunctionDef):
            names[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
    return {k: v for k, v in names.items() if not k.startswith("_") or k == "__version__"}


def _runtime_signature(obj: Any) -> ast.FunctionDef:
    first = (obj.__doc__ or "").strip().splitlines()[0]
    tree = ast.parse(f"def {first}: ...")
    function = tree.body[0]
    assert isinstance(function, ast.FunctionDef)
    return function


def _public(obj: Any) -> set[str]:
    own = set(vars(obj))
    return {n for n in own if not n.startswith("_") or n in ("__init__", "__version__")}


@pytest.mark.parametrize("module", MODULES)
def test_stub_names_every_public_name_of_the_module(module: str) -> None:
    native = importlib.import_module(module)
    stub = _stub(module)
    assert _public(native) - {"__init__"} == set(stub)
    for name, members in stub.items():
        if isinstance(members, dict):
            cls = getattr(native, name)
            if issubclass(cls, BaseException):
                continue
            # pybind11 gives a class without a bound constructor an __init__ that raises.
            bound = _public(cls) - ({"__init__"} if "__init__" not in members else set())
            assert bound == set(members), name


@pytest.mark.parametrize("module", MODULES)
def test_stub_signatures_match_the_bindings(module: str) -> None:
    native = importlib.import_module(module)
    checked = 0
    for name, node in _stub(module).items():
        targets: list[tuple[str, Any, Any]] = []
        if isinstance(node, ast.FunctionDef):
            targets.append((name, getattr(native, name), node))
        elif isinstance(node, dict):
            cls = getattr(native, name)
            for member, member_node in node.items():
                if isinstance(member_node, ast.FunctionDef) and not _is_property(member_node):
                    targets.append(
                        (f"{name}.{member}", inspect.getattr_static(cls, member), member_node)
                    )
        for label, obj, stub_node in targets:
            if isinstance(obj, staticmethod):
                obj = obj.__func__
            runtime = _runtime_signature(obj)
            assert _parameters(stub_node) == _parameters(runtime), label
            checked += 1
    assert checked > 0


def _is_property(node: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list)
