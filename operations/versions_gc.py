"""``llm-serving versions gc``: retire Versioned model versions that served no requests.

The decision (:func:`decide`) is a pure function of the stack's models, the request counts
Prometheus reports for the idle window and which versions it watched for the whole window;
:func:`run_gc` first checks that Prometheus watched only nodes of the stack's region (every prod
stack lists the same model ids, so another region's counters would look like this one's), then
queries Prometheus and, with ``apply=True``, removes the chosen versions from
``stacks/Pulumi.<stack>.yaml``, deleting only their entries' lines (and the comment lines right
above each), so the layout and every other comment stay as they were.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import re
import stat
import tempfile
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

__all__ = [
    "COVERAGE_SLACK",
    "MODELS_KEY",
    "GcDecision",
    "GcError",
    "ModelVersions",
    "coverage_query",
    "decide",
    "format_decisions",
    "models_from_config",
    "nodes_query",
    "parse_idle",
    "region_of_provider_id",
    "requests_query",
    "run_gc",
]

MODELS_KEY = "llm-serving:models"
REGION_KEY = "aws:region"
# The serving metrics are scraped every 15-60 s: a version without a sample this close to both
# ends of the window was not watched for all of it (deployed since, scrape broken, other cluster).
COVERAGE_SLACK = "15m"
_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_COUNTERS = "nv_inference_request_success|nv_inference_request_failure"
# On EKS a node's providerID is aws:///<availability zone>/<instance id> (Fargate adds a segment).
# The region is the zone less its letter (us-east-1a) or its local or Wavelength zone part
# (us-east-1-bos-1a, us-east-1-wl1-bos-wlz-1).
_PROVIDER_ID = re.compile(r"^aws:///(?P<region>[a-z]{2}(?:-[a-z]+)+-\d+)(?:[a-z]|-[a-z0-9-]+)/")
_PASSWORD = re.compile(r"^([^:/?#]+://[^/?#@:]*:)[^/?#@]*@")

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
    created_at: Mapping[str, date | None] = field(default_factory=dict)
    """``created_at`` by version (``None`` when unset)."""


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
    models: Sequence[ModelVersions],
    requests: Mapping[VersionKey, float],
    covered: Collection[VersionKey],
    idle: str,
    *,
    window_start: datetime,
) -> list[GcDecision]:
    """Which versions to remove: Versioned ones that Prometheus watched for the whole window
    (``covered``) without a request, never the newest listed version, never one that still has
    a route weight and never one created after ``window_start``. Red-Black models are skipped."""
    # created_at is a day: the version may have been deployed in its last second.
    youngest_old_day = window_start.astimezone(UTC).date() - timedelta(days=1)
    decisions = []
    for model in models:
        if model.strategy != "versioned":
            continue
        newest = model.versions[-1] if model.versions else None
        for version in model.versions:
            key = (model.model_id, version)
            served = requests.get(key)
            weight = model.route_weights.get(version)
            created = model.created_at.get(version)
            if version == newest:
                remove, reason = False, "newest version"
            elif weight is not None:
                remove, reason = False, f"route_weight {weight}"
            elif created is not None and created > youngest_old_day:
                remove, reason = False, f"younger than the window (created {created})"
            elif served is not None and served > 0:
                remove, reason = False, f"{served:.0f} requests in {idle}"
            elif served is None or math.isnan(served) or key not in covered:
                # No series, a NaN or a series that starts or stops inside the window: unknown.
                remove, reason = False, "no data for the window"
            else:
                remove, reason = True, f"no requests in {idle}"
            decisions.append(GcDecision(model.model_id, version, remove, reason))
    return decisions


def _created_at(value: Any, where: str) -> date | None:
    if value is None or (isinstance(value, date) and not isinstance(value, datetime)):
        return value
    if isinstance(value, datetime):
        return value.date()
    try:
        return date.fromisoformat(str(value))
    except ValueError:
        raise GcError(f"{where}.created_at: {value!r} is not a date like 2026-11-02") from None


def models_from_config(models: Any, source: Path) -> list[ModelVersions]:
    """Read ``llm-serving:models`` (contract 6 shape) into :class:`ModelVersions`."""
    if not isinstance(models, list):
        raise GcError(f"{source}: {MODELS_KEY} must be a list of models")
    found = []
    for index, model in enumerate(models):
        versions = model.get("versions") if isinstance(model, Mapping) else None
        if not isinstance(versions, list) or not model.get("id"):
            raise GcError(f"{source}: {MODELS_KEY}[{index}] needs an id and a versions list")
        where = f"{source}: {MODELS_KEY}[{index}].versions"
        for number, entry in enumerate(versions):
            if not isinstance(entry, Mapping) or entry.get("version") is None:
                raise GcError(
                    f"{where}[{number}]: expected a mapping like {{version: v1}}, got {entry!r}"
                )
        names = tuple(str(v["version"]) for v in versions)
        found.append(
            ModelVersions(
                model_id=str(model["id"]),
                strategy=str(model.get("strategy", "red-black")),
                versions=names,
                route_weights={str(v["version"]): v.get("route_weight") for v in versions},
                created_at={
                    str(v["version"]): _created_at(v.get("created_at"), f"{where}[{n}]")
                    for n, v in enumerate(versions)
                },
            )
        )
    return found


def _selector(model_ids: Sequence[str]) -> str:
    # Regex escapes must survive PromQL's own string escaping, hence the doubled backslashes.
    ids = "|".join(re.escape(m).replace("\\", "\\\\") for m in sorted(model_ids))
    return f'{{__name__=~"{_COUNTERS}", model_id=~"{ids}"}}'


def requests_query(model_ids: Sequence[str], window: str) -> str:
    """PromQL: requests (successes and failures) per model version over ``window``."""
    return f"sum by (model_id, model_version) (increase({_selector(model_ids)}[{window}]))"


def coverage_query(model_ids: Sequence[str], window: str) -> str:
    """PromQL: the model versions with a request counter sample near both ends of ``window``."""
    selector, by = _selector(model_ids), "group by (model_id, model_version)"
    return (
        f"{by} (last_over_time({selector}[{COVERAGE_SLACK}] offset {window}))"
        f" and {by} (last_over_time({selector}[{COVERAGE_SLACK}]))"
    )


def nodes_query(window: str) -> str:
    """PromQL: the provider IDs of the nodes kube-state-metrics reported at any time in
    ``window``, so a Prometheus that watched another region's nodes during the window (whose
    request counters it then holds) is caught, not only one that watches them now."""
    return f"group by (provider_id) (last_over_time(kube_node_info[{window}]))"


def region_of_provider_id(provider_id: str) -> str | None:
    """The AWS region of an EKS node's ``aws:///<zone>/<instance>`` provider ID (a local or
    Wavelength zone counts as its parent region); ``None`` for any other form."""
    match = _PROVIDER_ID.match(provider_id)
    return match.group("region") if match else None


def _shown(url: str) -> str:
    """``url`` for messages: a password in it (httpx sends ``user:password@`` as basic auth)
    masked."""
    return _PASSWORD.sub(r"\1***@", url)


def _query_samples(url: str, query: str, at: float) -> list[tuple[dict[str, str], float]]:
    """The instant vector ``query`` evaluates to at ``at``: (labels, value) per series."""
    shown = _shown(url)
    try:
        response = httpx.get(
            f"{url.rstrip('/')}/api/v1/query", params={"query": query, "time": at}, timeout=30
        )
    except httpx.HTTPError as error:
        raise GcError(f"cannot query Prometheus at {shown}: {error}") from error
    try:
        body = response.json()
    except ValueError:
        # Not the API: a wrong path (Prometheus' plain-text 404), an auth proxy, a gateway.
        raise GcError(
            f"Prometheus at {shown} answered HTTP {response.status_code} "
            f"{response.reason_phrase}, not a query result ({response.text.strip()[:80]}); "
            "check that --prometheus is the base URL (the part before /api/v1) and any "
            "credentials it needs"
        ) from None
    if not isinstance(body, dict) or body.get("status") != "success":
        reason = body.get("error") if isinstance(body, dict) else body
        raise GcError(f"Prometheus at {shown} rejected the query: {reason}")
    # Warnings mean the data holds only what could be collected (a failed remote read, a Thanos
    # store down); info annotations, which Prometheus 2.4x also listed there, do not.
    partial = [w for w in body.get("warnings") or [] if not str(w).startswith("PromQL info:")]
    if partial:
        raise GcError(
            f"Prometheus at {shown} answered with partial data ({'; '.join(map(str, partial))}); "
            "a version whose series are missing would look idle, so nothing was decided and "
            "the stack file was not changed"
        )
    try:
        return [
            ({str(k): str(v) for k, v in s["metric"].items()}, float(s["value"][1]))
            for s in body["data"]["result"]
        ]
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        raise GcError(
            f"{shown} answered without a Prometheus instant vector (data.result); "
            "check that --prometheus is a Prometheus base URL"
        ) from None


def _query_vector(url: str, query: str, at: float) -> dict[VersionKey, float]:
    return {
        (labels.get("model_id", ""), labels.get("model_version", "")): value
        for labels, value in _query_samples(url, query, at)
    }


def _check_region(url: str, window: str, at: float, stack: str, region: str) -> None:
    """Stop unless every node Prometheus watched in ``window`` is in ``region``: the request
    counters carry no cluster label and every prod stack lists the same model ids, so another
    region's Prometheus would make versions idle there but live here look idle."""
    shown = _shown(url)
    provider_ids = sorted(
        {
            labels.get("provider_id", "")
            for labels, _ in _query_samples(url, nodes_query(window), at)
        }
    )
    seen = {found for found in map(region_of_provider_id, provider_ids) if found}
    # Nodes without an aws:/// ID (not initialised yet, EKS hybrid nodes) tell no region; the
    # others do.
    if not seen:
        other = [p for p in provider_ids if p]
        example = f" (provider_id {other[0]!r})" if other else ""
        raise GcError(
            f"Prometheus at {shown} has no kube_node_info series with an aws:///<zone>/<instance> "
            f"provider_id in the last {window}{example}, so gc cannot tell which cluster it "
            "watches; nothing was decided and the stack file was not changed; check that "
            f"--prometheus is the Prometheus of the {region} cluster and that it scrapes "
            "kube-state-metrics (kube-prometheus-stack's kubeStateMetrics)"
        )
    if seen != {region}:
        raise GcError(
            f"Prometheus at {shown} watched nodes in {', '.join(sorted(seen))} in the last "
            f"{window} (kube_node_info), but stack {stack} is in {region} ({REGION_KEY}); its "
            "request counters may be another region's, so nothing was decided and the stack file "
            f"was not changed; point --prometheus at the Prometheus of the {region} cluster"
        )


def _yaml() -> YAML:
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    return yaml


def _read_stack(path: Path) -> tuple[Any, str, str]:
    """The stack file's round-trip document, its text and the SHA-256 of its bytes."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError as error:
        raise GcError(f"stack file {path} not found; check --stack and --stacks-dir") from error
    except OSError as error:
        raise GcError(f"cannot read stack file {path}: {error.strerror or error}") from error
    try:
        text = raw.decode("utf-8")
        document = _yaml().load(text)
    except (YAMLError, UnicodeDecodeError) as error:
        problem = getattr(error, "problem", None) or str(error).strip().split("\n")[0]
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise GcError(f"{path} is not valid YAML: {problem}{where}") from None
    return document, text, hashlib.sha256(raw).hexdigest()


def _is_comment_or_blank(line: str) -> bool:
    return not line.strip() or line.lstrip().startswith("#")


def _without_entries(text: str, models: Any, doomed: Collection[VersionKey]) -> str:
    """``text`` less the lines of each doomed ``versions`` entry and the comment lines right above
    it; every other line (indentation, quoting, the comments of kept versions) stays as it was."""
    lines = text.splitlines(keepends=True)
    drop: set[int] = set()
    for model in models:
        versions = model["versions"]
        for index, entry in enumerate(versions):
            if (str(model["id"]), str(entry["version"])) not in doomed:
                continue
            # The newest is never doomed, so a next entry exists; the comment and blank lines
            # leading into that entry belong to it.
            start, end = versions.lc.item(index)[0], versions.lc.item(index + 1)[0]
            while end > start + 1 and _is_comment_or_blank(lines[end - 1]):
                end -= 1
            while start > 0 and lines[start - 1].lstrip().startswith("#"):
                start -= 1
            drop.update(range(start, end))
    return "".join(line for number, line in enumerate(lines) if number not in drop)


def _checked_text(trimmed: str, edited: Any) -> str:
    """``trimmed`` (from :func:`_without_entries`) if it parses to ``edited``, the document with
    the entries deleted; otherwise (a flow list, entries sharing a line) ruamel's rendering of
    ``edited``, which keeps the comments but not the layout."""
    try:
        if _yaml().load(trimmed) == edited:
            return trimmed
    except YAMLError:
        pass
    rendered = io.StringIO()
    _yaml().dump(edited, rendered)
    return rendered.getvalue()


def _write_atomically(path: Path, text: str, read_digest: str) -> None:
    """Write ``text`` beside ``path`` and rename it over ``path``, so that neither a crash nor a
    full disk ever leaves half a stack file; refuse if ``path`` changed since it was read."""
    temporary: Path | None = None
    try:
        with tempfile.NamedTemporaryFile(
            "w",
            dir=path.parent,
            prefix=f".{path.name}.",
            delete=False,
            encoding="utf-8",
            newline="",
        ) as handle:
            temporary = Path(handle.name)
            handle.write(text)
            handle.flush()
            # On the disk before the rename: after a power cut the file is the old or the new one.
            os.fsync(handle.fileno())
        os.chmod(temporary, stat.S_IMODE(path.stat().st_mode))
        # Someone may have edited the file while Prometheus answered; never overwrite that. Editors
        # take no lock, so a write between this check and the rename (microseconds) still wins.
        if hashlib.sha256(path.read_bytes()).hexdigest() != read_digest:
            raise GcError(f"{path} changed while the gc ran; nothing written, run the gc again")
        os.replace(temporary, path)
    except OSError as error:
        raise GcError(
            f"cannot write stack file {path}: {error.strerror or error}; it was not changed"
        ) from error
    finally:
        if temporary is not None:
            temporary.unlink(missing_ok=True)


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
    window, delta = parse_idle(idle)
    path = stacks_dir / f"Pulumi.{stack}.yaml"
    document, text, digest = _read_stack(path)
    config = document.get("config") if isinstance(document, Mapping) else None
    if not isinstance(config, Mapping) or MODELS_KEY not in config:
        raise GcError(f"{path}: config has no {MODELS_KEY}")
    models = models_from_config(config[MODELS_KEY], path)
    versioned = [m.model_id for m in models if m.strategy == "versioned"]
    at = now if now is not None else time.time()
    requests: dict[VersionKey, float] = {}
    covered: dict[VersionKey, float] = {}
    if versioned:
        region = config.get(REGION_KEY)
        if not isinstance(region, str) or not region:
            raise GcError(
                f"{path}: config has no {REGION_KEY}; gc needs it to check that --prometheus "
                "watches this stack's cluster"
            )
        _check_region(prometheus_url, window, at, stack, region)
        requests = _query_vector(prometheus_url, requests_query(versioned, window), at)
        covered = _query_vector(prometheus_url, coverage_query(versioned, window), at)
        if apply and not requests and not covered:
            raise GcError(
                f"Prometheus at {_shown(prometheus_url)} has no request counters for "
                f"{', '.join(sorted(versioned))} in {window}; check --prometheus and the "
                "scrape of the serving metrics; the stack file was not changed"
            )
    window_start = datetime.fromtimestamp(at, UTC) - delta
    decisions = decide(models, requests, covered, window, window_start=window_start)
    doomed = {(d.model_id, d.version) for d in decisions if d.remove}
    if apply and doomed:
        # Line numbers of the entries are read before the deletions below.
        trimmed = _without_entries(text, config[MODELS_KEY], doomed)
        for model in config[MODELS_KEY]:
            versions = model["versions"]
            for index in reversed(range(len(versions))):
                if (str(model["id"]), str(versions[index]["version"])) in doomed:
                    del versions[index]
        _write_atomically(path, _checked_text(trimmed, document), digest)
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
