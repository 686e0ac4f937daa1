"""checkov, a second scanner beside cdk-nag, over both environments' synthesized templates: no
failed check, and every skipped one carries its reason (infra/checkov.py and `skip_check` calls)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from infra.checkov import LAMBDA_FINDINGS

pytestmark = pytest.mark.slow  # runs checkov (its own venv) over both environments

REPO_ROOT = Path(__file__).resolve().parents[2]
CHECKOV = REPO_ROOT / ".tools" / "checkov" / "bin" / "checkov"
CONCERNS = ("Network", "Lake", "Streaming", "SourceDatabase", "Compute", "Monitoring", "Jobs")


def run_checkov(templates: list[Path]) -> dict:
    """checkov's summary and findings over the templates, each finding with the template's file name."""
    assert CHECKOV.exists(), f"{CHECKOV} is missing: `make setup` installs the pinned checkov"
    args = [str(CHECKOV), "--framework", "cloudformation", "-o", "json", "--compact"]
    for template in templates:
        args += ["-f", str(template)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert result.stdout.strip(), (
        f"checkov printed nothing (exit {result.returncode}):\n{result.stderr[-2000:]}"
    )
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    merged = {"passed": 0, "failed": [], "skipped": []}
    for report in reports:
        merged["passed"] += report["summary"]["passed"]
        merged["failed"] += report["results"].get("failed_checks", [])
        merged["skipped"] += report["results"].get("skipped_checks", [])
    for check in merged["failed"] + merged["skipped"]:
        check["template"] = Path(check["file_path"]).name
    return merged


def scan(env) -> dict:
    """checkov over the env's templates (one run per env); each finding names its concern."""
    concerns = {stack.template_file: concern for concern, stack in zip(CONCERNS, env.stacks.all, strict=True)}
    results = run_checkov([env.outdir / stack.template_file for stack in env.stacks.all])
    for check in results["failed"] + results["skipped"]:
        check["concern"] = concerns[check["template"]]
    return results


@pytest.fixture(scope="session")
def checkov_results(dev, prod) -> dict[str, dict]:
    return {"dev": scan(dev), "prod": scan(prod)}


@pytest.mark.parametrize("env_name", ["dev", "prod"])
def test_checkov_finds_nothing_unreasoned(checkov_results, env_name: str) -> None:
    results = checkov_results[env_name]
    print(
        f"\ncheckov {env_name}: {results['passed']} passed, {len(results['failed'])} failed, "
        f"{len(results['skipped'])} skipped with a reason"
    )
    failed = [f"{c['check_id']} {c['resource']}: {c['check_name']}" for c in results["failed"]]
    assert not failed, (
        "checkov findings (fix them, or accept with a reason in infra/checkov.py):\n" + "\n".join(failed)
    )
    unreasoned = [
        f"{c['check_id']} {c['resource']}"
        for c in results["skipped"]
        if (c["check_result"].get("suppress_comment") or "No comment provided") == "No comment provided"
    ]
    assert not unreasoned, unreasoned
    assert results["passed"] > 400  # the scanner really read the templates


# Every Lambda function of the app, by stack and logical id. infra/checkov.py accepts CKV_AWS_115,
# 116, 117 and 173 for every function through an aspect, so a new function would inherit them
# silently: it must be added here, once its reason there (docs/security.md, "Accepted findings") fits it.
LAMBDA_CHECKS = ("CKV_AWS_115", "CKV_AWS_116", "CKV_AWS_117", "CKV_AWS_173")
LAMBDAS = (
    "Streaming/AWS679f53fac002430cb0da5b7982bd22872D164C4C",  # AwsCustomResource: bootstrap brokers
    "SourceDatabase/SourceDatabaseSeedFunctionC9046D89",  # seeds the source DB (in the VPC)
    "SourceDatabase/SourceDatabaseSeedProviderframeworkonEventA5D4A529",
    "Compute/ComputeTlsCertificatesFunction55D3849A",  # EMR's TLS certificates
    "Compute/ComputeTlsCertificatesProviderframeworkonEventB24A5C9C",
    "Compute/ComputeSecurityGroupCleanupFunctionEDEF27EE",  # EMR managed security group cleanup
    "Compute/ComputeSecurityGroupCleanupProviderframeworkonEventEBEAE131",
    "Compute/CustomCDKBucketDeployment8693BB64968944B69AAFB0CC9EB8756C81C01536",  # bootstrap scripts upload
    "Jobs/CustomCDKBucketDeployment8693BB64968944B69AAFB0CC9EB8756C2048MiB2048MiBD44B8A53",  # jobs upload
    "Jobs/AWSCDKTriggerCustomResourceProviderCustomResourceProviderHandler97BECD91",  # reconcile on deploy
    "Jobs/JobsStepSupervisorA3A641DA",  # the scheduled step supervisor
)
DEV_ONLY_LAMBDAS = ("Lake/CustomS3AutoDeleteObjectsCustomResourceProviderHandler9D90184F",)
LOGS_BUCKET = "Lake/LakeLogsBucket5F21DAB1"
DATA_BUCKETS = ("Lake/LakeWarehouseBucket96497B04", "Lake/LakeArtifactsBucket1B9F5BC1")
# (check, stack/logical id) accepted per environment; docs/security.md, "Accepted findings".
ACCEPTED = {
    "prod": {
        *((check, function) for function in LAMBDAS for check in LAMBDA_CHECKS),
        ("CKV_AWS_18", LOGS_BUCKET),  # the access-log target itself
        ("CKV_AWS_21", LOGS_BUCKET),
    },
}
ACCEPTED["dev"] = {
    *ACCEPTED["prod"],
    *((check, function) for function in DEV_ONLY_LAMBDAS for check in LAMBDA_CHECKS),
    *((check, bucket) for bucket in DATA_BUCKETS for check in ("CKV_AWS_18", "CKV_AWS_21")),
    ("CKV_AWS_157", "SourceDatabase/SourceDatabaseInstance797AD7A6"),  # single-AZ
}


@pytest.mark.parametrize("env_name", ["dev", "prod"])
def test_only_the_documented_findings_are_accepted(checkov_results, env_name: str) -> None:
    """A new skip, or an old one on a new resource, is a decision: it must be added here and to the
    docs/security.md."""
    skipped = {
        (c["check_id"], f"{c['concern']}/{c['resource'].split('.', 1)[1]}")  # resource: Type.LogicalId
        for c in checkov_results[env_name]["skipped"]
    }
    undocumented, stale = sorted(skipped - ACCEPTED[env_name]), sorted(ACCEPTED[env_name] - skipped)
    assert not undocumented, f"accepted, but not documented: {undocumented}"
    assert not stale, f"documented, but no longer skipped: {stale}"


def test_every_lambda_function_is_listed(dev, prod) -> None:
    """LAMBDAS above is the app's whole list (an unlisted function fails the test above too)."""
    for env, expected in ((dev, LAMBDAS + DEV_ONLY_LAMBDAS), (prod, LAMBDAS)):
        functions = {
            f"{concern}/{logical_id}"
            for concern, template in env.templates.items()
            for logical_id, resource in template["Resources"].items()
            if resource["Type"] == "AWS::Lambda::Function"
        }
        assert functions == set(expected), env.config.env_name


def test_checkov_reports_the_known_findings_of_a_canary_template(tmp_path) -> None:
    """The positive control: the same checkov run fails an unlogged, unversioned bucket and a
    function without the accepted skips; the skips it honours are the metadata infra/checkov.py
    writes; a skip without a reason shows as one (what test_checkov_finds_nothing_unreasoned reads)."""
    function = {
        "Type": "AWS::Lambda::Function",
        "Properties": {
            "Runtime": "python3.12",
            "Handler": "index.handler",
            "Role": "arn:aws:iam::123456789012:role/canary",
            "Code": {"ZipFile": "def handler(event, context): pass"},
            "Environment": {"Variables": {"TABLE": "canary"}},
        },
    }
    skips = [{"id": check, "comment": reason} for check, reason in LAMBDA_FINDINGS.items()]
    template = {
        "Resources": {
            "Bucket": {"Type": "AWS::S3::Bucket", "Properties": {}},
            "Function": function,
            "AcceptedFunction": {**function, "Metadata": {"checkov": {"skip": skips}}},
            "UnreasonedBucket": {
                "Type": "AWS::S3::Bucket",
                "Properties": {},
                "Metadata": {"checkov": {"skip": [{"id": "CKV_AWS_18"}]}},
            },
        }
    }
    path = tmp_path / "canary.template.json"
    path.write_text(json.dumps(template))
    results = run_checkov([path])
    failed = {(c["check_id"], c["resource"]) for c in results["failed"]}
    assert {("CKV_AWS_18", "AWS::S3::Bucket.Bucket"), ("CKV_AWS_21", "AWS::S3::Bucket.Bucket")} <= failed
    assert {(check, "AWS::Lambda::Function.Function") for check in LAMBDA_CHECKS} <= failed
    assert not any(resource == "AWS::Lambda::Function.AcceptedFunction" for _, resource in failed)
    skipped = {
        (c["check_id"], c["resource"]): c["check_result"]["suppress_comment"] for c in results["skipped"]
    }
    assert skipped == {
        **{
            (check, "AWS::Lambda::Function.AcceptedFunction"): LAMBDA_FINDINGS[check]
            for check in LAMBDA_CHECKS
        },
        ("CKV_AWS_18", "AWS::S3::Bucket.UnreasonedBucket"): "No comment provided",
    }
