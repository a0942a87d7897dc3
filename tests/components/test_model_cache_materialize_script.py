"""The materialize Job's script, run by bash against a stand-in ``lfs``.

The stand-in is a shell script that logs each call and answers ``hsm_state`` the way Lustre
prints it (``path: (0x...) released exists archived``) until a restore has been requested
and the file has been polled once, so the script's batching and its wait loop are both exercised.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from components.model_cache import materialize_script

FAKE_LFS = r"""#!/bin/bash
state="$LFS_STATE_DIR"
echo "$@" >> "$state/calls"
case "$1" in
  hsm_restore) shift; for f in "$@"; do touch "$state/restored-$(basename "$f")"; done ;;
  hsm_state)
    shift
    for f in "$@"; do
      seen="$state/seen-$(basename "$f")"
      if [ -f "$state/restored-$(basename "$f")" ] && [ -f "$seen" ]; then
        echo "$f: (0x00000009) exists archived, archive_id:1"
      else
        echo "$f: (0x0000000d) released exists archived, archive_id:1"
      fi
      touch "$seen"
    done ;;
esac
"""


def _run(tmp_path: Path, files: int, batch: int, manifest: bool = True) -> tuple[int, str, str]:
    folder = tmp_path / "cache" / "models" / "llama" / "v1"
    folder.mkdir(parents=True)
    for i in range(files):
        (folder / f"shard-{i:03d}.safetensors").write_bytes(b"x")
    if manifest:
        (folder / "manifest.json").write_text("{}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    lfs = bin_dir / "lfs"
    lfs.write_text(FAKE_LFS)
    lfs.chmod(lfs.stat().st_mode | stat.S_IEXEC)
    state = tmp_path / "state"
    state.mkdir()
    script = materialize_script(
        "llama", "v1", batch, poll_seconds=0, cache_root=str(tmp_path / "cache")
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LFS_STATE_DIR": str(state)}
    done = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    calls = (state / "calls").read_text() if (state / "calls").exists() else ""
    return done.returncode, done.stdout + done.stderr, calls


def test_restores_in_batches_then_waits_until_nothing_is_released(tmp_path: Path) -> None:
    code, output, calls = _run(tmp_path, files=9, batch=4)
    assert code == 0, output
    restores = [line.split()[1:] for line in calls.splitlines() if line.startswith("hsm_restore")]
    # 9 shards + manifest.json = 10 files in batches of 4.
    assert [len(batch) for batch in restores] == [4, 4, 2]
    assert "10 files still released" in output
    assert "all files of llama v1 are in Lustre" in output


def test_refuses_a_version_without_manifest(tmp_path: Path) -> None:
    code, output, calls = _run(tmp_path, files=2, batch=4, manifest=False)
    assert code == 1
    assert "no manifest.json" in output
    assert calls == ""
