"""Data in transit and at rest, on the synthesized templates: TLS required by RDS, customer-managed
keys for log groups and secrets, prod's versioned buckets, RDS enhanced monitoring."""

from __future__ import annotations

import fnmatch
import json
import re
import ssl

import pytest
from aws_cdk.assertions import Match
from cfn import as_list

from jobs.config import RDS_CA_BUNDLE, LakehouseConfig


def resources(env, concern: str, kind: str) -> dict[str, dict]:
    return {k: r for k, r in env.templates[concern]["Resources"].items() if r["Type"] == kind}


def test_rds_requires_tls_from_every_client(synthesized) -> None:
    # The parameter group the instance uses, not just a group somewhere in the template.
    (instance,) = resources(synthesized, "SourceDatabase", "AWS::RDS::DBInstance").values()
    group = synthesized.resolve("SourceDatabase", instance["Properties"]["DBParameterGroupName"])
    assert group.type == "AWS::RDS::DBParameterGroup" and group.attribute is None
    assert group.properties["Family"] == "mysql8.4"
    assert group.properties["Parameters"].get("require_secure_transport") == "1"


def test_the_jobs_verify_rds_against_the_shipped_ca_bundle() -> None:
    config = LakehouseConfig.aws(
        env="dev",
        region="us-east-1",
        kafka_bootstrap="b:9098",
        mysql_host="db.example.us-east-1.rds.amazonaws.com",
        mysql_port=3306,
        mysql_cdc_secret_id="arn:secret",
    )
    assert config.mysql.tls_options() == {
        "ssl_ca": str(RDS_CA_BUNDLE),
        "ssl_verify_cert": True,
        "ssl_verify_identity": True,
    }
    # A real bundle: the certificates load, among them the current RDS root CAs.
    context = ssl.create_default_context(cafile=str(RDS_CA_BUNDLE))
    subjects = {dict(x[0] for x in cert["subject"]).get("commonName") for cert in context.get_ca_certs()}
    assert len(subjects) > 50
    assert "Amazon RDS us-east-1 Root CA RSA2048 G1" in subjects


def test_the_seeding_lambda_bundles_the_ca(synthesized) -> None:
    stage = next(synthesized.outdir.glob("asset.*/rds-ca-bundle.pem"), None)
    assert stage is not None, "the seeding function's asset has no rds-ca-bundle.pem"
    assert stage.read_bytes() == RDS_CA_BUNDLE.read_bytes()


@pytest.mark.parametrize("concern", ["Network", "Streaming", "SourceDatabase", "Compute", "Jobs"])
def test_every_log_group_is_encrypted_with_the_stacks_key(synthesized, concern: str) -> None:
    groups = resources(synthesized, concern, "AWS::Logs::LogGroup")
    keys = resources(synthesized, concern, "AWS::KMS::Key")
    assert groups
    (logs_key,) = [k for k in keys if k.startswith("LogsKey")]
    for name, group in groups.items():
        assert group["Properties"]["KmsKeyId"] == {"Fn::GetAtt": [logs_key, "Arn"]}, name
    statements = keys[logs_key]["Properties"]["KeyPolicy"]["Statement"]
    logs_statement = next(s for s in statements if "Service" in s["Principal"])
    assert "kms:EncryptionContext:aws:logs:arn" in logs_statement["Condition"]["ArnLike"]
    assert keys[logs_key]["Properties"]["EnableKeyRotation"] is True


def without_hash(logical_id: str) -> str:
    """A logical id without the 8-character hash CDK appends to the construct path."""
    return re.sub(r"[0-9A-F]{8}$", "", logical_id)


def allows_decrypt(statement: dict) -> bool:
    return statement["Effect"] == "Allow" and any(
        fnmatch.fnmatchcase("kms:Decrypt", action) for action in as_list(statement["Action"])
    )


VIA_SECRETS_MANAGER = {
    "StringEquals": {
        "kms:ViaService": {"Fn::Join": ["", ["secretsmanager.", {"Ref": "AWS::Region"}, ".amazonaws.com"]]}
    }
}
ACCOUNT_ROOT = {
    "Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":iam::", {"Ref": "AWS::AccountId"}, ":root"]]
}


def test_secrets_use_their_own_key_and_only_granted_roles_decrypt(synthesized) -> None:
    env = synthesized
    secrets = resources(env, "SourceDatabase", "AWS::SecretsManager::Secret")
    assert len(secrets) == 2
    (key,) = {env.resolve("SourceDatabase", s["Properties"]["KmsKeyId"]) for s in secrets.values()}
    assert key.type == "AWS::KMS::Key" and key.logical_id.startswith("SourceDatabaseSecretsKey")
    assert key.properties["EnableKeyRotation"] is True

    # The key policy: one unconditioned statement for the account's key administration (it leaves
    # every other use to IAM policies, checked below); every statement that lets a principal
    # decrypt goes through Secrets Manager and names the account (Secrets Manager on its behalf)
    # or the seeding function's role. No service, no other account, no "*".
    decrypters = []
    for statement in key.properties["KeyPolicy"]["Statement"]:
        if statement["Effect"] == "Deny":
            continue
        principal = statement["Principal"]
        assert set(principal) == {"AWS"}, statement
        if statement["Action"] == "kms:*" and "Condition" not in statement:
            assert principal["AWS"] == ACCOUNT_ROOT, statement
            decrypters.append("account administration")
        elif allows_decrypt(statement):
            assert statement.get("Condition") == VIA_SECRETS_MANAGER, statement
            if principal["AWS"] == ACCOUNT_ROOT:
                decrypters.append("account via Secrets Manager")
            else:
                role = env.resolve("SourceDatabase", principal["AWS"])
                assert role.type == "AWS::IAM::Role"
                decrypters.append(without_hash(role.logical_id))
    assert sorted(decrypters) == [
        "SourceDatabaseSeedFunctionServiceRole",
        "account administration",
        "account via Secrets Manager",
    ]

    # Through IAM: only the EMR instance role may decrypt with this key (for the CDC secret), and
    # only via Secrets Manager; no identity policy lets anyone decrypt with every key ("*").
    granted = []
    for concern, role, statement in env.identity_statements():
        if not allows_decrypt(statement):
            continue
        for resource in as_list(statement["Resource"]):
            assert resource != "*", f"{role.concern}/{role.logical_id} may decrypt with every key"
            target = env.try_resolve(concern, resource)
            if target and (target.concern, target.logical_id) == (key.concern, key.logical_id):
                assert statement.get("Condition") == VIA_SECRETS_MANAGER, role.logical_id
                granted.append((role.concern, without_hash(role.logical_id)))
    assert granted == [("Compute", "ComputeInstanceRole")]


def test_prod_keeps_noncurrent_versions_for_30_days_and_dev_none(dev, prod) -> None:
    for bucket in ("LakeWarehouseBucket", "LakeArtifactsBucket"):
        (prod_bucket,) = [
            r for k, r in resources(prod, "Lake", "AWS::S3::Bucket").items() if k.startswith(bucket)
        ]
        assert prod_bucket["Properties"]["VersioningConfiguration"] == {"Status": "Enabled"}
        rules = prod_bucket["Properties"]["LifecycleConfiguration"]["Rules"]
        assert {"Id": "expire-noncurrent-versions", "NoncurrentVersionExpiration": {"NoncurrentDays": 30},
                "Status": "Enabled"} in rules  # fmt: skip
        (dev_bucket,) = [
            r for k, r in resources(dev, "Lake", "AWS::S3::Bucket").items() if k.startswith(bucket)
        ]
        assert "VersioningConfiguration" not in dev_bucket["Properties"]


def test_rds_has_enhanced_monitoring_every_minute(synthesized) -> None:
    synthesized.template("SourceDatabase").has_resource_properties(
        "AWS::RDS::DBInstance", {"MonitoringInterval": 60, "MonitoringRoleArn": Match.any_value()}
    )


# ---- who can do what: the cluster's own role ---------------------------------------------------------


def _instance_role_statements(env) -> tuple[str, list[dict]]:
    role_id = env.logical_id(env.stacks.compute.compute.instance_role)
    statements = [
        s
        for concern, role, s in env.identity_statements()
        if (concern, role.logical_id) == ("Compute", role_id) and s["Effect"] == "Allow"
    ]
    return role_id, statements


def _allows(statement: dict, action: str) -> bool:
    return any(fnmatch.fnmatchcase(action, pattern) for pattern in as_list(statement["Action"]))


def test_no_role_reads_parameters_beyond_its_environments(synthesized):
    """AmazonSSMManagedInstanceCore would let the cluster read every SSM parameter of the account
    (other teams' SecureStrings included): the instance role carries no managed policy, and every
    grant to read a parameter, of any role, names this environment's own."""
    env = synthesized
    role_id, statements = _instance_role_statements(env)
    assert "ManagedPolicyArns" not in env.templates["Compute"]["Resources"][role_id]["Properties"]
    assert any(_allows(s, "ssmmessages:OpenDataChannel") for s in statements)  # Session Manager still works
    own = f":parameter/lakehouse/{env.config.env_name}/"
    for concern, role, statement in env.identity_statements():
        reads = ("ssm:GetParameter", "ssm:GetParameters", "ssm:GetParametersByPath")
        if statement["Effect"] != "Allow" or not any(_allows(statement, a) for a in reads):
            continue
        for resource in as_list(statement["Resource"]):
            rendered = re.sub(
                r"\$\{(\w+)/(\w+)\}",
                lambda m: _parameter_name(env, *m.groups()),
                env.render(concern, resource),
            )
            assert own in rendered, f"{concern}/{role.logical_id} may read parameters {rendered}"
    assert managed_policies_beyond_the_known(env) == []


# AWS managed policies our roles may carry: none of them reads SSM parameters (or much else).
KNOWN_MANAGED_POLICIES = {
    "service-role/AWSLambdaBasicExecutionRole",  # logs of a function
    "service-role/AWSLambdaVPCAccessExecutionRole",  # network interfaces of a function in the VPC
    "service-role/AmazonEMRServicePolicy_v2",  # EMR's service role (tag-scoped)
    "service-role/AmazonRDSEnhancedMonitoringRole",  # RDS enhanced monitoring's role
}


def managed_policies_beyond_the_known(env) -> list[str]:
    """Managed policies on any role (a Lambda's or the supervisor's too, not only the instance role's)
    that are not among the known ones: AmazonSSMManagedInstanceCore or ReadOnlyAccess would read
    every parameter of the account."""
    found = []
    for concern, template in env.templates.items():
        for logical_id, resource in template["Resources"].items():
            if resource["Type"] != "AWS::IAM::Role":
                continue
            for arn in resource["Properties"].get("ManagedPolicyArns", []):
                name = env.render(concern, arn).split(":policy/", 1)[-1]
                if name not in KNOWN_MANAGED_POLICIES:
                    found.append(f"{concern}/{logical_id}: {name}")
    return found


def test_a_broad_managed_policy_on_any_role_is_found(dev):
    import copy

    env = copy.copy(dev)
    env.templates = copy.deepcopy(dev.templates)
    role = next(k for k, r in env.templates["Jobs"]["Resources"].items() if r["Type"] == "AWS::IAM::Role")
    env.templates["Jobs"]["Resources"][role]["Properties"].setdefault("ManagedPolicyArns", []).append(
        {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":iam::aws:policy/ReadOnlyAccess"]]}
    )
    assert managed_policies_beyond_the_known(env) == [f"Jobs/{role}: ReadOnlyAccess"]


def _parameter_name(env, concern: str, logical_id: str) -> str:
    """A reference to an SSM parameter of the app, as the parameter's name."""
    resource = env.templates[concern]["Resources"][logical_id]
    assert resource["Type"] == "AWS::SSM::Parameter", f"{concern}/{logical_id} is a {resource['Type']}"
    return resource["Properties"]["Name"]


def test_only_dev_deploys_the_generator_and_lets_the_cluster_write_the_topic(dev, prod):
    writes = ("kafka-cluster:WriteData", "kafka-cluster:WriteDataIdempotently")
    for env, generator in ((dev, True), (prod, False)):
        _, statements = _instance_role_statements(env)
        assert any(_allows(s, a) for s in statements for a in writes) is generator, env.config.env_name
        assert any(_allows(s, "kafka-cluster:ReadData") for s in statements)
        machines = env.resources("Jobs", "AWS::StepFunctions::StateMachine")
        named_gendata = [k for k in machines if k.startswith("JobsGendataJob")]
        assert bool(named_gendata) is generator, (env.config.env_name, sorted(machines))
        assert ("GendataStateMachineArn" in env.templates["Jobs"].get("Outputs", {})) is generator


# Services whose role trusts AWS documents aws:SourceAccount / aws:SourceArn for (confused deputy);
# the others (Lambda, EC2, RDS monitoring) assume roles with no source context to check.
SOURCE_CONDITIONED = {
    "elasticmapreduce": ":elasticmapreduce:",
    "scheduler": ":scheduler:",
    "states": ":states:",
    "vpc-flow-logs": ":ec2:",
}  # service -> what its aws:SourceArn names
NO_SOURCE_CONTEXT = {"lambda", "ec2", "monitoring.rds"}


def test_service_roles_trust_only_this_accounts_callers(synthesized) -> None:
    seen = set()
    for concern, template in synthesized.templates.items():
        for logical_id, role in template["Resources"].items():
            if role["Type"] != "AWS::IAM::Role":
                continue
            for statement in role["Properties"]["AssumeRolePolicyDocument"]["Statement"]:
                for service in as_list(statement.get("Principal", {}).get("Service", [])):
                    name = service.removesuffix(".amazonaws.com")
                    seen.add(name)
                    assert name in {*SOURCE_CONDITIONED, *NO_SOURCE_CONTEXT}, (
                        f"{concern}/{logical_id}: {name}"
                    )
                    if name in SOURCE_CONDITIONED:
                        condition = statement.get("Condition", {})
                        assert condition.get("StringEquals", {}).get("aws:SourceAccount") == {
                            "Ref": "AWS::AccountId"
                        }, f"{concern}/{logical_id} trusts {name} from any account"
                        source_arn = json.dumps(
                            condition.get("ArnLike", condition.get("StringEquals", {})).get("aws:SourceArn")
                        )
                        assert SOURCE_CONDITIONED[name] in source_arn, (
                            f"{concern}/{logical_id}: SourceArn {source_arn}"
                        )
    assert {"elasticmapreduce", "vpc-flow-logs", "lambda", "ec2"} <= seen  # the scan saw the roles


def test_only_the_vpc_its_subnets_and_the_emr_groups_carry_the_emr_policy_tag(synthesized) -> None:
    """EMR's v2 service policy may change any resource with this tag: not the endpoints' groups."""
    tagged = {}
    for concern, template in synthesized.templates.items():
        for logical_id, resource in template["Resources"].items():
            tags = resource.get("Properties", {}).get("Tags", [])
            if isinstance(tags, list) and {"Key": EMR_TAG, "Value": "true"} in tags:
                tagged.setdefault((concern, resource["Type"]), []).append(logical_id)
    azs = synthesized.config.network.max_azs
    assert {kind: len(ids) for kind, ids in tagged.items()} == {
        ("Network", "AWS::EC2::VPC"): 1,
        ("Network", "AWS::EC2::Subnet"): 2 * azs,
        ("Compute", "AWS::EC2::SecurityGroup"): 3,  # primary, workers, service access
        ("Compute", "AWS::EMR::Cluster"): 1,  # EMR passes it on to the instances it launches
    }
    endpoint_groups = resources(synthesized, "Network", "AWS::EC2::SecurityGroup")
    assert endpoint_groups  # interface endpoints have groups, and none is tagged


EMR_TAG = "for-use-with-amazon-emr-managed-policies"


def test_interface_endpoints_pass_only_this_account_and_their_groups_send_nothing(synthesized) -> None:
    """A data perimeter on the interface endpoints (this account's principals; for Secrets Manager
    and Glue also this account's resources), and endpoint groups that only answer HTTPS from the VPC."""
    endpoints = [
        e for e in resources(synthesized, "Network", "AWS::EC2::VPCEndpoint").values()
        if e["Properties"].get("VpcEndpointType") == "Interface"
    ]  # fmt: skip
    perimeters = {}
    for endpoint in endpoints:
        service = synthesized.render("Network", endpoint["Properties"]["ServiceName"]).rpartition(".")[2]
        (statement,) = endpoint["Properties"]["PolicyDocument"]["Statement"]
        assert (statement["Effect"], statement["Principal"], statement["Action"]) == (
            "Allow",
            {"AWS": "*"},
            "*",
        )
        condition = statement["Condition"]["StringEquals"]
        assert all(value == {"Ref": "AWS::AccountId"} for value in condition.values()), condition
        perimeters[service] = sorted(condition)
        for group_ref in endpoint["Properties"]["SecurityGroupIds"]:
            group = synthesized.resolve("Network", group_ref).properties
            # CDK's placeholder for "no egress at all" (a rule that matches no packet).
            assert group["SecurityGroupEgress"] == [
                {"CidrIp": "255.255.255.255/32", "Description": "Disallow all traffic", "FromPort": 252,
                 "IpProtocol": "icmp", "ToPort": 86}
            ]  # fmt: skip
            (ingress,) = group["SecurityGroupIngress"]
            assert (ingress["IpProtocol"], ingress["FromPort"], ingress["ToPort"]) == ("tcp", 443, 443)
    assert perimeters == {
        "elasticmapreduce": ["aws:PrincipalAccount"],
        "secretsmanager": ["aws:PrincipalAccount", "aws:ResourceAccount"],
        "glue": ["aws:PrincipalAccount", "aws:ResourceAccount"],
    }
