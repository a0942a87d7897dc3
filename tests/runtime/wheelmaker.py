"""Build small, installable plugin wheels and model source trees for the package tests."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import zipfile
from pathlib import Path

import yaml
from tokenizers import Tokenizer, models, pre_tokenizers

from runtime.package import build_package

#: The toy plugin's entry point: every plugin wheel a package builds with needs one.
TOY_ENTRY_POINTS = {"vllm.logits_processors": {"toy": "toy_plugin:Processor"}}


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def make_wheel(
    folder: Path,
    name: str,
    version: str = "1.0",
    requires: tuple[str, ...] = (),
    entry_points: dict[str, dict[str, str]] | None = None,
    module_source: str = "VALUE = 1\n",
    files: dict[str, bytes] | None = None,
    package: str | None = None,
) -> Path:
    """Write ``<name>-<version>-py3-none-any.whl`` with one package, ``package`` or named after
    the distribution (and ``files``, more members by path)."""
    module = name.replace("-", "_")
    dist_info = f"{module}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {
        f"{package or module}/__init__.py": module_source.encode(),
        f"{dist_info}/METADATA": metadata.encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
        **(files or {}),
    }
    if entry_points:
        text = "".join(
            f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items())
            for group, eps in entry_points.items()
        )
        files[f"{dist_info}/entry_points.txt"] = text.encode()
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in files.items())
    record += f"{dist_info}/RECORD,,\n"
    files[f"{dist_info}/RECORD"] = record.encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for file_name, data in files.items():
            archive.writestr(file_name, data)
    return path


def save_tokenizer(folder: Path) -> None:
    """A WordLevel tokenizer built in code (no downloads), saved as ``tokenizer.json``."""
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(["the", "quick", "brown", "fox"])}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))


def write_catalog(path: Path, items: dict[str, str]) -> None:
    """A constraint-engine catalog: JSONL of ``{"id", "text"}``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in items.items()))


def make_toy_plugin(plugins: Path, *requires: str) -> Path:
    """The toy package's plugin wheel (``package.yaml`` lists it by name), requiring
    ``requires``; written over the one `make_source` made, it changes what the package ships."""
    return make_wheel(plugins, "toy-plugin", requires=requires, entry_points=TOY_ENTRY_POINTS)


def make_source(root: Path, **spec_overrides: object) -> Path:
    """A model source tree: tokenizer, weights, a catalog, a logits-processor plugin wheel."""
    save_tokenizer(root / "tokenizer")
    (root / "weights").mkdir(parents=True, exist_ok=True)
    (root / "weights" / "model.safetensors").write_bytes(b"\x00" * 4096)
    (root / "weights" / "config.json").write_text(json.dumps({"architectures": ["Toy"]}))
    (root / "catalogs").mkdir(exist_ok=True)
    write_catalog(root / "catalogs" / "titles.jsonl", {"t1": "the quick", "t2": "brown fox"})
    make_toy_plugin(root / "plugins", "vllm==0.27.1", "numpy>=1")
    spec: dict[str, object] = {
        "model_id": "toy",
        "model_version": "v1",
        "engine_args": {"max_model_len": 128},
        "plugins": ["plugins/toy_plugin-1.0-py3-none-any.whl"],
        "catalogs": [{"name": "titles", "path": "catalogs/titles.jsonl"}],
    }
    spec.update(spec_overrides)
    (root / "package.yaml").write_text(yaml.safe_dump(spec))
    return root


def source_with_sneaky_plugin(root: Path, files: dict[str, bytes]) -> Path:
    """The toy source tree under ``root`` with one more plugin wheel, ``sneaky`` (a general
    plugin), that ships ``files``."""
    source = make_source(root)
    entry_points = {"vllm.general_plugins": {"sneaky": "sneaky:register"}}
    wheel = make_wheel(source / "plugins", "sneaky", entry_points=entry_points, files=files)
    spec = yaml.safe_load((source / "package.yaml").read_text())
    spec["plugins"].append(f"plugins/{wheel.name}")
    (source / "package.yaml").write_text(yaml.safe_dump(spec))
    return source


def build_multipart_version(root: Path, weight_bytes: int = 12 << 20) -> Path:
    """A built package whose distinct weight bytes (12 MiB: three 5 MiB parts, the last one
    short) go up as a multipart upload."""
    source = make_source(root / "src")
    (source / "weights" / "model.safetensors").write_bytes(os.urandom(weight_bytes))
    build_package(source, root / "out")
    return root / "out"
