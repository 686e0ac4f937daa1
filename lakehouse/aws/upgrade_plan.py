"""What `cdk deploy` of this version would replace or delete, said before it runs.

The CDK CLI's own diff (`cdk diff --template`, offline: the same engine and the same CloudFormation
replacement rules a deploy plans with) compares each stack of a synthesized assembly with an older
template: the release baseline kept in the repo (tests/infra/test_upgrade_baseline.py) or the
template CloudFormation holds for the deployed stack (`lakehouse aws plan-upgrade`). Each change of a
resource becomes a row: its impact, whether it holds data, and what the operator must do first.

A data-holding resource (by type, or anything the old template keeps with a Retain/Snapshot policy)
that would be replaced, deleted or orphaned makes the plan refuse (exit 1): CloudFormation creates
the replacement empty, and a kept resource dropped from the stack is no longer the one in use.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

# Types whose resources hold what the pipeline cannot rebuild from its sources, and what that is.
DATA_HOLDING_TYPES = {
    "AWS::RDS::DBInstance": "the source database: its rows and binlog (CDC's positions point into it)",
    "AWS::RDS::DBCluster": "the source database: its rows and binlog",
    "AWS::MSK::Cluster": "the click topic's records the ingest has not read",
    "AWS::MSK::Topic": "the click topic's records and offsets (the lake stores offsets into it)",
    "AWS::S3::Bucket": "objects: the lake's tables, the artifacts or the logs",
    "AWS::KMS::Key": "the key that decrypts what it encrypted",
    "AWS::SecretsManager::Secret": "a password or the TLS private key",
    "AWS::Glue::Database": "the catalog's tables (Iceberg metadata pointers)",
    "AWS::Glue::Table": "a catalog table",
    "AWS::DynamoDB::Table": "items",
}
KEEPING_POLICIES = frozenset({"Retain", "RetainExceptOnCreate", "Snapshot"})
# The impacts the CLI prints after a resource line; "" is an in-place update or an addition.
REMOVING_IMPACTS = ("replace", "may be replaced", "destroy", "orphan")
_LINE = re.compile(r"^\[(?P<sign>[-+~])\] (?P<type>[A-Za-z0-9]+::\S+) (?P<rest>.+)$")
# The impact follows the logical id; the CLI may append more (e.g. "(OR move ... via refactoring)").
_IMPACT = re.compile(r" (replace|may be replaced|destroy|orphan)(?: \(.*\))?$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class PlanError(Exception):
    """The plan cannot be made; the message says why and what to do."""


@dataclass(frozen=True)
class ResourceChange:
    stack: str
    sign: str  # "+" added, "-" removed, "~" modified: the CLI's own markers
    resource_type: str
    logical_id: str
    path: str  # the construct path, when the template's metadata names it
    impact: str  # one of REMOVING_IMPACTS, "update" or "add"

    @property
    def removes(self) -> bool:
        return self.impact in REMOVING_IMPACTS


@dataclass(frozen=True)
class PlanRow:
    change: ResourceChange
    holds: str | None  # what the old resource holds; None when nothing the pipeline keeps
    first: str  # what the operator must do before the deploy ("" when nothing)

    @property
    def refuses(self) -> bool:
        return self.holds is not None and self.change.removes


def parse_cdk_diff(stack: str, text: str) -> list[ResourceChange]:
    """The resource lines of `cdk diff`'s output for one stack (colours stripped)."""
    changes, lines = [], [_ANSI.sub("", raw).rstrip() for raw in text.splitlines()]
    for line in lines:
        match = _LINE.match(line)
        if not match:
            continue
        rest, impact = match["rest"], None
        if found := _IMPACT.search(rest):
            rest, impact = rest[: found.start()], found.group(1)
        words = rest.split()
        logical_id, path = words[-1], " ".join(words[:-1])
        # A removed resource without a word the parser knows is taken as destroyed, never as kept.
        impact = impact or {"+": "add", "-": "destroy"}.get(match["sign"], "update")
        changes.append(ResourceChange(stack, match["sign"], match["type"], logical_id, path, impact))
    if "Resources" in lines and not changes:
        raise PlanError(
            f"{stack}: cdk diff lists resource changes this parser does not read:\n{text[-2000:]}"
        )
    return changes


def holds_data(resource_type: str, old_resource: Mapping | None) -> str | None:
    """What the resource holds (its new type, or the old one's if the logical id changed type)."""
    for kind in (resource_type, (old_resource or {}).get("Type")):
        if kind in DATA_HOLDING_TYPES:
            return DATA_HOLDING_TYPES[kind]
    policies = {(old_resource or {}).get(k) for k in ("DeletionPolicy", "UpdateReplacePolicy")}
    if policies & KEEPING_POLICIES:
        return "what the old template keeps on purpose (Retain/Snapshot policy)"
    return None


def first_steps(change: ResourceChange, env_name: str) -> str:
    """What the operator does before the deploy, for one change ("" when nothing)."""
    kind, removes = change.resource_type, change.removes
    if kind == "AWS::EMR::Cluster" and removes:
        steps = (
            "the new cluster is created first; the old one runs its streaming steps until "
            "CloudFormation deletes it after the stack's update, and the new one's wait until then "
            "(infra/README 'Upgrade')"
        )
        if env_name == "prod":
            steps = (
                "lift the cluster's termination protection first (`aws emr modify-cluster-attributes "
                "--cluster-id <id> --no-termination-protected`), else the old cluster outlives the "
                "deploy and the new one's streaming steps wait for it; " + steps
            )
        return steps
    if kind in ("AWS::MSK::Cluster", "AWS::MSK::Topic") and removes:
        return (
            "drain the topic first: stop the producers, let the ingest catch up (`lakehouse aws status`: "
            "Kafka lag 0); the new topic's offsets restart at 0 (reset the ingest's stored offsets)"
        )
    if kind in ("AWS::RDS::DBInstance", "AWS::RDS::DBCluster") and removes:
        return "snapshot the instance and restore into the new one; CDC must then re-snapshot every table"
    if (
        kind in ("AWS::Scheduler::Schedule", "AWS::StepFunctions::StateMachine", "AWS::Events::Rule")
        and removes
    ):
        return "a run in progress is stopped with it: deploy between the schedules' runs"
    if kind == "AWS::Lambda::Function" and removes:
        return ""
    if removes and holds_data(kind, None):
        return "do not deploy: move the data or keep the old logical id (see infra/README 'Upgrade')"
    return ""


def plan_rows(
    changes: list[ResourceChange], old_templates: Mapping[str, Mapping], env_name: str
) -> list[PlanRow]:
    """One row per replaced, deleted or orphaned resource (updates in place and additions are left out)."""
    rows = []
    for change in changes:
        if not change.removes:
            continue
        old = old_templates.get(change.stack, {}).get("Resources", {}).get(change.logical_id)
        rows.append(PlanRow(change, holds_data(change.resource_type, old), first_steps(change, env_name)))
    return rows


CdkRunner = Callable[[list[str]], str]


def cdk_runner(cdk: Path, cwd: Path, env: Mapping[str, str] | None = None) -> CdkRunner:
    """Runs the CDK CLI with `args`; returns its output (the diff prints to stderr), raises on failure."""

    def run(args: list[str]) -> str:
        done = subprocess.run(
            [str(cdk), *args], cwd=cwd, env=dict(env) if env else None, capture_output=True, text=True
        )
        if done.returncode:
            raise PlanError(
                f"cdk {' '.join(args[:1])} failed (exit {done.returncode}): {done.stderr[-2000:]}"
            )
        return done.stdout + done.stderr

    return run


def assembly_stacks(assembly: Path) -> list[str]:
    """The CloudFormation stacks of a synthesized assembly, in the manifest's order."""
    manifest = json.loads((assembly / "manifest.json").read_text())
    return [
        name
        for name, artifact in manifest["artifacts"].items()
        if artifact["type"] == "aws:cloudformation:stack"
    ]


def diff_assembly(
    run_cdk: CdkRunner, assembly: Path, old_templates: Mapping[str, Mapping | None], workdir: Path
) -> list[ResourceChange]:
    """Every resource change of every stack of `assembly` over its old template; a stack with no old
    template (not deployed yet, not in the baseline) is left out: all of it is new."""
    from concurrent.futures import ThreadPoolExecutor

    def diff(stack: str) -> list[ResourceChange]:
        old_file = workdir / f"{stack}.old.template.json"
        old_file.write_text(json.dumps(old_templates[stack]))
        output = run_cdk(
            ["diff", "--exclusively", "--app", str(assembly), stack, "--template", str(old_file)]
        )
        return parse_cdk_diff(stack, output)

    # One CLI process per stack (--template takes one): ~1.5 s each, mostly Node starting, so a few
    # at once.
    in_assembly = assembly_stacks(assembly)
    stacks = [s for s in in_assembly if old_templates.get(s) is not None]
    with ThreadPoolExecutor(max_workers=4) as pool:
        changes = [change for found in pool.map(diff, stacks) for change in found]
    # A stack in the old set but not in the assembly: `cdk deploy --all` leaves it deployed and no
    # longer manages it; whatever takes its place starts empty.
    for stack, old in old_templates.items():
        if old is not None and stack not in in_assembly:
            changes += [
                ResourceChange(stack, "-", r["Type"], logical_id, "(stack no longer in the app)", "orphan")
                for logical_id, r in old.get("Resources", {}).items()
            ]
    return changes


def deployed_templates(cloudformation, stacks: list[str]) -> dict[str, dict | None]:
    """The template CloudFormation holds for each stack (as submitted), None for a stack not deployed."""
    from botocore.exceptions import ClientError

    found: dict[str, dict | None] = {}
    for stack in stacks:
        try:
            body = cloudformation.get_template(StackName=stack, TemplateStage="Original")["TemplateBody"]
        except ClientError as error:
            if "does not exist" in str(error):
                found[stack] = None
                continue
            raise PlanError(f"cannot read the deployed template of {stack}: {error}") from error
        try:
            found[stack] = json.loads(body) if isinstance(body, str) else json.loads(json.dumps(body))
        except ValueError as error:  # a YAML template: not one this app deployed
            raise PlanError(
                f"{stack}: the deployed template is not JSON ({error}): not deployed by this app?"
            ) from None
    return found


def deployed_stacks(cloudformation, prefix: str) -> list[str]:
    """The stacks deployed under the app's prefix (`Lakehouse-<env>-`), also those the app no longer has."""
    gone = {"DELETE_COMPLETE", "REVIEW_IN_PROGRESS"}
    names = []
    for page in cloudformation.get_paginator("list_stacks").paginate():
        names += [
            s["StackName"]
            for s in page["StackSummaries"]
            if s["StackName"].startswith(prefix) and s["StackStatus"] not in gone
        ]
    return sorted(set(names))


@dataclass(frozen=True)
class UpgradePlan:
    rows: list[PlanRow]
    not_deployed: list[str]  # stacks this version creates

    @property
    def refuses(self) -> bool:
        return any(row.refuses for row in self.rows)


def plan_against_deployed(cloudformation, assembly: Path, run_cdk: CdkRunner, env_name: str) -> UpgradePlan:
    """`lakehouse aws plan-upgrade`: this version's assembly over the templates CloudFormation holds."""
    import tempfile

    stacks = assembly_stacks(assembly)
    prefix = f"Lakehouse-{env_name}-"
    if strangers := [s for s in stacks if not s.startswith(prefix)]:
        raise PlanError(f"the assembly's stacks {strangers} are not {prefix}*: synthesized for another env?")
    deployed = deployed_templates(
        cloudformation, sorted(set(stacks) | set(deployed_stacks(cloudformation, prefix)))
    )
    with tempfile.TemporaryDirectory(prefix="lakehouse-plan-") as scratch:
        changes = diff_assembly(run_cdk, assembly, deployed, Path(scratch))
    present = {name: template for name, template in deployed.items() if template is not None}
    return UpgradePlan(plan_rows(changes, present, env_name), [s for s in stacks if deployed.get(s) is None])
