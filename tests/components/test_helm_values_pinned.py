"""Helm values against the pinned charts: every release of every region plan is one of the pins
recorded in ``components.cluster_addons.PINNED_CHARTS``, each pin has its copy under
``../shared/reference/charts/<chart>-<version>/``, and the values we set match the chart's
``values.schema.json`` where it ships one, else the shape of its default ``values.yaml``."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from components.cluster_addons import PINNED_CHARTS, ChartPin
from tests.support.stack_plans import REGION_STACKS, stack_plan

RELEASE = "kubernetes:helm.sh/v3:Release"
CHARTS = Path(__file__).resolve().parents[3] / "shared" / "reference" / "charts"
# gateway-helm keeps values.tmpl.yaml in git; its release workflow fills these two with envsubst.
_TEMPLATE_VARIABLES = {
    "${GatewayImage}": "docker.io/envoyproxy/gateway:v1.4.0",
    "${GatewayImagePullPolicy}": "IfNotPresent",
}


class PinWithoutChartError(AssertionError):
    """A pin names a chart version whose reference copy is missing."""


def chart_folder(pin: ChartPin, charts: Path = CHARTS) -> Path:
    """The pinned chart's reference copy; raises `PinWithoutChartError` where there is none."""
    folder = charts / f"{pin.chart.rsplit('/', 1)[-1]}-{pin.version}"
    if not (folder / "Chart.yaml").is_file():
        raise PinWithoutChartError(
            f"{pin.chart} {pin.version} has no {folder}/Chart.yaml: copy the chart's Chart.yaml, "
            "values.yaml (and values.schema.json) from that tag, or keep the pin"
        )
    return folder


def default_values(folder: Path) -> Any:
    values = folder / "values.yaml"
    if values.is_file():
        return yaml.safe_load(values.read_text())
    text = (folder / "values.tmpl.yaml").read_text()
    for placeholder, value in _TEMPLATE_VARIABLES.items():
        text = text.replace(placeholder, value)
    return yaml.safe_load(text)


def shape_errors(ours: Any, default: Any, path: str = "") -> list[str]:
    """Where our values differ in shape from the chart's defaults (a map where the chart has a
    map, a list where it has a list); keys the chart does not list are left to its templates."""
    if isinstance(default, dict):
        if not isinstance(ours, dict):
            return [f"{path or '(root)'}: the chart has a map, we pass {type(ours).__name__}"]
        return [
            error
            for key, value in ours.items()
            if key in default and default[key] is not None
            for error in shape_errors(value, default[key], f"{path}.{key}" if path else key)
        ]
    if isinstance(default, list) and not isinstance(ours, list):
        return [f"{path}: the chart has a list, we pass {type(ours).__name__}"]
    if not isinstance(default, dict | list) and isinstance(ours, dict | list):
        return [f"{path}: the chart has a {type(default).__name__}, we pass {type(ours).__name__}"]
    return []


def values_errors(pin: ChartPin, values: Any, charts: Path = CHARTS) -> list[str]:
    """What is wrong with ``values`` for the pinned chart (empty: nothing)."""
    folder = chart_folder(pin, charts)
    schema = folder / "values.schema.json"
    if schema.is_file():
        validator = jsonschema.Draft7Validator(json.loads(schema.read_text()))
        return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(values)]
    return shape_errors(values, default_values(folder))


def _pin(chart: str, version: str) -> ChartPin:
    (pin,) = [p for p in PINNED_CHARTS if (p.chart, p.version) == (chart, version)]
    return pin


@pytest.mark.parametrize("pin", PINNED_CHARTS, ids=lambda p: p.chart.rsplit("/", 1)[-1])
def test_every_pin_has_its_reference_chart(pin: ChartPin) -> None:
    chart = yaml.safe_load((chart_folder(pin) / "Chart.yaml").read_text())
    assert chart["name"] == pin.chart.rsplit("/", 1)[-1]
    # gateway-helm's Chart.yaml in git says v0.0.0-latest: its release workflow sets the version.
    assert chart["version"] in (pin.version.removeprefix("v"), pin.version, "v0.0.0-latest")


def test_a_pin_moved_without_its_folder_fails() -> None:
    moved = ChartPin("argo-rollouts", "2.37.8", "https://argoproj.github.io/argo-helm", "x")
    with pytest.raises(PinWithoutChartError, match=r"argo-rollouts 2\.37\.8 has no"):
        chart_folder(moved)


@pytest.mark.parametrize("stack", REGION_STACKS)
def test_every_release_is_a_pin_and_its_values_fit_the_chart(stack: str) -> None:
    releases = [r.inputs for r in stack_plan(stack).resources if r.type == RELEASE]
    assert releases
    for release in releases:
        pin = _pin(release["chart"], release["version"])
        assert values_errors(pin, release.get("values") or {}) == [], release["name"]


def test_the_old_argo_rollouts_plugin_list_fails_the_shape_check() -> None:
    # What the add-ons passed before the fix: a list where chart 2.37.6 has a map (rendered
    # under the argo-rollouts-config ConfigMap's data, which must map to strings).
    (release,) = [
        r.inputs
        for r in stack_plan("prod-us-east-1").resources
        if r.type == RELEASE and r.inputs["name"] == "argo-rollouts"
    ]
    values = copy.deepcopy(release["values"])
    values["controller"]["trafficRouterPlugins"] = [{"name": "argoproj-labs/gatewayAPI"}]
    (error,) = values_errors(_pin(release["chart"], release["version"]), values)
    assert error == "controller.trafficRouterPlugins: the chart has a map, we pass list"


def test_a_schema_is_used_where_a_chart_ships_one(tmp_path: Path) -> None:
    folder = tmp_path / "demo-1.0.0"
    folder.mkdir()
    (folder / "Chart.yaml").write_text("name: demo\nversion: 1.0.0\n")
    schema = {"type": "object", "properties": {"replicas": {"type": "integer"}}}
    (folder / "values.schema.json").write_text(json.dumps(schema))
    pin = ChartPin("demo", "1.0.0", None, "demo")
    assert values_errors(pin, {"replicas": "two"}, tmp_path) == [
        "replicas: 'two' is not of type 'integer'"
    ]
    assert values_errors(pin, {"replicas": 2}, tmp_path) == []
