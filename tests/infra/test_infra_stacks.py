"""What matters in the synthesized templates, per concern and per environment."""

from __future__ import annotations

import inspect
import json

from aws_cdk.assertions import Match
from cfn import as_list

from infra.constructs.source_database import seed_version
from jobs.config import (
    CATALOG_NAME,
    CLICK_TOPIC,
    CLICK_TOPIC_PARTITIONS,
    NAMESPACES,
    LakehouseConfig,
)

CONCERNS = ("Network", "Lake", "Streaming", "SourceDatabase", "Compute", "Monitoring", "Jobs")

# ---- app ------------------------------------------------------------------------------------


def test_stacks_are_named_by_environment_and_agnostic(synthesized):
    env = synthesized.config.env_name
    assert [s.stack_name for s in synthesized.stacks.all] == [f"Lakehouse-{env}-{c}" for c in CONCERNS]
    for stack in synthesized.stacks.all:
        assert stack.environment == "aws://unknown-account/unknown-region"


def test_deploy_order_follows_dependencies(dev):
    compute = dev.stacks.compute
    names = {s.stack_name for s in compute.dependencies}
    assert {
        "Lakehouse-dev-Network",
        "Lakehouse-dev-Lake",
        "Lakehouse-dev-Streaming",
        "Lakehouse-dev-SourceDatabase",
    } <= names
    # The data stacks never depend on Compute (ingress rules live in the Compute stack).
    for stack in (dev.stacks.kafka, dev.stacks.source_database, dev.stacks.lake):
        assert "Lakehouse-dev-Compute" not in {s.stack_name for s in stack.dependencies}


# ---- network --------------------------------------------------------------------------------


def test_network_azs_nat_endpoints_flow_logs(synthesized):
    template = synthesized.template("Network")
    azs = synthesized.config.network.max_azs
    template.resource_count_is("AWS::EC2::VPC", 1)
    template.resource_count_is("AWS::EC2::NatGateway", synthesized.config.network.nat_gateways)
    template.resource_count_is("AWS::EC2::Subnet", 2 * azs)  # public + private per AZ
    template.has_resource_properties(
        "AWS::EC2::VPCEndpoint", {"VpcEndpointType": "Gateway", "ServiceName": Match.any_value()}
    )
    services = json.dumps(template.find_resources("AWS::EC2::VPCEndpoint"))
    for service in ("elasticmapreduce", "secretsmanager", "glue", "s3"):
        assert f".{service}" in services, service
    template.has_resource_properties(
        "AWS::EC2::Subnet",
        {"Tags": Match.array_with([{"Key": "for-use-with-amazon-emr-managed-policies", "Value": "true"}])},
    )


def test_the_vpc_logs_all_its_traffic_to_an_encrypted_log_group(synthesized):
    env = synthesized
    (vpc_id,) = env.resources("Network", "AWS::EC2::VPC")
    (flow_log,) = env.resources("Network", "AWS::EC2::FlowLog").values()
    props = flow_log["Properties"]
    assert props["ResourceType"] == "VPC" and props["TrafficType"] == "ALL"
    vpc = env.resolve("Network", props["ResourceId"])
    assert (vpc.concern, vpc.logical_id, vpc.attribute) == ("Network", vpc_id, None)
    # Delivered to a CloudWatch log group of the stack, encrypted with the stack's logs key and kept
    # for the environment's retention, by a role only the flow-logs service can assume.
    assert props["LogDestinationType"] == "cloud-watch-logs" and "LogDestination" not in props
    group = env.resolve("Network", props["LogGroupName"])
    assert group.type == "AWS::Logs::LogGroup" and group.attribute is None
    key = env.resolve("Network", group.properties["KmsKeyId"])
    assert key.type == "AWS::KMS::Key" and key.logical_id.startswith("LogsKey")
    assert group.properties["RetentionInDays"] == {"dev": 30, "prod": 365}[env.config.env_name]
    role = env.resolve("Network", props["DeliverLogsPermissionArn"])
    assert role.type == "AWS::IAM::Role" and role.attribute == "Arn"
    (trust,) = role.properties["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "vpc-flow-logs.amazonaws.com"}


# ---- lake -----------------------------------------------------------------------------------


def test_buckets_encrypted_private_ssl_only_and_logged(synthesized):
    template = synthesized.template("Lake")
    buckets = template.find_resources("AWS::S3::Bucket")
    assert len(buckets) == 3
    for bucket in buckets.values():
        props = bucket["Properties"]
        assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
        assert props["PublicAccessBlockConfiguration"] == {
            "BlockPublicAcls": True,
            "BlockPublicPolicy": True,
            "IgnorePublicAcls": True,
            "RestrictPublicBuckets": True,
        }
    logged = [b for b in buckets.values() if "LoggingConfiguration" in b["Properties"]]
    # prod's warehouse and artifacts log to its retained logs bucket; dev auto-deletes that bucket,
    # so nothing logs into it (test_infra_deploy_review.py).
    assert len(logged) == (2 if synthesized.config.retain_data else 0)
    assert any(
        "LifecycleConfiguration" in b["Properties"] and "LoggingConfiguration" not in b["Properties"]
        for b in buckets.values()
    )  # the logs bucket expires its logs
    policies = template.find_resources("AWS::S3::BucketPolicy")
    ssl_denies = [p for p in policies.values() if '"aws:SecureTransport": "false"' in json.dumps(p)]
    assert len(ssl_denies) == 3


def test_glue_databases_in_the_warehouse_and_athena_workgroup(synthesized):
    env = synthesized
    template = env.template("Lake")
    lake = env.stacks.lake
    warehouse_id = lake.get_logical_id(lake.lake.warehouse_bucket.node.default_child)
    # The warehouse bucket's own name (a literal plus the account and region), as the bucket says it.
    warehouse = env.render("Lake", {"Ref": warehouse_id})
    assert warehouse == f"lakehouse-{env.config.env_name}-warehouse-${{AWS::AccountId}}-${{AWS::Region}}"
    # Each namespace where Iceberg's GlueCatalog puts it by default: <warehouse>/<namespace>.db.
    databases = {
        db["Properties"]["DatabaseInput"]["Name"]: db["Properties"]
        for db in env.resources("Lake", "AWS::Glue::Database").values()
    }
    assert sorted(databases) == sorted(NAMESPACES)
    for namespace, props in databases.items():
        assert props["CatalogId"] == {"Ref": "AWS::AccountId"}
        location = env.render("Lake", props["DatabaseInput"]["LocationUri"])
        assert location == f"s3://{warehouse}/warehouse/{namespace}.db", namespace
    assert env.render("Lake", env.templates["Lake"]["Outputs"]["WarehouseUri"]["Value"]) == (
        f"s3://{warehouse}/warehouse"
    )
    (workgroup,) = env.resources("Lake", "AWS::Athena::WorkGroup").values()
    results = workgroup["Properties"]["WorkGroupConfiguration"]["ResultConfiguration"]
    assert env.render("Lake", results["OutputLocation"]) == f"s3://{warehouse}/athena-results/"
    template.has_resource_properties(
        "AWS::Athena::WorkGroup",
        {
            "WorkGroupConfiguration": Match.object_like(
                {
                    "EnforceWorkGroupConfiguration": True,
                    "ResultConfiguration": Match.object_like(
                        {"EncryptionConfiguration": {"EncryptionOption": "SSE_S3"}}
                    ),
                }
            )
        },
    )


def test_dev_destroys_data_and_prod_retains_it(dev, prod):
    dev_lake, prod_lake = dev.template("Lake"), prod.template("Lake")
    for bucket in dev_lake.find_resources("AWS::S3::Bucket").values():
        assert bucket["DeletionPolicy"] == "Delete"
    assert dev_lake.find_resources("Custom::S3AutoDeleteObjects")
    for bucket in prod_lake.find_resources("AWS::S3::Bucket").values():
        assert bucket["DeletionPolicy"] == "Retain"
    assert not prod_lake.find_resources("Custom::S3AutoDeleteObjects")
    for database in prod_lake.find_resources("AWS::Glue::Database").values():
        assert database["DeletionPolicy"] == "Retain"

    dev_db = dev.template("SourceDatabase").find_resources("AWS::RDS::DBInstance")
    prod_db = prod.template("SourceDatabase").find_resources("AWS::RDS::DBInstance")
    (dev_instance,), (prod_instance,) = dev_db.values(), prod_db.values()
    assert dev_instance["DeletionPolicy"] == "Delete"
    assert dev_instance["Properties"]["DeletionProtection"] is False
    assert dev_instance["Properties"]["MultiAZ"] is False
    assert prod_instance["DeletionPolicy"] == "Snapshot"
    assert prod_instance["Properties"]["DeletionProtection"] is True
    assert prod_instance["Properties"]["MultiAZ"] is True


def _termination_protection(env) -> dict[str, bool]:
    """Per stack, what the cloud assembly tells CloudFormation (the deploy sets it on the stack)."""
    manifest = json.loads((env.outdir / "manifest.json").read_text())
    return {
        name: artifact.get("properties", {}).get("terminationProtection", False)
        for name, artifact in manifest["artifacts"].items()
        if artifact["type"] == "aws:cloudformation:stack"
    }


def test_prod_cannot_be_deleted_by_accident_and_keeps_its_unread_clicks(dev, prod):
    dev_protection, prod_protection = _termination_protection(dev), _termination_protection(prod)
    assert len(prod_protection) == len(CONCERNS) and all(prod_protection.values())
    assert len(dev_protection) == len(CONCERNS) and not any(dev_protection.values())  # dev parks
    assert _cluster(prod)["Instances"]["TerminationProtected"] is True
    assert _cluster(dev)["Instances"]["TerminationProtected"] is False
    # The click topic holds what the ingest has not read yet: prod keeps the cluster and the topic,
    # also when a change would replace them; dev deletes both.
    for env, policy in ((dev, "Delete"), (prod, "Retain")):
        template = env.template("Streaming")
        for kind in ("AWS::MSK::Cluster", "AWS::MSK::Topic"):
            (resource,) = template.find_resources(kind).values()
            assert (resource["DeletionPolicy"], resource["UpdateReplacePolicy"]) == (policy, policy), kind


# ---- kafka (the Streaming stack) ------------------------------------------------------------


def test_msk_tls_iam_encrypted_logged(synthesized):
    env = synthesized
    settings = env.config.kafka
    (cluster,) = env.resources("Streaming", "AWS::MSK::Cluster").values()
    props = cluster["Properties"]
    assert props["KafkaVersion"].startswith("3.")
    assert props["NumberOfBrokerNodes"] == settings.broker_count
    brokers = props["BrokerNodeGroupInfo"]
    assert brokers["InstanceType"] == settings.broker_instance_type
    subnets = [env.resolve("Streaming", subnet) for subnet in brokers["ClientSubnets"]]
    assert {(s.concern, s.type) for s in subnets} == {("Network", "AWS::EC2::Subnet")}
    assert len({s.logical_id for s in subnets}) == env.config.network.max_azs
    # IAM is the only way in: no TLS client certificates, no SCRAM, no unauthenticated clients.
    assert props["ClientAuthentication"] == {
        "Sasl": {"Iam": {"Enabled": True}},
        "Unauthenticated": {"Enabled": False},
    }
    encryption = props["EncryptionInfo"]
    assert encryption["EncryptionInTransit"] == {"ClientBroker": "TLS", "InCluster": True}
    # At rest: MSK always encrypts the brokers' volumes and cannot be told not to. Without a
    # DataVolumeKMSKeyId it uses its AWS-managed key (docs/security.md, "At rest"); with one, it
    # must be a rotating customer-managed key of this stack.
    assert set(encryption) <= {"EncryptionInTransit", "EncryptionAtRest"}
    at_rest = encryption.get("EncryptionAtRest")
    if at_rest is not None:
        key = env.resolve("Streaming", at_rest["DataVolumeKMSKeyId"])
        assert key.type == "AWS::KMS::Key" and key.properties["EnableKeyRotation"] is True
    # Broker logs go to this stack's log group, encrypted with its logs key.
    broker_logs = props["LoggingInfo"]["BrokerLogs"]["CloudWatchLogs"]
    assert broker_logs["Enabled"] is True
    group = env.resolve("Streaming", broker_logs["LogGroup"])
    assert group.type == "AWS::Logs::LogGroup" and group.concern == "Streaming"
    assert group.properties["RetentionInDays"] == {"dev": 7, "prod": 90}[env.config.env_name]
    logs_key = env.resolve("Streaming", group.properties["KmsKeyId"])
    assert logs_key.type == "AWS::KMS::Key" and logs_key.logical_id.startswith("LogsKey")


def test_click_topic_created_at_deploy_and_brokers_published(synthesized):
    template = synthesized.template("Streaming")
    template.has_resource_properties(
        "AWS::MSK::Topic",
        {
            "TopicName": CLICK_TOPIC,
            "PartitionCount": synthesized.config.kafka.click_topic_partitions,
            "ReplicationFactor": synthesized.config.kafka.topic_replication_factor,
        },
    )
    template.has_resource_properties(
        "AWS::SSM::Parameter",
        {
            "Name": f"/lakehouse/{synthesized.config.env_name}/msk/bootstrap-brokers",
        },
    )
    assert "BootstrapBrokers" in json.dumps(template.to_json()["Outputs"])

    assert "getBootstrapBrokers" in json.dumps(template.find_resources("Custom::AWS"))


# ---- source database ------------------------------------------------------------------------


def test_partitions_and_ingest_executors_come_from_the_capacity_model(synthesized):
    """Each environment's topic and streaming executors are what its capacity target gives
    (infra/capacity.py), resolved from the synthesized templates, never fewer partitions than the
    topics were created with (Kafka cannot remove one)."""
    from infra.config import DEV_PLAN, PROD_PLAN

    plan = {"dev": DEV_PLAN, "prod": PROD_PLAN}[synthesized.config.env_name]
    (topic,) = synthesized.template("Streaming").find_resources("AWS::MSK::Topic").values()
    partitions = topic["Properties"]["PartitionCount"]
    assert partitions == plan.partitions >= CLICK_TOPIC_PARTITIONS
    assert partitions % synthesized.config.kafka.broker_count == 0 or partitions == CLICK_TOPIC_PARTITIONS
    if not synthesized.config.jobs.one_streaming_application:  # prod: the ingest is a step of its own
        # (test_infra_jobs.py checks that every step is submitted with these resources)
        assert synthesized.config.jobs.streaming_resources.max_executors == plan.ingest_executors


def instance_parameters(env) -> dict:
    """The parameters of the parameter group the source DB instance uses (not just any group)."""
    (instance,) = env.resources("SourceDatabase", "AWS::RDS::DBInstance").values()
    group = env.resolve("SourceDatabase", instance["Properties"]["DBParameterGroupName"])
    assert group.type == "AWS::RDS::DBParameterGroup" and group.attribute is None
    assert group.properties["Family"] == "mysql8.4"
    return group.properties["Parameters"]


def test_mysql_binlog_parameters_and_backups(synthesized):
    template = synthesized.template("SourceDatabase")
    parameters = instance_parameters(synthesized)
    binlog = ("binlog_format", "binlog_row_image", "binlog_row_metadata")
    assert {name: parameters.get(name) for name in binlog} == {
        "binlog_format": "ROW",
        "binlog_row_image": "FULL",
        "binlog_row_metadata": "FULL",
    }
    (instance,) = template.find_resources("AWS::RDS::DBInstance").values()
    props = instance["Properties"]
    assert props["Engine"] == "mysql" and props["EngineVersion"].startswith("8.4.")
    assert props["BackupRetentionPeriod"] >= 1
    assert props["StorageEncrypted"] is True
    assert props["PubliclyAccessible"] is False
    assert "{{resolve:secretsmanager:" in json.dumps(props["MasterUserPassword"])


def test_admin_and_cdc_secrets_are_generated_and_seeding_runs_in_vpc(synthesized):
    template = synthesized.template("SourceDatabase")
    secrets = template.find_resources("AWS::SecretsManager::Secret")
    assert len(secrets) == 2
    for secret in secrets.values():
        assert "GenerateSecretString" in secret["Properties"]
        assert "SecretString" not in secret["Properties"]
    assert '\\"username\\":\\"cdc_user\\"' in json.dumps(secrets)
    template.has_resource_properties(
        "Custom::SourceDatabaseSeed",
        {
            "DatabaseName": "user_db",
            "AdminSecretArn": Match.any_value(),
            "CdcSecretArn": Match.any_value(),
            "BinlogRetentionHours": "24",
            # A changed seed (CDC's grants, its barrier table) re-runs the seeding on deploy.
            "SeedVersion": seed_version(),
        },
    )
    template.has_resource_properties(
        "AWS::Lambda::Function",
        {
            "Handler": "handler.on_event",
            "VpcConfig": Match.object_like({"SubnetIds": Match.any_value()}),
        },
    )


def test_seed_asset_vendors_pymysql(synthesized):
    seeds = [p for p in synthesized.outdir.glob("asset.*") if (p / "seed_data.py").exists()]
    assert seeds and all((p / "pymysql" / "__init__.py").exists() for p in seeds)


# ---- compute --------------------------------------------------------------------------------


def _cluster(synthesized) -> dict:
    (cluster,) = synthesized.template("Compute").find_resources("AWS::EMR::Cluster").values()
    return cluster["Properties"]


def test_emr_release_applications_and_classifications(synthesized):
    cluster = _cluster(synthesized)
    assert cluster["ReleaseLabel"] == "emr-7.14.0"
    assert {a["Name"] for a in cluster["Applications"]} == {"Spark", "Hive", "Trino"}
    classes = {c["Classification"]: c for c in cluster["Configurations"]}
    assert set(classes) == {
        "iceberg-defaults",
        "spark-defaults",
        "hive-site",
        "trino-connector-iceberg",
        "spark-env",
    }
    assert classes["iceberg-defaults"]["ConfigurationProperties"] == {"iceberg.enabled": "true"}
    spark = classes["spark-defaults"]["ConfigurationProperties"]
    catalog = f"spark.sql.catalog.{CATALOG_NAME}"
    assert spark[catalog] == "org.apache.iceberg.spark.SparkCatalog"
    assert spark[f"{catalog}.catalog-impl"] == "org.apache.iceberg.aws.glue.GlueCatalog"
    assert spark[f"{catalog}.io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    assert "/warehouse" in json.dumps(spark[f"{catalog}.warehouse"])
    assert "IcebergSparkSessionExtensions" in spark["spark.sql.extensions"]
    assert classes["hive-site"]["ConfigurationProperties"]["hive.metastore.client.factory.class"].endswith(
        "AWSGlueDataCatalogHiveClientFactory"
    )
    assert classes["trino-connector-iceberg"]["ConfigurationProperties"]["iceberg.catalog.type"] == "glue"
    (export,) = classes["spark-env"]["Configurations"]
    assert export["ConfigurationProperties"]["PYSPARK_PYTHON"] == "/usr/bin/python3.11"


def test_emr_scaling_termination_concurrency_and_spot(dev, prod):
    dev_cluster, prod_cluster = _cluster(dev), _cluster(prod)
    assert dev_cluster["AutoTerminationPolicy"]["IdleTimeout"] > 0
    assert "AutoTerminationPolicy" not in prod_cluster
    for cluster in (dev_cluster, prod_cluster):
        assert cluster["StepConcurrencyLevel"] > 1
        assert cluster["ManagedScalingPolicy"]["ComputeLimits"]["UnitType"] == "InstanceFleetUnits"
        assert cluster["Instances"]["KeepJobFlowAliveWhenNoSteps"] is True
        assert "LogUri" in cluster and "SecurityConfiguration" in cluster
    (dev_task,) = dev_cluster["Instances"]["TaskInstanceFleets"]
    assert dev_task["TargetSpotCapacity"] > 0 and dev_task["TargetOnDemandCapacity"] == 0


def test_emr_security_configuration_encrypts_and_requires_imdsv2(synthesized):
    template = synthesized.template("Compute")
    (config,) = template.find_resources("AWS::EMR::SecurityConfiguration").values()
    security = config["Properties"]["SecurityConfiguration"]
    encryption = security["EncryptionConfiguration"]
    assert encryption["EnableAtRestEncryption"] is True
    assert encryption["EnableInTransitEncryption"] is True
    local_disk = encryption["AtRestEncryptionConfiguration"]["LocalDiskEncryptionConfiguration"]
    assert local_disk["EncryptionKeyProviderType"] == "AwsKms" and local_disk["EnableEbsEncryption"]
    tls = encryption["InTransitEncryptionConfiguration"]["TLSCertificateConfiguration"]
    assert tls["CertificateProviderType"] == "PEM"
    assert "security/emr-tls-certificates.zip" in json.dumps(tls["S3Object"])
    assert security["InstanceMetadataServiceConfiguration"]["MinimumInstanceMetadataServiceVersion"] == 2
    template.has_resource_properties("AWS::KMS::Key", {"EnableKeyRotation": True})


def test_managed_security_group_cleanup_runs_before_groups_are_deleted(dev):
    template = dev.template("Compute")
    (cleanup_id,) = template.find_resources("Custom::EmrManagedSecurityGroupCleanup").keys()
    cleanup = template.find_resources("Custom::EmrManagedSecurityGroupCleanup")[cleanup_id]
    groups = template.find_resources("AWS::EC2::SecurityGroup")
    group_refs = json.dumps(cleanup["Properties"]["SecurityGroupIds"])
    assert sum(1 for gid in groups if gid in group_refs) == 3
    (cluster,) = template.find_resources("AWS::EMR::Cluster").values()
    assert cleanup_id in cluster["DependsOn"]  # the cluster goes first, then the cleanup, then SGs


def test_job_settings_seam_matches_lakehouse_config(dev):
    parameters = dev.template("Compute").find_resources("AWS::SSM::Parameter")
    assert any(p["Properties"]["Name"] == "/lakehouse/dev/jobs/settings" for p in parameters.values())
    accepted = set(inspect.signature(LakehouseConfig.aws).parameters)
    assert set(dev.stacks.compute.job_settings) <= accepted
    required = {
        n
        for n, p in inspect.signature(LakehouseConfig.aws).parameters.items()
        if p.default is inspect.Parameter.empty
    }
    assert required <= set(dev.stacks.compute.job_settings)


# ---- monitoring -----------------------------------------------------------------------------


def test_failures_and_storage_alarms_reach_an_encrypted_topic(synthesized):
    env = synthesized
    topic_id = env.logical_id(env.stacks.monitoring.monitoring.topic)
    topic = env.templates["Monitoring"]["Resources"][topic_id]["Properties"]
    # The topic is encrypted with the alerts key of this stack (not any key), which rotates...
    key = env.resolve("Monitoring", topic["KmsMasterKeyId"])
    assert (key.concern, key.type) == ("Monitoring", "AWS::KMS::Key")
    assert key.logical_id.startswith("MonitoringAlertsKey") and key.properties["EnableKeyRotation"]
    # ...and lets the two services that publish to it (EventBridge, CloudWatch alarms) use it.
    granted = {}
    for statement in key.properties["KeyPolicy"]["Statement"]:
        services = statement["Principal"].get("Service", [])
        for service in [services] if isinstance(services, str) else services:
            granted.setdefault(service, set()).update(as_list(statement["Action"]))
    for service in ("events.amazonaws.com", "cloudwatch.amazonaws.com"):
        assert {"kms:Decrypt", "kms:GenerateDataKey*"} <= granted.get(service, set()), service

    # A failed step or cluster of this app's EMR cluster goes to that topic.
    (rule,) = env.resources("Monitoring", "AWS::Events::Rule").values()
    pattern = rule["Properties"]["EventPattern"]
    assert pattern["source"] == ["aws.emr"]
    assert pattern["detail-type"] == ["EMR Step Status Change", "EMR Cluster State Change"]
    assert pattern["detail"]["state"] == ["FAILED", "TERMINATED_WITH_ERRORS"]
    (cluster_id,) = pattern["detail"]["clusterId"]
    cluster = env.resolve("Monitoring", cluster_id)
    assert (cluster.concern, cluster.type, cluster.attribute) == ("Compute", "AWS::EMR::Cluster", None)
    (target,) = rule["Properties"]["Targets"]
    arn = env.resolve("Monitoring", target["Arn"])
    assert (arn.concern, arn.logical_id, arn.attribute) == ("Monitoring", topic_id, None)
    # EventBridge may publish to the topic (its resource policy), over TLS only.
    (policy,) = env.resources("Monitoring", "AWS::SNS::TopicPolicy").values()
    assert [env.resolve("Monitoring", t).logical_id for t in policy["Properties"]["Topics"]] == [topic_id]
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    assert any(
        s["Effect"] == "Allow"
        and s["Principal"] == {"Service": "events.amazonaws.com"}
        and s["Action"] == "sns:Publish"
        for s in statements
    )
    assert any(
        s["Effect"] == "Deny" and s.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}}
        for s in statements
    )

    # The storage alarms (RDS free storage, one MSK disk alarm per broker) alert that topic; every
    # alarm's thresholds and actions: test_infra_pipeline_health.py.
    alarms = env.resources("Monitoring", "AWS::CloudWatch::Alarm").values()
    storage = [
        a
        for a in alarms
        if a["Properties"].get("MetricName") in ("FreeStorageSpace", "KafkaDataLogsDiskUsed")
    ]
    assert len(storage) == 1 + env.config.kafka.broker_count
    for alarm in storage:
        (action,) = alarm["Properties"]["AlarmActions"]
        assert env.resolve("Monitoring", action).logical_id == topic_id


def test_every_publisher_to_the_alerts_topic_may_use_its_key(synthesized):
    """tasks.SnsPublish grants sns:Publish only: a publisher without the key's rights would see its
    failure alert itself fail with a KMS access error."""
    env = synthesized
    topic_id = env.logical_id(env.stacks.monitoring.monitoring.topic)
    topic = env.templates["Monitoring"]["Resources"][topic_id]["Properties"]
    key_id = env.resolve("Monitoring", topic["KmsMasterKeyId"]).logical_id
    publishers = env.grantees("sns:Publish", "Monitoring", topic_id)
    # the step supervisor, the report, maintain, verify and replay state machines, and gendata's in dev
    assert len(publishers) == 5 + env.config.jobs.deploy_gendata
    missing = {
        f"{concern}/{role}: {action}"
        for action in ("kms:GenerateDataKey", "kms:Decrypt")
        for concern, role in publishers - env.grantees(action, "Monitoring", key_id)
    }
    assert not missing, sorted(missing)


# ---- teardown ---------------------------------------------------------------------------------


def test_dev_leaves_nothing_behind_and_prod_keeps_its_logs(dev, prod):
    """dev: no Retain/Snapshot anywhere (the framework's log groups included) and short retention;
    prod: every log group is kept on purpose."""
    for concern, template in dev.templates.items():
        for logical_id, resource in template["Resources"].items():
            assert resource.get("DeletionPolicy", "Delete") == "Delete", f"dev {concern}/{logical_id}"
            if resource["Type"] == "AWS::Logs::LogGroup":
                assert resource["Properties"]["RetentionInDays"] <= dev.config.log_retention_cap_days
    prod_log_groups = [
        r
        for t in prod.templates.values()
        for r in t["Resources"].values()
        if r["Type"] == "AWS::Logs::LogGroup"
    ]
    assert prod_log_groups and all(r["DeletionPolicy"] == "Retain" for r in prod_log_groups)


def test_source_is_mysql_8_4_with_the_binlog_settings(synthesized):
    (instance,) = synthesized.resources("SourceDatabase", "AWS::RDS::DBInstance").values()
    assert instance["Properties"]["Engine"] == "mysql"
    assert instance["Properties"]["EngineVersion"].startswith("8.4.")
    parameters = instance_parameters(synthesized)  # the family of the instance's own group is mysql8.4
    assert parameters.get("binlog_row_metadata") == "FULL" and parameters.get("binlog_format") == "ROW"
