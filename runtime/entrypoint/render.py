"""Stage 6: render the Triton model repository from the manifest (engine arguments and I/O are
generated here, at deploy time, so a frontend upgrade never needs a repackaged model)."""

from __future__ import annotations

import importlib.metadata as md
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from packaging.utils import canonicalize_name
from tritonclient.grpc import model_config_pb2 as mc

from runtime.compat import CompatPair
from runtime.package.manifest import LLM_BACKENDS, Manifest
from runtime.package.model_config import tensor
from runtime.package.repository import repository_configs
from runtime.package.triton_models import MODEL_REPOSITORY
from runtime.serving_backend import BACKEND_NAME, RESPONSE_HOOK, STOCK_BACKEND_NAME

__all__ = [
    "engine_gpus",
    "instance_kind",
    "link_catalogs",
    "plugin_processors",
    "render_repository",
    "vllm_backend_for",
]

#: The entry-point group from which vLLM loads logits processors into every engine.
LOGITS_PROCESSORS_GROUP = "vllm.logits_processors"
#: vLLM's structured-output settings that let a model end its JSON: guidance keeps JSON's
#: string grammar (xgrammar 0.2.9 lets raw control characters into strings, which JSON parsers
#: and the frontend refuse), and no free whitespace between tokens (models loop on it until
#: max_tokens). Measured on the real engine: tests/frontend/test_frontend_structured_real_engine.py.
STRUCTURED_OUTPUTS_DEFAULTS: dict[str, object] = {
    "backend": "guidance",
    "disable_any_whitespace": True,
}
#: The backends that take ``disable_any_whitespace`` (vLLM refuses it for the others).
_WHITESPACE_BACKENDS = ("xgrammar", "guidance")


def _config(name: str, backend: str, kind: str) -> Any:
    """A decoupled model with one instance of ``kind``, in Triton's own ``ModelConfig`` schema
    (a field Triton lacks fails here, not at load time; names are escaped by protobuf)."""
    return mc.ModelConfig(
        name=name,
        backend=backend,
        max_batch_size=0,
        model_transaction_policy=mc.ModelTransactionPolicy(decoupled=True),
        instance_group=[
            mc.ModelInstanceGroup(count=1, kind=mc.ModelInstanceGroup.Kind.Value(kind))
        ],
    )


def vllm_backend_for(pair: CompatPair) -> tuple[str, str | None]:
    """The Triton backend ``vllm`` packages get on ``pair``, and why it is not ours (or None).

    Ours (`BACKEND_NAME`) for every ``vllm`` package, not only ones that opt in: it changes no
    response but those that ask for prompt log-probabilities, and a per-package switch would
    only make ``/v1/score`` fail by configuration. It overrides one stock method, so it is
    rendered only where ``images/compat.toml`` records that method as the pair's hook.
    """
    if pair.response_hook == RESPONSE_HOOK:
        return BACKEND_NAME, None
    found = pair.response_hook or "not established"
    return STOCK_BACKEND_NAME, (
        f"the stock vLLM backend's response hook on Triton {pair.triton} is {found}, not "
        f"{RESPONSE_HOOK}, which {BACKEND_NAME} overrides: rendering backend "
        f'"{STOCK_BACKEND_NAME}", so /v1/score answers 501'
    )


#: vLLM 0.27.1's ``ParallelConfig``: ``world_size`` is pipeline x tensor x prefill-context
#: parallel (decode context parallelism reuses the tensor-parallel ranks), and each of the
#: ``data_parallel_size`` engine cores gets a world of its own (``world_size_across_dp``).
_ENGINE_SIZES = (
    "pipeline_parallel_size",
    "tensor_parallel_size",
    "prefill_context_parallel_size",
    "data_parallel_size",
)


def engine_gpus(engine_args: dict[str, object]) -> int:
    """GPUs one vLLM engine spans, as vLLM's ``ParallelConfig.world_size_across_dp`` counts
    them; the manifest holds these sizes as integers of at least 1."""
    gpus = 1
    for key in _ENGINE_SIZES:
        size = engine_args.get(key, 1)
        assert isinstance(size, int), f"engine_args.{key} passed the manifest as {size!r}"
        gpus *= size
    return gpus


def instance_kind(engine_args: dict[str, object], setting: str = "auto") -> str:
    """The ``instance_group`` kind of a vllm model: ``setting`` (`EntrypointSettings`'s
    ``instance_kind``) unless ``auto``, which is ``KIND_GPU`` for a one-GPU engine only
    (`engine_gpus`)."""
    if setting == "model":
        return "KIND_MODEL"
    if setting == "gpu":
        return "KIND_GPU"
    # For KIND_GPU the stock vLLM backend sets CUDA_VISIBLE_DEVICES to the instance's one
    # device, so an engine spanning more GPUs could not see them and would fail to load.
    return "KIND_MODEL" if engine_gpus(engine_args) > 1 else "KIND_GPU"


def _vllm_config(name: str, backend: str, kind: str) -> str:
    config = _config(name, backend, kind)
    for key in ("REPORT_CUSTOM_METRICS", "ENABLE_VLLM_HEALTH_CHECK"):
        config.parameters[key].string_value = "true"
    return str(text_format.MessageToString(config))


def _python_config(name: str, manifest: Manifest) -> str:
    assert manifest.python_model is not None  # checked by the caller
    config = _config(name, "python", "KIND_MODEL")
    config.input.extend(tensor(t, mc.ModelInput) for t in manifest.python_model.inputs)
    config.output.extend(tensor(t, mc.ModelOutput) for t in manifest.python_model.outputs)
    return str(text_format.MessageToString(config))


def engine_arguments(
    manifest: Manifest,
    version_dir: Path,
    unpacked: Path,
    logits_processor: str,
    plugin_dir: Path | None = None,
    structured_outputs: bool = True,
) -> dict[str, object]:
    """``model.json``: the manifest's engine args plus the paths and settings we always need.

    ``structured_outputs``: the pair's vLLM takes ``structured_outputs_config`` (0.11 and
    later), which gets :data:`STRUCTURED_OUTPUTS_DEFAULTS` under the manifest's own keys.
    """
    args: dict[str, object] = dict(manifest.engine_args)
    if structured_outputs:
        args["structured_outputs_config"] = structured_outputs_config(
            args.get("structured_outputs_config")
        )
    args["model"] = str(version_dir / manifest.weights)
    assert manifest.tokenizer is not None  # every LLM backend has one (the manifest's check)
    args["tokenizer"] = str(unpacked / manifest.tokenizer)
    # The vLLM backend bridges metrics only when stats are logged.
    args["disable_log_stats"] = False
    # vLLM adds every entry-point processor to the ones model.json names, without removing
    # doubles: a processor in both would mask every row twice and count every event twice.
    plugins = plugin_processors(plugin_dir)
    named = [*(args.get("logits_processors") or []), logits_processor]  # type: ignore[misc]
    args["logits_processors"] = [p for p in dict.fromkeys(named) if p not in plugins]
    return args


def structured_outputs_config(given: object) -> object:
    """The manifest's ``structured_outputs_config`` over our defaults (a non-mapping as given)."""
    if given is None:
        return dict(STRUCTURED_OUTPUTS_DEFAULTS)
    if not isinstance(given, dict):
        return given  # vLLM reports what it cannot read; we do not guess
    merged = {**STRUCTURED_OUTPUTS_DEFAULTS, **given}
    if "disable_any_whitespace" not in given and merged["backend"] not in _WHITESPACE_BACKENDS:
        del merged["disable_any_whitespace"]
    return merged


def plugin_processors(plugin_dir: Path | None = None) -> frozenset[str]:
    """``module:Class`` of every logits processor vLLM loads from entry points, as Triton's
    Python finds them: ``plugin_dir`` (``LLM_SERVING_PLUGIN_DIR``) first, then ``sys.path``."""
    path = ([str(plugin_dir)] if plugin_dir is not None else []) + sys.path
    seen: set[str] = set()
    found: set[str] = set()
    for dist in md.distributions(path=path):
        name = canonicalize_name(dist.metadata["Name"] or "")
        if name in seen:
            continue  # the first copy on the path is the one imported, as in entry_points()
        seen.add(name)
        found.update(ep.value for ep in dist.entry_points if ep.group == LOGITS_PROCESSORS_GROUP)
    return frozenset(found)


def link_catalogs(manifest: Manifest, unpacked: Path, folder: Path) -> Path:
    """A fresh ``folder`` holding ``<name>.jsonl`` -> each manifest catalog in the package.

    This is the ``LLM_SERVING_CATALOG_DIR`` the constraint processor reads: the manifest names
    catalogs freely (any path in the archive), the processor finds them by name. A catalog
    matched in decoded mode also gets its ``<name>.meta.json`` sidecar; canonical is the
    default when there is none.
    """
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for catalog in manifest.catalogs:
        (folder / f"{catalog.name}.jsonl").symlink_to(unpacked / catalog.path)
        if catalog.matching != "canonical":
            meta = {"matching": catalog.matching}
            (folder / f"{catalog.name}.meta.json").write_text(json.dumps(meta) + "\n")
    return folder


def _render_models(manifest: Manifest, version_dir: Path, repository: Path) -> Path:
    """Each model's ``config.pbtxt`` for this image, and its version folder's files as links to
    the verified copies in the version folder (the weights are never copied)."""
    configs = repository_configs(manifest.model_id, manifest.models, manifest.ensemble)
    for name, text in configs.items():
        (repository / name / "1").mkdir(parents=True, exist_ok=True)
        (repository / name / "config.pbtxt").write_text(text)
    prefix = f"{MODEL_REPOSITORY}/"
    for entry in manifest.weight_files:
        relative = entry.path.removeprefix(prefix)
        if relative.count("/") < 2:
            continue  # a config.pbtxt, rendered above for this release
        link = repository / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(version_dir / entry.path)
    return repository / manifest.model_id


def render_repository(
    manifest: Manifest,
    version_dir: Path,
    unpacked: Path,
    repository: Path,
    logits_processor: str,
    vllm_backend: str = BACKEND_NAME,
    plugin_dir: Path | None = None,
    structured_outputs: bool = True,
    kind_setting: str = "auto",
) -> Path:
    """Write ``<repository>/<model_id>/`` (config.pbtxt and version 1); returns the model dir.

    A non-LLM package's models (and its ensemble) get their ``config.pbtxt`` rendered here and
    their files linked from the version folder's ``model_repository/``; no ``model.json``.

    ``vllm_backend`` is the backend ``vllm`` packages name (`vllm_backend_for` the pair);
    ``plugin_dir`` is where stage 3 installed the plugins, if not into site-packages;
    ``structured_outputs`` whether the pair's vLLM takes ``structured_outputs_config``;
    ``kind_setting`` the entrypoint's ``instance_kind`` (see `instance_kind`).
    """
    if repository.exists():
        shutil.rmtree(repository)
    if manifest.backend not in LLM_BACKENDS:
        return _render_models(manifest, version_dir, repository)
    model_dir = repository / manifest.model_id
    version = model_dir / "1"
    version.mkdir(parents=True)
    if manifest.backend == "vllm":
        kind = instance_kind(manifest.engine_args, kind_setting)
        config = _vllm_config(manifest.model_id, vllm_backend, kind)
    else:
        config = _python_config(manifest.model_id, manifest)
        assert manifest.python_model is not None
        source = (unpacked / manifest.python_model.model_file).parent
        shutil.copytree(source, version, dirs_exist_ok=True)
        if (version / Path(manifest.python_model.model_file).name) != version / "model.py":
            shutil.copyfile(unpacked / manifest.python_model.model_file, version / "model.py")
    # Written after the python model's files so that ours is what runs: the python backend's
    # model.py may run vLLM itself, so it gets the same engine arguments.
    args = engine_arguments(
        manifest, version_dir, unpacked, logits_processor, plugin_dir, structured_outputs
    )
    (version / "model.json").write_text(json.dumps(args, indent=2, sort_keys=True) + "\n")
    (model_dir / "config.pbtxt").write_text(config)
    return model_dir
