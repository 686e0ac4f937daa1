"""AWS's documented behaviour applied to the synthesized dev and prod templates (aws_behaviour.py).

Each rule names the AWS page it encodes and has a positive control: the same templates, mutated the
way a plausible change would break them, must fail the rule.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import aws_behaviour as aws
import pytest

from infra.config import EMR_TLS_CERTIFICATES_KEY

REPO = Path(__file__).resolve().parents[2]
OPERATOR = f"arn:aws:iam::{aws.ACCOUNT}:role/Operator"  # a deployer's role, named in no guard


def find(templates, kind: str, name_part: str, name_property: str) -> str:
    """The logical id of the one resource of `kind` whose rendered name contains `name_part`."""
    (found,) = [
        logical_id
        for template in templates.values()
        for logical_id, resource in template["Resources"].items()
        if resource["Type"] == kind
        and name_part in aws.render(templates, resource.get("Properties", {}).get(name_property, ""))
    ]
    return found


def of_type(templates, kind: str) -> list[str]:
    return [lid for t in templates.values() for lid, r in t["Resources"].items() if r["Type"] == kind]


# ---- rule 1: services acting on our resources are let in ------------------------------------------


def test_every_service_the_templates_make_act_on_a_resource_is_let_in_by_its_policy(synthesized):
    templates = synthesized.templates
    deliveries = list(aws.service_deliveries(templates))
    kinds = Counter((d.request.service, d.request.action) for d in deliveries)
    alarms = len(of_type(templates, "AWS::CloudWatch::Alarm"))
    # every alarm publishes to the encrypted topic: the topic policy and both key actions
    assert kinds[("cloudwatch.amazonaws.com", "sns:Publish")] == alarms >= 12
    assert kinds[("cloudwatch.amazonaws.com", "kms:GenerateDataKey")] == alarms
    assert kinds[("events.amazonaws.com", "sns:Publish")] == 1  # EMR failures
    # a step of the cluster ending, and the handover step ending on a replaced one -> supervisor
    assert kinds[("events.amazonaws.com", "lambda:InvokeFunction")] == 2
    logged = [
        b
        for b in of_type(templates, "AWS::S3::Bucket")
        if "LoggingConfiguration" in str(templates["Lake"]["Resources"].get(b))
    ]
    assert kinds[("logging.s3.amazonaws.com", "s3:PutObject")] == len(logged)  # prod: warehouse, artifacts
    assert aws.undelivered(templates) == []


def test_a_topic_policy_without_cloudwatch_s_statement_silences_every_alarm(prod):
    topic = find(prod.templates, "AWS::SNS::Topic", "Lakehouse alerts", "DisplayName")
    (policy,) = of_type(prod.templates, "AWS::SNS::TopicPolicy")

    def drop_cloudwatch(resource):
        statements = resource["Properties"]["PolicyDocument"]["Statement"]
        statements[:] = [s for s in statements if "cloudwatch.amazonaws.com" not in str(s.get("Principal"))]

    found = aws.undelivered(aws.mutated(prod.templates, policy, drop_cloudwatch))
    assert len(found) == len(of_type(prod.templates, "AWS::CloudWatch::Alarm")) == 13
    assert all(f"-> topic {topic}: cloudwatch.amazonaws.com sns:Publish is implicit" in f for f in found)

    def other_account(resource):  # a condition naming the wrong source fails as surely
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]:
            if "cloudwatch.amazonaws.com" in str(statement.get("Principal")):
                statement["Condition"] = {
                    "ArnLike": {"aws:SourceArn": "arn:aws:cloudwatch:*:999999999999:alarm:*"}
                }

    assert len(aws.undelivered(aws.mutated(prod.templates, policy, other_account))) == 13


def test_a_key_policy_without_cloudwatch_s_grant_fails_the_encrypted_topic(dev):
    topic = find(dev.templates, "AWS::SNS::Topic", "Lakehouse alerts", "DisplayName")
    key = aws.target_of(
        dev.templates, dev.templates["Monitoring"]["Resources"][topic]["Properties"]["KmsMasterKeyId"]
    )

    def drop_cloudwatch(resource):  # EventBridge keeps its grant (one statement names both services)
        for statement in resource["Properties"]["KeyPolicy"]["Statement"]:
            principal = statement.get("Principal")
            if isinstance(principal, dict) and "Service" in principal:
                services = [s for s in aws.as_list(principal["Service"]) if s != "cloudwatch.amazonaws.com"]
                principal["Service"] = services or ["nobody.amazonaws.com"]

    found = aws.undelivered(aws.mutated(dev.templates, key, drop_cloudwatch))
    alarms = len(of_type(dev.templates, "AWS::CloudWatch::Alarm"))
    assert len(found) == 2 * alarms  # GenerateDataKey and Decrypt, for each alarm
    assert all(f"-> key {key}" in f and "cloudwatch.amazonaws.com kms:" in f for f in found)


def test_an_eventbridge_target_permission_for_another_rule_does_not_let_the_rule_in(dev):
    # One permission per rule that invokes the supervisor (a step of the cluster, the handover's end)
    permitted = {
        aws.target_of(dev.templates, dev.templates["Jobs"]["Resources"][p]["Properties"]["SourceArn"]): p
        for p in of_type(dev.templates, "AWS::Lambda::Permission")
    }
    assert len(permitted) == 2
    permission = permitted[min(permitted)]
    (other_rule,) = [r for r in of_type(dev.templates, "AWS::Events::Rule") if r not in permitted]

    def for_the_other_rule(resource):
        resource["Properties"]["SourceArn"] = {"Fn::GetAtt": [other_rule, "Arn"]}

    found = aws.undelivered(aws.mutated(dev.templates, permission, for_the_other_rule))
    assert len(found) == 1 and "events.amazonaws.com lambda:InvokeFunction is implicit" in found[0]


def test_access_logs_need_the_log_bucket_to_let_s3_logging_in(prod):
    (policy,) = [
        lid
        for lid in of_type(prod.templates, "AWS::S3::BucketPolicy")
        if "logging.s3.amazonaws.com" in str(prod.templates["Lake"]["Resources"][lid])
    ]

    def drop_logging(resource):
        statements = resource["Properties"]["PolicyDocument"]["Statement"]
        statements[:] = [s for s in statements if "logging.s3.amazonaws.com" not in str(s.get("Principal"))]

    assert len(aws.undelivered(aws.mutated(prod.templates, policy, drop_logging))) == 2


def test_the_eventbridge_topic_statement_carries_no_condition_block(synthesized):
    """'You can't use Condition blocks in Amazon SNS topic policies for EventBridge' (PAGES)."""
    templates = synthesized.templates
    assert aws.conditions_on_eventbridge_topic_statements(templates) == []
    (policy,) = of_type(templates, "AWS::SNS::TopicPolicy")

    def add_condition(resource):
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]:
            if "events.amazonaws.com" in str(statement.get("Principal")):
                statement["Condition"] = {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}

    assert (
        len(aws.conditions_on_eventbridge_topic_statements(aws.mutated(templates, policy, add_condition)))
        == 1
    )


# ---- rule 2: S3 existence checks read a missing key as missing ------------------------------------

# Every head_object/list_objects_v2/get_object call in code that runs against AWS, with what it is:
# an existence check (who makes it, on which bucket and key) or why it is none.
NOT_EXISTENCE_CHECKS = {
    "infra/lambdas/emr_tls_certificates/handler.py:_exists:head_object": "the metadata of a key just listed",
    "infra/lambdas/step_supervisor/handler.py:load_steps_from_s3:get_object": "the deployment writes the "
    "steps file before any invocation: missing is an error whatever S3 answers",
    "lakehouse/local/topic_retention.py:_high_watermark:get_object": "the local broker's SeaweedFS, not AWS",
    "lakehouse/aws/operate.py:request_resync:get_object": "the deployment writes the steps file: missing "
    "or unreadable is an error whatever S3 answers (AccessDenied for a missing key without s3:ListBucket)",
}


def existence_checks(templates) -> dict[str, aws.ExistenceCheck]:
    artifacts = find(templates, "AWS::S3::Bucket", "-artifacts-", "BucketName")
    logs = find(templates, "AWS::S3::Bucket", "-logs-", "BucketName")
    tls_role = find(templates, "AWS::IAM::Role", "-emr-tls-", "RoleName")
    return {
        "infra/lambdas/emr_tls_certificates/handler.py:_exists:list_objects_v2": aws.ExistenceCheck(
            "emr_tls_certificates/handler.py:_exists",
            "list_objects_v2",
            artifacts,
            EMR_TLS_CERTIFICATES_KEY,
            tls_role,
        ),
        "lakehouse/aws/preflight.py:certificate:list_objects_v2": aws.ExistenceCheck(
            "lakehouse/aws/preflight.py:certificate",
            "list_objects_v2",
            artifacts,
            EMR_TLS_CERTIFICATES_KEY,
            None,
            OPERATOR,
        ),
        # `lakehouse aws logs`: "no stderr yet, try again" only when S3 says 404
        "lakehouse/aws/operate.py:step_log:get_object": aws.ExistenceCheck(
            "lakehouse/aws/operate.py:step_log",
            "get_object",
            logs,
            "emr/j-1/steps/s-1/stderr.gz",
            None,
            OPERATOR,
        ),
    }


def test_every_s3_call_of_the_code_that_runs_on_aws_is_declared(dev):
    sites = aws.s3_existence_call_sites(REPO, ["infra/lambdas", "lakehouse", "jobs"])
    assert sites == set(existence_checks(dev.templates)) | set(NOT_EXISTENCE_CHECKS)


def test_every_s3_existence_check_is_answerable_to_the_role_that_makes_it(synthesized):
    templates = synthesized.templates
    assert aws.unanswerable_existence_checks(templates, list(existence_checks(templates).values())) == []


def test_a_head_object_check_without_plain_list_bucket_reads_a_missing_key_as_403(synthesized):
    """The two bugs this rule exists for: the TLS function's HEAD (ListBucket only under s3:prefix) and
    the preflight's HEAD as an operator the bucket denies reads under security/."""
    templates = synthesized.templates
    checks = [
        aws.ExistenceCheck(c.where, "head_object", c.bucket_id, c.key, c.role_id, c.operator_arn)
        for c in existence_checks(templates).values()
    ]
    found = aws.unanswerable_existence_checks(templates, checks)
    assert any(
        "handler.py:_exists: head_object needs s3:ListBucket" in f and "identity policy: implicit" in f
        for f in found
    ), found
    assert any(
        "preflight.py:certificate: head_object needs s3:GetObject" in f and "bucket policy: deny" in f
        for f in found
    ), found


# ---- rule 3: no fixed name where a change would replace the resource ------------------------------

# Data-holding resources keep their fixed names: people and alarms look them up by name, and a
# change that would replace one must fail rather than replace it (the release baseline and the
# upgrade plan of issue 47 are where such a change is caught before the deploy).
KEPT_FIXED_NAMES = {
    "StreamingCluster": "MSK cluster: holds the topic's unread clicks; alarms and operators use its name",
    "StreamingClickTopic": "the click topic: its records are the ingest's source of truth",
    "SourceDatabaseInstance": "the source database: rows and binlog positions; snapshot on delete in prod",
}


def test_no_fixed_name_blocks_a_replacement(synthesized):
    assert aws.names_blocking_replacement(synthesized.templates, KEPT_FIXED_NAMES) == []
    kept = {lid for _, lid, _, others in aws.fixed_names(synthesized.templates) if others}
    assert {next(p for p in KEPT_FIXED_NAMES if lid.startswith(p)) for lid in kept} == set(KEPT_FIXED_NAMES)


@pytest.mark.parametrize(
    ("kind", "old_name", "replaces_on"),
    [
        # the fixed name this release removed: any change to the configuration failed the update
        ("AWS::EMR::SecurityConfiguration", "lakehouse-dev-emr-security", "['SecurityConfiguration']"),
        # the name before it carried the Kafka version: a version change failed the update
        ("AWS::MSK::Configuration", "lakehouse-dev-msk-config", "['KafkaVersionsList']"),
    ],
)
def test_a_fixed_name_that_blocks_a_replacement_is_found(synthesized, kind, old_name, replaces_on):
    templates = synthesized.templates
    (resource_id,) = of_type(templates, kind)

    def named(resource):
        resource["Properties"]["Name"] = old_name

    found = aws.names_blocking_replacement(aws.mutated(templates, resource_id, named), KEPT_FIXED_NAMES)
    assert len(found) == 1 and found[0].endswith(f"({kind}) has a fixed name and replaces on {replaces_on}")


# ---- rule 4: metric math only in documented forms ---------------------------------------------------


def test_every_alarm_expression_uses_documented_metric_math(synthesized):
    expressions = list(aws.alarm_expressions(synthesized.templates))
    assert len(expressions) >= 3  # clicks not committed (two), rejects ratio
    for alarm, expression, ids in expressions:
        assert aws.undocumented_metric_math(expression, ids) == [], alarm


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("rejects / MAX([records, 1])", "a number (1) inside [ ] is not a time series"),
        ("rejects / MAXIMUM([records])", "MAXIMUM is not a documented metric math function"),
        ("SUM([rejects, other])", "other is not a metric of the expression"),
    ],
)
def test_undocumented_metric_math_is_found(expression, problem):
    assert any(problem in p for p in aws.undocumented_metric_math(expression, {"rejects", "records"}))
    assert (
        aws.undocumented_metric_math("rejects / MAX([records, TIME_SERIES(1)])", {"rejects", "records"}) == []
    )


# ---- dev: the person who deployed reads the tables through Athena -----------------------------------


@pytest.mark.synth
def test_the_person_who_deployed_dev_can_query_the_tables_with_athena(dev, tmp_path):
    """Athena reads S3 with the caller's credentials (PAGES['athena-s3']), and the warehouse bucket
    denies table reads to every role not named: the role the dev preflight pinned must be named."""
    from conftest import synthesize

    from infra.config import DEV_LAKE_READERS_CONTEXT_KEY

    me = f"arn:aws:iam::{aws.ACCOUNT}:role/aws-reserved/sso.amazonaws.com/AWSReservedSSO_Admin_0123"
    pinned = synthesize("dev", tmp_path / "dev-pinned", {DEV_LAKE_READERS_CONTEXT_KEY: [me]})

    def table_read(templates) -> str:
        warehouse = find(templates, "AWS::S3::Bucket", "-warehouse-", "BucketName")
        key = "warehouse/ads_behavior.db/product_views/data/00000-0.parquet"
        request = aws.Request(
            "s3:GetObject", f"{aws.physical(templates, warehouse, 'Arn')}/{key}", principal_arn=me
        )
        return aws.evaluate(templates, aws.resource_policy(templates, warehouse), request)

    assert table_read(pinned.templates) != "deny"
    assert table_read(dev.templates) == "deny"  # not pinned: Athena's query fails "Access denied"


# ---- rule 5: a replaced cluster reaches the stacks that act on it ----------------------------------


def test_the_stacks_acting_on_the_cluster_read_its_id_at_every_deploy(synthesized):
    assert aws.stale_after_replacement(synthesized.templates) == []


def test_the_last_release_read_the_cluster_id_by_a_reference_a_replacement_left_stale():
    """Positive control: the last release's templates (tests/infra/baselines), where the supervisor,
    the state machines, the step-change rule and the EMR failure rule named the cluster by
    Fn::GetStackOutput."""
    from lakehouse.release import current_baseline

    old = {name.rsplit("-", 1)[-1]: t for name, t in current_baseline().templates("dev").items()}
    found = aws.stale_after_replacement(old)
    assert {f.split("/")[0] for f in found} == {"Jobs", "Monitoring"}, found
    assert any("Supervisor" in f for f in found), found


# ---- rule 6: a replacing cluster's supervisor can take over from the cluster it replaces ------------


def test_the_supervisor_of_a_replacing_cluster_can_interrupt_the_replaced_cluster_s_steps(synthesized):
    from infra.emr_steps import SUPERVISED_CLUSTER_TAG

    assert aws.handover_gaps(synthesized.templates, SUPERVISED_CLUSTER_TAG) == []


def test_a_cluster_without_the_tag_or_a_role_without_the_condition_fails_the_handover(dev):
    from infra.emr_steps import SUPERVISED_CLUSTER_TAG

    (cluster,) = of_type(dev.templates, "AWS::EMR::Cluster")

    def untag(resource):
        resource["Properties"]["Tags"] = [
            t for t in resource["Properties"]["Tags"] if t["Key"] != SUPERVISED_CLUSTER_TAG
        ]

    gaps = aws.handover_gaps(aws.mutated(dev.templates, cluster, untag), SUPERVISED_CLUSTER_TAG)
    assert any("no tag" in gap for gap in gaps), gaps

    (policy,) = [lid for lid in of_type(dev.templates, "AWS::IAM::Policy") if "StepSupervisor" in lid]

    def drop_condition(resource):
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]:
            statement.pop("Condition", None)

    gaps = aws.handover_gaps(aws.mutated(dev.templates, policy, drop_condition), SUPERVISED_CLUSTER_TAG)
    assert any("not tagged" in gap for gap in gaps), gaps


def test_the_last_release_s_cluster_carries_no_tag_so_the_first_handover_waits_for_an_operator():
    """The baseline's cluster was created without the tag: the supervisor of the release that
    replaces it cannot list its steps and holds the start (handler.py) until it is terminated.
    infra/README's Upgrade section says so."""
    from infra.emr_steps import SUPERVISED_CLUSTER_TAG
    from lakehouse.release import current_baseline

    old = {name.rsplit("-", 1)[-1]: t for name, t in current_baseline().templates("prod").items()}
    assert any("no tag" in gap for gap in aws.handover_gaps(old, SUPERVISED_CLUSTER_TAG))
