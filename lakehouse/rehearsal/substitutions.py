"""What stands in for AWS in the rehearsal: by value, never by key.

Every configuration key and argument that EMR or the deployment sets stays as it is; only values
that point at AWS change (an S3 URI becomes a file URI, the Glue catalog class becomes the JDBC
catalog class, the RDS endpoint becomes the local MariaDB). Each substitution is recorded once
with what it leaves unproven, and printed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lakehouse.rehearsal.assembly import Resource

REHEARSAL_ACCOUNT = "111111111111"
REHEARSAL_REGION = "eu-west-1"
PSEUDO_PARAMETERS = {
    "AWS::AccountId": REHEARSAL_ACCOUNT,
    "AWS::Region": REHEARSAL_REGION,
    "AWS::Partition": "aws",
    "AWS::URLSuffix": "amazonaws.com",
    "AWS::NoValue": "",
}
REHEARSAL_CLUSTER_ID = "j-REHEARSAL000"

GLUE_CATALOG = "org.apache.iceberg.aws.glue.GlueCatalog"
JDBC_CATALOG = "org.apache.iceberg.jdbc.JdbcCatalog"
S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"
HADOOP_FILE_IO = "org.apache.iceberg.hadoop.HadoopFileIO"
_S3_URI = re.compile(r"s3://([a-z0-9][a-z0-9.-]*)(/[^\s\"'#,]*)?")


@dataclass(frozen=True)
class Substitution:
    what: str
    aws: str
    local: str
    unproven: str


@dataclass(frozen=True)
class LocalEndpoints:
    """Where the local stand-ins listen (filled in once the local stack is up)."""

    s3_root: Path  # s3://<bucket>/<key> -> <s3_root>/<bucket>/<key>
    node_root: Path  # the EMR node's file system root (bootstrap actions run against it)
    mysql_host: str
    mysql_port: int
    mysql_ca: str
    kafka_bootstrap: str
    catalog_jdbc_uri: str
    spark_master: str
    executor_memory: str
    executor_cores: int


@dataclass
class Substitutions:
    local: LocalEndpoints
    # Secrets Manager stand-in: template secret -> ARN of the secret made for it (moto).
    make_secret: Callable[[Resource], str]
    records: dict[tuple[str, str], Substitution] = field(default_factory=dict)

    def record(self, what: str, aws: str, local: str, unproven: str) -> str:
        self.records.setdefault((what, aws), Substitution(what, aws, local, unproven))
        return local

    # ---- resources referenced by the templates (Ref / Fn::GetAtt) ------------------------------

    def resource_value(self, resource: Resource, attribute: str | None) -> str | None:
        kind = resource.type
        if kind == "AWS::S3::Bucket" and attribute is None:
            # Bucket names are literal in these templates; the bucket itself is a folder.
            return (
                resource.properties.get("BucketName")
                if isinstance(resource.properties.get("BucketName"), str)
                else None
            )
        if kind == "AWS::EMR::Cluster" and attribute is None:
            return self.record(
                "EMR cluster id", resource.logical_id, REHEARSAL_CLUSTER_ID,
                "EMR itself: provisioning, step scheduling, CancelSteps",
            )  # fmt: skip
        if kind == "AWS::RDS::DBInstance" and attribute == "Endpoint.Address":
            return self.record(
                "RDS MySQL endpoint", "Endpoint.Address", self.local.mysql_host,
                "RDS for MySQL 8.4 itself (the local source is MariaDB 10.11 with the same binlog "
                "settings and TLS), security groups",
            )  # fmt: skip
        if kind == "AWS::RDS::DBInstance" and attribute == "Endpoint.Port":
            return self.record("RDS MySQL port", "Endpoint.Port", str(self.local.mysql_port), "-")
        if kind == "Custom::AWS" and attribute and attribute.startswith("BootstrapBrokerString"):
            return self.record(
                "MSK bootstrap brokers", attribute, self.local.kafka_bootstrap,
                "MSK itself, its TLS listener and IAM access control",
            )  # fmt: skip
        if kind == "AWS::SecretsManager::Secret" and attribute is None:
            arn = self.make_secret(resource)
            return self.record(
                "Secrets Manager secret", resource.logical_id, arn,
                "the secret's KMS key and resource policy, IAM on GetSecretValue (moto grants all)",
            )  # fmt: skip
        return None

    # ---- values inside configuration and arguments ---------------------------------------------

    def localize(self, text: str) -> str:
        """Every AWS-pointing value inside `text` replaced by its stand-in."""
        if GLUE_CATALOG in text:
            text = text.replace(GLUE_CATALOG, JDBC_CATALOG)
            self.record(
                "Iceberg catalog implementation", GLUE_CATALOG, JDBC_CATALOG + " (SQLite)",
                "Glue API calls, Glue permissions, the AWS SDK for Java inside Iceberg",
            )  # fmt: skip
        if S3_FILE_IO in text:
            text = text.replace(S3_FILE_IO, HADOOP_FILE_IO)
            self.record(
                "Iceberg FileIO", S3_FILE_IO, HADOOP_FILE_IO,
                "S3 reads/writes, bucket policies and encryption, S3FileIO's SDK client",
            )  # fmt: skip
        text = _S3_URI.sub(self._s3_to_file, text)
        return text

    def _s3_to_file(self, match: re.Match) -> str:
        bucket, key = match.group(1), (match.group(2) or "/")
        local = f"file://{self.local.s3_root / bucket}{key}"
        self.record(
            "S3 bucket", f"s3://{bucket}", f"file://{self.local.s3_root / bucket}",
            "IAM and bucket policies; only objects a BucketDeployment uploads are there",
        )  # fmt: skip
        return local

    def node_path(self, path: str) -> str:
        """An absolute path on the EMR node -> the same path under the rehearsal's node root."""
        local = str(self.local.node_root) + path
        self.record(
            "path on the EMR node", path, local,
            "Amazon Linux 2023's own python3.11 (a clean CPython 3.11 stands in)",
        )  # fmt: skip
        return local

    def step_argument(self, flag: str, value: str) -> str:
        """Job arguments whose value names an AWS-only mechanism (the flag stays)."""
        if flag == "--kafka-auth" and value == "iam":
            return self.record(
                "Kafka authentication", "iam (SASL_SSL/OAUTHBEARER, MSK signer)", "plaintext",
                "MSK IAM authentication and TLS to the brokers",
            )  # fmt: skip
        if flag == "--mysql-ssl-ca" and value == "rds":
            return self.record(
                "MySQL TLS trust", "rds (Amazon RDS CA bundle in the package)", self.local.mysql_ca,
                "that RDS's certificate chains to the bundled CA (the TLS code path itself runs)",
            )  # fmt: skip
        return value

    def spark_size(self, key: str, value: str) -> str:
        """YARN container sizes -> what the local standalone worker can give."""
        local = {
            "spark.executor.memory": self.local.executor_memory,
            "spark.executor.cores": str(self.local.executor_cores),
        }.get(key)
        if local is None or local == value:
            return value
        return self.record(
            f"{key} (YARN container size)", value, local,
            "that YARN on the cluster's instance types fits these containers",
        )  # fmt: skip
