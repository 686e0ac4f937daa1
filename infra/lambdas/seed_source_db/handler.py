"""Custom resource: seed the RDS MySQL source database and create the CDC user.

Runs in the VPC (the database is private). On Create/Update it is idempotent: creates `user_db`, the
seed tables and rows, CDC's snapshot barrier table, the CDC user with only REPLICATION SLAVE,
REPLICATION CLIENT, SELECT on the source database and SELECT, INSERT, UPDATE on the barrier, and sets RDS's
binlog retention so the CDC reader can resume after a pause. Delete does nothing: the
database goes with its instance (dev) or is kept (prod).
Properties: Host, Port, DatabaseName, AdminSecretArn, CdcSecretArn, BinlogRetentionHours.
"""

from __future__ import annotations

import json
import logging
import ssl
from pathlib import Path

import seed_data

LOG = logging.getLogger()
LOG.setLevel(logging.INFO)


def _secret(client, arn: str) -> dict:
    return json.loads(client.get_secret_value(SecretId=arn)["SecretString"])


# The Amazon RDS CA certificates, bundled beside this file at synth (jobs/rds-ca-bundle.pem).
RDS_CA_BUNDLE = Path(__file__).with_name("rds-ca-bundle.pem")


def _tls_context() -> ssl.SSLContext:
    """RDS requires TLS (require_secure_transport); the server's certificate and host name are
    verified against the RDS CA bundle."""
    return ssl.create_default_context(cafile=str(RDS_CA_BUNDLE))


def seed_statements(database: str, cdc_user: str, cdc_password: str, retention_hours: int):
    """The (sql, args) pairs the seeding runs, in order. Pure: tested without a database."""
    quoted_db = "`" + database.replace("`", "``") + "`"
    yield f"CREATE DATABASE IF NOT EXISTS {quoted_db}", None
    yield f"USE {quoted_db}", None
    yield seed_data.PRODUCTS_DDL, None
    yield seed_data.USER_MEMBER_DDL, None
    for row in seed_data.PRODUCT_ROWS:
        yield seed_data.INSERT_PRODUCT, row
    for row in seed_data.USER_MEMBER_ROWS:
        yield seed_data.INSERT_USER_MEMBER, row
    # CDC's snapshot barrier (one row it writes; never synced).
    yield f"CREATE DATABASE IF NOT EXISTS `{seed_data.CDC_BARRIER_DATABASE}`", None
    yield seed_data.CDC_BARRIER_DDL, None
    # CDC user: binlog access, SELECT on the source database, the barrier row; nothing else.
    yield "CREATE USER IF NOT EXISTS %s@'%%' IDENTIFIED BY %s", (cdc_user, cdc_password)
    yield "ALTER USER %s@'%%' IDENTIFIED BY %s", (cdc_user, cdc_password)
    for privileges, on in seed_data.cdc_grants(database):
        yield f"GRANT {privileges} ON {on} TO %s@'%%'", (cdc_user,)
    # RDS purges binlogs as soon as it can unless told to keep them.
    yield (
        "CALL mysql.rds_set_configuration('binlog retention hours', %s)",
        (int(retention_hours),),
    )


def on_event(event, context):  # noqa: ARG001 - Lambda signature
    request_type = event["RequestType"]
    props = event["ResourceProperties"]
    physical_id = f"seed-{props['DatabaseName']}"
    if request_type == "Delete":
        return {"PhysicalResourceId": event.get("PhysicalResourceId", physical_id)}

    import boto3  # in the Lambda runtime
    import pymysql  # bundled with the function at synth time

    secrets = boto3.client("secretsmanager")
    admin = _secret(secrets, props["AdminSecretArn"])
    cdc = _secret(secrets, props["CdcSecretArn"])
    connection = pymysql.connect(
        host=props["Host"],
        port=int(props["Port"]),
        user=admin["username"],
        password=admin["password"],
        ssl=_tls_context(),
        connect_timeout=15,
        autocommit=True,
    )
    try:
        with connection.cursor() as cursor:
            for sql, args in seed_statements(
                props["DatabaseName"],
                cdc["username"],
                cdc["password"],
                int(props.get("BinlogRetentionHours", 24)),
            ):
                cursor.execute(sql, args)
    finally:
        connection.close()
    LOG.info("seeded %s and the CDC user %s", props["DatabaseName"], cdc["username"])
    return {"PhysicalResourceId": physical_id}
