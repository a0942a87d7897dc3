"""``llm-serving package build``: a source tree and its ``package.yaml`` become a version folder."""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runtime.compat import load_matrix, vllm_requirements
from runtime.constraints.catalog import CatalogError, read_catalog
from runtime.package.archive import check_archive
from runtime.package.errors import PackageError, field_error
from runtime.package.manifest import (
    ARCHIVE_NAME,
    FORMAT_VERSION,
    LLM_BACKENDS,
    MANIFEST_NAME,
    RECORDS_DIR,
    Catalog,
    FileEntry,
    Manifest,
    Plugin,
    PythonModel,
)
from runtime.package.plugin_checks import check_plugin_entry_points, check_plugin_files, known_image
from runtime.package.repository import (
    EnsembleSpec,
    ModelSpec,
    repository_configs,
    resolve_ensemble,
    resolve_model,
)
from runtime.package.sources import SourceFile, collect, resolve_inside
from runtime.package.tensors import check_python_model
from runtime.package.triton_models import MODEL_REPOSITORY, Ensemble, TritonModel
from runtime.package.wheels import (
    ImageEnvironment,
    check_against_pins,
    parse_pins,
    read_wheel,
    required_names,
    vllm_ranges,
)

__all__ = [
    "SPEC_NAME",
    "TOKENIZER_FILES",
    "ImagePins",
    "PackageSpec",
    "build_package",
    "check_catalog",
    "image_pins",
]

SPEC_NAME = "package.yaml"
# Any one of these makes a folder loadable by transformers' AutoTokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_CHUNK = 1 << 20


class PackageSpec(BaseModel):
    """What the model developer writes in ``package.yaml`` at the root of the source tree."""

    model_config = ConfigDict(extra="forbid")

    model_id: str
    model_version: str
    backend: Literal["vllm", "python", "fil", "onnxruntime", "pytorch", "ensemble"] = "vllm"
    serving_mode: Literal["standalone", "embedded"] = "standalone"
    engine_args: dict[str, Any] = Field(default_factory=dict)
    weights: str = "weights"
    tokenizer: str = "tokenizer"
    plugins: list[str] = Field(default_factory=list, description="wheel paths")
    catalogs: list[Catalog] = Field(default_factory=list)
    python_model: PythonModel | None = None
    model: ModelSpec | None = Field(default=None, description="backends fil, onnxruntime, pytorch")
    ensemble: EnsembleSpec | None = Field(default=None, description="backend ensemble")
    include: list[str] = Field(default_factory=list, description="more files or folders")


@dataclass(frozen=True)
class _Repository:
    """A non-LLM package's Triton models, their files and their ``config.pbtxt`` texts."""

    models: list[TritonModel]
    ensemble: Ensemble | None
    files: list[SourceFile]
    configs: dict[str, str]


@dataclass(frozen=True)
class ImagePins:
    """What plugin wheels are checked against: one Triton release's image and its pins."""

    triton: str
    pins: dict[str, Version]
    """Exact versions by canonical distribution name (matrix pair plus a constraints file)."""
    environment: ImageEnvironment
    """The image's interpreter and platform, for requirement markers."""
    ranges: dict[str, SpecifierSet] = field(default_factory=dict)
    """What the image's vLLM requires of the distributions not pinned above (the Triton
    backend's dependencies, which the base image ships at versions the matrix does not record;
    a constraints file from the image pins them exactly instead)."""
    distributions: frozenset[str] = frozenset()
    """Every distribution the image is known to have, by canonical name: the pins and all of
    vLLM's requirements, bounded or not (what a plugin's files must not shadow)."""


def image_pins(triton: str | None, constraints: Path | None) -> ImagePins:
    """The image of a Triton release (default: the serving image's) and what it fixes: exact
    pins (the pair, plus a constraints file) and vLLM's own requirements of everything else."""
    matrix = load_matrix()
    pair = matrix.default if triton is None else matrix.for_triton(triton)
    environment = ImageEnvironment(python=pair.python)
    lines = [f"vllm=={pair.vllm}", *(f"{n}=={v}" for n, v in pair.pins)]
    if constraints is not None:
        try:
            lines += constraints.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise PackageError(f"cannot read constraints file {constraints}: {exc}") from exc
        except UnicodeDecodeError as exc:
            raise PackageError(
                f"constraints file {constraints} is not UTF-8 ({exc.reason} at byte "
                f"{exc.start}); pass a pip constraints file (name==version lines)"
            ) from exc
    pins = parse_pins(lines)
    requires = vllm_requirements(pair.vllm)
    ranges = vllm_ranges(requires, environment)
    unpinned = {name: spec for name, spec in ranges.items() if name not in pins}
    known = frozenset(pins) | required_names(requires, environment)
    return ImagePins(pair.triton, pins, environment, unpinned, known)


def check_catalog(path: Path, catalog: Catalog, where: str) -> None:
    """Raise `PackageError` unless the constraint engine's own loader reads the catalog file."""
    try:
        read_catalog(path, catalog.name)
    except CatalogError as exc:
        raise PackageError(
            f"{where}: catalog {catalog.name!r} ({catalog.path}) is not a valid JSONL catalog "
            f'(one {{"id", "text"}} object per line): {exc}'
        ) from exc


def _load_spec(source: Path) -> PackageSpec:
    path = source / SPEC_NAME
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PackageError(f"cannot read {path}: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise PackageError(
            f"{path} is not UTF-8 ({exc.reason} at byte {exc.start}); save it as UTF-8 YAML"
        ) from exc
    except yaml.YAMLError as exc:
        raise PackageError(f"{path} is not valid YAML: {exc}") from exc
    try:
        return PackageSpec.model_validate(raw)
    except ValidationError as exc:
        raise field_error(str(path), exc) from exc


def _archive_sources(source: Path, spec: PackageSpec) -> list[SourceFile]:
    files: list[SourceFile] = []
    if spec.backend in LLM_BACKENDS:
        tokenizer = resolve_inside(source, spec.tokenizer, "tokenizer")
        if not tokenizer.is_dir() or not any((tokenizer / n).is_file() for n in TOKENIZER_FILES):
            raise PackageError(
                f"tokenizer: {spec.tokenizer}/ is missing or has none of "
                f"{', '.join(TOKENIZER_FILES)}; save the tokenizer there "
                "(tokenizer.save_pretrained)"
            )
        files += collect(source, spec.tokenizer, "tokenizer")
    for i, wheel in enumerate(spec.plugins):
        if not wheel.endswith(".whl"):
            raise PackageError(f"plugins.{i}: {wheel} is not a wheel (*.whl)")
        files += collect(source, wheel, f"plugins.{i}")
    for i, catalog in enumerate(spec.catalogs):
        catalog_files = collect(source, catalog.path, f"catalogs.{i}")
        if len(catalog_files) != 1 or catalog_files[0].arcname != catalog.path:
            raise PackageError(f"catalogs.{i}: {catalog.path} must be one file, not a folder")
        check_catalog(catalog_files[0].source, catalog, f"catalogs.{i}")
        files += catalog_files
    if spec.python_model is not None:
        model_dir = str(Path(spec.python_model.model_file).parent)
        if model_dir == ".":
            files += collect(source, spec.python_model.model_file, "python_model.model_file")
        else:
            files += collect(source, model_dir, "python_model.model_file")
    for i, extra in enumerate(spec.include):
        files += collect(source, extra, f"include.{i}")
    seen: dict[str, str] = {}
    for item in files:
        if item.arcname in seen:
            raise PackageError(
                f"duplicate entry {item.arcname} (from {seen[item.arcname]} and {item.origin}); "
                "list each file once"
            )
        if item.arcname == ARCHIVE_NAME or item.arcname == MANIFEST_NAME:
            raise PackageError(f"{item.origin}: {item.arcname} is a reserved name")
        seen[item.arcname] = item.origin
    return sorted(files, key=lambda f: f.arcname)


class _HashingReader:
    """Feeds a file to ``tarfile`` while hashing it, so every byte is read once."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        self.digest.update(data)
        return data


def _write_archive(files: list[SourceFile], target: Path) -> list[FileEntry]:
    entries = []
    with tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as tar:
        for item in files:
            size = item.source.stat().st_size
            # Fixed owner, mode and time keep archives of the same tree byte-identical.
            info = tarfile.TarInfo(item.arcname)
            info.size, info.mode, info.mtime = size, 0o644, 0
            with item.source.open("rb") as handle:
                reader = _HashingReader(handle)
                tar.addfile(info, reader)
            entries.append(
                FileEntry(path=item.arcname, size=size, sha256=reader.digest.hexdigest())
            )
    return entries


def file_entry(path: Path, relative: str) -> FileEntry:
    """Size and sha256 of one file."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return FileEntry(path=relative, size=path.stat().st_size, sha256=digest.hexdigest())


def _weight_sources(source: Path, spec: PackageSpec) -> list[SourceFile]:
    # The weights sit in the version folder beside the archive and the manifest, under the
    # path they have in the source tree, so that path must not be the root or their names.
    if spec.weights == ".":
        raise PackageError(
            "weights: '.' is the whole source tree; put the weights in their own folder "
            "(weights: weights)"
        )
    top = spec.weights.split("/", 1)[0]
    if top in (ARCHIVE_NAME, MANIFEST_NAME):
        raise PackageError(
            f"weights: {spec.weights} collides with the version folder's own {top}; "
            "rename it, e.g. put the weights in a folder named weights"
        )
    if top == RECORDS_DIR:
        # Publish keeps its upload records there in the bucket and deletes them at the end.
        raise PackageError(
            f"weights: {spec.weights}: a version folder's {RECORDS_DIR}/ is reserved for "
            "publish's upload records; rename it, e.g. put the weights in a folder named weights"
        )
    files = collect(source, spec.weights, "weights")
    if not files:
        raise PackageError(f"weights: {spec.weights}/ has no files")
    return files


def _place_weights(files: list[SourceFile], out: Path) -> list[FileEntry]:
    entries = []
    for item in files:
        target = out / item.arcname
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(item.source.resolve(), target)  # same file system: no copy of the weights
        except OSError:
            shutil.copyfile(item.source, target)
        entries.append(file_entry(target, item.arcname))
    return entries


def _repository(source: Path, spec: PackageSpec) -> _Repository | None:
    """A non-LLM package's models, tensors read from their files (``None`` for vllm/python)."""
    if spec.backend in LLM_BACKENDS:
        for field in ("model", "ensemble"):
            if field in spec.model_fields_set:
                raise PackageError(
                    f"{field}: belongs to backends fil, onnxruntime, pytorch and ensemble; "
                    f"backend {spec.backend} takes python_model or engine_args"
                )
        return None
    llm_only = ("tokenizer", "weights", "engine_args", "plugins", "catalogs", "python_model")
    given = [field for field in llm_only if field in spec.model_fields_set]
    if given:
        raise PackageError(
            f"{', '.join(given)}: backend {spec.backend} has no tokenizer, weights folder or "
            "vLLM engine; remove them (the model file goes in model.file)"
        )
    if spec.serving_mode == "embedded":
        raise PackageError(
            f"serving_mode: embedded puts the OpenAI frontend in front of an LLM; a "
            f"{spec.backend} model is served over KServe v2 gRPC only: set serving_mode: "
            "standalone"
        )
    if spec.backend == "ensemble":
        if spec.ensemble is None or spec.model is not None:
            raise PackageError(
                "backend ensemble takes ensemble (models, steps, outputs), not model"
            )
        models, ensemble, files = resolve_ensemble(source, spec.ensemble, spec.model_id)
    else:
        assert spec.backend in ("fil", "onnxruntime", "pytorch")  # LLM_BACKENDS returned above
        if spec.model is None or spec.ensemble is not None:
            raise PackageError(
                f"backend {spec.backend} takes model (file, max_batch_size, ...), not ensemble"
            )
        if spec.model.name is not None or spec.model.backend is not None:
            raise PackageError(
                f"model: remove name and backend: the model is {spec.model_id}, backend "
                f"{spec.backend}"
            )
        model, files = resolve_model(source, spec.model, spec.model_id, spec.backend, "model")
        models, ensemble = [model], None
    configs = repository_configs(spec.model_id, models, ensemble)
    return _Repository(models, ensemble, files, configs)


def _config_path(name: str) -> str:
    return f"{MODEL_REPOSITORY}/{name}/config.pbtxt"


def _write_repository(repository: _Repository, model_id: str, out: Path) -> list[FileEntry]:
    """Place the model files and write each ``config.pbtxt``; an ensemble gets the empty
    version folder Triton requires of it."""
    entries = _place_weights(repository.files, out)
    for name, text in repository.configs.items():
        path = out / _config_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        entries.append(file_entry(path, _config_path(name)))
    if repository.ensemble is not None:
        (out / MODEL_REPOSITORY / model_id / "1").mkdir(parents=True, exist_ok=True)
    return sorted(entries, key=lambda e: e.path)


def _placeholder(path: str) -> FileEntry:
    return FileEntry(path=path, size=0, sha256="0" * 64)


def _manifest(
    spec: PackageSpec,
    triton: str,
    plugins: list[Plugin],
    archive: FileEntry,
    archive_files: list[FileEntry],
    weight_files: list[FileEntry],
    where: Path,
    repository: _Repository | None,
) -> Manifest:
    try:
        return Manifest(
            format_version=FORMAT_VERSION,
            model_id=spec.model_id,
            model_version=spec.model_version,
            backend=spec.backend,
            serving_mode=spec.serving_mode,
            engine_args=spec.engine_args,
            triton=triton,
            weights=spec.weights if repository is None else MODEL_REPOSITORY,
            tokenizer=spec.tokenizer if repository is None else None,
            plugins=plugins,
            catalogs=spec.catalogs,
            python_model=spec.python_model,
            models=[] if repository is None else repository.models,
            ensemble=None if repository is None else repository.ensemble,
            archive=archive,
            archive_files=archive_files,
            weight_files=weight_files,
        )
    except ValidationError as exc:
        raise field_error(str(where), exc) from exc


def _staging_folder(out: Path) -> Path:
    """A new, empty sibling of ``out`` (same file system, so hard links and the rename work)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PackageError(f"output folder {out} is not empty; choose a new one")
    staging = out.parent / f".{out.name}.{secrets.token_hex(4)}.partial"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
    except OSError as exc:
        raise PackageError(f"cannot create {staging} beside the output folder: {exc}") from exc
    return staging


def build_package(
    source: Path, out: Path, triton: str | None = None, constraints: Path | None = None
) -> Manifest:
    """Check the source tree, then write ``package.tar``, the weights and ``manifest.json``.

    Every check runs before anything is written but the archive's member checks (those of
    ``package verify`` and the pod's unpack), run on the archive as written; the folder is built
    beside ``out`` and renamed into place, so ``out`` appears complete or not at all.
    """
    source = source.resolve()
    out = Path(os.path.abspath(out))  # a normalised name and parent for the staging folder
    spec = _load_spec(source)
    image = image_pins(triton, constraints)
    repository = _repository(source, spec)
    files = _archive_sources(source, spec)
    if repository is None:
        weights = _weight_sources(source, spec)
        weight_paths = [f.arcname for f in weights]
    else:
        weights = repository.files
        weight_paths = [f.arcname for f in weights] + [_config_path(n) for n in repository.configs]
    names = known_image(image.distributions)
    wheels = [(wheel, read_wheel(source / wheel, wheel)) for wheel in spec.plugins]
    shipped: dict[str, tuple[str, ...]] = {
        canonicalize_name(info.distribution): info.requires for _, info in wheels
    }
    for wheel, info in wheels:
        check_against_pins(info, wheel, image.pins, image.environment, image.ranges, shipped)
        check_plugin_files(info, wheel, names, set(image.pins))
    plugins = [
        Plugin(
            wheel=wheel,
            distribution=info.distribution,
            version=info.version,
            entry_points=info.entry_points,
        )
        for wheel, info in wheels
    ]
    check_plugin_entry_points(wheels, image.environment)
    if spec.python_model is not None:
        check_python_model(spec.python_model)
    # The manifest's own checks (ids, engine_args, consistency) need only names, so run them
    # on placeholder digests before the archive and the weights are written.
    _manifest(
        spec,
        image.triton,
        plugins,
        _placeholder(ARCHIVE_NAME),
        [_placeholder(f.arcname) for f in files],
        [_placeholder(path) for path in weight_paths],
        source / SPEC_NAME,
        repository,
    )
    staging = _staging_folder(out)
    try:
        archive_files = _write_archive(files, staging / ARCHIVE_NAME)
        # The pod's unpack and package verify run the same checks: refuse here what they would.
        with (staging / ARCHIVE_NAME).open("rb") as handle:
            check_archive(handle, str(out / ARCHIVE_NAME), archive_files)
        if repository is None:
            weight_files = _place_weights(weights, staging)
        else:
            weight_files = _write_repository(repository, spec.model_id, staging)
        manifest = _manifest(
            spec,
            image.triton,
            plugins,
            file_entry(staging / ARCHIVE_NAME, ARCHIVE_NAME),
            archive_files,
            weight_files,
            source / SPEC_NAME,
            repository,
        )
        (staging / MANIFEST_NAME).write_text(manifest.to_json(), encoding="utf-8")
        # rename(2) replaces an empty ``out`` and fails if something filled it meanwhile.
        staging.rename(out)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if out.is_dir() and any(out.iterdir()):
            raise PackageError(f"output folder {out} is not empty; choose a new one") from exc
        raise PackageError(f"writing {out} failed: {exc}; fix that and build again") from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest
