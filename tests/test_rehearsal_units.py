"""The rehearsal's pure parts: intrinsic functions, States.Array, YARN cluster mode, substitutions.
(The whole rehearsal runs in tests/infra/test_rehearsal.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lakehouse.rehearsal.assembly import AssemblyError, CloudAssembly, Resolver, require_resolved
from lakehouse.rehearsal.checks import check_clicks, check_dimension, check_views
from lakehouse.rehearsal.steps import evaluate_intrinsic
from lakehouse.rehearsal.substitutions import LocalEndpoints, Substitutions
from lakehouse.rehearsal.yarn_cluster_mode import plan


def _assembly(tmp_path: Path, templates: dict[str, dict]) -> CloudAssembly:
    artifacts = {}
    for name, template in templates.items():
        (tmp_path / f"{name}.template.json").write_text(json.dumps(template))
        artifacts[name] = {
            "type": "aws:cloudformation:stack",
            "properties": {"templateFile": f"{name}.template.json"},
        }
    (tmp_path / "manifest.json").write_text(json.dumps({"artifacts": artifacts}))
    return CloudAssembly(tmp_path)


def _subs(tmp_path: Path) -> Substitutions:
    local = LocalEndpoints(
        s3_root=tmp_path / "s3", node_root=tmp_path / "node", mysql_host="127.0.0.1", mysql_port=3999,
        mysql_ca="/ca.pem", kafka_bootstrap="127.0.0.1:9092", catalog_jdbc_uri="jdbc:sqlite:/c.db",
        spark_master="spark://127.0.0.1:7077", executor_memory="1g", executor_cores=1,
    )  # fmt: skip
    return Substitutions(local=local, make_secret=lambda resource: f"arn:moto:{resource.logical_id}")


def test_cross_stack_outputs_and_resources_resolve_to_their_stand_ins(tmp_path):
    assembly = _assembly(
        tmp_path,
        {
            "Db": {
                "Resources": {"Instance": {"Type": "AWS::RDS::DBInstance", "Properties": {}}},
                "Outputs": {"Host": {"Value": {"Fn::GetAtt": ["Instance", "Endpoint.Address"]}}},
            },
            "Jobs": {
                "Resources": {
                    "Queue": {"Type": "AWS::SQS::Queue", "Properties": {}},
                    "Fn": {"Type": "AWS::Lambda::Function", "Properties": {
                        "Host": {"Fn::GetStackOutput": {"StackName": "Db", "OutputName": "Host"}},
                        "Bucket": {"Fn::Sub": "s3://b-${AWS::AccountId}-${AWS::Region}/k"},
                        "Queue": {"Fn::Join": ["", ["q=", {"Ref": "Queue"}]]},
                    }},
                }
            },
        },
    )  # fmt: skip
    subs = _subs(tmp_path)
    resolver = Resolver(assembly, {"AWS::AccountId": "1", "AWS::Region": "r"}, subs.resource_value)
    props = resolver.resolve("Jobs", assembly.resource("Jobs", "Fn").properties)
    assert props["Host"] == "127.0.0.1"
    assert subs.localize(props["Bucket"]) == f"file://{tmp_path}/s3/b-1-r/k"
    # A resource with no stand-in resolves to a marker that fails where it would be used.
    with pytest.raises(AssemblyError, match="AWS::SQS::Queue Jobs/Queue"):
        require_resolved("the step", props["Queue"])


def test_states_array_takes_literals_escapes_and_paths():
    state = {"count": "1000", "rate": "20"}
    expression = r"States.Array('spark-submit', 'it\'s', 'a,b', $.count, '--rate', $.rate)"
    assert evaluate_intrinsic(expression, state) == ["spark-submit", "it's", "a,b", "1000", "--rate", "20"]
    with pytest.raises(AssemblyError, match="no \\$.missing"):
        evaluate_intrinsic("States.Array($.missing)", state)


def test_yarn_cluster_mode_becomes_client_mode_with_the_application_masters_environment():
    args, env, archives = plan(
        ["--deploy-mode", "cluster", "--name", "x", "--conf", "spark.archives=file:///a/env.zip#pyenv",
         "--conf", "spark.yarn.appMasterEnv.PYTHONPATH=./pyenv",
         "file:///a/emr_step.py", "jobs.x", "--deploy-mode"]
    )  # fmt: skip
    assert args[:2] == ["--deploy-mode", "client"]
    assert "cluster" not in args and args[-1] == "--deploy-mode"  # an application argument stays
    assert env == {"PYTHONPATH": "./pyenv"}
    assert archives == [("/a/env.zip", "pyenv")]


def test_aws_values_are_substituted_and_recorded_keys_never(tmp_path):
    subs = _subs(tmp_path)
    assert subs.localize("org.apache.iceberg.aws.glue.GlueCatalog") == "org.apache.iceberg.jdbc.JdbcCatalog"
    assert subs.step_argument("--kafka-auth", "iam") == "plaintext"
    assert subs.step_argument("--mysql-ssl-ca", "rds") == "/ca.pem"
    assert subs.step_argument("--mysql-ssl-ca", "/other.pem") == "/other.pem"
    assert subs.spark_size("spark.executor.memory", "8g") == "1g"
    assert subs.spark_size("spark.driver.memory", "4g") == "4g"
    assert {record.what for record in subs.records.values()} >= {
        "Iceberg catalog implementation", "Kafka authentication", "MySQL TLS trust",
    }  # fmt: skip


def test_click_check_finds_a_lost_a_doubled_and_a_misplaced_record():
    from datetime import UTC, datetime

    event = {
        "webpageId": 5,
        "productId": "1",
        "cookieId": "c",
        "expendTime": 1,
        "updateTime": 1_763_700_000_123,
    }

    def sent(uid: str) -> bytes:
        return json.dumps({**event, "uid": uid}).encode()

    topic = {(0, 0): sent("a"), (0, 1): sent("b"), (1, 0): b"{bad"}
    at = datetime.fromtimestamp(1_763_700_000.123, UTC)
    row = {**event, "uid": "a", "eventTime": at, "kafka_partition": 0, "kafka_offset": 0}
    good = [row, {**row, "uid": "b", "kafka_offset": 1}]
    reject = [{"kafka_partition": 1, "kafka_offset": 0}]
    assert check_clicks(topic, {(1, 0)}, good, reject) == []
    assert check_clicks(topic, {(1, 0)}, good[:1], reject)  # lost
    assert check_clicks(topic, {(1, 0)}, [*good, good[0]], reject)  # twice
    assert check_clicks(topic, {(1, 0)}, good, [])  # the malformed one vanished
    assert check_clicks(topic, {(1, 0)}, [good[0], {**good[1], "uid": "z"}], reject)  # altered
    assert check_clicks(topic, {(1, 0)}, [good[0], {**good[1], "webpageId": 6}], reject)
    assert check_clicks(
        topic, {(1, 0)}, [good[0], {**good[1], "eventTime": at.replace(microsecond=0)}], reject
    )
    assert check_views(good, [{"productId": "1", "views": 2}]) == []
    assert check_views(good, [{"productId": "1", "views": 3}])
    assert check_dimension("t", [{"k": 1}, {"k": 1}], [{"k": 1}], ("k",))  # duplicates matter


def test_the_report_check_finds_a_missing_day_a_miscount_and_a_day_not_asked_for():
    from datetime import date, datetime

    from lakehouse.rehearsal.checks import check_report

    facts = [{"eventTime": datetime(2026, 11, d, 12)} for d in (27, 28, 28)]
    both = [
        {"report_date": date(2026, 11, 27), "events": 1},
        {"report_date": date(2026, 11, 28), "events": 2},
    ]
    assert check_report(facts, both) == []
    assert check_report(facts, both[1:]) == ["report 2026-11-27: missing, 1 clicks that day"]
    assert check_report(facts, [{**both[1], "events": 3}], days={date(2026, 11, 28)}) == [
        "report 2026-11-28: 3 events reported, 2 clicks that day"
    ]
    assert check_report(facts, both, days={date(2026, 11, 28)}) == [
        "report 2026-11-27: reported, but the report was not run for that day"
    ]
    assert check_report(facts, []) == [
        "report 2026-11-27: missing, 1 clicks that day",
        "report 2026-11-28: missing, 2 clicks that day",
        "the report table is empty",
    ]
