"""Custom resource: the PEM zip EMR's in-transit encryption reads, present before the cluster exists.

Mode `generate` (dev): if the object is missing, create a private CA and a certificate for the
cluster's internal host names (`*.ec2.internal` in us-east-1, `*.<region>.compute.internal`
elsewhere) and upload the zip EMR expects (privateKey.pem, certificateChain.pem,
trustedCertificates.pem). The key never leaves this function and S3: nothing secret goes into the
response, the template or the logs. An existing object (an operator's own) is kept.
Mode `require` (prod): fail at once, with what to do, if the operator's zip is missing, instead of
an EMR cluster failing after many minutes of provisioning.
On delete, only a zip this function generated is removed.
"""

from __future__ import annotations

import io
import json
import logging
import zipfile
from datetime import UTC, datetime, timedelta

LOG = logging.getLogger()
LOG.setLevel(logging.INFO)

GENERATED_MARKER = "lakehouse-generated"
VALIDITY = timedelta(days=825)  # the longest validity clients accept for a leaf certificate


def internal_host_patterns(region: str) -> list[str]:
    """EMR nodes' private DNS names: us-east-1 uses ec2.internal, other regions compute.internal."""
    patterns = [f"*.{region}.compute.internal"]
    return ["*.ec2.internal", *patterns] if region == "us-east-1" else patterns


def certificate_zip(region: str, now: datetime) -> bytes:
    """A new CA and a leaf certificate for the region's internal host names, zipped as EMR reads them."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def name(common_name: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = name("lakehouse EMR in-transit CA")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    hosts = internal_host_patterns(region)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    leaf = (
        x509.CertificateBuilder()
        .subject_name(name(hosts[0]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    private_key = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("privateKey.pem", private_key)
        archive.writestr("certificateChain.pem", leaf.public_bytes(pem) + ca.public_bytes(pem))
        archive.writestr("trustedCertificates.pem", ca.public_bytes(pem))
    return buffer.getvalue()


def _exists(s3, bucket: str, key: str) -> dict | None:
    """The object's HEAD answer, or None when it is missing.

    Asked by listing the key as a prefix: this role may list the bucket only under that prefix (an
    `s3:prefix` condition), and S3 answers a HeadObject on a missing key with 403, not 404, to a caller
    without an unconditioned s3:ListBucket (HeadObject API reference). HEAD only once it is listed."""
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1).get("Contents", [])
    if not listed or listed[0]["Key"] != key:
        return None
    return s3.head_object(Bucket=bucket, Key=key)


def apply(event: dict, s3, now: datetime) -> dict:
    """The custom resource's work; returns the Provider framework's response (nothing secret)."""
    props = event["ResourceProperties"]
    bucket, key, mode = props["Bucket"], props["Key"], props["Mode"]
    uri = f"s3://{bucket}/{key}"
    if event["RequestType"] == "Delete":
        found = _exists(s3, bucket, key)
        if found and found.get("Metadata", {}).get(GENERATED_MARKER) == "true":
            s3.delete_object(Bucket=bucket, Key=key)
            LOG.info(json.dumps({"deleted": uri}))
        return {"PhysicalResourceId": uri}
    if _exists(s3, bucket, key):
        LOG.info(json.dumps({"kept": uri}))
        return {"PhysicalResourceId": uri}
    if mode == "require":
        raise RuntimeError(
            f"EMR in-transit encryption needs the TLS certificate zip at {uri} (privateKey.pem, "
            "certificateChain.pem, trustedCertificates.pem for the cluster's internal host names) "
            "and it is missing: upload your organisation's certificate there, as a role named in "
            "the context value `security_admins` (the bucket denies other uploaders; infra/README.md, "
            "'Deploy (prod)'), and deploy again. Nothing else was created."
        )
    s3.put_object(
        Bucket=bucket,
        Key=key,
        Body=certificate_zip(props["Region"], now),
        ServerSideEncryption="AES256",
        Metadata={GENERATED_MARKER: "true"},
    )
    LOG.info(json.dumps({"generated": uri, "hosts": internal_host_patterns(props["Region"])}))
    return {"PhysicalResourceId": uri}


def on_event(event, context):  # noqa: ARG001 - Lambda signature
    import boto3

    return apply(event, boto3.client("s3"), datetime.now(UTC))
