"""A stand-in for NVIDIA's ``tritonserver:<release>-vllm-python-py3`` image, built with buildah.

The NGC image cannot be pulled on these machines, so ``images/serving/Dockerfile`` is built
``FROM`` this instead, under the NGC image's own name in a private buildah store. It holds what
the Dockerfile and the entrypoint rely on, and nothing of Triton itself:

- Debian's Python with pip, its headers, wheel and setuptools, which Triton's own image build
  installs for the python backend; like the NGC image, it lets pip install system-wide (no
  PEP 668 marker). Debian ships Python 3.11 where NGC ships 3.12.
- the pair's real vLLM, a CPU torch at the pair's version and the pure-Python packages that
  vLLM's probed modules, the runtime and the stand-in import, at versions vLLM accepts; vLLM's
  other requirements (CUDA kernels, torchaudio, ...) as bare metadata at versions it accepts, so
  that pip sees a consistent vLLM as it does in the NGC image;
- NVIDIA's entrypoint script, which here only execs its arguments;
- the ``tritonserver`` stand-in of ``tests/support`` on ``PATH``, and the stock vLLM backend's
  stand-in under ``/opt/tritonserver/backends/vllm``.
"""

from __future__ import annotations

import email
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from runtime.compat import CompatPair

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = Path(__file__).resolve().parent
DEBIAN_SUITE = "bookworm"
# What Triton's image build installs for its python backend, and the certificates pip needs.
DEBIAN_PACKAGES = (
    "python3",
    "python3-pip",
    "python3-wheel",
    "python3-setuptools",
    "libpython3-dev",
    "ca-certificates",
)
# The pure-Python packages vLLM's interfaces import (also installed by `make setup`).
VLLM_INTERFACE_REQUIREMENTS = ROOT / "requirements" / "vllm-interfaces.txt"
# What the tritonserver stand-in itself imports.
STANDIN_REQUIREMENTS = ("grpcio", "numpy", "protobuf", "tritonclient[grpc]")
STANDIN_MODULES = (
    "__init__.py",
    "dynamic_batcher.py",
    "kserve_server.py",
    "repository_models.py",
    "toy_model.py",
    "triton_flags.py",
)
# Pinned by the pair but not always among vLLM's requirements: bare metadata at the pins.
BARE_PINS = ("torchaudio", "torchvision")
PATH = "/opt/tritonserver/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class BuildahError(RuntimeError):
    """A buildah (or mmdebstrap, or pip) command of the stand-in failed."""


def write_bare_distributions(site: Path, versions: dict[str, str]) -> Path:
    """Distributions as bare ``.dist-info`` metadata in ``site``: installed, as far as pip and
    importlib.metadata can tell, with nothing to import."""
    for name, version in versions.items():
        # The folder's name escapes `-` as wheels do: pip reads name and version from it.
        info = site / f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return site


def _run(argv: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 1800) -> str:
    done = subprocess.run(
        list(argv), capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise BuildahError(
            f"{' '.join(argv[:4])} ... exited {done.returncode}:\n"
            f"{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
        )
    return done.stdout


@dataclass(frozen=True)
class Buildah:
    """buildah on a private store under ``root`` (vfs, chroot isolation: no daemon, no
    privileges beyond what this sandbox's root has)."""

    root: Path

    def env(self) -> dict[str, str]:
        return {**os.environ, "BUILDAH_ISOLATION": "chroot", "STORAGE_DRIVER": "vfs"}

    def argv(self, *args: str) -> list[str]:
        """The command line of ``buildah args`` on this store, for a caller that runs it."""
        store = ["--root", str(self.root / "store"), "--runroot", str(self.root / "run")]
        return ["buildah", *store, "--storage-driver", "vfs", *args]

    def __call__(self, *args: str, timeout: float = 1800) -> str:
        return _run(self.argv(*args), env=self.env(), timeout=timeout)

    def inspect(self, image: str) -> dict:
        """The image's OCI configuration (``config``: Entrypoint, Env, ExposedPorts, ...)."""
        return json.loads(self("inspect", "--type", "image", image))["OCIv1"]


def _requires_dist(wheel: Path) -> list[Requirement]:
    """The wheel's Requires-Dist whose markers hold here (no extras requested)."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(archive.read(name))
    found = [Requirement(line) for line in metadata.get_all("Requires-Dist", [])]
    return [r for r in found if r.marker is None or r.marker.evaluate({"extra": ""})]


def _downloaded(dest: Path) -> set[str]:
    return {canonicalize_name(w.name.split("-")[0]) for w in dest.glob("*.whl")}


def _wheelhouse(pair: CompatPair, dest: Path) -> dict[str, str]:
    """Download the base's real wheels with this machine's pip (its CPU torch, its package
    index) under vLLM's own requirements; return the rest of those requirements as the bare
    ``{name: version}`` metadata that satisfies them, as the NGC image's installs do."""
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:"]
    _run([*pip, "--dest", str(dest), "--no-deps", f"vllm=={pair.vllm}"])
    (vllm,) = dest.glob("vllm-*.whl")
    requires = _requires_dist(vllm)
    constraints = dest / "vllm-constraints.txt"
    constraints.write_text("".join(f"{r.name}{r.specifier}\n" for r in requires))
    pip += ["--constraint", str(constraints)]
    pins = dict(pair.pins)
    runtime = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = [f"torch=={pins['torch']}", *STANDIN_REQUIREMENTS, *runtime]
    wanted += ["-r", str(VLLM_INTERFACE_REQUIREMENTS)]
    # What vLLM's modules, the stand-in and the runtime import is real (in the NGC image, vLLM's
    # requirements bring the runtime's). A first resolution names it; the second, the one kept,
    # adds vLLM's requirements on those with their extras (fastapi[standard]).
    first = dest / "first"
    _run([*pip, "--dest", str(first), *wanted])
    real = [
        str(r).partition(";")[0]
        for r in requires
        if canonicalize_name(r.name) in _downloaded(first)
    ]
    shutil.rmtree(first)
    _run([*pip, "--dest", str(dest), *wanted, *real])
    have = _downloaded(dest)
    bare = {name: pins[name] for name in BARE_PINS}
    for r in requires:
        name = canonicalize_name(r.name)
        if name not in have:
            bare.setdefault(name, _satisfying(r))
    return bare


def _satisfying(requirement: Requirement) -> str:
    """The lowest version the requirement names that it accepts (``0`` when it names none)."""
    specifier = requirement.specifier
    named = sorted(Version(s.version.removesuffix(".*")) for s in specifier if s.operator != "!=")
    for candidate in [*(str(v) for v in named), "0"]:
        if specifier.contains(candidate, prereleases=True):
            return candidate
    raise BuildahError(f"no bare version satisfies vLLM's requirement {requirement}")


def _debian_rootfs(dest: Path) -> Path:
    tarball = dest / "rootfs.tar"
    _run(["mmdebstrap", "--variant=minbase", "--include=" + ",".join(DEBIAN_PACKAGES),
          DEBIAN_SUITE, str(tarball)])  # fmt: skip
    return tarball


def _lay_out(rootfs: Path, bare: dict[str, str]) -> None:
    """Everything the base holds besides Debian and its wheels, written into its rootfs."""
    # The build's pip and apt reach the registries through whatever this machine trusts.
    shutil.copy2("/etc/ssl/certs/ca-certificates.crt", rootfs / "etc/ssl/certs/ca-certificates.crt")
    for marker in rootfs.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    nvidia = rootfs / "opt/nvidia/nvidia_entrypoint.sh"
    nvidia.parent.mkdir(parents=True)
    nvidia.write_text(
        '#!/bin/bash\n# Stand-in: NVIDIA\'s script sets up CUDA, then execs.\nexec "$@"\n'
    )
    nvidia.chmod(0o755)
    standin = rootfs / "opt/tritonserver/standin/tests"
    (standin / "support").mkdir(parents=True)
    shutil.copy2(ROOT / "tests/__init__.py", standin / "__init__.py")
    for name in STANDIN_MODULES:
        shutil.copy2(SUPPORT / name, standin / "support" / name)
    server = rootfs / "opt/tritonserver/bin/tritonserver"
    server.parent.mkdir(parents=True)
    server.write_text(
        "#!/bin/sh\n"
        'PYTHONPATH=/opt/tritonserver/standin exec python3 -m tests.support.kserve_server "$@"\n'
    )
    server.chmod(0o755)
    shutil.copytree(SUPPORT / "stock_vllm_backend", rootfs / "opt/tritonserver/backends/vllm")
    (site,) = rootfs.glob("usr/lib/python3/dist-packages")
    local = rootfs / f"usr/local/lib/python3.{_python_minor(site)}/dist-packages"
    local.mkdir(parents=True, exist_ok=True)
    write_bare_distributions(local, bare)


def _python_minor(site: Path) -> str:
    (stdlib,) = site.parents[1].glob("python3.*[0-9]")
    return stdlib.name.removeprefix("python3.")


def build_base(buildah: Buildah, pair: CompatPair, work: Path) -> str:
    """Build the stand-in for ``pair``'s NGC image into ``buildah``'s store; return its name."""
    wheels = work / "wheelhouse"
    wheels.mkdir(parents=True, exist_ok=True)
    bare = _wheelhouse(pair, wheels)
    downloaded = sorted(wheels.glob("*.whl"))
    tarball = _debian_rootfs(work)
    container = buildah("from", "scratch").strip()
    try:
        mount = Path(buildah("mount", container).strip())
        _run(["tar", "-C", str(mount), "-xf", str(tarball)])
        _lay_out(mount, bare)
        buildah("umount", container)
        buildah("run", "--network", "none", "-v", f"{wheels}:/wheelhouse:ro", container, "--",
                "python3", "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                "--disable-pip-version-check",
                *(f"/wheelhouse/{w.name}" for w in downloaded))  # fmt: skip
        buildah("config", "--env", f"PATH={PATH}", "--env",
                f"NVIDIA_TRITON_SERVER_VERSION={pair.triton}", "--entrypoint",
                '["/opt/nvidia/nvidia_entrypoint.sh"]', "--workingdir", "/opt/tritonserver",
                container)  # fmt: skip
        buildah("commit", "--quiet", container, pair.image)
    finally:
        buildah("rm", container)
    tarball.unlink()
    return pair.image


def main() -> int:
    """``python -m tests.support.triton_base STORE``: build the default pair's stand-in base."""
    from runtime.compat import load_matrix

    store = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp())
    print(build_base(Buildah(store), load_matrix().default, store / "work"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
