"""The CEL rules (``x-kubernetes-validations``) of CRD schemas, evaluated as the API server
evaluates them when an object is created, with cel-python (``celpy``) as the CEL evaluator.

What the API server does, and so what this does:

- A rule runs at the schema node that declares it, with ``self`` bound to the value there; a
  node whose value is absent (or null) runs none of its rules.
- The request body is defaulted from the schema before it is validated: each absent property
  with a ``default`` gets it (nested defaults included), and nulls of non-nullable properties
  without one are dropped. Rules of the pinned Gateway API CRDs rely on it (``self.kind``,
  ``self[0].matches`` are absent until defaulted), so defaults are applied, on a copy.
- ``self`` is typed by the schema: an object with ``properties`` exposes only the declared
  ones, under their escaped CEL names (``namespace`` is ``__namespace__``, ``a-b`` is
  ``a__dash__b``; names that cannot be escaped are not visible); a map
  (``additionalProperties``) keeps its keys; ``integer`` is int, ``number`` double,
  ``x-kubernetes-int-or-string`` either; strings of format ``date``/``date-time`` are
  timestamps, ``duration`` durations, ``byte`` bytes; an untyped or unstructured value is
  converted as JSON. At the root only ``metadata.name`` and ``metadata.generateName`` are
  visible.
- A rule that references ``oldSelf`` is a transition rule: it does not run on create. It is
  skipped and counted (:attr:`Outcome.transition_skipped`).
- Failures report ``messageExpression``'s value, else ``message``, else ``failed rule: <rule>``.

Known differences from the API server's cel-go: cel-python does not type-check a rule against
the schema (the API server did, when it accepted these CRDs), has no cost limits, and
``has(a.b.c)`` is false rather than an error when ``a.b`` is absent (the pinned rules test the
parents of their ``has()`` chains first).

Kubernetes adds libraries to standard CEL (strings, lists, regex, URLs, IPs, quantities,
``format``). Only the functions that the pinned CRDs' rules call are implemented here, on top
of cel-python's standard ones: :data:`KUBERNETES_FUNCTIONS` (``split``, from the strings
library). Nothing is skipped silently: a rule that does not parse, calls a function that is
neither standard nor implemented here, sets ``optionalOldSelf``, or sits where this walk never
looks (under ``allOf``/``anyOf``/``oneOf``/``not``) is listed in :attr:`CrdRules.problems`; a
rule that errors while it runs is a :class:`Violation` (``error=True``) naming the CRD, the
schema path and the rule.
"""

from __future__ import annotations

import base64
import copy
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import celpy
import celpy.celtypes as ct
import lark
import yaml
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError, base_functions

__all__ = ["KUBERNETES_FUNCTIONS", "CrdRules", "Outcome", "Rule", "Violation", "escape"]

# The reserved words that Kubernetes escapes as ``__<word>__`` (k8s.io/apiserver/pkg/cel).
_RESERVED = frozenset(
    {"true", "false", "null", "in", "as", "break", "const", "continue", "else", "for"}
    | {"function", "if", "import", "let", "loop", "package", "namespace", "return", "var"}
    | {"void", "while"}
)
_EXPAND = re.compile(r"(__|[-./]|[^a-zA-Z0-9\-./_])")
_ESCAPES = {"__": "__underscores__", ".": "__dot__", "-": "__dash__", "/": "__slash__"}
_MACROS = frozenset({"has", "all", "exists", "exists_one", "map", "filter"})
_COMBINATORS = ("allOf", "anyOf", "oneOf", "not")


def escape(name: str) -> str | None:
    """A property name as CEL sees it (Kubernetes' rules), or ``None`` where it has none."""
    if not name or "0" <= name[0] <= "9":
        return None
    if name in _RESERVED:
        return f"__{name}__"
    unescapable = False

    def expand(match: re.Match[str]) -> str:
        nonlocal unescapable
        unescapable |= match.group(0) not in _ESCAPES
        return _ESCAPES.get(match.group(0), "")

    escaped = _EXPAND.sub(expand, name)
    return None if unescapable else escaped


def _split(text: Any, separator: Any, limit: Any = None) -> ct.ListType:
    """``<string>.split(<string>[, <int>])`` of Kubernetes' strings library: Go's
    ``strings.SplitN`` (a negative or no limit splits at every separator, 0 gives no parts, an
    empty separator splits between characters)."""
    if not isinstance(text, str) or not isinstance(separator, str):
        raise TypeError(f"split({type(text).__name__}, {type(separator).__name__})")
    n = -1 if limit is None else int(limit)
    if n == 0:
        parts: list[str] = []
    elif separator == "":
        chars = list(text)
        parts = chars if n < 0 or n >= len(chars) else [*chars[: n - 1], "".join(chars[n - 1 :])]
    else:
        parts = text.split(separator) if n < 0 else text.split(separator, n - 1)
    return ct.ListType([ct.StringType(p) for p in parts])


#: The Kubernetes CEL library functions implemented on top of cel-python: the ones that the
#: rules of the pinned CRDs call. Add one here when a pinned CRD's rule needs it.
KUBERNETES_FUNCTIONS: dict[str, Callable[..., Any]] = {"split": _split}


@dataclass(frozen=True)
class Rule:
    """One ``x-kubernetes-validations`` entry, where it is declared."""

    crd: str
    """The CRD and served version, ``httproutes.gateway.networking.k8s.io/v1``."""
    schema_path: str
    """The declaring node in the schema, ``.spec.rules[].matches[].path`` (``[]`` an array's
    items, ``{}`` a map's values)."""
    rule: str
    """The CEL expression, ``self`` bound to the value at :attr:`schema_path`."""
    message: str | None = None
    message_expression: str | None = None
    """A CEL expression giving the message (it wins over :attr:`message`)."""
    field_path: str | None = None
    """Where below the declaring node a failure is reported (``fieldPath``)."""
    transition: bool = False
    """Whether the rule references ``oldSelf`` (does not run on create)."""

    def __str__(self) -> str:
        return f"{self.crd} {self.schema_path or '(root)'}: {self.rule}"


@dataclass(frozen=True)
class Violation:
    """A rule that returned false, or that could not run (``error``), at one value."""

    rule: Rule
    path: str
    """Where in the object, ``spec.rules[0].matches[0].path``."""
    message: str
    error: bool = False

    def __str__(self) -> str:
        what = "cannot evaluate" if self.error else "violates"
        return f"{self.path or '(root)'}: {self.message} ({what} rule of {self.rule})"


@dataclass
class Outcome:
    """What validating one object did."""

    violations: list[Violation] = field(default_factory=list)
    evaluated: list[Rule] = field(default_factory=list)
    """One entry per evaluation (a rule on an array's items runs once per item)."""
    transition_skipped: list[Rule] = field(default_factory=list)


@dataclass(frozen=True)
class _Version:
    crd: str
    schema: dict[str, Any]


class CrdRules:
    """The served versions of the CRDs in a folder, with their rules compiled once."""

    def __init__(self, folder: Path) -> None:
        self._env = celpy.Environment()
        self._programs: dict[str, celpy.Runner] = {}
        self._failures: dict[str, str] = {}
        self._variables: dict[str, set[str]] = {}
        self.versions: dict[tuple[str, str], _Version] = {}
        """``(apiVersion, kind)`` to the CRD name and the version's ``openAPIV3Schema``."""
        self.rules: dict[tuple[str, str], list[Rule]] = {}
        """``(apiVersion, kind)`` to every rule of that version's schema."""
        self._at: dict[tuple[str, str], dict[tuple[str, str], Rule]] = {}
        self.problems: list[str] = []
        """Rules that cannot be evaluated here, each naming the CRD, the path and the rule."""
        for path in sorted(folder.glob("*.yaml")):
            for crd in yaml.safe_load_all(path.read_text()):
                if crd and crd.get("kind") == "CustomResourceDefinition":
                    self._load(crd)

    def _load(self, crd: dict[str, Any]) -> None:
        spec = crd["spec"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
            name = f"{crd['metadata']['name']}/{version['name']}"
            schema = version["schema"]["openAPIV3Schema"]
            self.versions[key] = _Version(name, schema)
            rules = [self._rule(name, p, r) for p, node in _nodes(schema, "") for r in _rules(node)]
            self.rules[key] = rules
            self._at[key] = {(r.schema_path, r.rule): r for r in rules}
            everywhere = _count_rules_anywhere(schema)
            if everywhere != len(rules):
                self.problems.append(
                    f"{name}: {everywhere - len(rules)} rules sit under "
                    f"{'/'.join(_COMBINATORS)}, where they are not evaluated"
                )

    def _rule(self, crd: str, schema_path: str, entry: dict[str, Any]) -> Rule:
        rule = Rule(
            crd,
            schema_path,
            entry["rule"],
            message=entry.get("message"),
            message_expression=entry.get("messageExpression"),
            field_path=entry.get("fieldPath"),
        )
        variables: set[str] = set()
        for expression in filter(None, (rule.rule, rule.message_expression)):
            if reason := self._compile(expression):
                self.problems.append(f"{rule}: {reason}")
            variables |= self._variables.get(expression, set())
        if entry.get("optionalOldSelf"):
            self.problems.append(f"{rule}: optionalOldSelf rules run on create; not supported")
        return replace(rule, transition="oldSelf" in variables)

    def _compile(self, expression: str) -> str | None:
        """Compile once; the reason it cannot be evaluated here, if so."""
        if expression not in self._programs and expression not in self._failures:
            try:
                ast = self._env.compile(expression)
            except Exception as ex:
                self._failures[expression] = f"does not parse: {_short(ex)}"
                return self._failures[expression]
            variables, functions = _identifiers(ast)
            self._variables[expression] = variables
            known = set(base_functions) | _MACROS | set(KUBERNETES_FUNCTIONS)
            if unknown := sorted(functions - known):
                self._failures[expression] = f"calls {', '.join(unknown)}: not implemented here"
            else:
                self._programs[expression] = self._env.program(ast, functions=KUBERNETES_FUNCTIONS)
        return self._failures.get(expression)

    def validate(self, manifest: dict[str, Any]) -> Outcome:
        """Run every rule of the object's schema that applies on create."""
        key = (manifest["apiVersion"], manifest["kind"])
        version = self.versions[key]
        body = dict(manifest)
        meta = manifest.get("metadata") or {}
        body["metadata"] = {k: meta[k] for k in ("name", "generateName") if k in meta}
        body = default(copy.deepcopy(body), version.schema)
        outcome = Outcome()
        for path, schema_path, value, schema in _walk(body, version.schema, "", ""):
            for entry in schema.get("x-kubernetes-validations") or ():
                rule = self._at[key][schema_path, entry["rule"]]
                if rule.transition:
                    outcome.transition_skipped.append(rule)
                    continue
                outcome.evaluated.append(rule)
                if violation := self._evaluate(rule, path, value, schema):
                    outcome.violations.append(violation)
        return outcome

    def _evaluate(self, rule: Rule, path: str, value: Any, schema: Any) -> Violation | None:
        where = f"{path}.{rule.field_path.lstrip('.')}" if rule.field_path else path
        program = self._programs.get(rule.rule)
        if program is None:
            return Violation(rule, where, "the rule could not be compiled", error=True)
        try:
            activation = {"self": to_cel(value, schema)}
            result = program.evaluate(activation)
        except Exception as ex:
            return Violation(rule, where, _short(ex), error=True)
        if result is True or (isinstance(result, ct.BoolType) and bool(result)):
            return None
        if not isinstance(result, ct.BoolType):
            return Violation(rule, where, f"returned {result!r}, not a bool", error=True)
        return Violation(rule, where, self._message(rule, activation))

    def _message(self, rule: Rule, activation: dict[str, Any]) -> str:
        expression = rule.message_expression
        if expression and expression in self._programs:
            try:
                text = self._programs[expression].evaluate(activation)
            except Exception:
                text = None
            if isinstance(text, str) and text.strip():
                return str(text)
        return rule.message or f"failed rule: {rule.rule}"


def _rules(node: dict[str, Any]) -> list[dict[str, Any]]:
    return list(node.get("x-kubernetes-validations") or ())


def _nodes(schema: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every structural node of a schema with its path (properties, items, map values)."""
    if not isinstance(schema, dict):
        return
    yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from _nodes(sub, f"{path}.{name}")
    yield from _nodes(schema.get("items"), f"{path}[]")
    yield from _nodes(schema.get("additionalProperties"), f"{path}{{}}")


def _count_rules_anywhere(schema: Any) -> int:
    """Rules anywhere in a schema, under ``allOf``/``anyOf``/``oneOf``/``not`` included."""
    if not isinstance(schema, dict):
        return 0
    subs = [
        *(schema.get("properties") or {}).values(),
        schema.get("items"),
        schema.get("additionalProperties"),
        schema.get("not"),
        *(sub for k in ("allOf", "anyOf", "oneOf") for sub in schema.get(k) or ()),
    ]
    own = len(schema.get("x-kubernetes-validations") or ())
    return own + sum(_count_rules_anywhere(sub) for sub in subs)


def _identifiers(ast: lark.Tree) -> tuple[set[str], set[str]]:
    """The variables and the functions (global or receiver-style) a parsed rule names."""
    variables: set[str] = set()
    functions: set[str] = set()
    for node in ast.iter_subtrees():
        tokens = [c for c in node.children if isinstance(c, lark.Token)]
        if node.data == "ident" and tokens:
            variables.add(tokens[0].value)
        elif node.data in ("ident_arg", "dot_ident_arg", "member_dot_arg") and tokens:
            functions.add(tokens[0].value)
    return variables, functions


def _walk(
    value: Any, schema: Any, path: str, schema_path: str
) -> Iterator[tuple[str, str, Any, dict[str, Any]]]:
    """Each present (non-null) value with its schema node, parents first."""
    if value is None or not isinstance(schema, dict):
        return
    yield path, schema_path, value, schema
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        for name, sub in properties.items():
            if name in value:
                child = f"{path}.{name}" if path else name
                yield from _walk(value[name], sub, child, f"{schema_path}.{name}")
        values = schema.get("additionalProperties")
        if isinstance(values, dict):
            for name, item in value.items():
                if name not in properties:
                    yield from _walk(item, values, f"{path}[{name!r}]", f"{schema_path}{{}}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _walk(item, schema.get("items"), f"{path}[{i}]", f"{schema_path}[]")


def default(value: Any, schema: Any) -> Any:
    """Kubernetes' structural defaulting, in place: absent properties (and nulls of
    non-nullable ones) take the schema's ``default``, then defaulting recurses into them;
    nulls of non-nullable properties without a default are dropped."""
    if not isinstance(schema, dict):
        return value
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        for name, sub in properties.items():
            missing = name not in value or (value[name] is None and not sub.get("nullable"))
            if missing and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            elif name in value and value[name] is None and not sub.get("nullable"):
                del value[name]
            if name in value:
                default(value[name], sub)
        values = schema.get("additionalProperties")
        if isinstance(values, dict):
            for name, item in value.items():
                if name not in properties:
                    default(item, values)
    elif isinstance(value, list):
        for item in value:
            default(item, schema.get("items"))
    return value


def to_cel(value: Any, schema: Any) -> Any:
    """A JSON value as the CEL value Kubernetes binds for that schema node (see the module)."""
    if value is None or not isinstance(schema, dict):
        return json_to_cel(value)
    kind = schema.get("type")
    if schema.get("x-kubernetes-int-or-string") or kind not in ("object", "array", "string"):
        if kind == "number" and isinstance(value, int | float) and not isinstance(value, bool):
            return ct.DoubleType(value)
        return json_to_cel(value)
    if kind == "object" and isinstance(value, dict):
        properties = schema.get("properties")
        if properties is not None:
            visible = {}
            for name, item in value.items():
                cel_name = escape(name) if name in properties else None
                if cel_name is not None:
                    visible[ct.StringType(cel_name)] = to_cel(item, properties[name])
            return ct.MapType(visible)
        values = schema.get("additionalProperties")
        if isinstance(values, dict):
            return ct.MapType({ct.StringType(k): to_cel(v, values) for k, v in value.items()})
        return json_to_cel(value)
    if kind == "array" and isinstance(value, list):
        return ct.ListType([to_cel(item, schema.get("items")) for item in value])
    if kind == "string" and isinstance(value, str):
        form = schema.get("format")
        if form == "byte":
            return ct.BytesType(base64.b64decode(value))
        if form == "date-time":
            return ct.TimestampType(value)
        if form == "date":
            return ct.TimestampType(f"{value}T00:00:00Z")
        if form == "duration":
            return ct.DurationType(value)
        return ct.StringType(value)
    return json_to_cel(value)


def _short(ex: BaseException) -> str:
    """An evaluator error in one line (cel-python's messages carry the whole activation)."""
    if isinstance(ex, CELEvalError) and ex.args:
        text = str(ex.args[0])
    else:
        text = f"{type(ex).__name__}: {ex}"
    return text.split(" (in activation")[0][:300]
