"""AWS's documented behaviour, written down as rules over the synthesized templates.

The scanners (cdk-nag, cfn-lint, checkov) and the rehearsal check what we wrote; they cannot see how
AWS itself answers it: a topic policy that replaces SNS's default one, S3 answering 403 instead of 404,
a fixed name that blocks a replacement. Each rule here encodes one such behaviour and names the AWS page
it comes from; tests/infra/test_aws_behaviour.py applies them to dev and prod and breaks each one on
purpose (a mutated template must fail it).

The policy evaluator is deliberately small: it knows the condition operators our templates use and
raises on any other, so a policy it cannot read fails a test instead of passing it.
"""

from __future__ import annotations

import ast
import copy
import fnmatch
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cfn import as_list

# The concrete account, region and partition every template value is rendered with.
ACCOUNT, REGION, PARTITION = "123456789012", "us-east-1", "aws"
PSEUDO = {
    "AWS::AccountId": ACCOUNT,
    "AWS::Region": REGION,
    "AWS::Partition": PARTITION,
    "AWS::URLSuffix": "amazonaws.com",
}

# Pages each rule encodes (cited in the rules' docstrings and the closing notes).
PAGES = {
    "cloudwatch-sns": "https://repost.aws/knowledge-center/cloudwatch-receive-sns-for-alarm-trigger",
    "sns-kms": "https://docs.aws.amazon.com/sns/latest/dg/sns-key-management.html"
    "#compatibility-with-aws-services",
    "eventbridge-sns": "https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-use-resource-based.html"
    "#eb-sns-permissions",
    "eventbridge-lambda": "https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-use-resource-based.html"
    "#eb-lambda-permissions",
    "s3-log-delivery": "https://docs.aws.amazon.com/AmazonS3/latest/userguide/enable-server-access-logging.html",
    "head-object": "https://docs.aws.amazon.com/AmazonS3/latest/API/API_HeadObject.html",
    "s3-prefix": "https://docs.aws.amazon.com/AmazonS3/latest/userguide/amazon-s3-policy-keys.html",
    "custom-names": "https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-properties-name.html",
    "metric-math": "https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/using-metric-math.html",
    "condition-keys": "https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_condition-keys.html",
    "athena-s3": "https://docs.aws.amazon.com/athena/latest/ug/s3-permissions.html",
    "get-stack-output": "https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/"
    "intrinsic-function-reference-getstackoutput.html",
    "ssm-parameter-types": "https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/"
    "cloudformation-supplied-parameter-types.html",
    "emr-actions": "https://docs.aws.amazon.com/service-authorization/latest/reference/"
    "list_amazonelasticmapreduce.html",
    "emr-tag-access": "https://docs.aws.amazon.com/emr/latest/ManagementGuide/emr-fine-grained-cluster-access.html",
    "cfn-replacement": "https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/"
    "using-cfn-updating-stacks-update-behaviors.html",
}

Templates = dict[str, dict]  # concern -> template JSON


# ---- rendering template values to the strings AWS would see ------------------------------------


def _resources(templates: Templates) -> dict[str, tuple[str, dict]]:
    return {lid: (c, r) for c, t in templates.items() for lid, r in t["Resources"].items()}


def _stack_outputs(templates: Templates, stack_suffix: str) -> dict:
    for concern, template in templates.items():
        if stack_suffix.endswith(f"-{concern}"):
            return template.get("Outputs", {})
    raise KeyError(stack_suffix)


def physical(templates: Templates, logical_id: str, attribute: str | None) -> str:
    """What a Ref/GetAtt of a resource evaluates to, as a concrete string: ARNs in the form AWS
    documents for the type, with the resource's own name where it sets one (else its logical id)."""
    _, resource = _resources(templates)[logical_id]
    kind, props = resource["Type"], resource.get("Properties", {})

    def name(key: str) -> str:
        return render(templates, props[key]) if key in props else logical_id

    a, r, p = ACCOUNT, REGION, PARTITION
    # (what Ref returns, what GetAtt Arn returns) per type, as the resource reference pages give them.
    known = {
        "AWS::SNS::Topic": (f"arn:{p}:sns:{r}:{a}:{name('TopicName')}",) * 2,
        "AWS::S3::Bucket": (name("BucketName"), f"arn:{p}:s3:::{name('BucketName')}"),
        "AWS::IAM::Role": (name("RoleName"), f"arn:{p}:iam::{a}:role/{name('RoleName')}"),
        "AWS::KMS::Key": (logical_id, f"arn:{p}:kms:{r}:{a}:key/{logical_id}"),
        "AWS::CloudWatch::Alarm": (
            name("AlarmName"),
            f"arn:{p}:cloudwatch:{r}:{a}:alarm:{name('AlarmName')}",
        ),
        "AWS::Events::Rule": (name("Name"), f"arn:{p}:events:{r}:{a}:rule/{name('Name')}"),
        "AWS::Lambda::Function": (
            name("FunctionName"),
            f"arn:{p}:lambda:{r}:{a}:function:{name('FunctionName')}",
        ),
        "AWS::StepFunctions::StateMachine": (
            f"arn:{p}:states:{r}:{a}:stateMachine:{name('StateMachineName')}",
        )
        * 2,
        "AWS::Logs::LogGroup": (
            name("LogGroupName"),
            f"arn:{p}:logs:{r}:{a}:log-group:{name('LogGroupName')}:*",
        ),
        "AWS::SecretsManager::Secret": (f"arn:{p}:secretsmanager:{r}:{a}:secret:{name('Name')}-AbCdEf",) * 2,
    }
    if kind in known and attribute in (None, "Arn"):
        return known[kind][0 if attribute is None else 1]
    return f"{{{logical_id}{'.' + attribute if attribute else ''}}}"


def render(templates: Templates, value: Any) -> str:
    """A template value as the string AWS would see (pseudo parameters as ACCOUNT/REGION/PARTITION,
    references by `physical`, cross-stack outputs followed)."""
    if isinstance(value, str | int | float | bool):
        return str(value).lower() if isinstance(value, bool) else str(value)
    if isinstance(value, dict) and len(value) == 1:
        ((function, argument),) = value.items()
        if function == "Ref":
            if argument in PSEUDO:
                return PSEUDO[argument]
            if any(argument in t.get("Parameters", {}) for t in templates.values()):
                return f"{{{argument}}}"  # a template parameter (e.g. SSM-typed): known at deploy time
            return physical(templates, argument, None)
        if function == "Fn::GetAtt":
            logical_id, attribute = argument if isinstance(argument, list) else argument.split(".", 1)
            return physical(templates, logical_id, attribute)
        if function == "Fn::Join":
            separator, parts = argument
            return separator.join(render(templates, part) for part in parts)
        if function == "Fn::Sub":
            text, variables = (argument, {}) if isinstance(argument, str) else argument

            def substitute(match: re.Match) -> str:
                key = match.group(1)
                if key in variables:
                    return render(templates, variables[key])
                if key in PSEUDO:
                    return PSEUDO[key]
                logical_id, _, attribute = key.partition(".")
                return physical(templates, logical_id, attribute or None)

            return re.sub(r"\$\{([^}!]+)\}", substitute, text)
        if function == "Fn::GetStackOutput":
            outputs = _stack_outputs(templates, argument["StackName"])
            return render(templates, outputs[argument["OutputName"]]["Value"])
        if function == "Fn::ImportValue":
            for template in templates.values():
                for output in template.get("Outputs", {}).values():
                    if output.get("Export", {}).get("Name") == argument:
                        return render(templates, output["Value"])
        if function == "Fn::Select":
            index, items = argument
            return render(templates, items[int(index)])
    raise ValueError(f"cannot render {json.dumps(value)[:200]}")


def target_of(templates: Templates, value: Any) -> str | None:
    """The logical id a reference (Ref, GetAtt, a cross-stack output) points at, else None."""
    if isinstance(value, dict) and len(value) == 1:
        ((function, argument),) = value.items()
        if function == "Ref" and argument not in PSEUDO:
            return argument
        if function == "Fn::GetAtt":
            return argument[0] if isinstance(argument, list) else argument.split(".", 1)[0]
        if function == "Fn::GetStackOutput":
            outputs = _stack_outputs(templates, argument["StackName"])
            return target_of(templates, outputs[argument["OutputName"]]["Value"])
    return None


# ---- a small IAM policy evaluator ----------------------------------------------------------------


class UnreadablePolicy(ValueError):
    """A policy construct the evaluator does not model: the test fails rather than guess an answer."""


@dataclass(frozen=True)
class Request:
    """One call as AWS evaluates it: who (a service principal or a role ARN), what, on which ARN,
    and the request context's keys (aws:SourceArn, s3:prefix, ...)."""

    action: str
    resource: str
    service: str | None = None  # e.g. cloudwatch.amazonaws.com
    principal_arn: str | None = None  # a role's ARN (aws:PrincipalArn)
    context: dict[str, str] = field(default_factory=dict)

    def keys(self) -> dict[str, str]:
        """The request context (IAM global condition keys page): TLS always, aws:PrincipalIsAWSService
        true for a service principal acting directly, aws:PrincipalArn for a role."""
        keys = {"aws:SecureTransport": "true", "aws:PrincipalIsAWSService": str(bool(self.service)).lower()}
        if self.service:
            keys["aws:PrincipalServiceName"] = self.service
        if self.principal_arn:
            keys["aws:PrincipalArn"] = self.principal_arn
            keys["aws:PrincipalAccount"] = ACCOUNT
        return {**keys, **self.context}


def _like(pattern: str, value: str) -> bool:
    return fnmatch.fnmatchcase(value, pattern.replace("[", "[[]"))


def _arn_like(pattern: str, value: str) -> bool:
    """ArnLike: each of the six colon-separated parts matched on its own (IAM condition operators)."""
    pattern_parts, value_parts = pattern.split(":", 5), value.split(":", 5)
    return len(pattern_parts) == len(value_parts) == 6 and all(
        _like(p, v) for p, v in zip(pattern_parts, value_parts, strict=True)
    )


_POSITIVE = {
    "StringEquals": lambda p, v: p == v,
    "StringLike": _like,
    "ArnLike": _arn_like,
    "ArnEquals": _arn_like,
    "Bool": lambda p, v: p.lower() == v.lower(),
}
_NEGATED = {
    "StringNotEquals": "StringEquals",
    "StringNotLike": "StringLike",
    "ArnNotLike": "ArnLike",
    "ArnNotEquals": "ArnEquals",
}


def _condition_holds(templates: Templates, condition: dict, keys: dict[str, str]) -> bool:
    for operator, tests in condition.items():
        for key, patterns in tests.items():
            patterns = [render(templates, p) for p in as_list(patterns)]
            value = keys.get(key)
            if operator in _POSITIVE:
                if value is None or not any(_POSITIVE[operator](p, value) for p in patterns):
                    return False
            elif operator in _NEGATED:
                # A negated operator on a key the request lacks is true (IAM condition operators).
                if value is not None and any(_POSITIVE[_NEGATED[operator]](p, value) for p in patterns):
                    return False
            else:
                raise UnreadablePolicy(f"condition operator {operator}")
    return True


def _principal_matches(templates: Templates, principal: Any, request: Request) -> bool:
    if principal == "*":
        return True
    if not isinstance(principal, dict):
        raise UnreadablePolicy(f"principal {principal!r}")
    if request.service and request.service in [
        render(templates, s) for s in as_list(principal.get("Service", []))
    ]:
        return True
    for aws in as_list(principal.get("AWS", [])):
        arn = render(templates, aws)
        if arn == "*":
            return True
        if request.principal_arn and (
            arn == request.principal_arn or arn in (ACCOUNT, f"arn:{PARTITION}:iam::{ACCOUNT}:root")
        ):
            return True  # the account root delegates to the caller's identity policies
    return False


def _statement_matches(templates: Templates, statement: dict, request: Request) -> bool:
    if "NotPrincipal" in statement or "NotResource" in statement:
        raise UnreadablePolicy("NotPrincipal/NotResource")
    if "Principal" in statement and not _principal_matches(templates, statement["Principal"], request):
        return False
    if "NotAction" in statement:
        if any(_like(a.lower(), request.action.lower()) for a in as_list(statement["NotAction"])):
            return False
    elif not any(_like(a.lower(), request.action.lower()) for a in as_list(statement["Action"])):
        return False
    resources = [render(templates, r) for r in as_list(statement.get("Resource", "*"))]
    if not any(_like(r, request.resource) for r in resources):
        return False
    return _condition_holds(templates, statement.get("Condition", {}), request.keys())


def evaluate(templates: Templates, statements: list[dict], request: Request) -> str:
    """'deny' (an explicit Deny matches), 'allow' (an Allow matches and no Deny) or 'implicit'."""
    matched = [s["Effect"] for s in statements if _statement_matches(templates, s, request)]
    return "deny" if "Deny" in matched else "allow" if "Allow" in matched else "implicit"


def resource_policy(templates: Templates, logical_id: str) -> list[dict]:
    """The statements of every resource policy attached to a resource (SNS topic policies, bucket
    policies, a KMS key's own policy, secret policies, Lambda permissions as statements)."""
    resources = _resources(templates)
    _, resource = resources[logical_id]
    statements = list(resource.get("Properties", {}).get("KeyPolicy", {}).get("Statement", []))
    for _, other in resources.values():
        props = other.get("Properties", {})
        kind = other["Type"]
        if kind == "AWS::SNS::TopicPolicy" and logical_id in [
            target_of(templates, t) for t in props["Topics"]
        ]:
            statements += props["PolicyDocument"]["Statement"]
        elif kind == "AWS::S3::BucketPolicy" and target_of(templates, props["Bucket"]) == logical_id:
            statements += props["PolicyDocument"]["Statement"]
        elif (
            kind == "AWS::SecretsManager::ResourcePolicy"
            and target_of(templates, props["SecretId"]) == logical_id
        ):
            statements += props["ResourcePolicy"]["Statement"]
        elif kind == "AWS::Lambda::Permission" and target_of(templates, props["FunctionName"]) == logical_id:
            statement = {
                "Effect": "Allow",
                "Principal": {"Service": props["Principal"]}
                if props["Principal"].endswith(".amazonaws.com")
                else {"AWS": props["Principal"]},
                "Action": props["Action"],
                "Resource": {"Fn::GetAtt": [logical_id, "Arn"]},
            }
            condition = {}
            if "SourceArn" in props:
                condition["ArnLike"] = {"aws:SourceArn": props["SourceArn"]}
            if "SourceAccount" in props:
                condition["StringEquals"] = {"aws:SourceAccount": props["SourceAccount"]}
            statements.append({**statement, "Condition": condition} if condition else statement)
    return statements


def identity_statements(templates: Templates, role_id: str) -> list[dict]:
    """Every identity-policy statement of a role: inline, and AWS::IAM::Policy/ManagedPolicy attached."""
    resources = _resources(templates)
    _, role = resources[role_id]
    statements = [s for p in role["Properties"].get("Policies", []) for s in p["PolicyDocument"]["Statement"]]
    for _, (_, other) in resources.items():
        if other["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            props = other["Properties"]
            if role_id in [target_of(templates, r) for r in props.get("Roles", [])]:
                statements += props["PolicyDocument"]["Statement"]
    return statements


# ---- rule 1: a service the templates make act on a resource is let in by its resource policy -----


@dataclass(frozen=True)
class Delivery:
    """One AWS service acting on one of our resources because a template told it to."""

    why: str  # e.g. "alarm RdsFreeStorageAlarm -> topic AlertsTopic"
    target: str  # logical id of the resource acted on
    request: Request
    page: str


def _delivery(templates: Templates, why: str, target_id: str, request: Request, page: str) -> Delivery:
    return Delivery(why, target_id, request, page)


def service_deliveries(templates: Templates) -> Iterator[Delivery]:
    """Every delivery the templates set up: CloudWatch alarm actions to SNS (and the topic's KMS
    key), EventBridge rule targets without a role (SNS topics, Lambda functions), S3 server access
    logs to their destination bucket."""
    resources = _resources(templates)
    for logical_id, (_, resource) in resources.items():
        props = resource.get("Properties", {})
        kind = resource["Type"]
        if kind == "AWS::CloudWatch::Alarm":
            source = physical(templates, logical_id, "Arn")
            for key in ("AlarmActions", "OKActions", "InsufficientDataActions"):
                for action in props.get(key, []):
                    target = target_of(templates, action)
                    if target and resources[target][1]["Type"] == "AWS::SNS::Topic":
                        yield from _to_topic(
                            templates,
                            f"alarm {logical_id}",
                            target,
                            "cloudwatch.amazonaws.com",
                            source,
                            PAGES["cloudwatch-sns"],
                        )
        elif kind == "AWS::Events::Rule":
            source = physical(templates, logical_id, "Arn")
            for rule_target in props.get("Targets", []):
                if "RoleArn" in rule_target:
                    continue  # the rule's role acts (identity policy), not the service principal
                target = target_of(templates, rule_target["Arn"])
                target_kind = resources[target][1]["Type"] if target else None
                if target_kind == "AWS::SNS::Topic":
                    yield from _to_topic(
                        templates,
                        f"rule {logical_id}",
                        target,
                        "events.amazonaws.com",
                        source,
                        PAGES["eventbridge-sns"],
                    )
                elif target_kind == "AWS::Lambda::Function":
                    yield Delivery(
                        f"rule {logical_id} -> function {target}",
                        target,
                        Request(
                            "lambda:InvokeFunction",
                            physical(templates, target, "Arn"),
                            service="events.amazonaws.com",
                            context={"aws:SourceArn": source, "aws:SourceAccount": ACCOUNT},
                        ),
                        PAGES["eventbridge-lambda"],
                    )
        elif kind == "AWS::S3::Bucket" and "LoggingConfiguration" in props:
            logging = props["LoggingConfiguration"]
            destination = target_of(templates, logging["DestinationBucketName"])
            key = f"{render(templates, logging.get('LogFilePrefix', ''))}2026-11-28-00-00-00-ABCDEF"
            yield Delivery(
                f"access logs of bucket {logical_id} -> bucket {destination}",
                destination,
                Request(
                    "s3:PutObject",
                    f"{physical(templates, destination, 'Arn')}/{key}",
                    service="logging.s3.amazonaws.com",
                    context={
                        "aws:SourceArn": physical(templates, logical_id, "Arn"),
                        "aws:SourceAccount": ACCOUNT,
                    },
                ),
                PAGES["s3-log-delivery"],
            )


def _to_topic(templates, why, topic_id, service, source_arn, page) -> Iterator[Delivery]:
    """Publishing to a topic: the topic policy, and for an encrypted topic the key's policy too."""
    context = {"aws:SourceArn": source_arn, "aws:SourceAccount": ACCOUNT}
    topic_arn = physical(templates, topic_id, None)
    yield Delivery(
        f"{why} -> topic {topic_id}",
        topic_id,
        Request("sns:Publish", topic_arn, service=service, context=context),
        page,
    )
    key = _resources(templates)[topic_id][1]["Properties"].get("KmsMasterKeyId")
    key_id = target_of(templates, key) if key else None
    if key_id:
        key_arn = physical(templates, key_id, "Arn")
        for action in ("kms:GenerateDataKey", "kms:Decrypt"):
            yield Delivery(
                f"{why} -> key {key_id} of topic {topic_id} ({action})",
                key_id,
                Request(action, key_arn, service=service, context=context),
                PAGES["sns-kms"],
            )


def undelivered(templates: Templates) -> list[str]:
    """Deliveries the target's resource policy would refuse: the rule's findings."""
    found = []
    for delivery in service_deliveries(templates):
        verdict = evaluate(templates, resource_policy(templates, delivery.target), delivery.request)
        if verdict != "allow":
            found.append(
                f"{delivery.why}: {delivery.request.service} {delivery.request.action} is {verdict} by the "
                f"resource policy ({delivery.page})"
            )
    return found


def conditions_on_eventbridge_topic_statements(templates: Templates) -> list[str]:
    """EventBridge cannot publish to a topic through a statement with a Condition block: 'You can't
    use Condition blocks in Amazon SNS topic policies for EventBridge' (PAGES['eventbridge-sns'])."""
    found = []
    for logical_id, (_, resource) in _resources(templates).items():
        if resource["Type"] != "AWS::SNS::TopicPolicy":
            continue
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]:
            services = (
                as_list(statement.get("Principal", {}).get("Service", []))
                if isinstance(statement.get("Principal"), dict)
                else []
            )
            if (
                statement["Effect"] == "Allow"
                and "events.amazonaws.com" in services
                and "Condition" in statement
            ):
                found.append(f"{logical_id}: the EventBridge statement has a Condition block")
    return found


# ---- rule 2: an S3 existence check gets 404 for a missing key, not 403 ---------------------------


@dataclass(frozen=True)
class ExistenceCheck:
    """An S3 call our code makes to learn whether a key exists, and who makes it."""

    where: str  # file:function of the call
    call: str  # head_object | list_objects_v2
    bucket_id: str  # logical id of the bucket
    key: str
    role_id: str | None  # the template role that calls; None for an operator outside the templates
    operator_arn: str | None = None


def existence_check_requests(templates: Templates, check: ExistenceCheck) -> list[Request]:
    """The requests an existence check must have allowed so that a missing key reads as missing:
    HeadObject needs s3:GetObject on the key and s3:ListBucket on the bucket with no s3:prefix in
    the request (without ListBucket S3 answers 403, not 404: PAGES['head-object']); ListObjectsV2
    with Prefix=key needs s3:ListBucket with s3:prefix=key (PAGES['s3-prefix'])."""
    bucket_arn = physical(templates, check.bucket_id, "Arn")
    principal = check.operator_arn or physical(templates, check.role_id, "Arn")
    if check.call in ("head_object", "get_object"):
        return [
            Request("s3:GetObject", f"{bucket_arn}/{check.key}", principal_arn=principal),
            Request("s3:ListBucket", bucket_arn, principal_arn=principal),
        ]
    if check.call == "list_objects_v2":
        return [
            Request("s3:ListBucket", bucket_arn, principal_arn=principal, context={"s3:prefix": check.key})
        ]
    raise ValueError(f"{check.where}: unknown existence call {check.call}")


def unanswerable_existence_checks(templates: Templates, checks: list[ExistenceCheck]) -> list[str]:
    """Checks whose role's identity policy does not allow the call, or the bucket policy denies it."""
    found = []
    for check in checks:
        for request in existence_check_requests(templates, check):
            bucket = evaluate(templates, resource_policy(templates, check.bucket_id), request)
            identity = (
                "allow"
                if check.role_id is None  # an operator's own policy: ours to grant, not the template's
                else evaluate(templates, identity_statements(templates, check.role_id), request)
            )
            if bucket == "deny" or identity != "allow":
                found.append(
                    f"{check.where}: {check.call} needs {request.action} on {request.resource}"
                    f"{' with ' + str(request.context) if request.context else ''}; "
                    f"identity policy: {identity}, "
                    f"bucket policy: {bucket} -> a missing key answers 403, not 404 ({PAGES['head-object']})"
                )
    return found


S3_CALLS = re.compile(r"\.(head_object|list_objects_v2|get_object)\(")


def s3_existence_call_sites(repo: Path, trees: list[str]) -> set[str]:
    """path:function:call of every head_object/list_objects_v2/get_object call under `trees` (paths
    relative to `repo`; the innermost function that makes the call)."""
    found = set()
    for tree_name in trees:
        for path in sorted((repo / tree_name).rglob("*.py")):
            module = ast.parse(path.read_text())
            for function in ast.walk(module):
                if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                nested = {
                    id(n)
                    for inner in function.body
                    for n in ast.walk(inner)
                    if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
                    for n in ast.walk(n)
                }
                for node in ast.walk(function):
                    if (
                        id(node) not in nested
                        and isinstance(node, ast.Call)
                        and isinstance(node.func, ast.Attribute)
                        and S3_CALLS.fullmatch(f".{node.func.attr}(")
                    ):
                        found.add(f"{path.relative_to(repo)}:{function.name}:{node.func.attr}")
    return found


# ---- rule 3: no fixed name where an update could require replacement ----------------------------

# Name properties of the types whose names are unique in an account/region (a second resource of the
# same name cannot exist at once), from the CloudFormation 'Name type' page.
UNIQUE_NAME_PROPERTIES = {
    "AWS::S3::Bucket": "BucketName",
    "AWS::IAM::Role": "RoleName",
    "AWS::IAM::ManagedPolicy": "ManagedPolicyName",
    "AWS::IAM::InstanceProfile": "InstanceProfileName",
    "AWS::EMR::SecurityConfiguration": "Name",
    "AWS::MSK::Cluster": "ClusterName",
    "AWS::MSK::Configuration": "Name",
    "AWS::RDS::DBInstance": "DBInstanceIdentifier",
    "AWS::RDS::DBParameterGroup": "DBParameterGroupName",
    "AWS::RDS::DBSubnetGroup": "DBSubnetGroupName",
    "AWS::Athena::WorkGroup": "Name",
    "AWS::Glue::Database": "DatabaseInput.Name",
    "AWS::Logs::LogGroup": "LogGroupName",
    "AWS::SSM::Parameter": "Name",
    "AWS::Lambda::Function": "FunctionName",
    "AWS::StepFunctions::StateMachine": "StateMachineName",
    "AWS::SecretsManager::Secret": "Name",
    "AWS::SNS::Topic": "TopicName",
    "AWS::Events::Rule": "Name",
    "AWS::Scheduler::Schedule": "Name",
    "AWS::KMS::Alias": "AliasName",
    "AWS::EC2::SecurityGroup": "GroupName",
    "AWS::CloudWatch::Alarm": "AlarmName",
    "AWS::CloudWatch::Dashboard": "DashboardName",
    "AWS::MSK::Topic": "TopicName",
}


def create_only_properties(kind: str) -> set[str]:
    """The properties whose change replaces a resource of `kind`, from the CloudFormation resource
    schema cfn-lint ships (`createOnlyProperties`), as dotted paths."""
    import cfnlint.data.schemas as schemas

    directory = Path(schemas.__file__).parent
    by_type = json.loads((directory / "providers" / f"{REGION}.json").read_text())
    if kind not in by_type:
        return set()
    schema = json.loads((directory / "resources" / f"{by_type[kind]}.json").read_text())
    return {p.removeprefix("/properties/").replace("/", ".") for p in schema.get("createOnlyProperties", [])}


def _get(props: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(props, dict) or part not in props:
            return None
        props = props[part]
    return props


def fixed_names(templates: Templates) -> Iterator[tuple[str, str, str, set[str]]]:
    """(concern, logical id, type, the other create-only properties it sets, unless the name carries
    their values) of every resource with a fixed unique name."""
    for concern, template in templates.items():
        for logical_id, resource in template["Resources"].items():
            kind = resource["Type"]
            name_property = UNIQUE_NAME_PROPERTIES.get(kind)
            props = resource.get("Properties", {})
            if name_property is None or _get(props, name_property) is None:
                continue
            name = render(templates, _get(props, name_property)).replace(".", "-")
            others = {
                p
                for p in create_only_properties(kind) - {name_property}
                if _get(props, p) is not None
                # a value the name carries changes the name with it (the MSK configuration's version)
                and not all(str(v).replace(".", "-") in name for v in as_list(_get(props, p)))
            }
            yield concern, logical_id, kind, others


def names_blocking_replacement(templates: Templates, kept: dict[str, str]) -> list[str]:
    """A fixed unique name on a resource that a change of another create-only property would replace:
    CloudFormation creates the replacement before deleting the old one, and 'you can't perform an
    update that causes a custom-named resource to be replaced' (PAGES['custom-names']). `kept` names
    the logical-id prefixes allowed anyway, each with its reason (data-holding, kept on replacement)."""
    found = []
    for concern, logical_id, kind, others in fixed_names(templates):
        if others and not any(logical_id.startswith(prefix) for prefix in kept):
            found.append(f"{concern}/{logical_id} ({kind}) has a fixed name and replaces on {sorted(others)}")
    return found


# ---- rule 4: metric math uses only documented forms -------------------------------------------------

# Functions of the metric math reference (PAGES['metric-math']) our expressions may use.
METRIC_MATH_FUNCTIONS = {
    "ABS",
    "AVG",
    "CEIL",
    "FILL",
    "FLOOR",
    "IF",
    "MAX",
    "MIN",
    "SUM",
    "RATE",
    "DIFF",
    "METRICS",
    "TIME_SERIES",
    "SEARCH",
    "REMOVE_EMPTY",
    "FIRST",
    "LAST",
    "SORT",
}


def undocumented_metric_math(expression: str, ids: set[str]) -> list[str]:
    """An array `[ ]` holds time series (metric ids or functions returning one), never a bare number:
    the reference types MAX/MIN/SUM/AVG's argument as 'TS[]' and makes a scalar a series with
    TIME_SERIES(S). Functions must be in the reference."""
    problems = []
    if expression.lstrip().startswith("SEARCH("):
        return problems
    for function in re.findall(r"([A-Z_]+)\s*\(", expression):
        if function not in METRIC_MATH_FUNCTIONS:
            problems.append(f"{expression!r}: {function} is not a documented metric math function")
    for array in re.findall(r"\[([^\]]*)\]", expression):
        for element in _split_top_level(array):
            element = element.strip()
            if re.fullmatch(r"[-+]?\d+(\.\d+)?", element):
                problems.append(f"{expression!r}: a number ({element}) inside [ ] is not a time series")
            elif re.fullmatch(r"[a-z][A-Za-z0-9_]*", element) and element not in ids:
                problems.append(f"{expression!r}: {element} is not a metric of the expression")
    return problems


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]


def alarm_expressions(templates: Templates) -> Iterator[tuple[str, str, set[str]]]:
    """(alarm logical id, expression, ids of the metrics it may use) of every metric-math alarm."""
    for template in templates.values():
        for logical_id, resource in template["Resources"].items():
            if resource["Type"] != "AWS::CloudWatch::Alarm":
                continue
            queries = resource["Properties"].get("Metrics", [])
            ids = {q["Id"] for q in queries}
            for query in queries:
                if "Expression" in query:
                    yield logical_id, query["Expression"], ids


def mutated(templates: Templates, logical_id: str, change) -> Templates:
    """A deep copy of the templates with `change(resource)` applied to one resource (positive controls)."""
    copied = copy.deepcopy(templates)
    for template in copied.values():
        if logical_id in template["Resources"]:
            change(template["Resources"][logical_id])
            return copied
    raise KeyError(logical_id)


# ---- rule 5: a replaced resource reaches the stacks that act on it ---------------------------------

# Resources a routine change replaces (the cluster: a release, bootstrap action or classification).
REPLACED_ROUTINELY = ("AWS::EMR::Cluster",)


def _references(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, argument in value.items():
            if key in ("Fn::GetStackOutput", "Fn::ImportValue"):
                yield key, argument
            yield from _references(argument)
    elif isinstance(value, list):
        for item in value:
            yield from _references(item)


def stale_after_replacement(templates: Templates) -> list[str]:
    """Values in one stack that name a routinely replaced resource of another stack through
    Fn::GetStackOutput or Fn::ImportValue. CloudFormation resolves such a reference only when the
    consumer is updated (PAGES["get-stack-output"]), and the CDK CLI skips a stack whose template,
    tags and parameters did not change: after a replacement the consumer keeps the old id. An
    SSM-typed template parameter is resolved at every update (PAGES["ssm-parameter-types"]) and
    makes the CLI deploy the stack every time."""
    exports = {
        output["Export"]["Name"]: (concern, output["Value"])
        for concern, template in templates.items()
        for output in template.get("Outputs", {}).values()
        if isinstance(output.get("Export", {}).get("Name"), str)
    }
    found = []
    for concern, template in templates.items():
        for logical_id, resource in template["Resources"].items():
            for function, argument in _references(resource.get("Properties", {})):
                if function == "Fn::GetStackOutput":
                    producer = next(
                        (c for c in templates if str(argument["StackName"]).endswith(f"-{c}")), None
                    )
                    output = (
                        templates[producer].get("Outputs", {}).get(argument["OutputName"])
                        if producer
                        else None
                    )
                    value = output and output["Value"]
                else:
                    producer, value = exports.get(argument, (None, None))
                target = value.get("Ref") if isinstance(value, dict) else None
                kind = (
                    templates[producer]["Resources"].get(target, {}).get("Type")
                    if producer and target
                    else None
                )
                if kind in REPLACED_ROUTINELY:
                    found.append(f"{concern}/{logical_id}: {function} of {producer}/{target} ({kind})")
    return sorted(set(found))


# ---- rule 6: the supervisor of a replacing cluster can hand over from the cluster it replaces -----


def handover_gaps(templates: Templates, tag_key: str) -> list[str]:
    """A replacement creates the new cluster before deleting the old (PAGES["cfn-replacement"]),
    and prod's old cluster is termination-protected, so it runs on. The supervisor of the new
    cluster (step_supervisor/handler.py, the handover) must be able to find the old cluster by name
    (ListClusters: no resource type, PAGES["emr-actions"]), list and cancel its steps and add the
    step that stops its applications, which EMR authorizes on the cluster's tags
    (elasticmapreduce:ResourceTag/<key>, PAGES["emr-tag-access"]).
    So each cluster must carry `tag_key` = its name, and the supervisor's role must be allowed those
    calls on a cluster with that tag and no other. Returns what is missing."""
    resources = _resources(templates)
    clusters = [r for _, r in resources.values() if r["Type"] == "AWS::EMR::Cluster"]
    supervisors = [
        r
        for _, r in resources.values()
        if r["Type"] == "AWS::Lambda::Function"
        and "STREAMING_STEPS_S3_URI" in r["Properties"].get("Environment", {}).get("Variables", {})
    ]
    gaps = []
    for cluster in clusters:
        props = cluster["Properties"]
        name = render(templates, props["Name"])
        tags = {t["Key"]: render(templates, t["Value"]) for t in props.get("Tags", [])}
        if tags.get(tag_key) != name:
            gaps.append(f"cluster {name}: no tag {tag_key}={name}, so the next release cannot take over")
        for supervisor in supervisors:
            variables = supervisor["Properties"]["Environment"]["Variables"]
            if render(templates, variables.get("CLUSTER_NAME", "")) != name:
                gaps.append(f"supervisor: CLUSTER_NAME is not {name}")
            statements = identity_statements(
                templates, target_of(templates, supervisor["Properties"]["Role"])
            )
            old = f"arn:{PARTITION}:elasticmapreduce:{REGION}:{ACCOUNT}:cluster/j-REPLACED"
            tagged = {f"elasticmapreduce:ResourceTag/{tag_key}": name}
            other = {f"elasticmapreduce:ResourceTag/{tag_key}": f"{name}-other"}
            actions = ("ListSteps", "CancelSteps", "AddJobFlowSteps")  # list, cancel, add the stop step
            for action in (f"elasticmapreduce:{a}" for a in actions):
                if evaluate(templates, statements, Request(action, old, context=tagged)) != "allow":
                    gaps.append(f"supervisor: {action} on the replaced cluster is not allowed")
                for context in (other, {}):
                    if evaluate(templates, statements, Request(action, old, context=context)) == "allow":
                        gaps.append(f"supervisor: {action} allowed on a cluster not tagged {tag_key}={name}")
            if evaluate(templates, statements, Request("elasticmapreduce:ListClusters", "*")) != "allow":
                gaps.append("supervisor: elasticmapreduce:ListClusters is not allowed")
    if clusters and not supervisors:
        gaps.append("no supervisor found")
    return gaps
