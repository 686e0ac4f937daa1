"""What matters in the synthesized templates, per concern and per environment."""

from __future__ import annotations

import inspect
import json

from aws_cdk.assertions import Match

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
    for stack in (dev.stacks.streaming, dev.stacks.source_database, dev.stacks.lake):
        assert "Lakehouse-dev-Compute" not in {s.stack_name for s in stack.dependencies}


# ---- network --------------------------------------------------------------------------------


def test_network_azs_nat_endpoints_flow_logs(synthesized):
    template = synthesized.template("Network")
    azs = synthesized.config.network.max_azs
    template.resource_count_is("AWS::EC2::VPC", 1)
    template.resource_count_is("AWS::EC2::NatGateway", synthesized.config.network.nat_gateways)
    template.resource_count_is("AWS::EC2::Subnet", 2 * azs)  # public + private per AZ
    template.resource_count_is("AWS::EC2::FlowLog", 1)
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
    template = synthesized.template("Lake")
    for namespace in NAMESPACES:
        template.has_resource_properties(
            "AWS::Glue::Database",
            {"DatabaseInput": {"Name": namespace, "LocationUri": Match.any_value()}},
        )
    template.resource_count_is("AWS::Glue::Database", len(NAMESPACES))
    template.has_resource_properties(
        "AWS::Athena::WorkGroup",
        {
            "WorkGroupConfiguration": Match.object_like(
                {
                    "EnforceWorkGroupConfiguration": True,
                    "ResultConfiguration": {
                        "OutputLocation": Match.any_value(),
                        "EncryptionConfiguration": {"EncryptionOption": "SSE_S3"},
                    },
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


# ---- streaming ------------------------------------------------------------------------------


def test_msk_tls_iam_encrypted_logged(synthesized):
    template = synthesized.template("Streaming")
    settings = synthesized.config.streaming
    template.has_resource_properties(
        "AWS::MSK::Cluster",
        {
            "KafkaVersion": Match.string_like_regexp(r"^3\."),
            "NumberOfBrokerNodes": settings.broker_count,
            "BrokerNodeGroupInfo": Match.object_like({"InstanceType": settings.broker_instance_type}),
            "EncryptionInfo": {"EncryptionInTransit": {"ClientBroker": "TLS", "InCluster": True}},
            "ClientAuthentication": {
                "Sasl": {"Iam": {"Enabled": True}},
                "Unauthenticated": {"Enabled": False},
            },
            "LoggingInfo": {"BrokerLogs": {"CloudWatchLogs": Match.object_like({"Enabled": True})}},
        },
    )
    # At rest: MSK always encrypts; no EncryptionAtRest block means the MSK-managed key.
    assert synthesized.config.env_name != "dev" or settings.broker_instance_type == "kafka.t3.small"


def test_click_topic_created_at_deploy_and_brokers_published(synthesized):
    template = synthesized.template("Streaming")
    template.has_resource_properties(
        "AWS::MSK::Topic",
        {
            "TopicName": CLICK_TOPIC,
            "PartitionCount": CLICK_TOPIC_PARTITIONS,
            "ReplicationFactor": synthesized.config.streaming.topic_replication_factor,
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


def test_mysql_binlog_parameters_and_backups(synthesized):
    template = synthesized.template("SourceDatabase")
    template.has_resource_properties(
        "AWS::RDS::DBParameterGroup",
        {
            "Family": "mysql8.4",
            "Parameters": Match.object_like(
                {
                    "binlog_format": "ROW",
                    "binlog_row_image": "FULL",
                    "binlog_row_metadata": "FULL",
                }
            ),
        },
    )
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
    template = synthesized.template("Monitoring")
    template.has_resource_properties("AWS::SNS::Topic", {"KmsMasterKeyId": Match.any_value()})
    template.has_resource_properties(
        "AWS::Events::Rule",
        {
            "EventPattern": {
                "source": ["aws.emr"],
                "detail-type": ["EMR Step Status Change", "EMR Cluster State Change"],
                "detail": {"clusterId": Match.any_value(), "state": ["FAILED", "TERMINATED_WITH_ERRORS"]},
            },
            "Targets": Match.array_with([Match.object_like({"Arn": Match.any_value()})]),
        },
    )
    template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "MetricName": "FreeStorageSpace",
            "ComparisonOperator": "LessThanThreshold",
        },
    )
    disk_alarms = template.find_resources(
        "AWS::CloudWatch::Alarm", {"Properties": {"MetricName": "KafkaDataLogsDiskUsed"}}
    )
    assert len(disk_alarms) == synthesized.config.streaming.broker_count
    for alarm in template.find_resources("AWS::CloudWatch::Alarm").values():
        assert alarm["Properties"]["AlarmActions"]


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
    template = synthesized.template("SourceDatabase")
    template.has_resource_properties(
        "AWS::RDS::DBInstance", {"Engine": "mysql", "EngineVersion": Match.string_like_regexp(r"^8\.4")}
    )
    template.has_resource_properties(
        "AWS::RDS::DBParameterGroup",
        {
            "Family": "mysql8.4",
            "Parameters": Match.object_like({"binlog_row_metadata": "FULL", "binlog_format": "ROW"}),
        },
    )
