"""The versioned model package manifest (``manifest.json``) and its JSON schema."""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from runtime.package.ensembles import check_ensemble
from runtime.package.errors import PackageError
from runtime.package.triton_models import (
    MODEL_REPOSITORY,
    Ensemble,
    TensorSpec,
    TritonModel,
    refuse_optional_outputs,
)

__all__ = [
    "ARCHIVE_NAME",
    "FORMAT_VERSION",
    "LLM_BACKENDS",
    "MANIFEST_NAME",
    "RECORDS_DIR",
    "Catalog",
    "FileEntry",
    "Manifest",
    "Plugin",
    "PythonModel",
    "TensorSpec",
    "check_relative_path",
    "load_manifest",
    "manifest_json_schema",
    "parse_manifest",
    "read_manifest_bytes",
]

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
ARCHIVE_NAME = "package.tar"
RECORDS_DIR = ".publish"
"""Top folder of a published version where ``llm-serving publish`` keeps its upload records."""

_ID_PATTERN = r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$"
_SHA256_PATTERN = r"^[0-9a-f]{64}$"
# vLLM loads a named processor with ``module, qualname = name.split(":")``: exactly one colon.
_PROCESSOR_NAME = re.compile(r"(?!\d)\w+(\.(?!\d)\w+)*:(?!\d)\w+(\.(?!\d)\w+)*")
# vLLM's parallel sizes, each ``Field(ge=1)`` in its ParallelConfig; render multiplies all but
# decode context parallel (which reuses the tensor-parallel GPUs) into the GPUs the engine spans,
# which picks the instance group's kind.
_PARALLEL_SIZES = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "prefill_context_parallel_size",
    "decode_context_parallel_size",
)
LLM_BACKENDS = ("vllm", "python")
"""Backends with a tokenizer, engine arguments and the OpenAI frontend; the others are Triton
models of their own (`TritonModel`) served over KServe v2 gRPC only."""


def check_relative_path(value: str) -> str:
    """Return ``value`` if it is a normalised relative POSIX path inside its root, else raise."""
    if not value or "\x00" in value or "\\" in value:
        raise ValueError(f"path {value!r} must be a non-empty POSIX path without NUL or '\\'")
    if not value.isprintable() or any("\udc80" <= c <= "\udcff" for c in value):
        # Undecodable bytes arrive as surrogate escapes, which JSON manifests cannot carry.
        raise ValueError(f"path {value!r} is not printable UTF-8")
    path = PurePosixPath(value)
    if not path.parts:
        raise ValueError(f"path {value!r} is the root itself; name a file or folder inside it")
    if path.is_absolute():
        raise ValueError(f"path {value!r} is absolute; use a path relative to the package root")
    if any(part in ("..", ".") for part in path.parts) or str(path) != value:
        raise ValueError(f"path {value!r} must be normalised and stay inside the package root")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FileEntry(_Strict):
    """One file of a published version: where it is, its size and its sha256."""

    path: str = Field(description="POSIX path relative to the version folder or archive root")
    size: int = Field(ge=0, description="size in bytes")
    sha256: str = Field(pattern=_SHA256_PATTERN, description="lower-case hex sha256")

    _check_path = field_validator("path")(check_relative_path)


class Plugin(_Strict):
    """A vLLM plugin wheel shipped in the archive and installed offline at start-up."""

    wheel: str = Field(description="wheel path inside the archive")
    distribution: str = Field(description="the wheel's distribution name")
    version: str = Field(description="the wheel's version")
    entry_points: dict[str, list[str]] = Field(
        default_factory=dict,
        description="vllm.general_plugins / vllm.logits_processors entry points it declares",
    )

    _check_path = field_validator("wheel")(check_relative_path)


class Catalog(_Strict):
    """A catalog for the constraint engine, shipped in the archive."""

    name: str = Field(pattern=_ID_PATTERN)
    path: str = Field(description="catalog path inside the archive")
    matching: Literal["canonical", "decoded"] = Field(
        default="canonical",
        description="how constraints match items: the canonical tokenization of each piece, "
        "or every token sequence whose decoded text spells a valid list",
    )

    _check_path = field_validator("path")(check_relative_path)


class PythonModel(_Strict):
    """A ``python`` backend model: its ``model.py`` (inside the archive) and its tensors."""

    model_file: str = Field(default="python/model.py", description="model.py inside the archive")
    inputs: list[TensorSpec] = Field(min_length=1)
    outputs: list[TensorSpec] = Field(min_length=1)

    _check_path = field_validator("model_file")(check_relative_path)

    @field_validator("outputs")
    @classmethod
    def _outputs(cls, outputs: list[TensorSpec]) -> list[TensorSpec]:
        return refuse_optional_outputs(outputs, "python_model")


class Manifest(_Strict):
    """What a model version is and every file it consists of (``format_version`` 1)."""

    format_version: Literal[1] = Field(
        description="manifest format; required, so a reader can refuse a format it does not know"
    )
    model_id: str = Field(pattern=_ID_PATTERN, description="model id (DNS label style)")
    model_version: str = Field(pattern=_ID_PATTERN, description="model version")
    backend: Literal["vllm", "python", "fil", "onnxruntime", "pytorch", "ensemble"] = Field(
        description="`vllm`: Triton's vLLM backend; `python`: the package's own model.py; "
        "`fil` (XGBoost, LightGBM), `onnxruntime`, `pytorch` (TorchScript): one model of that "
        "Triton backend in `models`; `ensemble`: Triton's ensemble over `models`"
    )
    serving_mode: Literal["standalone", "embedded"] = Field(
        description="`standalone` Triton, or `embedded` behind the OpenAI frontend"
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="vLLM AsyncEngineArgs; `model` and `tokenizer` are set at deploy time; "
        "`max_model_len` (required for serving_mode `embedded`) and the `*_parallel_size` "
        "sizes are integers of at least 1",
    )
    triton: str = Field(description="Triton release the plugins were checked against")
    weights: str = Field(description="weights folder, relative to the version folder")
    tokenizer: str | None = Field(
        default=None, description="tokenizer folder inside the archive (vllm and python only)"
    )
    plugins: list[Plugin] = Field(default_factory=list)
    catalogs: list[Catalog] = Field(default_factory=list)
    python_model: PythonModel | None = None
    models: list[TritonModel] = Field(
        default_factory=list,
        description="the Triton models under `model_repository/` (non-LLM backends)",
    )
    ensemble: Ensemble | None = Field(default=None, description="backend `ensemble` only")
    archive: FileEntry = Field(description="the package archive beside the manifest")
    archive_files: list[FileEntry] = Field(description="every regular file inside the archive")
    weight_files: list[FileEntry] = Field(description="every file of the weights folder")

    _check_paths = field_validator("weights")(check_relative_path)

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer(cls, value: str | None) -> str | None:
        return None if value is None else check_relative_path(value)

    @field_validator("engine_args")
    @classmethod
    def _engine_args(cls, args: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        reserved = sorted({"model", "tokenizer"} & set(args))
        if reserved:
            raise ValueError(
                f"engine_args must not set {', '.join(reserved)}: they are the package's "
                "weights and tokenizer folders, filled in at deploy time"
            )
        _check_processors(args.get("logits_processors"))
        if args.get("speculative_config") is not None:
            # vLLM's V1 runner drops entry-point processors under speculative decoding without
            # a word, so constrained requests would come back unconstrained.
            raise ValueError(
                "engine_args must not set speculative_config: the constraint processor in "
                "every engine cannot mask draft tokens; remove it to serve this model"
            )
        if info.data.get("serving_mode") == "embedded" and "max_model_len" not in args:
            # The entrypoint hands it to the frontend, which checks prompt + max_tokens against
            # it; without it the frontend would guess a context length vLLM does not use.
            raise ValueError(
                "serving_mode embedded needs max_model_len (the OpenAI frontend and vLLM must "
                "use the same context length); set engine_args.max_model_len, e.g. 4096"
            )
        _check_counts(args)
        return args

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        if (self.backend == "python") != (self.python_model is not None):
            raise ValueError("python_model is required for backend 'python' and only there")
        for field, entries in (
            ("archive_files", self.archive_files),
            ("weight_files", self.weight_files),
        ):
            seen: set[str] = set()
            for entry in entries:
                if entry.path in seen:
                    raise ValueError(f"{field} lists {entry.path!r} twice")
                seen.add(entry.path)
        if self.archive.path == MANIFEST_NAME or any(
            entry.path == self.archive.path for entry in self.weight_files
        ):
            raise ValueError(f"archive path {self.archive.path!r} is also another file's path")
        # Each list is unpacked or placed into one folder, where no path can be both a file
        # and a folder holding another.
        for field, paths in (
            ("archive_files", [e.path for e in self.archive_files]),
            (
                "weight_files",
                [MANIFEST_NAME, self.archive.path, *(e.path for e in self.weight_files)],
            ),
        ):
            clash = _file_and_folder(paths)
            if clash is not None:
                raise ValueError(
                    f"{field}: {clash[0]!r} is a file, so {clash[1]!r} cannot lie inside it; "
                    "rename one of them and rebuild the package"
                )
        members = {entry.path for entry in self.archive_files}
        needed = [p.wheel for p in self.plugins] + [c.path for c in self.catalogs]
        if self.python_model is not None:
            needed.append(self.python_model.model_file)
        missing = [path for path in needed if path not in members]
        if missing:
            raise ValueError(f"archive_files lacks {', '.join(missing)}")
        if self.backend in LLM_BACKENDS:
            if self.tokenizer is None:
                raise ValueError(f"backend {self.backend} needs a tokenizer folder")
            if not any(_under(p, self.tokenizer) for p in members):
                raise ValueError(f"archive_files has nothing under tokenizer {self.tokenizer!r}")
            if self.models or self.ensemble is not None:
                raise ValueError(
                    "models and ensemble belong to backends fil, onnxruntime, pytorch and "
                    "ensemble only"
                )
        else:
            _check_triton_models(self)
        for kind, names in (
            ("plugin distribution", [p.distribution.lower() for p in self.plugins]),
            ("catalog name", [c.name for c in self.catalogs]),
        ):
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"duplicate {kind}: {', '.join(dupes)}")
        return self

    @property
    def max_model_len(self) -> int | None:
        """The context length ``engine_args`` sets (a validated count), ``None`` where unset."""
        value = self.engine_args.get("max_model_len")
        return None if value is None else int(value)

    @property
    def max_logprobs(self) -> int | None:
        """The ``max_logprobs`` ``engine_args`` sets (checked at build), ``None`` where unset."""
        value = self.engine_args.get("max_logprobs")
        return None if value is None else int(value)

    def to_json(self) -> str:
        """The manifest as written to ``manifest.json`` (stable key order, trailing newline)."""
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


def _check_triton_models(manifest: Manifest) -> None:
    """Refuse what a non-LLM package cannot have, and models that are not in its files."""
    backend = manifest.backend
    refused = [
        field
        for field, value in (
            ("tokenizer", manifest.tokenizer),
            ("engine_args", manifest.engine_args),
            ("plugins", manifest.plugins),
            ("catalogs", manifest.catalogs),
        )
        if value
    ]
    if refused:
        raise ValueError(
            f"backend {backend} has no tokenizer and no vLLM engine: remove {', '.join(refused)}"
        )
    if manifest.serving_mode == "embedded":
        raise ValueError(
            f"serving_mode embedded puts the OpenAI frontend in front of an LLM; a {backend} "
            "model is served over KServe v2 gRPC only: set serving_mode: standalone"
        )
    if manifest.weights != MODEL_REPOSITORY:
        raise ValueError(f"backend {backend} keeps its models in weights {MODEL_REPOSITORY!r}")
    names = [m.name for m in manifest.models]
    if backend == "ensemble":
        if manifest.ensemble is None:
            raise ValueError("backend ensemble needs ensemble (its steps)")
        if len(set(names)) != len(names) or manifest.model_id in names:
            raise ValueError(f"models {names} must have distinct names other than the model_id")
        check_ensemble(manifest.ensemble, manifest.models)
    elif manifest.ensemble is not None:
        raise ValueError(f"ensemble belongs to backend ensemble, not {backend}")
    elif names != [manifest.model_id] or manifest.models[0].backend != backend:
        raise ValueError(
            f"backend {backend} has exactly one model, named {manifest.model_id} and of "
            f"backend {backend}"
        )
    files = {entry.path for entry in manifest.weight_files}
    configs = [f"{MODEL_REPOSITORY}/{n}/config.pbtxt" for n in names]
    if manifest.ensemble is not None:
        configs.append(f"{MODEL_REPOSITORY}/{manifest.model_id}/config.pbtxt")
    missing = [p for p in [*configs, *(m.file for m in manifest.models)] if p not in files]
    if missing:
        raise ValueError(f"weight_files lacks {', '.join(missing)}")


def _check_processors(value: object) -> None:
    """Refuse an ``engine_args.logits_processors`` that vLLM would not load as a list of names."""
    if value is None:
        return
    if not isinstance(value, list):
        raise ValueError(
            f"engine_args.logits_processors must be a list of 'module:Class' names, not "
            f"{type(value).__name__} {value!r}; write it as [{value!r}]"
        )
    for i, name in enumerate(value):
        if not isinstance(name, str) or not _PROCESSOR_NAME.fullmatch(name):
            raise ValueError(
                f"engine_args.logits_processors.{i} is {name!r}, not a 'module:Class' name "
                "(e.g. my_pkg.procs:BanWords), the form vLLM loads"
            )


def _check_counts(args: dict[str, Any]) -> None:
    """Refuse a ``max_model_len``, parallel size or ``max_logprobs`` that is not a count."""
    # The frontend refuses requests above it; -1 is vLLM's "no cap".
    value = args.get("max_logprobs", 0)
    if type(value) is not int or value < -1:
        raise ValueError(
            f"engine_args.max_logprobs is {value!r}, not a whole number of at least -1; write "
            "the most log-probabilities per token a request may ask for (e.g. max_logprobs: 5), "
            "or -1 for no cap"
        )
    for key in ("max_model_len", *_PARALLEL_SIZES):
        if key not in args:
            continue
        value = args[key]
        # type() rather than isinstance: true is a Python int, and vLLM's lax pydantic would
        # take it (and "2") as a size. vLLM's -1 (fit the length to memory) gives the frontend
        # no length, and the entrypoint can serve any package embedded.
        if type(value) is not int or value < 1:
            example = "4096" if key == "max_model_len" else "2"
            raise ValueError(
                f"engine_args.{key} is {value!r}, not a positive integer; write a whole number "
                f"of at least 1 (e.g. {key}: {example})"
            )


def _file_and_folder(paths: list[str]) -> tuple[str, str] | None:
    """A pair ``(file, path under it)`` from ``paths``, if one path is a folder of another."""
    files = set(paths)
    for path in paths:
        head = path
        while "/" in head:
            head = head.rpartition("/")[0]
            if head in files:
                return head, path
    return None


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def load_manifest(path: Path) -> Manifest:
    """Read and validate a ``manifest.json``; raises `PackageError` naming file and field."""
    return parse_manifest(read_manifest_bytes(path), path)


def read_manifest_bytes(path: Path) -> bytes:
    """The bytes of the ``manifest.json`` at ``path``; raises `PackageError` naming it."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise PackageError(f"cannot read manifest {path}: {exc}") from exc


def parse_manifest(body: bytes, path: Path) -> Manifest:
    """Validate the bytes read from ``path``; raises `PackageError` naming file and field."""
    try:
        data = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise PackageError(
            f"manifest {path} is not UTF-8 ({exc.reason} at byte {exc.start}); llm-serving "
            "package build writes it as UTF-8 JSON: rebuild or republish the package"
        ) from exc
    except json.JSONDecodeError as exc:
        raise PackageError(f"manifest {path} is not valid JSON: {exc}") from exc
    if isinstance(data, dict):
        found = data.get("format_version")
        # type() rather than isinstance: JSON true is a Python int equal to 1.
        if type(found) is not int or found != FORMAT_VERSION:
            said = f"format_version {found!r}" if "format_version" in data else "no format_version"
            raise PackageError(
                f"manifest {path} has {said}; this runtime reads format_version "
                f"{FORMAT_VERSION}: rebuild the package with this version"
            )
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        raise PackageError(f"manifest {path}: {_describe(exc)}") from exc


def _describe(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(top level)"
    return f"field {where}: {first['msg']}"


def manifest_json_schema() -> dict[str, Any]:
    """The manifest's JSON schema (draft 2020-12), as shipped in ``manifest.schema.json``."""
    schema = Manifest.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://llm-serving/schemas/manifest-v{FORMAT_VERSION}.json"
    return schema
