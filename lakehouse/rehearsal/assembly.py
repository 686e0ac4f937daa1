"""A synthesized CDK cloud assembly read the way CloudFormation would deploy it.

Only what the templates and the staged assets say is used: intrinsic functions are evaluated with
a value for every pseudo parameter, and a resource's `Ref`/`Fn::GetAtt` asks a `ResourceValues`
(the rehearsal's substitutes for AWS). A resource without a substitute resolves to a marker
(`<<unresolved:…>>`), so a whole state machine definition can be read; `require_resolved` fails
when such a marker reaches anything the rehearsal runs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path


class AssemblyError(RuntimeError):
    """The cloud assembly does not hold what the rehearsal needs; the message says what."""


@dataclass(frozen=True)
class Resource:
    stack: str
    logical_id: str
    type: str
    properties: dict


# (resource, attribute or None for Ref) -> value; None when there is no substitute.
ResourceValues = Callable[[Resource, str | None], str | None]

UNRESOLVED = "<<unresolved:"
_SUB_VARIABLE = re.compile(r"\$\{([^}!][^}]*)\}")


class CloudAssembly:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        manifest_path = self.directory / "manifest.json"
        if not manifest_path.exists():
            raise AssemblyError(
                f"{self.directory} is not a cloud assembly (no manifest.json): run `make synth`"
            )
        manifest = json.loads(manifest_path.read_text())
        self.templates: dict[str, dict] = {}
        self.asset_manifests: dict[str, dict] = {}
        for artifact_id, artifact in manifest["artifacts"].items():
            properties = artifact.get("properties", {})
            if artifact["type"] == "aws:cloudformation:stack":
                name = properties.get("stackName", artifact_id)
                self.templates[name] = json.loads((self.directory / properties["templateFile"]).read_text())
            elif artifact["type"] == "cdk:asset-manifest":
                self.asset_manifests[artifact_id] = json.loads(
                    (self.directory / properties["file"]).read_text()
                )

    def resources(self, resource_type: str) -> Iterator[Resource]:
        for stack, template in self.templates.items():
            for logical_id, body in template.get("Resources", {}).items():
                if body["Type"] == resource_type:
                    yield Resource(stack, logical_id, body["Type"], body.get("Properties", {}))

    def only(self, resource_type: str) -> Resource:
        found = list(self.resources(resource_type))
        if len(found) != 1:
            raise AssemblyError(f"expected one {resource_type} in the assembly, found {len(found)}")
        return found[0]

    def resource(self, stack: str, logical_id: str) -> Resource:
        try:
            body = self.templates[stack]["Resources"][logical_id]
        except KeyError:
            raise AssemblyError(f"{stack} has no resource {logical_id}") from None
        return Resource(stack, logical_id, body["Type"], body.get("Properties", {}))

    def file_asset(self, object_key: str) -> tuple[Path, str]:
        """(staged path, packaging) of the file asset uploaded under `object_key` (`<hash>.zip`)."""
        asset_hash = object_key.removesuffix(".zip")
        for manifest in self.asset_manifests.values():
            entry = manifest.get("files", {}).get(asset_hash)
            if entry:
                return self.directory / entry["source"]["path"], entry["source"].get("packaging", "file")
        raise AssemblyError(f"no staged asset for S3 key {object_key} in {self.directory}")


class Resolver:
    """Evaluates CloudFormation intrinsics over the assembly's templates."""

    def __init__(self, assembly: CloudAssembly, pseudo: dict[str, str], values: ResourceValues) -> None:
        self.assembly = assembly
        self.pseudo = pseudo
        self.values = values

    def resolve(self, stack: str, value):
        if isinstance(value, list):
            return [self.resolve(stack, v) for v in value]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((key, arg),) = value.items()
            if key == "Ref":
                return self._ref(stack, arg)
            if key == "Fn::GetAtt":
                logical_id, attribute = arg if isinstance(arg, list) else arg.split(".", 1)
                return self._resource_value(stack, logical_id, attribute)
            if key == "Fn::Join":
                separator, parts = arg
                return separator.join(str(p) for p in self.resolve(stack, parts))
            if key == "Fn::Sub":
                return self._sub(stack, arg)
            if key == "Fn::Select":
                index, items = arg
                return self.resolve(stack, items)[int(self.resolve(stack, index))]
            if key == "Fn::GetStackOutput":
                other = self.resolve(stack, arg["StackName"])
                return self._output(other, arg["OutputName"])
            if key == "Fn::ImportValue":
                return self._import(self.resolve(stack, arg))
            if key.startswith("Fn::"):
                raise AssemblyError(f"{stack}: intrinsic {key} is not supported by the rehearsal")
        return {k: self.resolve(stack, v) for k, v in value.items()}

    def _ref(self, stack: str, name: str) -> str:
        if name == "AWS::StackName":
            return stack
        if name in self.pseudo:
            return self.pseudo[name]
        parameter = self.assembly.templates[stack].get("Parameters", {}).get(name)
        if parameter is not None and str(parameter.get("Type", "")).startswith("AWS::SSM::Parameter::Value"):
            return self._ssm_parameter(str(parameter["Default"]))
        if parameter is not None:
            return str(parameter.get("Default", f"{UNRESOLVED}parameter {name}>>"))
        return self._resource_value(stack, name, None)

    def _ssm_parameter(self, name: str) -> str:
        """An SSM-typed template parameter as CloudFormation resolves it at deploy: the value of the
        parameter of that name, here the one a stack of the assembly creates."""
        for other, template in self.assembly.templates.items():
            for resource in template.get("Resources", {}).values():
                properties = resource.get("Properties", {})
                if resource["Type"] == "AWS::SSM::Parameter" and properties.get("Name") == name:
                    return str(self.resolve(other, properties["Value"]))
        return f"{UNRESOLVED}SSM parameter {name}>>"

    def _resource_value(self, stack: str, logical_id: str, attribute: str | None) -> str:
        resource = self.assembly.resource(stack, logical_id)
        value = self.values(resource, attribute)
        if value is None:
            what = f"{logical_id}.{attribute}" if attribute else logical_id
            return f"{UNRESOLVED}{resource.type} {stack}/{what}>>"
        return value

    def _sub(self, stack: str, arg) -> str:
        text, variables = (arg, {}) if isinstance(arg, str) else (arg[0], self.resolve(stack, arg[1]))

        def replace(match: re.Match) -> str:
            name = match.group(1)
            if name in variables:
                return str(variables[name])
            if "." in name and not name.startswith("AWS::"):
                logical_id, attribute = name.split(".", 1)
                return self._resource_value(stack, logical_id, attribute)
            return self._ref(stack, name)

        return _SUB_VARIABLE.sub(replace, text)

    def _output(self, stack: str, output_name: str):
        try:
            output = self.assembly.templates[stack]["Outputs"][output_name]
        except KeyError:
            raise AssemblyError(f"stack {stack} has no output {output_name}") from None
        return self.resolve(stack, output["Value"])

    def _import(self, export_name: str):
        for stack, template in self.assembly.templates.items():
            for output in template.get("Outputs", {}).values():
                export = output.get("Export", {}).get("Name")
                if export is not None and self.resolve(stack, export) == export_name:
                    return self.resolve(stack, output["Value"])
        raise AssemblyError(f"no stack exports {export_name}")


def require_resolved(what: str, value) -> None:
    """Fail when a value the rehearsal is about to use points at an AWS resource it cannot stand in for."""
    text = json.dumps(value)
    if UNRESOLVED in text:
        start = text.index(UNRESOLVED)
        raise AssemblyError(f"{what} uses {text[start : text.index('>>', start) + 2]}: no local substitute")
