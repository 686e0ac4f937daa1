"""Synthesizes the CDK app once per environment for the whole tests/infra session.

No AWS credentials, no CLI: the app is built in-process with the context of cdk.json (the feature
flags the CLI would pass) and `-c env=<env>`, exactly like `cdk synth -c env=<env>`. cdk-nag runs as
a validation plugin during synth; if it reports findings, the report is kept for the nag test and
the app is rebuilt without the plugin so the other tests still say what else is wrong.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App, CfnElement, Stack
from aws_cdk.assertions import Template
from cfn import as_list

from infra.config import DeploymentConfig
from infra.lakehouse_app import build_lakehouse, config_from_context
from infra.stacks import LakehouseStacks

REPO_ROOT = Path(__file__).resolve().parents[2]
CONCERNS = ("Network", "Lake", "Streaming", "SourceDatabase", "Compute", "Monitoring", "Jobs")


@dataclass(frozen=True)
class Target:
    """The resource a reference (Ref, Fn::GetAtt, Fn::GetStackOutput, Fn::ImportValue) points at."""

    concern: str
    logical_id: str
    attribute: str | None  # None for a Ref
    resource: dict = field(compare=False, repr=False)

    @property
    def type(self) -> str:
        return self.resource["Type"]

    @property
    def properties(self) -> dict:
        return self.resource.get("Properties", {})


@dataclass
class SynthesizedEnv:
    config: DeploymentConfig
    app: App
    stacks: LakehouseStacks
    outdir: Path
    nag_report: str | None
    templates: dict[str, dict] = field(default_factory=dict)  # concern -> template JSON

    def template(self, concern: str) -> Template:
        return Template.from_json(self.templates[concern])

    def logical_id(self, construct) -> str:
        """The logical id of a construct's CloudFormation resource (an L2's default child)."""
        resource = construct if isinstance(construct, CfnElement) else construct.node.default_child
        return Stack.of(resource).get_logical_id(resource)

    def resources(self, concern: str, kind: str) -> dict[str, dict]:
        """Logical id -> resource, for the resources of one type in one concern's template."""
        return {k: r for k, r in self.templates[concern]["Resources"].items() if r["Type"] == kind}

    def resolve(self, concern: str, value: Any) -> Target:
        """The resource `value` (in `concern`'s template) refers to, across stacks: a
        Fn::GetStackOutput/Fn::ImportValue is followed to the producing stack's output. Anything that
        is not a reference to a resource of these templates fails the test."""
        if isinstance(value, dict) and len(value) == 1:
            ((function, argument),) = value.items()
            if function == "Ref" and isinstance(argument, str) and not argument.startswith("AWS::"):
                parameter = self.templates[concern].get("Parameters", {}).get(argument)
                if parameter and parameter["Type"].startswith("AWS::SSM::Parameter::Value"):
                    return self.resolve(*self._ssm_parameter_value(parameter["Default"]))
                return self._target(concern, argument, None)
            if function == "Fn::GetAtt":
                logical_id, attribute = argument if isinstance(argument, list) else argument.split(".", 1)
                return self._target(concern, logical_id, attribute)
            if function == "Fn::GetStackOutput":
                producer = self._concern_of_stack(argument["StackName"])
                outputs = self.templates[producer].get("Outputs", {})
                assert argument["OutputName"] in outputs, f"{producer} has no output {argument}"
                return self.resolve(producer, outputs[argument["OutputName"]]["Value"])
            if function == "Fn::ImportValue" and isinstance(argument, str):
                found = [
                    (producer, output["Value"])
                    for producer, template in self.templates.items()
                    for output in template.get("Outputs", {}).values()
                    if output.get("Export", {}).get("Name") == argument
                ]
                assert len(found) == 1, f"export {argument}: {found}"
                return self.resolve(*found[0])
        raise AssertionError(f"{concern}: not a reference to a resource: {json.dumps(value)}")

    def try_resolve(self, concern: str, value: Any) -> Target | None:
        try:
            return self.resolve(concern, value)
        except AssertionError:
            return None

    def render(self, concern: str, value: Any) -> str:
        """A template value as one string: pseudo parameters as ${AWS::Region} (also in a Fn::Sub),
        a bucket's Ref as its BucketName, any other reference as ${Concern/LogicalId[.Attribute]},
        Fn::Join joined."""
        if isinstance(value, str | int | float):
            return str(value)
        if isinstance(value, dict) and set(value) == {"Ref"} and value["Ref"].startswith("AWS::"):
            return f"${{{value['Ref']}}}"
        if isinstance(value, dict) and set(value) == {"Fn::Sub"} and isinstance(value["Fn::Sub"], str):
            return value["Fn::Sub"]  # only pseudo parameters in the ones CDK writes
        if isinstance(value, dict) and set(value) == {"Fn::Join"}:
            separator, parts = value["Fn::Join"]
            return separator.join(self.render(concern, part) for part in parts)
        target = self.resolve(concern, value)
        if target.type == "AWS::S3::Bucket" and target.attribute is None:
            return self.render(target.concern, target.properties["BucketName"])
        suffix = f".{target.attribute}" if target.attribute else ""
        return f"${{{target.concern}/{target.logical_id}{suffix}}}"

    def _target(self, concern: str, logical_id: str, attribute: str | None) -> Target:
        resources = self.templates[concern]["Resources"]
        assert logical_id in resources, f"{concern} has no resource {logical_id}"
        return Target(concern, logical_id, attribute, resources[logical_id])

    def _ssm_parameter_value(self, name: str) -> tuple[str, Any]:
        """(concern, value) of the SSM parameter named `name` that a stack of this app creates: what
        CloudFormation resolves an SSM-typed template parameter to at deploy."""
        found = [
            (concern, resource["Properties"]["Value"])
            for concern, template in self.templates.items()
            for resource in template["Resources"].values()
            if resource["Type"] == "AWS::SSM::Parameter" and resource["Properties"].get("Name") == name
        ]
        assert len(found) == 1, f"SSM parameter {name}: created by {len(found)} stacks of this app"
        return found[0]

    def _concern_of_stack(self, stack_name: str) -> str:
        stacks = zip(CONCERNS, self.stacks.all, strict=True)
        by_name = {stack.stack_name: concern for concern, stack in stacks}
        assert stack_name in by_name, f"no stack {stack_name} in this app"
        return by_name[stack_name]

    def identity_statements(self) -> list[tuple[str, Target, dict]]:
        """(concern, role, statement) for every statement of every IAM identity policy of the app: inline
        policies of roles and the roles each AWS::IAM::Policy / ManagedPolicy is attached to."""
        found = []
        for concern, template in self.templates.items():
            for logical_id, resource in template["Resources"].items():
                props = resource.get("Properties", {})
                if resource["Type"] == "AWS::IAM::Role":
                    roles = [self._target(concern, logical_id, None)]
                    documents = [p["PolicyDocument"] for p in props.get("Policies", [])]
                elif resource["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
                    roles = [self.resolve(concern, role) for role in props.get("Roles", [])]
                    documents = [props["PolicyDocument"]]
                else:
                    continue
                for document in documents:
                    found += [(concern, role, s) for role in roles for s in document["Statement"]]
        return found

    def grantees(self, action: str, concern: str, logical_id: str) -> set[tuple[str, str]]:
        """(concern, logical id) of the roles whose identity policies allow `action` on the resource
        `concern`/`logical_id` (by a reference to it or by "*"), whatever the condition."""
        found = set()
        for where, role, statement in self.identity_statements():
            actions = statement.get("Action", [])
            resources = statement.get("Resource", [])
            if statement["Effect"] != "Allow" or not any(
                fnmatch.fnmatchcase(action, pattern) for pattern in as_list(actions)
            ):
                continue
            for value in as_list(resources):
                target = None if value == "*" else self.try_resolve(where, value)
                if value == "*" or (target and (target.concern, target.logical_id) == (concern, logical_id)):
                    found.add((role.concern, role.logical_id))
        return found

    def nag_plugin_report(self) -> dict:
        """cdk-nag's part of the validation report CDK wrote at synth."""
        report_file = self.outdir / "validation-report.json"
        assert report_file.exists(), f"no {report_file.name}: no validation plugin ran at synth"
        reports = json.loads(report_file.read_text())["pluginReports"]
        nag = [r for r in reports if r["pluginName"] == "AwsSolutions"]
        assert len(nag) == 1, (
            f"cdk-nag (AwsSolutions) did not run at synth: {[r['pluginName'] for r in reports]}"
        )
        return nag[0]

    def acknowledgements(self) -> list[tuple[str, str, str]]:
        """(construct path, rule id, reason) of every acknowledged validation rule."""
        found = []
        for construct in self.app.node.find_all():
            for entry in construct.node.metadata:
                if entry.type == "aws:cdk:acknowledged-rules":
                    found += [(construct.node.path, rule, reason) for rule, reason in entry.data.items()]
        return found


def cdk_json_context() -> dict:
    return json.loads((REPO_ROOT / "cdk.json").read_text())["context"]


def _build(
    env_name: str, outdir: Path, *, nag: bool, context: dict | None = None
) -> tuple[App, DeploymentConfig, LakehouseStacks]:
    context = {**cdk_json_context(), "env": env_name, **(context or {})}
    app = App(context=context, outdir=str(outdir))
    # An empty environment: no CDK_DEFAULT_ACCOUNT/REGION, as on a machine without credentials.
    config = config_from_context(app, environ={})
    return app, config, build_lakehouse(app, config, nag=nag)


def synthesize(env_name: str, outdir: Path, context: dict | None = None) -> SynthesizedEnv:
    app, config, stacks = _build(env_name, outdir, nag=True, context=context)
    nag_report = None
    try:
        app.synth()
    except RuntimeError as error:  # jsii surfaces ValidationFailed as RuntimeError
        reports = sorted(outdir.glob("*validation-report*"))
        nag_report = "\n".join(p.read_text() for p in reports) or str(error)
        outdir = outdir.with_name(outdir.name + "-no-nag")
        app, config, stacks = _build(env_name, outdir, nag=False, context=context)
        app.synth()
    env = SynthesizedEnv(config=config, app=app, stacks=stacks, outdir=outdir, nag_report=nag_report)
    for concern, stack in zip(CONCERNS, stacks.all, strict=True):
        env.templates[concern] = json.loads((outdir / stack.template_file).read_text())
    return env


@pytest.fixture(scope="session")
def dev(tmp_path_factory) -> SynthesizedEnv:
    return synthesize("dev", tmp_path_factory.mktemp("cdk") / "dev")


@pytest.fixture(scope="session")
def prod(tmp_path_factory) -> SynthesizedEnv:
    return synthesize("prod", tmp_path_factory.mktemp("cdk") / "prod")


# Roles named in prod's context by the tests that need them (resource guards, docs/security.md).
ANALYST_ARN = "arn:aws:iam::111122223333:role/analysts"
TLS_OPERATOR_ARN = "arn:aws:iam::111122223333:role/tls-operator"


@pytest.fixture(scope="session")
def prod_with_context(tmp_path_factory) -> SynthesizedEnv:
    """prod with every optional context value set: a lake reader, a security admin, and the verify
    step's repairs (`-c verify_repair=true`)."""
    context = {"lake_readers": ANALYST_ARN, "security_admins": TLS_OPERATOR_ARN, "verify_repair": "true"}
    return synthesize("prod", tmp_path_factory.mktemp("cdk") / "prod-context", context)


@pytest.fixture(scope="session")
def parked_dev(tmp_path_factory) -> SynthesizedEnv:
    """dev as `lakehouse aws park` deploys it (`-c parked=true`)."""
    return synthesize("dev", tmp_path_factory.mktemp("cdk") / "dev-parked", {"parked": "true"})


@pytest.fixture(scope="session", params=["dev", "prod"])
def synthesized(request) -> SynthesizedEnv:
    return request.getfixturevalue(request.param)
