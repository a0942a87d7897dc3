"""Packaging-time checks of plugin wheels' files and entry points, so that a plugin the
entrypoint's stage 3 would refuse is refused before it is packaged.

Without the image at hand, a wheel's files are compared with the import names of the
distributions the image is known to have: its pins and vLLM's own requirements. That list is
not the image's every distribution (the Triton base image ships more), so stage 3, which reads
the installed distributions' RECORD files, remains the complete check against the real image.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from runtime.package.errors import PackageError
from runtime.package.plugin_groups import PluginWheel, unloadable
from runtime.package.shadowing import ImageNames, ImportKey, WheelLayoutError, find_shadowing
from runtime.package.wheels import ImageEnvironment, WheelInfo

__all__ = [
    "IMPORT_NAMES",
    "check_plugin_entry_points",
    "check_plugin_files",
    "import_keys",
    "known_image",
]

#: Distributions among the pins and vLLM's requirements (images/vllm-requirements.toml) whose
#: import names are not their canonical name with '-' -> '_'; dotted names are portions of a
#: namespace package. Read from the distributions' RECORD files; one not listed here is missed
#: only until stage 3 reads the real image.
IMPORT_NAMES: Mapping[str, tuple[str, ...]] = {
    "apache-tvm-ffi": ("tvm_ffi",),
    "flashinfer-python": ("flashinfer",),
    "grpcio": ("grpc",),
    "lm-format-enforcer": ("lmformatenforcer",),
    "nvidia-cudnn-frontend": ("cudnn",),
    "opencv-python-headless": ("cv2",),
    # The opentelemetry distributions share the opentelemetry namespace, each its portions.
    "opentelemetry-api": tuple(
        f"opentelemetry.{p}"
        for p in (
            "_logs",
            "attributes",
            "baggage",
            "context",
            "environment_variables",
            "metrics",
            "propagate",
            "propagators",
            "trace",
            "util",
            "version",
        )
    ),
    "opentelemetry-exporter-otlp": (),  # no code of its own: it only requires the exporters
    "opentelemetry-sdk": ("opentelemetry.sdk",),
    "opentelemetry-semantic-conventions-ai": ("opentelemetry.semconv_ai",),
    "pillow": ("PIL",),
    "protobuf": ("google.protobuf", "google._upb"),
    "py-cpuinfo": ("cpuinfo",),
    "pynvvideocodec": ("PyNvVideoCodec",),  # imports are case-sensitive on Linux
    "python-json-logger": ("pythonjsonlogger",),
    "pyyaml": ("yaml", "_yaml"),
    "pyzmq": ("zmq",),
    "quack-kernels": ("quack",),
    "setuptools": ("setuptools", "_distutils_hack"),
    "torch": ("torch", "torchgen", "functorch"),
}


def import_keys(distribution: str) -> tuple[ImportKey, ...]:
    """The import keys of the canonically named ``distribution`` (see `IMPORT_NAMES`)."""
    names = IMPORT_NAMES.get(distribution, (distribution.replace("-", "_"),))
    return tuple(tuple(name.split(".")) for name in names)


def known_image(distributions: Iterable[str]) -> ImageNames:
    """What the image's known ``distributions`` (canonical names) install, by import key."""
    return ImageNames.of({name: import_keys(name) for name in distributions})


# pip writes each entry point of these groups as a command into the environment's bin/, where a
# plugin installed into the image's prefix could replace the image's own (vllm, tritonserver).
_SCRIPT_GROUPS = ("console_scripts", "gui_scripts")


def check_plugin_files(info: WheelInfo, label: str, image: ImageNames, pinned: set[str]) -> None:
    """Refuse a wheel that ships a ``.pth`` file, another distribution's metadata, a command, or
    a package or module of the image (``pinned`` names the distributions to call pinned)."""
    scripts = [group for group in _SCRIPT_GROUPS if group in info.groups]
    if scripts:
        raise PackageError(
            f"plugin wheel {label} registers [{scripts[0]}] entry points: pip would write them as "
            "commands into the image's bin/, where they could replace its own; a vLLM plugin is "
            f"loaded through vLLM's entry points and needs no command: remove [{scripts[0]}] and "
            "rebuild the wheel"
        )
    try:
        found = find_shadowing(list(info.files), image)
    except WheelLayoutError as exc:
        raise PackageError(f"plugin wheel {label} is not a wheel: {exc}; rebuild it") from exc
    if found:
        problem, fix = found[0].explain(label, pinned)
        raise PackageError(f"{problem}; {fix}")


def check_plugin_entry_points(
    wheels: Sequence[tuple[str, WheelInfo]], environment: ImageEnvironment
) -> None:
    """Refuse a wheel of ``(label, info)`` pairs that registers no vLLM entry point and that no
    other wheel requires in the image's ``environment``."""
    plugins = [
        PluginWheel(label, info.distribution, info.requires, info.groups) for label, info in wheels
    ]
    refused = unloadable(plugins, environment.markers())
    if refused:
        first = refused[0]
        raise PackageError(
            f"plugin wheel {first.plugin.wheel} ({first.plugin.distribution}) {first.problem}, "
            "and no other plugin wheel of the package requires it; "
            f"{first.fix} in the plugin's entry points and rebuild the wheel, or drop the wheel "
            "from plugins"
        )
