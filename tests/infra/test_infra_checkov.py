"""checkov, a second scanner beside cdk-nag, over both environments' synthesized templates: no
failed check, and every skipped one carries its reason (infra/checkov.py and `skip_check` calls)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CHECKOV = REPO_ROOT / ".tools" / "checkov" / "bin" / "checkov"


def scan(env) -> dict:
    """checkov's summary and findings over the env's templates (one run per env)."""
    assert CHECKOV.exists(), f"{CHECKOV} is missing: `make setup` installs the pinned checkov"
    templates = [str(env.outdir / stack.template_file) for stack in env.stacks.all]
    args = [str(CHECKOV), "--framework", "cloudformation", "-o", "json", "--compact"]
    for template in templates:
        args += ["-f", template]
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
    return merged


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


def test_only_the_documented_findings_are_accepted(checkov_results, prod) -> None:
    """A new kind of skip is a decision: it must be added here and to the README's Security section."""
    accepted = {c["check_id"] for results in checkov_results.values() for c in results["skipped"]}
    assert accepted == {
        "CKV_AWS_115",
        "CKV_AWS_116",
        "CKV_AWS_117",
        "CKV_AWS_173",
        "CKV_AWS_18",
        "CKV_AWS_21",
        "CKV_AWS_157",
    }
    prod_skips = {(c["check_id"], c["resource"]) for c in checkov_results["prod"]["skipped"]}
    # prod versions its data buckets and runs multi-AZ: those skips are dev's alone.
    assert ("CKV_AWS_21", "AWS::S3::Bucket.LakeWarehouseBucket96497B04") not in prod_skips
    assert not any(check == "CKV_AWS_157" for check, _ in prod_skips)
    # prod logs every data bucket: its one access-logging skip is the logs bucket itself.
    lake = prod.stacks.lake
    logs_bucket = lake.get_logical_id(lake.lake.logs_bucket.node.default_child)
    assert {resource for check, resource in prod_skips if check == "CKV_AWS_18"} == {
        f"AWS::S3::Bucket.{logs_bucket}"
    }
