"""Model packages: the manifest, building, verifying, inspecting and unpacking them."""

from __future__ import annotations

from runtime.package.archive import UnpackLimits, check_archive
from runtime.package.build import PackageSpec, build_package
from runtime.package.errors import PackageError
from runtime.package.manifest import (
    ARCHIVE_NAME,
    FORMAT_VERSION,
    MANIFEST_NAME,
    Manifest,
    load_manifest,
    manifest_json_schema,
)
from runtime.package.unpack import unpack_archive
from runtime.package.verify import describe, verify_package

__all__ = [
    "ARCHIVE_NAME",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "Manifest",
    "PackageError",
    "PackageSpec",
    "UnpackLimits",
    "build_package",
    "check_archive",
    "describe",
    "load_manifest",
    "manifest_json_schema",
    "unpack_archive",
    "verify_package",
]
