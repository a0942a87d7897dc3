"""``promtool test rules`` runs the unit tests of every shipped alert rule."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from contracts.promql import ALERTS_FILE, asset_text, load_alert_groups

RULE_TESTS = Path(__file__).parent / "rules" / "alerts.test.yaml"


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    expected: dict[str, list[list]] = {}
    for case in cases:
        for check in case["alert_rule_test"]:
            expected.setdefault(check["alertname"], []).append(check["exp_alerts"])
    for group in load_alert_groups():
        for rule in group["rules"]:
            outcomes = expected.get(rule["alert"], [])
            assert any(outcomes) and not all(outcomes), rule["alert"]


def test_promtool_test_rules_pass(tmp_path: Path) -> None:
    (tmp_path / ALERTS_FILE).write_text(asset_text(ALERTS_FILE))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    out = subprocess.run(
        ["promtool", "test", "rules", RULE_TESTS.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
