"""Settings that would break a stage later are refused at start: exit 2, one line naming them.

PROMETHEUS_MULTIPROC_DIR must be a folder of its own (stage 4 deletes files there), ports are
1..65535, durations finite and modes one of their names; stage 4 itself deletes only
prometheus_client's ``*.db`` files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.entrypoint import EntrypointSettings
from runtime.entrypoint.errors import ExitCode, StageFailed
from runtime.entrypoint.stages import wipe_multiproc_dir
from tests.runtime.pod import Pod


def _config_line(err: str) -> str:
    lines = [line for line in err.splitlines() if "invalid setting" in line]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    ("multiproc", "named"),
    [
        ("{root}/work", "LLM_SERVING_WORK_DIR"),
        ("{root}/work/prom", "LLM_SERVING_WORK_DIR"),
        ("{root}", "LLM_SERVING_WORK_DIR"),
        ("{root}/plugins", "LLM_SERVING_PLUGIN_DIR"),
    ],
)
def test_multiproc_dir_overlapping_the_work_or_plugin_dir_is_refused(
    tmp_path: Path, multiproc: str, named: str
) -> None:
    pod = Pod.create(tmp_path)
    kept = tmp_path / "work" / "package" / "kept.txt"
    kept.parent.mkdir(parents=True)
    kept.write_text("an earlier start's unpack")
    pod.env["PROMETHEUS_MULTIPROC_DIR"] = multiproc.replace("{root}", str(tmp_path))
    code, err = pod.run_to_exit()
    assert code == ExitCode.CONFIG, err
    line = _config_line(err)
    assert "PROMETHEUS_MULTIPROC_DIR" in line and named in line
    assert kept.read_text() == "an earlier start's unpack"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LLM_SERVING_HEALTH_PORT", "70000"),
        ("LLM_SERVING_PUBLIC_GRPC_PORT", "0"),
        ("LLM_SERVING_TRITON_HTTP_PORT", "-1"),
        ("LLM_SERVING_DRAIN_SECONDS", "inf"),
        ("LLM_SERVING_DRAIN_SECONDS", "nan"),
        ("LLM_SERVING_DRAIN_SECONDS", "1e300"),
        ("LLM_SERVING_READY_TIMEOUT_SECONDS", "inf"),
        ("LLM_SERVING_READINESS_POLL_SECONDS", "inf"),
        ("LLM_SERVING_SERVING_MODE", "embeded"),
    ],
)
def test_out_of_range_setting_exits_2_naming_it(tmp_path: Path, name: str, value: str) -> None:
    pod = Pod.create(tmp_path)
    pod.env[name] = value
    code, err = pod.run_to_exit()
    assert code == ExitCode.CONFIG, err
    assert f"invalid setting {name}: " in _config_line(err)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LLM_SERVING_GATE", "relay"),
        ("LLM_SERVING_GATE", "auto"),
        ("LLM_SERVING_TRITON_GRPC_PORT", "18001"),
    ],
)
def test_a_variable_of_the_removed_relay_gate_is_refused_naming_it(
    tmp_path: Path, name: str, value: str
) -> None:
    # A pod spec written for the relay: one line saying to remove it, before any stage runs.
    pod = Pod.create(tmp_path)
    pod.env[name] = value
    code, err = pod.run_to_exit()
    assert code == ExitCode.CONFIG, err
    line = _config_line(err)
    assert f"invalid setting {name}: " in line and f"(got {value!r})" in line
    assert "was removed with the relay gate" in line
    assert "remove the variable from the pod spec" in line
    assert "stage 1/8" not in err


@pytest.mark.parametrize(
    ("host", "url"),
    [("0.0.0.0", "127.0.0.1:8001"), ("::", "127.0.0.1:8001"), ("fd00::5", "[fd00::5]:8001")],
)
def test_the_frontend_reaches_the_public_port_on_the_address_triton_binds(
    host: str, url: str
) -> None:
    assert EntrypointSettings(public_host=host).public_grpc_url() == url


def test_wipe_deletes_only_prometheus_files(tmp_path: Path) -> None:
    folder = tmp_path / "prom"
    (folder / "notes").mkdir(parents=True)
    (folder / "notes" / "a.txt").write_text("kept")
    (folder / "README").write_text("kept")
    for name in ("counter_12.db", "gauge_livesum_12.db", "histogram_7.db"):
        (folder / name).write_bytes(b"\x00" * 8)
    (folder / "link.db").symlink_to(folder / "README")
    assert wipe_multiproc_dir(folder) == 4
    assert sorted(p.name for p in folder.iterdir()) == ["README", "notes"]
    assert (folder / "notes" / "a.txt").read_text() == "kept"
    assert (folder / "README").read_text() == "kept"


def test_wipe_refuses_a_folder_named_like_a_metrics_file(tmp_path: Path) -> None:
    folder = tmp_path / "prom"
    (folder / "counter_1.db").mkdir(parents=True)
    (folder / "counter_1.db" / "inside").write_text("kept")
    with pytest.raises(StageFailed, match=r"holds a folder counter_1\.db"):
        wipe_multiproc_dir(folder)
    assert (folder / "counter_1.db" / "inside").read_text() == "kept"
