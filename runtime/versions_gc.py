"""``llm-serving versions gc``: retire Versioned model versions that served no requests.

The decision (:func:`decide`) is a pure function of the stack's models and the request counts
Prometheus reports for the idle window; :func:`run_gc` queries Prometheus and, with
``apply=True``, removes the chosen versions from ``stacks/Pulumi.<stack>.yaml`` in place,
keeping its comments and key order.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
from ruamel.yaml import YAML

__all__ = [
    "MODELS_KEY",
    "GcDecision",
    "GcError",
    "ModelVersions",
    "decide",
    "format_decisions",
    "models_from_config",
    "parse_idle",
    "requests_query",
    "run_gc",
]

MODELS_KEY = "llm-serving:models"
_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}

VersionKey = tuple[str, str]


class GcError(Exception):
    """The gc cannot run: bad option, unreadable stack file, or Prometheus unreachable."""


@dataclass(frozen=True)
class ModelVersions:
    """What the decision needs of one configured model."""

    model_id: str
    strategy: str
    versions: tuple[str, ...]
    """Listed versions, oldest first."""
    route_weights: Mapping[str, int | None]
    """``route_weight`` by version (``None`` when unset)."""


@dataclass(frozen=True)
class GcDecision:
    """The verdict on one version of a Versioned model."""

    model_id: str
    version: str
    remove: bool
    reason: str


def parse_idle(value: str) -> tuple[str, timedelta]:
    """``24h`` → (the PromQL range ``24h``, its timedelta); units s, m, h, d, w."""
    match = _DURATION.match(value.strip())
    if not match or int(match.group(1)) == 0:
        raise GcError(f"--idle {value!r} is not a duration like 24h, 90m or 7d (units s m h d w)")
    amount, unit = int(match.group(1)), match.group(2)
    return f"{amount}{unit}", timedelta(**{_UNITS[unit]: amount})


def decide(
    models: Sequence[ModelVersions], requests: Mapping[VersionKey, float], idle: str
) -> list[GcDecision]:
    """Which versions to remove: Versioned ones with no request in the window, never the newest
    listed version and never one that still has a route weight. Red-Black models are skipped."""
    decisions = []
    for model in models:
        if model.strategy != "versioned":
            continue
        newest = model.versions[-1] if model.versions else None
        for version in model.versions:
            served = requests.get((model.model_id, version), 0.0)
            weight = model.route_weights.get(version)
            if version == newest:
                remove, reason = False, "newest version"
            elif weight is not None:
                remove, reason = False, f"route_weight {weight}"
            elif served > 0:
                remove, reason = False, f"{served:.0f} requests in {idle}"
            else:
                remove, reason = True, f"no requests in {idle}"
            decisions.append(GcDecision(model.model_id, version, remove, reason))
    return decisions


def models_from_config(models: Any, source: Path) -> list[ModelVersions]:
    """Read ``llm-serving:models`` (contract 6 shape) into :class:`ModelVersions`."""
    if not isinstance(models, list):
        raise GcError(f"{source}: {MODELS_KEY} must be a list of models")
    found = []
    for index, model in enumerate(models):
        versions = model.get("versions") if isinstance(model, Mapping) else None
        if not isinstance(versions, list) or not model.get("id"):
            raise GcError(f"{source}: {MODELS_KEY}[{index}] needs an id and a versions list")
        names = tuple(str(v["version"]) for v in versions)
        found.append(
            ModelVersions(
                model_id=str(model["id"]),
                strategy=str(model.get("strategy", "red-black")),
                versions=names,
                route_weights={str(v["version"]): v.get("route_weight") for v in versions},
            )
        )
    return found


def requests_query(model_ids: Sequence[str], window: str) -> str:
    """PromQL: requests (successes and failures) per model version over ``window``."""
    # Regex escapes must survive PromQL's own string escaping, hence the doubled backslashes.
    ids = "|".join(re.escape(m).replace("\\", "\\\\") for m in sorted(model_ids))
    selector = (
        '{__name__=~"nv_inference_request_success|nv_inference_request_failure", '
        f'model_id=~"{ids}"}}'
    )
    return f"sum by (model_id, model_version) (increase({selector}[{window}]))"


def _query_requests(url: str, query: str, at: float) -> dict[VersionKey, float]:
    try:
        response = httpx.get(
            f"{url.rstrip('/')}/api/v1/query", params={"query": query, "time": at}, timeout=30
        )
        body = response.json()
    except (httpx.HTTPError, ValueError) as error:
        raise GcError(f"cannot query Prometheus at {url}: {error}") from error
    if body.get("status") != "success":
        raise GcError(f"Prometheus at {url} rejected the query: {body.get('error')}")
    return {
        (s["metric"].get("model_id", ""), s["metric"].get("model_version", "")): float(
            s["value"][1]
        )
        for s in body["data"]["result"]
    }


def _yaml() -> YAML:
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    return yaml


def _write_atomically(path: Path, document: Any) -> None:
    # Write beside the target and rename, so a crash never leaves half a stack file.
    with tempfile.NamedTemporaryFile(
        "w", dir=path.parent, prefix=f".{path.name}.", delete=False, encoding="utf-8"
    ) as handle:
        _yaml().dump(document, handle)
    os.replace(handle.name, path)


def run_gc(
    stack: str,
    prometheus_url: str,
    idle: str,
    *,
    apply: bool = False,
    stacks_dir: Path = Path("stacks"),
    now: float | None = None,
) -> list[GcDecision]:
    """Decide for every Versioned model of ``stack``; with ``apply``, edit its stack file."""
    window, _ = parse_idle(idle)
    path = stacks_dir / f"Pulumi.{stack}.yaml"
    try:
        document = _yaml().load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise GcError(f"stack file {path} not found; check --stack and --stacks-dir") from error
    config = (document or {}).get("config") or {}
    if MODELS_KEY not in config:
        raise GcError(f"{path}: config has no {MODELS_KEY}")
    models = models_from_config(config[MODELS_KEY], path)
    versioned = [m.model_id for m in models if m.strategy == "versioned"]
    requests = (
        _query_requests(prometheus_url, requests_query(versioned, window), now or time.time())
        if versioned
        else {}
    )
    decisions = decide(models, requests, window)
    doomed = {(d.model_id, d.version) for d in decisions if d.remove}
    if apply and doomed:
        for model in config[MODELS_KEY]:
            versions = model["versions"]
            for index in reversed(range(len(versions))):
                if (str(model["id"]), str(versions[index]["version"])) in doomed:
                    del versions[index]
        _write_atomically(path, document)
    return decisions


def format_decisions(decisions: Sequence[GcDecision], applied: bool) -> str:
    """A plain table of the verdicts and a last line saying what happened to the stack file."""
    if not decisions:
        return "no Versioned models in this stack"
    width = max(len(f"{d.model_id} {d.version}") for d in decisions)
    lines = [
        f"{f'{d.model_id} {d.version}':<{width}}  {'remove' if d.remove else 'keep':<6}  {d.reason}"
        for d in decisions
    ]
    removed = sum(d.remove for d in decisions)
    if not removed:
        lines.append("nothing to remove")
    elif applied:
        lines.append(f"removed {removed} version(s) from the stack configuration")
    else:
        lines.append(f"{removed} version(s) would be removed; rerun with --apply to edit the stack")
    return "\n".join(lines)
