"""Who can read the lake, the TLS key and the passwords, and who can write the code the cluster
runs: resolved from the synthesized templates, principals x actions x resources (issue 29).

A principal "can" when no resource policy denies it and, for the app's own roles, an identity
policy allows it. Principals outside the app (an administrator, ReadOnlyAccess, CDK's own
deployment roles) are assumed to hold every identity permission: only the resource side stops
them, which is the point of the guards."""

from __future__ import annotations

import fnmatch
import re

import pytest
from cfn import as_list
from conftest import ANALYST_ARN, TLS_OPERATOR_ARN

ACCOUNT, REGION, PARTITION = "111122223333", "eu-west-1", "aws"
PSEUDO = {"${AWS::AccountId}": ACCOUNT, "${AWS::Region}": REGION, "${AWS::Partition}": PARTITION}


def outsider(name: str) -> str:
    return f"arn:aws:iam::{ACCOUNT}:role/{name}"


# A role anyone with iam:CreateRole can make, named like CloudFormation's execution role.
LOOK_ALIKE = outsider(f"cdk-attacker-cfn-exec-role-{ACCOUNT}-{REGION}")
OUTSIDERS = {
    LOOK_ALIKE,
    outsider("Admin"),  # AdministratorAccess
    outsider("ReadOnly"),  # ReadOnlyAccess (s3:Get* on "*")
    outsider("PowerUser"),  # PowerUserAccess: everything but IAM, secrets and keys included
    outsider(f"cdk-hnb659fds-file-publishing-role-{ACCOUNT}-{REGION}"),  # CDK's asset upload
    outsider(f"cdk-hnb659fds-cfn-exec-role-{ACCOUNT}-{REGION}"),  # CloudFormation's execution role
}
DEPLOYER = outsider(f"cdk-hnb659fds-cfn-exec-role-{ACCOUNT}-{REGION}")


class Lake:
    """The app's roles, its resource policies and identity policies, with concrete ARNs."""

    def __init__(self, env) -> None:
        self.env = env
        self.role_arns: dict[tuple[str, str], str] = {}  # (concern, logical id) -> ARN
        for concern in env.templates:
            for logical_id, role in env.resources(concern, "AWS::IAM::Role").items():
                name = role["Properties"].get("RoleName")
                # A generated name is unknown at synth: the logical id stands in for it.
                name = self.concrete(concern, name) if name else f"generated-{logical_id}"
                self.role_arns[(concern, logical_id)] = outsider(name)

    def concrete(self, concern: str, value) -> str:
        text = self.env.render(concern, value)
        for placeholder, replacement in PSEUDO.items():
            text = text.replace(placeholder, replacement)

        def role(match: re.Match) -> str:  # a role's or a bucket's ARN
            key = (match.group(1), match.group(2))
            resource = self.env.templates[key[0]]["Resources"].get(key[1], {})
            if resource.get("Type") == "AWS::S3::Bucket":
                return f"arn:aws:s3:::{self.concrete(key[0], resource['Properties']['BucketName'])}"
            return self.role_arns.get(key, match.group(0))

        def attached_secret(match: re.Match) -> str:
            # A secret attachment's Ref is the ARN of the secret it is attached to.
            resource = self.env.templates[match.group(1)]["Resources"].get(match.group(2), {})
            if resource.get("Type") == "AWS::SecretsManager::SecretTargetAttachment":
                return self.concrete(match.group(1), resource["Properties"]["SecretId"])
            return match.group(0)

        text = re.sub(r"\$\{(\w+)/(\w+)\}", attached_secret, text)
        return re.sub(r"\$\{(\w+)/(\w+)\.Arn\}", role, text)

    def object_arn(self, bucket_logical_prefix: str, key: str) -> str:
        return f"arn:aws:s3:::{self.bucket_name(bucket_logical_prefix)}/{key}"

    def bucket_name(self, logical_prefix: str) -> str:
        (bucket,) = [
            b
            for k, b in self.env.resources("Lake", "AWS::S3::Bucket").items()
            if k.startswith(logical_prefix)
        ]
        return self.concrete("Lake", bucket["Properties"]["BucketName"])

    def resource_statements(self, resource_arn: str) -> list[tuple[str, dict]]:
        """(concern, statement) of the resource policies on the bucket or secret of `resource_arn`."""
        found = []
        for concern in self.env.templates:
            for policy in self.env.resources(concern, "AWS::S3::BucketPolicy").values():
                bucket = self.concrete(concern, policy["Properties"]["Bucket"])
                if resource_arn == f"arn:aws:s3:::{bucket}" or resource_arn.startswith(
                    f"arn:aws:s3:::{bucket}/"
                ):
                    found += [(concern, s) for s in policy["Properties"]["PolicyDocument"]["Statement"]]
            for policy in self.env.resources(concern, "AWS::SecretsManager::ResourcePolicy").values():
                if self.concrete(concern, policy["Properties"]["SecretId"]) == resource_arn:
                    statements = policy["Properties"]["ResourcePolicy"]["Statement"]
                    # A secret's policy says "*" for the secret it is attached to.
                    found += [(concern, {**s, "Resource": resource_arn}) for s in statements]
        return found

    def denied(self, principal: str, action: str, resource_arn: str) -> bool:
        for concern, statement in self.resource_statements(resource_arn):
            if statement["Effect"] != "Deny" or not self._applies(concern, statement, action, resource_arn):
                continue
            assert statement["Principal"] in ({"AWS": "*"}, "*"), f"a deny for some only: {statement}"
            conditions = statement.get("Condition", {})
            assert set(conditions) <= {"ArnNotLike", "Bool"}, f"unclassified condition: {conditions}"
            if conditions.get("Bool") == {"aws:SecureTransport": "false"}:
                continue  # the TLS-only statement: the requests evaluated here use TLS
            if "Bool" in conditions:
                assert conditions["Bool"] == {"aws:PrincipalIsAWSService": "false"}, conditions
            excepted = conditions.get("ArnNotLike", {}).get("aws:PrincipalArn")
            if excepted is None or not any(
                fnmatch.fnmatchcase(principal, self.concrete(concern, p)) for p in as_list(excepted)
            ):
                return True
        return False

    def allowed(self, role_key: tuple[str, str], action: str, resource_arn: str) -> bool:
        """By the role's identity policies, or by a resource policy naming it (same account)."""
        for concern, role, statement in self.env.identity_statements():
            if (role.concern, role.logical_id) != role_key or statement["Effect"] != "Allow":
                continue
            if "Action" in statement and self._applies(concern, statement, action, resource_arn):
                return True
        for concern, statement in self.resource_statements(resource_arn):
            principal = statement.get("Principal", {})
            names_role = isinstance(principal, dict) and self.role_arns[role_key] in {
                self.concrete(concern, p) for p in as_list(principal.get("AWS", []))
            }
            if statement["Effect"] == "Allow" and names_role:
                if self._applies(concern, statement, action, resource_arn):
                    return True
        return False

    def _applies(self, concern: str, statement: dict, action: str, resource_arn: str) -> bool:
        return any(fnmatch.fnmatchcase(action, a) for a in as_list(statement["Action"])) and any(
            fnmatch.fnmatchcase(resource_arn, self.concrete(concern, r))
            for r in as_list(statement["Resource"])
        )

    def who_can(self, action: str, resource_arn: str, outsiders: set[str] = OUTSIDERS) -> set[str]:
        """Names (role names; generated ones as `generated-<logical id>`) of those who can."""
        who = {p for p in outsiders if not self.denied(p, action, resource_arn)}
        for key, arn in self.role_arns.items():
            if self.allowed(key, action, resource_arn) and not self.denied(arn, action, resource_arn):
                who.add(arn)
        return {arn.rpartition(":role/")[2] for arn in who}

    def secret_arn(self, logical_prefix: str) -> str:
        (logical_id,) = [
            k
            for k in self.env.resources("SourceDatabase", "AWS::SecretsManager::Secret")
            if k.startswith(logical_prefix)
        ]
        return self.concrete("SourceDatabase", {"Ref": logical_id})


def named(lake: Lake, role: str) -> str:
    """A role's fixed name (infra/access.py), in the test's region."""
    return f"{lake.env.config.name_prefix}-{role}-{REGION}"


def generated(names: set[str]) -> set[str]:
    """Generated role names without their hash: `generated-SourceDatabaseSeedFunctionServiceRole`."""
    return {re.sub(r"[0-9A-F]{8}$", "", n) for n in names}


@pytest.fixture(scope="module", params=["dev", "prod"])
def lake(request) -> Lake:
    return Lake(request.getfixturevalue(request.param))


def test_only_the_cluster_reads_and_writes_the_tables(lake) -> None:
    table_file = lake.object_arn("LakeWarehouseBucket", "warehouse/dim_db.db/products/data/00000-0.parquet")
    checkpoint = lake.object_arn("LakeWarehouseBucket", "checkpoints/clickstream/offsets/7")
    athena_result = lake.object_arn("LakeWarehouseBucket", "athena-results/q.csv")
    for key in (table_file, checkpoint):
        assert lake.who_can("s3:GetObject", key) == {named(lake, "emr-instance")}, key
        assert lake.who_can("s3:GetObjectVersion", key) == {named(lake, "emr-instance")}, key
        assert lake.who_can("s3:PutObject", key) == {named(lake, "emr-instance")}, key
    # Athena's results are copies of table rows: nobody reads them until readers are named.
    assert lake.who_can("s3:GetObject", athena_result) == set()
    # The actions replication reads and writes with are not the plain ones: named too (round 3).
    for key in (table_file, checkpoint, athena_result):
        assert lake.who_can("s3:GetObjectVersionForReplication", key) == set(), key
    for key in (table_file, checkpoint):  # (Athena writes its results as the caller: not guarded)
        assert lake.who_can("s3:ReplicateObject", key) == set(), key


def test_only_the_cluster_and_its_tls_function_touch_the_tls_key(lake) -> None:
    tls_zip = lake.object_arn("LakeArtifactsBucket", "security/emr-tls-certificates.zip")
    assert lake.who_can("s3:GetObject", tls_zip) == {named(lake, "emr-instance"), named(lake, "emr-tls")}
    # Neither CDK upload role (their grants cover the whole bucket) nor CDK's publishing role.
    assert lake.who_can("s3:PutObject", tls_zip) == {named(lake, "emr-tls")}
    assert lake.who_can("s3:GetObjectVersionForReplication", tls_zip) == set()
    assert lake.who_can("s3:ReplicateObject", tls_zip) == set()


def test_only_the_uploads_write_the_code_the_cluster_runs(lake) -> None:
    bootstrap = lake.object_arn("LakeArtifactsBucket", "bootstrap/configure-iceberg.sh")
    job_code = lake.object_arn("LakeArtifactsBucket", "emr/0123abcd/emr_step.py")
    steps = lake.object_arn("LakeArtifactsBucket", "emr/0123abcd/streaming-steps.json")
    assert lake.who_can("s3:PutObject", bootstrap) == {named(lake, "bootstrap-upload")}
    assert lake.who_can("s3:PutObject", job_code) == {named(lake, "jobs-upload")}
    assert lake.who_can("s3:PutObject", steps) == {named(lake, "jobs-upload")}
    for code in (bootstrap, job_code, steps):
        assert lake.who_can("s3:ReplicateObject", code) == set(), code
    # Reading the code stays open to the cluster (and to the account): it holds no secret.
    assert named(lake, "emr-instance") in lake.who_can("s3:GetObject", job_code)


def test_only_the_seeding_the_deploy_and_the_cdc_reader_read_the_passwords(lake) -> None:
    admin = lake.who_can("secretsmanager:GetSecretValue", lake.secret_arn("SourceDatabaseAdminSecret"))
    cdc = lake.who_can("secretsmanager:GetSecretValue", lake.secret_arn("SourceDatabaseCdcSecret"))
    assert generated(admin) == {
        "generated-SourceDatabaseSeedFunctionServiceRole",
        DEPLOYER.rpartition("/")[2],
    }
    assert generated(cdc) == {"generated-SourceDatabaseSeedFunctionServiceRole", named(lake, "emr-instance")}


ANALYST, TLS_OPERATOR = outsider("analysts"), outsider("tls-operator")
assert (ANALYST, TLS_OPERATOR) == (ANALYST_ARN, TLS_OPERATOR_ARN)


@pytest.fixture(scope="module")
def prod_with_readers(prod_with_context) -> Lake:
    """prod with a role in `lake_readers` and one in `security_admins`."""
    return Lake(prod_with_context)


def test_named_lake_readers_and_security_admins_are_let_in(prod_with_readers) -> None:
    lake = prod_with_readers
    outsiders = {*OUTSIDERS, ANALYST, TLS_OPERATOR}
    table_file = lake.object_arn("LakeWarehouseBucket", "warehouse/ods_behavior.db/clickevent/data/1.parquet")
    tls_zip = lake.object_arn("LakeArtifactsBucket", "security/emr-tls-certificates.zip")
    assert "analysts" in lake.who_can("s3:GetObject", table_file, outsiders)
    athena_result = lake.object_arn("LakeWarehouseBucket", "athena-results/q.csv")
    assert "analysts" in lake.who_can("s3:GetObject", athena_result, outsiders)
    assert "analysts" not in lake.who_can("s3:PutObject", table_file, outsiders)  # readers only read
    assert "analysts" not in lake.who_can("s3:GetObject", tls_zip, outsiders)
    assert {"tls-operator"} <= lake.who_can("s3:PutObject", tls_zip, outsiders)
    assert "tls-operator" not in lake.who_can("s3:GetObject", table_file, outsiders)


def test_nobody_but_the_deploy_changes_the_guards(lake) -> None:
    """A role allowed s3:* or secretsmanager:* (PowerUserAccess) cannot delete a guard first."""
    deployer = DEPLOYER.rpartition("/")[2]
    for bucket in ("LakeWarehouseBucket", "LakeArtifactsBucket"):
        arn = f"arn:aws:s3:::{lake.bucket_name(bucket)}"
        for action in ("s3:PutBucketPolicy", "s3:DeleteBucketPolicy"):
            who = generated(lake.who_can(action, arn))
            # dev's teardown (CDK's auto-delete) puts a deny-writes policy on a bucket before emptying it.
            expected = {deployer} | (
                {"generated-CustomS3AutoDeleteObjectsCustomResourceProviderRole"}
                if lake.env.config.env_name == "dev" and action == "s3:PutBucketPolicy"
                else set()
            )
            assert who == expected, (bucket, action)
    for secret in ("SourceDatabaseAdminSecret", "SourceDatabaseCdcSecret"):
        for action in ("secretsmanager:PutResourcePolicy", "secretsmanager:DeleteResourcePolicy"):
            assert lake.who_can(action, lake.secret_arn(secret)) == {deployer}, (secret, action)


BUCKET_CONFIGURATION_ACTIONS = (
    "s3:PutBucketVersioning",  # suspend it: overwritten tables lose their noncurrent versions
    "s3:PutLifecycleConfiguration",  # expire the tables' objects
    "s3:PutReplicationConfiguration",  # copy every object to a bucket outside the guards
)
PASSWORD_WRITE_ACTIONS = (
    # A new value, then the seeding function sets the MySQL user's password to it (round 3, item 3).
    "secretsmanager:PutSecretValue",
    "secretsmanager:UpdateSecret",
    "secretsmanager:UpdateSecretVersionStage",
    "secretsmanager:ReplicateSecretToRegions",  # a replica outside the guards
)


def test_nobody_but_the_deploy_changes_the_buckets_configuration_or_the_passwords(lake) -> None:
    deployer = DEPLOYER.rpartition("/")[2]
    for bucket in ("LakeWarehouseBucket", "LakeArtifactsBucket"):
        arn = f"arn:aws:s3:::{lake.bucket_name(bucket)}"
        for action in BUCKET_CONFIGURATION_ACTIONS:
            assert generated(lake.who_can(action, arn)) == {deployer}, (bucket, action)
    for secret in ("SourceDatabaseAdminSecret", "SourceDatabaseCdcSecret"):
        for action in PASSWORD_WRITE_ACTIONS:
            assert lake.who_can(action, lake.secret_arn(secret)) == {deployer}, (secret, action)


def test_the_cluster_keeps_its_access_while_an_older_deployment_is_upgraded(lake) -> None:
    """Before its fixed name the nodes' role had CloudFormation's generated one; the guards deploy
    before the Compute stack renames it, so that one name (and no other role of Compute) still reads."""
    compute = lake.env.config.stack_name("Compute")
    before = outsider(f"{compute}-ComputeInstanceRoleC860B428-Ab12Cd34Ef56")
    other = outsider(f"{compute}-ComputeSecurityGroupCleanupFunctionServiceRole-Ab12Cd34Ef56")
    table_file = lake.object_arn("LakeWarehouseBucket", "warehouse/dim_db.db/products/data/0.parquet")
    cdc = lake.secret_arn("SourceDatabaseCdcSecret")
    for action, resource in (("s3:GetObject", table_file), ("secretsmanager:GetSecretValue", cdc)):
        who = lake.who_can(action, resource, {before, other})
        assert before.rpartition("/")[2] in who and other.rpartition("/")[2] not in who, (action, who)


GUARDS = {"AWS::S3::BucketPolicy": "Bucket", "AWS::SecretsManager::ResourcePolicy": "SecretId"}


def guards_lost_on_destroy(templates: dict[str, dict]) -> list[str]:
    """Resource policies deleted with their stack while the bucket or secret they guard is kept
    (DeletionPolicy Retain): after `cdk destroy`, that data would stand without its guards."""
    lost = []
    for concern, template in templates.items():
        resources = template["Resources"]
        for logical_id, resource in resources.items():
            if resource["Type"] not in GUARDS:
                continue
            target = resource["Properties"][GUARDS[resource["Type"]]]
            guarded = resources.get(target.get("Ref")) if isinstance(target, dict) else None
            assert guarded is not None, f"{concern}/{logical_id} guards a resource of another stack"
            if guarded.get("DeletionPolicy") == "Retain" and resource.get("DeletionPolicy") != "Retain":
                lost.append(f"{concern}/{logical_id}")
    return lost


@pytest.mark.parametrize("env_name", ["dev", "prod"])
def test_a_retained_bucket_or_secret_keeps_its_guard_when_the_stack_is_destroyed(env_name, request) -> None:
    env = request.getfixturevalue(env_name)
    assert guards_lost_on_destroy(env.templates) == []
    if env_name == "prod":  # the control: prod retains its buckets and secrets, so it has guards to keep
        guards = [
            (concern, lid)
            for concern, t in env.templates.items()
            for lid, r in t["Resources"].items()
            if r["Type"] in GUARDS
        ]
        assert len(guards) == 5, guards
        (concern, lid) = guards[0]
        import copy

        mutated = copy.deepcopy(env.templates)
        del mutated[concern]["Resources"][lid]["DeletionPolicy"]
        assert guards_lost_on_destroy(mutated) == [f"{concern}/{lid}"]


# docs/security.md's table "what | who can": each row's probes (action, bucket or secret, key) ...
BUCKETS, SECRETS = (
    ("LakeWarehouseBucket", "LakeArtifactsBucket"),
    ("SourceDatabaseAdminSecret", "SourceDatabaseCdcSecret"),
)
TABLE_FILE, CHECKPOINT = "warehouse/dim_db.db/products/data/0.parquet", "checkpoints/clickstream/offsets/7"
TLS_ZIP = "security/emr-tls-certificates.zip"


def on_buckets(*actions: str) -> list[tuple]:
    return [(a, b, "") for a in actions for b in BUCKETS]


def on_secrets(*actions: str) -> list[tuple]:
    return [(a, s, None) for a in actions for s in SECRETS]


DOCUMENTED_ROWS = {
    "read the tables' files and checkpoints": [
        ("s3:GetObject", "LakeWarehouseBucket", TABLE_FILE),
        ("s3:GetObjectVersion", "LakeWarehouseBucket", CHECKPOINT),
        ("s3:GetObject", "LakeWarehouseBucket", "warehouse/_lakehouse/verify/verify-20261129T041500Z.json"),
    ],
    "write them": [("s3:PutObject", "LakeWarehouseBucket", k) for k in (TABLE_FILE, CHECKPOINT)],
    "read Athena's results": [("s3:GetObject", "LakeWarehouseBucket", "athena-results/q.csv")],
    "read the EMR TLS private key": [("s3:GetObject", "LakeArtifactsBucket", TLS_ZIP)],
    "write it": [("s3:PutObject", "LakeArtifactsBucket", TLS_ZIP)],
    "write the bootstrap scripts": [
        ("s3:PutObject", "LakeArtifactsBucket", "bootstrap/configure-iceberg.sh")
    ],
    "write the job code": [
        ("s3:PutObject", "LakeArtifactsBucket", "emr/0123abcd/emr_step.py"),
        ("s3:PutObject", "LakeArtifactsBucket", "emr/0123abcd/streaming-steps.json"),
    ],
    "read the RDS admin password": [("secretsmanager:GetSecretValue", "SourceDatabaseAdminSecret", None)],
    "read the CDC user's password": [("secretsmanager:GetSecretValue", "SourceDatabaseCdcSecret", None)],
    "change or delete any of these policies": [
        *on_buckets("s3:PutBucketPolicy", "s3:DeleteBucketPolicy"),
        *on_secrets("secretsmanager:PutResourcePolicy", "secretsmanager:DeleteResourcePolicy"),
    ],
    "change the buckets' versioning, lifecycle or replication": [
        *on_buckets(*BUCKET_CONFIGURATION_ACTIONS),
        *on_secrets(*PASSWORD_WRITE_ACTIONS),
    ],
}
# ... and the table's words for the principals (names as `who_can` gives them).
DOCUMENTED_WHO = {
    "the EMR instance role": lambda lake: named(lake, "emr-instance"),
    "the TLS function": lambda lake: named(lake, "emr-tls"),
    "`lake_readers`": lambda lake: "analysts",
    "`security_admins`": lambda lake: "tls-operator",
    "CDK's bootstrap upload": lambda lake: named(lake, "bootstrap-upload"),
    "CDK's jobs upload": lambda lake: named(lake, "jobs-upload"),
    "the seeding function": lambda lake: "generated-SourceDatabaseSeedFunctionServiceRole",
    "CloudFormation's execution role": lambda lake: DEPLOYER.rpartition("/")[2],
    "CDK's auto-delete function": lambda lake: (
        "generated-CustomS3AutoDeleteObjectsCustomResourceProviderRole"
    ),
}


def documented_access_table(text: str) -> dict[str, str]:
    """docs/security.md's table whose header is `| what | who can … |`: {what: who}."""
    lines = text.splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.startswith("| what | who can")]
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        what, who = (cell.strip() for cell in line.strip("|").split("|"))
        rows[what] = who
    return rows


def documented_who(lake: Lake, who: str) -> set[str]:
    """The principals a cell names; in prod not those it names for dev only ("in dev also …")."""
    if lake.env.config.env_name != "dev":
        who = who.split("in dev also")[0]
    return {name(lake) for phrase, name in DOCUMENTED_WHO.items() if phrase in who}


@pytest.fixture(scope="module", params=["dev", "prod"])
def documented_lake(request, prod_with_readers) -> Lake:
    if request.param == "prod":
        return prod_with_readers
    return Lake(request.getfixturevalue("dev"))


def test_the_security_docs_table_names_exactly_who_the_templates_let_in(documented_lake) -> None:
    """docs/security.md's "who can" table, read as the templates resolve it: for each row, the roles
    it names are exactly those who can do any of the row's actions (prod with a lake reader and a
    security admin named; dev with none, so its cells' readers and admins name nobody there)."""
    from pathlib import Path

    lake = documented_lake
    table = documented_access_table((Path(__file__).parents[2] / "docs" / "security.md").read_text())
    probes_of = {
        what: next((probes for start, probes in DOCUMENTED_ROWS.items() if what.startswith(start)), None)
        for what in table
    }
    matched = {what: [start for start in DOCUMENTED_ROWS if what.startswith(start)] for what in table}
    assert [w for w, starts in matched.items() if len(starts) != 1] == [], "a row with no (or two) probes"
    assert sorted(s for starts in matched.values() for s in starts) == sorted(DOCUMENTED_ROWS), (
        "a probed row is gone from the docs, or two rows match one"
    )
    outsiders = {*OUTSIDERS, ANALYST, TLS_OPERATOR}
    for what, probes in probes_of.items():
        who = set()
        for action, resource, key in probes:
            if key is None:
                arn = lake.secret_arn(resource)
            else:
                arn = lake.object_arn(resource, key) if key else f"arn:aws:s3:::{lake.bucket_name(resource)}"
            who |= generated(lake.who_can(action, arn, outsiders))
        expected = documented_who(lake, table[what])
        if lake.env.config.env_name == "dev":
            expected -= {"analysts", "tls-operator"}  # named in prod's synth only
        assert who == expected, f"docs/security.md, row {what!r}: the templates let in {sorted(who)}"
