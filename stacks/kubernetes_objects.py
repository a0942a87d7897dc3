"""The Kubernetes objects of a planned stack: each as the manifest the provider would apply,
written as YAML for review, and validated offline (built-ins strictly against the Kubernetes
schema of the cluster's version, custom resources by shape)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from stacks import mock_engine
from stacks.mock_engine import ProgramRun, RecordedResource

__all__ = [
    "DEFAULT_KUBERNETES_VERSION",
    "KubernetesSchemaError",
    "Validation",
    "kubernetes_objects",
    "manifest_yaml",
    "validate_object",
    "write_objects",
]

DEFAULT_KUBERNETES_VERSION = "1.33"
_NOT_OBJECTS = ("kubernetes:helm.sh/", "pulumi:providers:")


class KubernetesSchemaError(ValueError):
    """No Kubernetes schema fits the cluster's version."""


@dataclass(frozen=True)
class Validation:
    """How one Kubernetes object was checked."""

    path: Path
    kind: str
    schema: bool
    """``True``: validated strictly against the Kubernetes schema; ``False``: a custom
    resource, whose CRD schema is not available offline, checked for apiVersion/kind/metadata."""
    error: str | None


def kubernetes_objects(run: ProgramRun) -> Iterator[tuple[RecordedResource, dict[str, Any]]]:
    """Every Kubernetes object the run declared, as the manifest the provider would apply."""
    for resource in run.resources:
        if not resource.type.startswith("kubernetes:") or resource.type.startswith(_NOT_OBJECTS):
            continue
        head = ("apiVersion", "kind", "metadata")
        manifest = {k: resource.inputs[k] for k in head if k in resource.inputs}
        metadata = manifest.get("metadata")
        if isinstance(metadata, dict) and "name" not in metadata:
            manifest["metadata"] = {**metadata, "name": mock_engine.auto_name(resource.name)}
        manifest.update({k: v for k, v in resource.inputs.items() if k not in {*head, "status"}})
        yield resource, manifest


class _ManifestDumper(yaml.SafeDumper):
    """Writes multi-line strings (job scripts, dashboards) as literal blocks, for review."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_ManifestDumper.add_representer(str, _represent_str)

#: An object's identity first, as kubectl prints it; every other key sorted.
_HEAD = ("apiVersion", "kind", "metadata")


def _sorted(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted(item) for item in value]
    return value


def manifest_yaml(manifest: Mapping[str, Any]) -> str:
    """``manifest`` as review-ready YAML whose bytes depend on its content alone.

    The engine hands inputs over as protobuf maps, whose key order differs between runs;
    sorting the keys keeps a plan's files diffable from one run (or pull request) to the next.
    """
    head = [key for key in _HEAD if key in manifest]
    ordered = {key: _sorted(manifest[key]) for key in head}
    ordered.update((key, _sorted(manifest[key])) for key in sorted(manifest) if key not in head)
    return yaml.dump(ordered, Dumper=_ManifestDumper, sort_keys=False)


@cache
def _schema_version(version: str) -> str:
    """The newest schema kubernetes-validate ships that is not newer than the cluster."""
    import kubernetes_validate.utils as kv

    def key(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in text.split(".")[:2])

    usable = [v for v in kv.all_versions() if key(v) <= key(version)]
    if not usable:
        raise KubernetesSchemaError(f"no Kubernetes schema for version {version} or older")
    return max(usable, key=key)


@cache
def _validator(kind: str, api_version: str, version: str) -> Any:
    """A strict schema validator for one built-in kind, or ``None`` for a custom resource."""
    import jsonschema
    import kubernetes_validate.utils as kv
    from referencing import Registry, Resource

    group = api_version.split("/")[0].split(".")[0] + "-" if "/" in api_version else ""
    directory = f"kubernetes-json-schema/v{_schema_version(version)}-local-strict"
    name = f"{directory}/{kind.lower()}-{group}{api_version.split('/')[-1]}.json"
    try:
        schema = kv.schema_contents(name, version)
    except FileNotFoundError:
        return None
    definitions = kv.schema_contents(f"{directory}/_definitions.json", version)
    registry = Resource.from_contents(schema) @ Registry()
    registry = Resource.from_contents(definitions) @ registry
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def validate_object(
    manifest: Mapping[str, Any], version: str = DEFAULT_KUBERNETES_VERSION
) -> tuple[bool, str | None]:
    """Check one object: ``(has_schema, error)``; built-ins strictly, custom resources by shape."""
    api_version, kind = manifest.get("apiVersion"), manifest.get("kind")
    metadata = manifest.get("metadata")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return False, "apiVersion and kind must be strings"
    validator = _validator(kind, api_version, version)
    if validator is None:
        if not isinstance(metadata, Mapping) or not metadata.get("name"):
            return False, "metadata.name is missing"
        if "/" not in api_version:
            return False, f"custom resource apiVersion {api_version!r} has no group"
        return False, None
    errors = sorted(validator.iter_errors(dict(manifest)), key=lambda e: list(e.path))
    if errors:
        where = ".".join(str(p) for p in errors[0].path) or "(root)"
        return True, f"{where}: {errors[0].message}"
    return True, None


def write_objects(run: ProgramRun, out: Path, version: str) -> list[Validation]:
    """Write each object of ``run`` as YAML under ``out/<namespace>/`` and validate it."""
    validations = []
    for resource, manifest in kubernetes_objects(run):
        metadata = manifest.get("metadata") or {}
        folder = out / str(metadata.get("namespace") or "_cluster")
        folder.mkdir(parents=True, exist_ok=True)
        name = metadata.get("name") or resource.name
        path = folder / f"{str(manifest.get('kind', 'object')).lower()}-{name}.yaml"
        path.write_text(manifest_yaml(manifest))
        schema, error = validate_object(manifest, version)
        validations.append(Validation(path, str(manifest.get("kind")), schema, error))
    return validations
