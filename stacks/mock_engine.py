"""Run a stack program under Pulumi's mock engine and record every resource it declares.

This is what the offline plan and the component tests run instead of the Pulumi CLI and a
cloud account. Outputs only the cloud knows stay unknown, as in a preview (shown as computed);
provider functions (``getCluster``, ``getObject``, ...) and the global stack's outputs behind
``StackReference`` are answered with stand-ins. The module needs only Pulumi and PyYAML, so
``python stacks/mock_engine.py ROOT STACK GLOBAL_OUTPUTS_JSON OUT_JSON`` can run another
revision's program (``llm-serving plan --against``) from that revision's own checkout.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import runpy
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import yaml
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc
from pulumi.runtime.proto import resource_pb2

__all__ = [
    "COMPUTED",
    "MOCK_ACCOUNT",
    "DuplicateURNError",
    "PlanMocks",
    "ProgramRun",
    "RecordedResource",
    "auto_name",
    "ensure_event_loop",
    "run_program",
    "stack_config_strings",
]

COMPUTED = "(computed)"
MOCK_ACCOUNT = "123456789012"
STACK_REFERENCE = "pulumi:pulumi:StackReference"
# Output properties the cloud computes inside an object the program passes in (the engine marks
# absent top-level outputs unknown by itself, but a nested one would read as null). Dotted paths
# into the outputs; filled only where the program did not set them.
NESTED_COMPUTED_OUTPUTS: dict[str, tuple[str, ...]] = {
    "aws:eks/cluster:Cluster": ("vpcConfig.clusterSecurityGroupId", "vpcConfig.vpcId"),
}


class DuplicateURNError(Exception):
    """The program declared a resource whose URN (type chain and name) it declared before."""


@dataclass
class RecordedResource:
    """One resource as the program declared it."""

    urn: str
    type: str
    name: str
    parent: str
    custom: bool
    inputs: dict[str, Any]
    dependencies: list[str] = field(default_factory=list)
    property_dependencies: dict[str, list[str]] = field(default_factory=dict)
    """Per input property, the resources its value came from (what a policy pack sees)."""
    options: dict[str, Any] = field(default_factory=dict)
    """The resource options the engine acts on that were set: ``protect``,
    ``retainOnDelete``, ``deleteBeforeReplace``, ``ignoreChanges``, ``replaceOnChanges``."""

    @property
    def key(self) -> str:
        """Type and name: what identifies a resource between two plans."""
        return f"{self.type}::{self.name}"


@dataclass
class ProgramRun:
    """Everything one run of a stack program declared."""

    resources: list[RecordedResource]
    outputs: dict[str, Any]


def _plain(value: Any) -> Any:
    """Inputs as plain data: unknown values become :data:`COMPUTED`."""
    if isinstance(value, pulumi.output.Unknown) or value == rpc.UNKNOWN:
        return COMPUTED
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if not str(k).startswith("__")}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        # The engine's wire format (protobuf Struct) carries every number as a double.
        return int(value)
    if isinstance(value, pulumi.Resource):
        return f"<resource {type(value).__name__}>"
    return value


class _RecordingMonitor(pulumi_mocks.MockMonitor):
    """The SDK's mock monitor, also keeping each registration's parent and dependencies, and
    refusing a repeated URN as the engine does (the SDK's mock keeps the last one).

    The SDK calls the monitor from its executor's threads, several registrations at once, so
    the records' order varies from run to run and the URN check holds a lock.
    """

    def __init__(self, mocks: pulumi_mocks.Mocks) -> None:
        super().__init__(mocks)
        self.records: list[RecordedResource] = []
        self._urns: set[str] = set()
        self._lock = threading.Lock()

    def _record(
        self,
        request: Any,
        urn: str,
        properties: Any,
        custom: bool,
        property_dependencies: dict[str, list[str]] | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        record = RecordedResource(
            urn=urn,
            type=request.type,
            name=request.name,
            parent=request.parent,
            custom=custom,
            inputs=_plain(rpc.deserialize_properties(properties, keep_unknowns=True)),
            dependencies=sorted(request.dependencies),
            property_dependencies=property_dependencies or {},
            options=options or {},
        )
        # Two registrations of one URN on two threads must not both pass the check.
        with self._lock:
            if urn in self._urns:
                # The engine's own words (pulumi pkg/diag/errors.go, error 2001).
                raise DuplicateURNError(
                    f"Duplicate resource URN '{urn}'; try giving it a unique name"
                )
            self._urns.add(urn)
            self.records.append(record)

    def RegisterResource(self, request: Any) -> Any:
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            self._record(
                request,
                response.urn,
                request.object,
                bool(request.custom),
                {key: sorted(deps.urns) for key, deps in request.propertyDependencies.items()},
                _options(request),
            )
        return response

    def ReadResource(self, request: Any) -> Any:
        # The SDK's mock leaves a read's id empty, which a preview takes as unknown; a stack
        # reference's id must be known or every invoke that depends on it turns unknown too.
        response = super().ReadResource(request)
        self._record(request, response.urn, request.properties, custom=True)
        return resource_pb2.ReadResourceResponse(
            urn=response.urn, properties=response.properties, id=request.id
        )


def _options(request: Any) -> dict[str, Any]:
    """The engine-facing options a registration set (the unset ones are left out, so that two
    plans differ only where an option does)."""
    options: dict[str, Any] = {
        "protect": request.protect,
        "retainOnDelete": request.retainOnDelete,
        "deleteBeforeReplace": request.deleteBeforeReplace,
        "ignoreChanges": sorted(request.ignoreChanges),
        "replaceOnChanges": sorted(request.replaceOnChanges),
    }
    return {key: value for key, value in options.items() if value}


class PlanMocks(pulumi_mocks.Mocks):
    """Answers resource registrations and provider functions without a cloud.

    Outputs that the cloud would compute stay unknown, as in a preview; the global stack's
    outputs, the account, an adopted cluster (at ``adopted_cluster_version``) and each
    version's ``manifest.json`` (with ``serving_mode``) are stand-ins.
    """

    def __init__(
        self,
        global_outputs: Mapping[str, Any],
        serving_mode: str = "embedded",
        adopted_cluster_version: str = "1.33",
    ) -> None:
        self.global_outputs = dict(global_outputs)
        self.serving_mode = serving_mode
        self.adopted_cluster_version = adopted_cluster_version

    def new_resource(self, args: pulumi_mocks.MockResourceArgs) -> tuple[str | None, dict]:
        outputs = dict(args.inputs)
        if args.typ == STACK_REFERENCE:
            return args.name, {**outputs, "outputs": self.global_outputs}
        metadata = outputs.get("metadata")
        if (
            args.typ.startswith("kubernetes:")
            and isinstance(metadata, dict)
            and "name" not in metadata
        ):
            outputs["metadata"] = {**metadata, "name": auto_name(args.name)}
        for path in NESTED_COMPUTED_OUTPUTS.get(args.typ, ()):
            _set_unknown(outputs, path.split("."))
        return "", outputs

    def call(self, args: pulumi_mocks.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        # An empty failure list, not None: the mock monitor iterates it whatever its type says.
        return self._call(args), []

    def _call(self, args: pulumi_mocks.MockCallArgs) -> dict[str, Any]:
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {
                "accountId": MOCK_ACCOUNT,
                "arn": f"arn:aws:iam::{MOCK_ACCOUNT}:user/plan",
                "userId": "plan",
                "id": MOCK_ACCOUNT,
            }
        if args.token == "aws:eks/getCluster:getCluster":
            return {
                "id": args.args["name"],
                **_cluster_outputs(args.args["name"]),
                "version": self.adopted_cluster_version,
            }
        if args.token == "aws:iam/getOpenIdConnectProvider:getOpenIdConnectProvider":
            url = args.args.get("url", "")
            return {"arn": f"arn:aws:iam::{MOCK_ACCOUNT}:oidc-provider/{url}", "url": url}
        if args.token == "aws:s3/getObject:getObject":
            return {
                "body": json.dumps({"serving_mode": self.serving_mode}),
                "bucket": args.args.get("bucket"),
                "key": args.args.get("key"),
            }
        return {}


def _set_unknown(outputs: dict[str, Any], path: list[str]) -> None:
    """Mark ``path`` unknown in ``outputs`` (as a preview would show it) unless it is set."""
    *parents, leaf = path
    node = outputs
    for key in parents:
        child = node.get(key)
        node[key] = child = dict(child) if isinstance(child, Mapping) else {}
        node = child
    if node.get(leaf) is None:
        node[leaf] = rpc.UNKNOWN


def auto_name(resource_name: str) -> str:
    """The ``metadata.name`` pulumi-kubernetes gives an object declared without one (already
    in a preview): the resource name and a suffix, random there, derived from the name here so
    that two plans compare."""
    return f"{resource_name}-{hashlib.sha256(resource_name.encode()).hexdigest()[:8]}"


def _cluster_outputs(name: str) -> dict[str, Any]:
    """What ``getCluster`` answers for an adopted cluster."""
    return {
        "name": name,
        "endpoint": f"https://{name}.eks.mock.amazonaws.com",
        "identities": [{"oidcs": [{"issuer": f"https://oidc.eks.mock.amazonaws.com/id/{name}"}]}],
        "vpcConfig": {
            "clusterSecurityGroupId": f"sg-{hashlib.sha256(name.encode()).hexdigest()[:17]}"
        },
        "certificateAuthorities": [{"data": "bW9jaw=="}],
    }


async def _resolve(value: Any) -> Any:
    """An exported value as plain data, each unknown leaf shown as :data:`COMPUTED`."""
    if isinstance(value, Mapping):
        return {str(k): await _resolve(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [await _resolve(v) for v in value]
    output = pulumi.Output.from_input(value)
    if not await output.is_known():
        return COMPUTED
    return _plain(await output.future())


def stack_config_strings(stack_file: Path) -> dict[str, str]:
    """A stack file's ``config:`` as the engine passes it: structured values as JSON text."""
    document = yaml.safe_load(stack_file.read_text()) if stack_file.is_file() else None
    config = (document or {}).get("config") or {}
    return {
        # default=str: YAML reads an unquoted 2026-10-01 as a date, which Pulumi passes as text.
        key: value if isinstance(value, str) else json.dumps(value, default=str)
        for key, value in config.items()
    }


def ensure_event_loop() -> None:
    """Give this thread an open event loop if it has none.

    Pulumi's synchronous helpers run on the thread's current loop, and an earlier
    ``asyncio.run()`` in the same process leaves none set. An existing open loop is kept:
    Pulumi's runtime state from earlier runs in this process is bound to it.
    """
    try:
        loop = asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        loop = None
    if loop is None or loop.is_closed():
        asyncio.set_event_loop(asyncio.new_event_loop())


def run_program(
    program: Path | Callable[[], None],
    stack: str,
    config: Mapping[str, str],
    mocks: PlanMocks,
    *,
    preview: bool = True,
    project: str = "llm-serving",
) -> ProgramRun:
    """Run ``program`` (a ``__main__.py``, or a function) as ``stack`` with ``config``.

    Returns every resource the program declared and its resolved stack outputs.
    """
    from pulumi.runtime.settings import ROOT, SETTINGS
    from pulumi.runtime.stack import run_pulumi_func
    from pulumi.runtime.sync_await import _sync_await

    ensure_event_loop()
    ROOT.set(None)
    monitor = _RecordingMonitor(mocks)
    pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=preview, monitor=monitor)
    # Outputs made outside any run (a pure function such as build_pod_template called on its
    # own) stay tracked on a loop that never runs again; the run would wait for them forever.
    with SETTINGS.lock:
        SETTINGS.outputs.clear()
    pulumi.runtime.set_all_config(dict(config))
    exported: dict[str, Any] = {}

    def program_body() -> Awaitable[None]:
        if callable(program):
            program()
        else:
            runpy.run_path(str(program), run_name="__main__")
        root = pulumi.runtime.get_root_resource()
        outputs = dict(getattr(root, "outputs", {}))
        names = sorted(outputs)

        async def resolve() -> None:
            for name in names:
                exported[name] = await _resolve(outputs[name])

        return resolve()

    _sync_await(run_pulumi_func(program_body))
    return ProgramRun(resources=list(monitor.records), outputs=exported)


def _main(argv: list[str]) -> int:
    """Run another checkout's program: ``ROOT STACK GLOBAL_OUTPUTS_JSON OUT_JSON``."""
    root, stack, global_outputs, out = Path(argv[0]), argv[1], argv[2], Path(argv[3])
    # That checkout's packages must win over the editable install of this one.
    sys.meta_path[:] = [f for f in sys.meta_path if "Redirecting" not in type(f).__name__]
    sys.path.insert(0, str(root))
    program = root / "stacks" / "__main__.py"
    run = ProgramRun(resources=[], outputs={})
    if program.is_file():
        config = stack_config_strings(root / "stacks" / f"Pulumi.{stack}.yaml")
        run = run_program(program, stack, config, PlanMocks(json.loads(global_outputs)))
    out.write_text(
        json.dumps({"resources": [asdict(r) for r in run.resources], "outputs": run.outputs})
    )
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
