"""The EMR TLS certificate custom resource: generated in dev, required in prod (moto S3)."""

from __future__ import annotations

import importlib.util
import io
import zipfile
from datetime import UTC, datetime

import boto3
import pytest
from cryptography import x509
from moto import mock_aws
from s3_answers import S3AsAwsAnswers

from infra.config import EMR_TLS_CERTIFICATES_KEY

HANDLER = importlib.util.spec_from_file_location(
    "emr_tls_certificates", "infra/lambdas/emr_tls_certificates/handler.py"
)
tls = importlib.util.module_from_spec(HANDLER)
HANDLER.loader.exec_module(tls)
NOW = datetime(2026, 11, 23, tzinfo=UTC)


def event(request: str, mode: str, region: str = "us-east-1") -> dict:
    props = {"Bucket": "artifacts", "Key": EMR_TLS_CERTIFICATES_KEY, "Region": region, "Mode": mode}
    return {"RequestType": request, "ResourceProperties": props}


@pytest.fixture
def s3():
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="artifacts")
        yield client


def read_zip(s3) -> dict[str, bytes]:
    body = s3.get_object(Bucket="artifacts", Key=EMR_TLS_CERTIFICATES_KEY)["Body"].read()
    with zipfile.ZipFile(io.BytesIO(body)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def test_dev_generates_a_ca_and_a_certificate_for_the_internal_host_names(s3):
    response = tls.apply(event("Create", "generate"), s3, NOW)
    assert response == {"PhysicalResourceId": f"s3://artifacts/{EMR_TLS_CERTIFICATES_KEY}"}  # no secrets
    files = read_zip(s3)
    assert set(files) == {"privateKey.pem", "certificateChain.pem", "trustedCertificates.pem"}
    leaf, ca = x509.load_pem_x509_certificates(files["certificateChain.pem"])
    assert x509.load_pem_x509_certificate(files["trustedCertificates.pem"]) == ca
    leaf.verify_directly_issued_by(ca)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["*.ec2.internal", "*.us-east-1.compute.internal"]
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    key = load_pem_private_key(files["privateKey.pem"], password=None)
    assert key.public_key().public_numbers() == leaf.public_key().public_numbers()


def test_other_regions_use_compute_internal():
    assert tls.internal_host_patterns("eu-west-1") == ["*.eu-west-1.compute.internal"]


def test_an_existing_zip_is_kept_and_only_a_generated_one_is_deleted(s3):
    s3.put_object(Bucket="artifacts", Key=EMR_TLS_CERTIFICATES_KEY, Body=b"the operator's own")
    tls.apply(event("Create", "generate"), s3, NOW)
    tls.apply(event("Delete", "generate"), s3, NOW)
    body = s3.get_object(Bucket="artifacts", Key=EMR_TLS_CERTIFICATES_KEY)["Body"].read()
    assert body == b"the operator's own"

    s3.delete_object(Bucket="artifacts", Key=EMR_TLS_CERTIFICATES_KEY)
    tls.apply(event("Create", "generate"), s3, NOW)
    tls.apply(event("Update", "generate"), s3, NOW)  # an update does not regenerate it
    tls.apply(event("Delete", "generate"), s3, NOW)
    assert s3.list_objects_v2(Bucket="artifacts").get("KeyCount") == 0


def test_prod_fails_fast_with_what_to_do_when_the_zip_is_missing(s3):
    with pytest.raises(RuntimeError, match="upload your organisation's certificate there"):
        tls.apply(event("Create", "require"), s3, NOW)
    s3.put_object(Bucket="artifacts", Key=EMR_TLS_CERTIFICATES_KEY, Body=b"zip")
    assert tls.apply(event("Create", "require"), s3, NOW)["PhysicalResourceId"].startswith("s3://")


def test_the_cluster_waits_for_the_certificates(synthesized):
    template = synthesized.templates["Compute"]
    (resource_id,) = [
        k for k, r in template["Resources"].items() if r["Type"] == "Custom::EmrTlsCertificates"
    ]
    mode = template["Resources"][resource_id]["Properties"]["Mode"]
    assert mode == ("generate" if synthesized.config.env_name == "dev" else "require")
    (security_id,) = [
        k for k, r in template["Resources"].items() if r["Type"] == "AWS::EMR::SecurityConfiguration"
    ]
    assert resource_id in template["Resources"][security_id]["DependsOn"]


@pytest.fixture
def s3_as_the_tls_role(s3):
    """S3 as it answers the TLS function's role: object actions on the key, s3:ListBucket only with
    `s3:prefix` = the key (emr_compute.py), so a HeadObject on the missing zip answers 403."""
    return S3AsAwsAnswers(s3, may_list_bucket=False, may_list_prefixes=(EMR_TLS_CERTIFICATES_KEY,))


def test_the_first_deploy_and_its_rollback_work_with_the_role_s_own_permissions(s3_as_the_tls_role, s3):
    # Create on an empty bucket generates (a HEAD-first check raised 403 here and failed the deploy)...
    tls.apply(event("Create", "generate"), s3_as_the_tls_role, NOW)
    assert set(read_zip(s3)) == {"privateKey.pem", "certificateChain.pem", "trustedCertificates.pem"}
    # ... and a Delete finds and removes its own zip; a second Delete (a rollback after a failed
    # create) finds nothing and succeeds instead of leaving the stack in ROLLBACK_FAILED.
    tls.apply(event("Delete", "generate"), s3_as_the_tls_role, NOW)
    assert s3.list_objects_v2(Bucket="artifacts").get("KeyCount") == 0
    tls.apply(event("Delete", "generate"), s3_as_the_tls_role, NOW)
    assert "list_objects_v2" in s3_as_the_tls_role.calls


def test_prod_says_what_to_do_instead_of_a_raw_403(s3_as_the_tls_role):
    with pytest.raises(RuntimeError, match="upload your organisation's certificate there"):
        tls.apply(event("Create", "require"), s3_as_the_tls_role, NOW)
